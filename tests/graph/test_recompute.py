"""Recompute: the ``--recompute`` grammar, full recompute's uniform/block semantics, per-rank
``num_layers``, and that a fully recomputed layer keeps exactly its input outside ``paper``."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sources import template_of

from timeline.errors import UserError
from timeline.io.runfile import load_run
from timeline.spec.recompute import parse_recompute
from timeline.spec.run import RecomputeSpec

LLAMA = """
[model]
preset = "llama3-8b"
profile = "megatron"
num_hidden_layers = 8
[parallel]
pp = 2
tp = 2
[training]
seq_len = 1024
"""


@pytest.mark.parametrize(("text", "spec"), [
    ("none", RecomputeSpec(policy="none")),
    ("selective:core_attn", RecomputeSpec(policy="selective", modules=("core_attn",))),
    ("selective:moe+shared_experts", RecomputeSpec(policy="selective", modules=("moe", "shared_experts"))),
    ("full:uniform:2", RecomputeSpec(policy="full", method="uniform", num_layers=2)),
    ("full:block:1,0", RecomputeSpec(policy="full", method="block", num_layers=(1, 0))),
    ("selective", RecomputeSpec(policy="selective", modules=("core_attn",))),  # Megatron's default modules
])
def test_parse(text, spec):
    assert parse_recompute(text) == spec


@pytest.mark.parametrize("text", ["", "some", "selective:", "selective:attn", "full:uniform", "full:x:1",
                                  "full:block:-1", "full:block:a"])
def test_parse_rejects_with_forms(text):
    with pytest.raises(UserError) as exc:
        parse_recompute(text)
    assert repr(text) in str(exc.value) and "selective:MOD" in str(exc.value)


def run_with(write_run, text):
    return replace(load_run(write_run(LLAMA), []), recompute=parse_recompute(text))


def kept(t):
    return {st.layer: st.tensor.name for st in t.saved if st.layer >= 0}


def test_full_uniform_keeps_group_inputs(write_run):
    t = template_of(run_with(write_run, "full:uniform:2"), 0)
    hidden = 1024 // 2 * 4096 * 2  # b·s/tp rows of h, bf16
    assert t.layer_activation_bytes == {0: hidden, 2: hidden}
    assert [st.tensor.name for st in t.saved if st.layer >= 0] == ["embedding.out", "layers.1.output"]


def test_full_block_first_layers_only(write_run):
    base = template_of(run_with(write_run, "none"), 1).layer_activation_bytes
    t = template_of(run_with(write_run, "full:block:1"), 1)
    assert t.layer_activation_bytes[4] == 1024 // 2 * 4096 * 2  # exactly its input
    for layer in (5, 6, 7):
        assert t.layer_activation_bytes[layer] == base[layer]


def test_full_num_layers_per_pipeline_rank(write_run):
    run = run_with(write_run, "full:block:0,2")
    assert template_of(run, 0).layer_activation_bytes == template_of(run_with(write_run, "none"),
                                                                           0).layer_activation_bytes
    t = template_of(run, 1)
    assert t.layer_activation_bytes[4] == t.layer_activation_bytes[5] == 1024 // 2 * 4096 * 2


def test_recompute_ops_precede_their_backward(write_run):
    t = template_of(run_with(write_run, "full:uniform:1"), 0)
    names = [o.name for o in t.backward_i]
    for layer in range(4):
        first_rc = names.index(f"layers.{layer}.input_layernorm.recompute")
        assert first_rc < names.index(f"layers.{layer}.mlp.linear_fc2")
        assert all(o.recompute for o in t.backward_i if o.name.endswith(".recompute"))
