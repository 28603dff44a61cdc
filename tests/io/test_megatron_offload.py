"""``--fine-grained-activation-offloading`` in from-megatron (timeline.io.megatron_offload): the modules and the
size floor map onto ``[offload]``; Megatron-LM's own refusals and the knobs not modelled are one-line errors. The
job is Megatron-LM's ``moe/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_no_mtp_no_a2a_ovlp_fine_grained_offloading``
functional test (model_config.yaml at f5b2ec0130), its memory-relevant part."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from timeline.errors import UserError
from timeline.io.megatron_args import from_mapping
from timeline.io.megatron_write import convert, run_file_text
from timeline.io.runfile import run_from_data

ARGS = {"--tensor-model-parallel-size": 2, "--pipeline-model-parallel-size": 2, "--expert-model-parallel-size": 4,
        "--expert-tensor-parallel-size": 1, "--use-distributed-optimizer": True, "--attention-backend": "unfused",
        "--sequence-parallel": True, "--disable-bias-linear": True, "--micro-batch-size": 1,
        "--global-batch-size": 8, "--recompute-granularity": "selective",
        "--recompute-modules": "[layernorm mla_up_proj mlp moe_act]", "--fine-grained-activation-offloading": True,
        "--offload-modules": "[expert_fc1 moe_act attn_norm mlp_norm qkv_linear core_attn attn_proj]",
        "--transformer-impl": "transformer_engine", "--seq-length": 4096, "--num-layers": 15,
        "--moe-layer-freq": "([0]*3+[1]*12)", "--pipeline-model-parallel-layout": "Et*3|(tt|)*6L",
        "--hidden-size": 1024, "--ffn-hidden-size": 4096, "--num-attention-heads": 32, "--kv-channels": 128,
        "--max-position-embeddings": 4096, "--position-embedding-type": "rope",
        "--make-vocab-size-divisible-by": 3232, "--normalization": "RMSNorm", "--swiglu": True,
        "--untie-embeddings-and-output-weights": True, "--multi-latent-attention": True, "--qk-layernorm": True,
        "--num-experts": 32, "--moe-ffn-hidden-size": 1024, "--moe-shared-expert-intermediate-size": 1024,
        "--moe-router-load-balancing-type": "seq_aux_loss", "--moe-router-topk": 4,
        "--moe-token-dispatcher-type": "alltoall", "--moe-grouped-gemm": True, "--moe-router-dtype": "fp32",
        "--moe-permute-fusion": True, "--q-lora-rank": 1536, "--kv-lora-rank": 512, "--qk-head-dim": 128,
        "--qk-pos-emb-head-dim": 64, "--v-head-dim": 128, "--bf16": True, "--vocab-size": 50257}
ENV = {"NVTE_CPU_OFFLOAD_V1": "1", "NVTE_FUSED_ATTN": "0"}


def _convert(args: dict, env: dict | None = None, **kw):
    return convert(from_mapping(args, ENV if env is None else env), world_size=8, gpu="h100", te_version="2.12", **kw)


def test_the_modules_and_the_floor_map_onto_offload():
    c = _convert(ARGS)
    assert c.sections["offload"] == {"modules": ["expert_fc1", "moe_act", "attn_norm", "mlp_norm", "qkv_linear",
                                                 "core_attn", "attn_proj"], "min_elements": 1048576}
    assert _convert(ARGS | {"--min-offloaded-tensor-size": 4096}).sections["offload"]["min_elements"] == 4096
    text = run_file_text(c, name="offload", source="model_config.yaml", world_size=8)
    run = run_from_data(tomllib.loads(text), Path("offload.toml"))
    assert run.offload.modules[:2] == ("expert_fc1", "moe_act")


def test_the_later_knobs_map_too():
    off = _convert(ARGS | {"--activation-offload-fraction": 0.5,
                           "--delta-offload-bytes-across-pp-ranks": 2**30}).sections["offload"]
    assert (off["fraction"], off["delta_bytes"]) == (0.5, 2**30)


def test_without_the_flag_nothing_is_offloaded():
    args = {k: v for k, v in ARGS.items() if k != "--fine-grained-activation-offloading"}
    assert "offload" not in _convert(args).sections


@pytest.mark.parametrize("args,env,needle", [
    ({"--offload-modules": "[attn_proj]"}, None, "attn_proj without core_attn"),
    ({"--offload-modules": "[mlp]"}, None, "not a module Megatron-LM offloads"),
    ({}, {"NVTE_FUSED_ATTN": "0"}, "NVTE_CPU_OFFLOAD_V1=1"),
    ({"--activation-offload-fraction": 1.5}, None, "between 0 and 1"),
    ({"--delta-offload-bytes-across-pp-ranks": -1}, None, "not negative"),
    ({"--offload-modules": "[fused_group_mlp]"}, None, "fused grouped MLP"),
])
def test_refusals_name_the_argument(args, env, needle):
    with pytest.raises(UserError, match="^--") as exc:
        _convert(ARGS | args, env)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_te_before_2_10_needs_no_environment_switch():
    c = convert(from_mapping(ARGS, {"NVTE_FUSED_ATTN": "0"}), world_size=8, gpu="h100", te_version="2.9")
    assert c.sections["offload"]["modules"]


def test_the_environment_switch_is_asserted_only_from_the_release_that_added_it():
    """b97184db56 added the NVTE_CPU_OFFLOAD_V1 assertion (first released in core_v0.16.0): a main or dev snapshot
    of 0.16.0rc0 spans both sides and runs without it, with a note; the release refuses in one line."""
    env = {"NVTE_FUSED_ATTN": "0"}
    snap = convert(from_mapping(ARGS, env), world_size=8, gpu="h100", te_version="2.10", megatron_core="0.16.0rc0")
    assert snap.sections["offload"]["modules"][0] == "expert_fc1"
    assert any("no NVTE_CPU_OFFLOAD_V1=1: a Megatron-LM snapshot before b97184db56" in n for n in snap.notes)
    for release in ("0.16.0", "0.17.0rc0"):
        with pytest.raises(UserError, match="^--fine-grained-activation-offloading with Transformer Engine 2.10"):
            convert(from_mapping(ARGS, env), world_size=8, gpu="h100", te_version="2.10", megatron_core=release)
