"""Megatron's MoE token dispatchers keep per-layer references from a layer's forward until its next forward
(``MoEAlltoAllTokenDispatcher.dispatch_preprocess``: ``self.probs``, ``self.routing_map``,
``self.reversed_local_input_permutation_mapping``; the flex dispatcher's ``_HybridEPManager``: ``token_probs``,
``routing_map``, ``dispatched_probs`` and, through its ``HybridEPDispatch`` node's ``ctx.handle``, the dispatch
handle), so after the optimizer step each MoE layer still holds the last micro-batch's: the steady state the
alltoall and flex jobs measure above the allgather ones."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers_run import TINY_MODEL, sim_plan, tiny_run

from timeline.result.build import build_timeline
from timeline.sim.expand import dispatcher_held

MOE = replace(TINY_MODEL, n_routed_experts=4, moe_intermediate_size=256, num_experts_per_tok=2,
              first_k_dense_replace=0, moe_layer_freq=1)
T, E, K = 128, 4, 2  # tokens per micro-batch (b·s, tp = cp = 1), routed experts, top-k


def _live_after_step(run, iteration: int = 0) -> dict[str, int]:
    """Per tensor name, the bytes device 0 holds when iteration ``iteration``'s optimizer step ends."""
    tl = build_timeline(run)
    ev = tl.events(0)
    names = np.array(tl.sim.names)[ev.tensor]
    step = next(s for s in tl.sim.spans[0] if s.kind == "step" and s.iteration == iteration)
    m = ev.t_us <= step.end_us
    live: dict[str, int] = {}
    for n, s, z in zip(names[m].tolist(), ev.sign[m].tolist(), ev.size[m].tolist(), strict=True):
        live[n] = live.get(n, 0) + int(s) * int(z)
    return {n: v for n, v in live.items() if v}


@pytest.mark.parametrize("fused", [False, True])
def test_alltoall_dispatcher_keeps_probs_routing_map_and_permutation_map_past_the_step(fused):
    run = tiny_run(model=MOE, layers=2, pp=1, ep=2, dp=2, num_microbatches=3, moe_token_dispatcher="alltoall",
                   moe_permute_fusion=fused)
    live = _live_after_step(run)
    # the router's dense probs [T, E] (the logits' dtype: bf16), its bool routing map [T, E], and permute's
    # reversed mapping: TE's int32 row-id map [T, 2·E + 1], or the unfused int64 sorted indices [T·k]
    perm = ("dispatch.row_id_map", T * (2 * E + 1) * 4) if fused else ("dispatch.sorted_idx", T * K * 8)
    for layer in (0, 1):
        p = f"layers.{layer}.mlp"
        assert live[f"{p}.router.probs"] == T * E * 2
        assert live[f"{p}.router.routing_map"] == T * E
        assert live[f"{p}.{perm[0]}"] == perm[1]
    held = {n: v for n, v in live.items() if n.startswith("layers.")}
    assert sum(held.values()) == 2 * (T * E * 2 + T * E + perm[1])
    # the allgather dispatcher drops its gathered map and keeps nothing of these (not modelled)
    ag = _live_after_step(tiny_run(model=MOE, layers=2, pp=1, ep=2, dp=2, num_microbatches=3,
                                   moe_token_dispatcher="allgather"))
    assert not [n for n in ag if n.startswith("layers.")]


def test_the_next_forward_replaces_what_the_dispatcher_keeps():
    """Each set lives until the layer's next forward reaches its dispatch: one set per layer at any step, and
    none is left over across iterations."""
    run = tiny_run(model=MOE, layers=2, pp=1, ep=2, dp=2, num_microbatches=3, iterations=3,
                   moe_token_dispatcher="alltoall", moe_permute_fusion=True)
    first, second = _live_after_step(run, 0), _live_after_step(run, 1)
    held = sorted(n for n in first if n.startswith("layers."))
    assert held == sorted(n for n in second if n.startswith("layers."))
    assert all(first[n] == second[n] for n in held)
    tl = build_timeline(run)
    ev = tl.events(0)
    names = np.array(tl.sim.names)[ev.tensor]
    spans = tl.sim.spans[0]
    nxt = next(s for s in spans if s.kind == "F" and s.iteration == 1 and s.microbatch == 0)
    step = next(s for s in spans if s.kind == "step" and s.iteration == 0)
    # the last micro-batch's probs, through the step, go where the next iteration's first forward dispatches
    m = (names == "layers.1.mlp.router.probs") & (ev.sign < 0) & (ev.t_us > step.end_us) & (ev.t_us <= nxt.end_us)
    assert m.sum() == 1 and nxt.start_us < float(ev.t_us[m][0]) < nxt.end_us
    made = (names == "layers.1.mlp.router.probs") & (ev.sign > 0) & (ev.t_us >= nxt.start_us) & (ev.t_us <= nxt.end_us)
    assert made.sum() == 1 and float(ev.t_us[made][0]) <= float(ev.t_us[m][0])


def test_hybridep_manager_keeps_its_probs_map_dispatched_probs_and_handle():
    run = tiny_run(model=MOE, layers=2, pp=1, ep=2, dp=2, num_microbatches=3, moe_token_dispatcher="flex",
                   moe_flex_backend="hybridep", moe_permute_fusion=True, moe_router_dtype="fp32")
    live = _live_after_step(run)
    p = "layers.1.mlp"
    w, e_local = 2, E // 2  # the expert-TP × EP group, the local experts
    assert live[f"{p}.router.probs"] == T * E * 4  # fp32 token_probs (expert-TP 1: a view of the router's)
    assert live[f"{p}.router.routing_map"] == T * E
    assert live[f"{p}.dispatch.received_probs"] == T * K * 4  # dispatched_probs, fp32 [rows]
    # the handle: HybridEP's per-token metadata over the group's T·W tokens
    assert live[f"{p}.dispatch.row_id_map"] == T * w * e_local * 4
    assert live[f"{p}.dispatch.local_expert_routing_map"] == T * w * e_local


def test_dispatcher_held_names_each_layers_tensors_at_its_first_dispatch_op():
    run = tiny_run(model=MOE, layers=2, pp=1, ep=2, dp=2, num_microbatches=3, moe_token_dispatcher="alltoall",
                   moe_permute_fusion=True)
    f = sim_plan(run).compiled[0][(0, "F")]
    held = dispatcher_held(f, "alltoall")
    assert set(held) == {f"layers.{k}.mlp.{s}" for k in (0, 1)
                         for s in ("router.probs", "router.routing_map", "dispatch.row_id_map")}
    assert {f.op_names[o] for o in held.values()} == {"layers.0.mlp.dispatch.permute", "layers.1.mlp.dispatch.permute"}
    assert dispatcher_held(f, "") == {}
