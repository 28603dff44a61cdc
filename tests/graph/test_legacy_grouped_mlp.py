"""Megatron's legacy ``GroupedMLP`` (grouped_gemm's ``gmm``; ``[framework] moe_legacy_grouped_gemm``, or
``--moe-grouped-gemm`` under a Transformer Engine without ``GroupedLinear``): its ``activation_func_with_probs``
is one ``jit_fuser`` (torch.compile) function, which keeps the fc1 output and the probs and recomputes the
activation, and no TE GroupedLinear creates TE's multi-stream cuBLAS workspaces (the shipped DeepSeek-V3 layer 4
with GeLU experts: b = 1, s = 4096 over tp = 2, top-8, ep = 8)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_run import collected_record, validate_measured
from sources import template_of

from timeline.io.megatron_args import from_mapping
from timeline.io.megatron_write import convert
from timeline.io.runfile import load_run
from timeline.profiles.megatron_workspaces import legacy_grouped_mlp
from timeline.spec.framework import FrameworkSpec

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"
GELU = ['model.profile="megatron"', 'model.hidden_act="gelu"']
P = "layers.4.mlp.experts.act"
ROWS, FFN = 4096 // 2 * 8, 2048  # t·k rows on each EP rank (balanced, etp = 1); moe_intermediate_size


@pytest.mark.parametrize(("fields", "legacy"), [
    ({"transformer_engine": "1.2"}, True),  # NGC PyTorch 24.01's TE: no GroupedLinear
    ({"transformer_engine": "1.9"}, False),
    ({"transformer_engine": "2.6", "moe_legacy_grouped_gemm": True}, True),
    ({"transformer_engine": "2.6", "transformer_impl": "local"}, True),
    ({"transformer_engine": "1.2", "moe_grouped_gemm": False}, False),  # SequentialMLP
    ({"transformer_engine": "2.6", "moe_legacy_grouped_gemm": True, "megatron_core": "0.17.0"}, False),  # removed
])
def test_megatron_builds_the_legacy_grouped_mlp_where_te_has_no_grouped_linear(fields, legacy):
    assert legacy_grouped_mlp(FrameworkSpec(**{"megatron_core": "0.13.0", **fields})) is legacy


def _act_saved(*overrides: str) -> dict[str, tuple[tuple[int, ...], str]]:
    run = load_run(SHIPPED, [*GELU, *overrides])
    return {st.tensor.name: (st.tensor.shape, st.tensor.dtype)
            for st in template_of(run, 1).saved if st.layer == 4 and st.tensor.name.startswith(P)}


def test_the_compiled_activation_keeps_its_input_and_the_probs_not_the_activation():
    te = _act_saved('framework.pytorch="2.2"')
    legacy = _act_saved('framework.pytorch="2.2"', "framework.moe_legacy_grouped_gemm=true")
    assert te[f"{P}.act"] == ((ROWS, FFN), "bf16")  # TEGroupedMLP's eager `activation_func(x) * probs`
    assert set(te) - set(legacy) == {f"{P}.act"}
    # before torch 2.2 jit_fuser is torch.jit.script, not read here: the eager rule stands
    assert _act_saved('framework.pytorch="2.1"', "framework.moe_legacy_grouped_gemm=true") == te


def _workspaces(*overrides: str) -> set[str]:
    from timeline.result.build import build_timeline

    run = load_run(SHIPPED, [*GELU, 'framework.pytorch="2.2"', "training.iterations=1",
                             "training.num_microbatches=16", *overrides])
    tl = build_timeline(run)
    return {n for n in tl.names if n.startswith("workspace.te_cublas_stream")}


def test_no_te_grouped_linear_no_multi_stream_workspaces():
    assert _workspaces() == {f"workspace.te_cublas_stream{i}" for i in range(4)}
    assert _workspaces("framework.moe_legacy_grouped_gemm=true") == set()


def test_from_megatron_maps_the_legacy_flag():
    args = {"--num-layers": 2, "--hidden-size": 256, "--num-attention-heads": 4, "--seq-length": 128,
            "--max-position-embeddings": 128, "--micro-batch-size": 1, "--global-batch-size": 8,
            "--num-experts": 4, "--moe-grouped-gemm": True, "--moe-use-legacy-grouped-gemm": True,
            "--disable-bias-linear": True, "--vocab-size": 1024, "--bf16": True}
    conv = convert(from_mapping(args), world_size=1)
    assert conv.sections["framework"]["moe_legacy_grouped_gemm"] is True
    assert conv.mapped["--moe-use-legacy-grouped-gemm"] == "framework.moe_legacy_grouped_gemm"


@pytest.mark.parametrize(("name", "at"), [
    ("gpt3_mr_mcore_te_tp2_zp_z3_resume_torch_dist_te_8experts2parallel_top2router_dgx_a100_1N8G", "3ed2571b0a"),
    ("gpt3_mr_mcore_te_tp2_pp1_te_8experts2parallel_ddp_average_in_collective_dgx_a100_1N8G", "e494219642"),
])
def test_the_lts_image_s_grouped_experts_simulate_within_one_percent(name, at):
    """Megatron-LM's functional tests on the lts image (NGC 24.01: torch 2.2, TE 1.2) after 2659630721: +7.12 %
    and +3.80 % while they were simulated as TEGroupedMLP."""
    rec = collected_record(name, f"{at}:")
    vm = validate_measured()
    alloc = vm.predict(vm.as_recorded(rec, vm.load_provenance()))[0]
    assert abs(alloc / int(rec["measured"]["max_allocated_bytes_second_logged"]["bytes"]) - 1) < 0.01
