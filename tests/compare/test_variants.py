"""Variant lists in the recompute grammar: splitting, round-tripping names, validation."""

from __future__ import annotations

import pytest
from recompute_template import tiny_run

from timeline.cli.variants import policy_variants
from timeline.compare.variants import recompute_name, split_policies
from timeline.errors import UserError
from timeline.spec.recompute import parse_recompute


def test_split_keeps_per_rank_layer_lists_together():
    assert split_policies(["none,full:block:2,1,selective:mlp", "full:uniform:1"]) == [
        "none", "full:block:2,1", "selective:mlp", "full:uniform:1"]


@pytest.mark.parametrize("text", ["none", "selective:core_attn+mlp", "full:uniform:2", "full:block:2,1"])
def test_names_round_trip(text):
    assert recompute_name(parse_recompute(text)) == text


def test_invalid_policies_are_user_errors():
    with pytest.raises(UserError, match="selective:nope"):
        policy_variants(tiny_run(), ["none,selective:nope"])
    with pytest.raises(UserError, match="mixture-of-experts"):
        policy_variants(tiny_run(), ["selective:moe_act"])  # a dense model
    with pytest.raises(UserError, match="one per pipeline rank"):
        policy_variants(tiny_run(pp=2), ["full:block:1,1,1"])
