"""``from-megatron`` and run validation for the flex token dispatcher: ``--moe-flex-dispatcher-backend``,
the deprecated ``--moe-enable-deepep``, HybridEP's NVLink domain, and Megatron's own refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from timeline.errors import UserError
from timeline.io.megatron_args import from_mapping
from timeline.io.megatron_write import convert
from timeline.io.runfile import load_run

BASE = {"--num-layers": 4, "--hidden-size": 256, "--num-attention-heads": 8, "--seq-length": 512,
        "--micro-batch-size": 2, "--global-batch-size": 16, "--bf16": True, "--num-experts": 8,
        "--moe-router-topk": 2, "--expert-model-parallel-size": 2}
FLEX = BASE | {"--moe-token-dispatcher-type": "flex"}
SHIPPED = Path(__file__).resolve().parents[2] / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"


def framework(args: dict, env: dict | None = None, **kw) -> dict:
    return convert(from_mapping(args, env), world_size=2, **kw).sections["framework"]


def test_flex_backend_and_nvlink_domain_are_written():
    f = framework(FLEX)
    assert (f["moe_token_dispatcher"], f["moe_flex_backend"], f["nvlink_domain"]) == ("flex", "deepep", 8)
    f = framework(FLEX | {"--moe-flex-dispatcher-backend": "hybridep"}, gpu="gb200")
    assert (f["moe_flex_backend"], f["nvlink_domain"]) == ("hybridep", 72)  # one NVL72 rack
    f = framework(FLEX | {"--moe-flex-dispatcher-backend": "hybridep"},
                  {"NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": "4"}, gpu="gb200")
    assert f["nvlink_domain"] == 4  # HybridEPBuffer takes the variable over what it detects
    assert framework(FLEX | {"--moe-enable-deepep": True})["moe_flex_backend"] == "deepep"


def test_other_dispatchers_write_no_flex_keys():
    f = framework(BASE | {"--moe-token-dispatcher-type": "alltoall", "--moe-flex-dispatcher-backend": "hybridep"})
    assert "moe_flex_backend" not in f and "nvlink_domain" not in f


@pytest.mark.parametrize(("args", "env", "needle"), [
    (FLEX | {"--moe-flex-dispatcher-backend": "nccl"}, None, "--moe-flex-dispatcher-backend nccl"),
    (BASE | {"--moe-enable-deepep": True}, None, "--moe-enable-deepep: DeepEP runs only with"),
    (FLEX | {"--moe-enable-deepep": True, "--moe-flex-dispatcher-backend": "hybridep"}, None, "give one backend"),
    (FLEX, {"NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": "x"}, "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=x"),
])
def test_refusals_name_the_argument(args: dict, env: dict | None, needle: str):
    with pytest.raises(UserError, match=needle):
        framework(args, env)


def test_validation_refuses_what_megatron_refuses():
    with pytest.raises(UserError, match='"flex" needs ep·etp > 1'):
        load_run(SHIPPED, ['model.profile="megatron"', 'framework.moe_token_dispatcher="flex"', "parallel.ep=1"])
    with pytest.raises(UserError, match="deepep backend does not pad to capacity"):
        load_run(SHIPPED, ['model.profile="megatron"', 'framework.moe_token_dispatcher="flex"',
                           "training.capacity_factor=1.0", "training.pad_to_capacity=true"])
    load_run(SHIPPED, ['model.profile="megatron"', 'framework.moe_token_dispatcher="flex"',
                       'framework.moe_flex_backend="hybridep"', "training.capacity_factor=1.0",
                       "training.pad_to_capacity=true"])
