"""``megatron`` profile: each selective module removes exactly its saved tensors; routed-expert
activations scale with tp, cp, ep, etp and top_k as DESIGN §4 states."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from timeline.graph.recompute import parse_recompute
from timeline.graph.template import chunk_template
from timeline.io.runfile import load_run

# the shipped run (not via conftest: other test folders have a conftest module too)
SHIPPED = Path(__file__).resolve().parents[2] / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"

MEGATRON = ['model.profile="megatron"']


def saved(run, chunk: int, layer: int) -> set[str]:
    return {st.tensor.name for st in chunk_template(run, chunk).saved if st.layer == layer}


def with_rc(run, text):
    return replace(run, recompute=parse_recompute(text))


P = "layers.4"
EXPECTED = {  # module -> (chunk, layer, removed, added checkpoint inputs)
    "core_attn": (1, 4, {f"{P}.self_attn.core_attn.softmax_lse"}, set()),
    "mla_up_proj": (1, 4, {f"{P}.self_attn.q_layernorm.out", f"{P}.self_attn.q_layernorm.rsigma",
                           f"{P}.self_attn.kv_layernorm.out", f"{P}.self_attn.kv_layernorm.rsigma",
                           f"{P}.self_attn.q", f"{P}.self_attn.k", f"{P}.self_attn.v"},
                    {f"{P}.self_attn.linear_kv_down_proj.k_pe"}),
    "layernorm": (1, 4, {f"{P}.input_layernorm.out", f"{P}.input_layernorm.rsigma",
                         f"{P}.pre_mlp_layernorm.out", f"{P}.pre_mlp_layernorm.rsigma"}, set()),
    "moe": (1, 4, {f"{P}.mlp.router.scores_saved", f"{P}.mlp.router.topk_idx", f"{P}.mlp.dispatch.sorted_idx",
                   f"{P}.mlp.dispatch.received", f"{P}.mlp.dispatch.received_probs",
                   f"{P}.mlp.experts.linear_fc1.out", f"{P}.mlp.experts.act.out",
                   f"{P}.mlp.shared_experts.linear_fc1.out", f"{P}.mlp.shared_experts.act.out"}, set()),
    "moe_act": (1, 4, {f"{P}.mlp.experts.act.out"}, set()),
    "shared_experts": (1, 4, {f"{P}.mlp.shared_experts.linear_fc1.out", f"{P}.mlp.shared_experts.act.out"},
                       set()),
    "mlp": (0, 1, {"layers.1.post_attention_layernorm.out", "layers.1.post_attention_layernorm.rsigma",
                   "layers.1.mlp.linear_fc1.out", "layers.1.mlp.act.out"}, set()),
}


@pytest.mark.parametrize("module", list(EXPECTED))
def test_selective_module_removes_exactly_its_tensors(module):
    chunk, layer, removed, added = EXPECTED[module]
    run = load_run(SHIPPED, MEGATRON)
    base = saved(run, chunk, layer)
    got = saved(with_rc(run, f"selective:{module}"), chunk, layer)
    assert base - got == removed
    assert got - base == added
    t = chunk_template(with_rc(run, f"selective:{module}"), chunk)
    rc = [o for o in t.backward_i if o.recompute and o.layer == layer]
    assert rc and {a.name.removesuffix("@recompute") for o in rc for a in o.allocs
                   if a.category == "recompute"} == removed


def test_flash_attention_has_no_s2_tensors():
    run = load_run(SHIPPED, MEGATRON)
    for st in chunk_template(run, 1).saved:
        assert 4096 * 4096 not in (st.tensor.shape[-1] * st.tensor.shape[-2] if len(st.tensor.shape) > 1 else 0,)
    lse = [st for st in chunk_template(run, 1).saved if st.tensor.name.endswith("softmax_lse")][0]
    assert lse.tensor.dtype == "fp32" and lse.tensor.size_bytes == 4 * 1 * (128 // 2) * 4096


def expert_rows(*overrides) -> tuple[int, int]:
    """(rows received by this EP rank's experts, rows the expert fc1 sees after the ETP gather)."""
    run = load_run(SHIPPED, [*MEGATRON, *overrides])
    t = chunk_template(run, 1)
    by = {st.tensor.name: st.tensor for st in t.saved if st.layer == 4}
    fc1 = by[f"{P}.mlp.experts.linear_fc1.out"]
    return by[f"{P}.mlp.dispatch.received_probs"].shape[0], fc1.shape[0]


B, S, K = 1, 4096, 8


@pytest.mark.parametrize(("overrides", "rows", "etp"), [
    ([], B * S // 2 * K, 1),
    (["parallel.tp=4"], B * S // 4 * K, 1),
    (["parallel.cp=2"], B * S // (2 * 2) * K, 1),
    (["parallel.ep=4"], B * S // 2 * K, 1),
    (["parallel.ep=16"], B * S // 2 * K, 1),
    (["parallel.etp=2"], B * S // 2 * K, 2),
    (["model.num_experts_per_tok=4"], B * S // 2 * 4, 1),
    (["training.micro_batch_size=2"], 2 * S // 2 * K, 1),
])
def test_routed_rows_scale(overrides, rows, etp):
    got_rows, fc1_rows = expert_rows(*overrides)
    assert got_rows == rows
    assert fc1_rows == rows * etp


def test_routing_skew_and_capacity():
    tokens = B * S // 2
    assert expert_rows('training.routing="skew"', "training.routing_skew=1.5")[0] == int(tokens * K * 1.5)
    cap = 256 * -(-int(0.5 * tokens * K) // 256)
    assert expert_rows("training.capacity_factor=0.5")[0] == min(tokens * K, cap)
    assert expert_rows("training.capacity_factor=2.0")[0] == tokens * K  # dropless below the cap
    assert expert_rows("training.capacity_factor=2.0", "training.pad_to_capacity=true")[0] == \
        256 * -(-2 * tokens * K // 256)


def test_megatron_mla_latents_are_sequence_parallel():
    by = {st.tensor.name: st.tensor for st in chunk_template(load_run(SHIPPED, MEGATRON), 1).saved}
    assert by[f"{P}.self_attn.q_layernorm.out"].shape == (S // 2, 1536)
    paper = {st.tensor.name: st.tensor for st in chunk_template(load_run(SHIPPED, []), 1).saved}
    assert paper[f"{P}.self_attn.q_layernorm.out"].shape == (S, 1536)
