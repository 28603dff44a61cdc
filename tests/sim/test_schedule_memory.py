"""Memory over time under each schedule, on a small real DeepSeek-V3-style model (megatron
profile): in-flight micro-batches per rank, buffer sizes of collectives, accounting."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest

from timeline.graph.tensors import CATEGORIES
from timeline.io.runfile import load_run
from timeline.result.build import build_timeline
from timeline.sim.expand import DISPATCHER_HELD

SHIPPED = Path(__file__).resolve().parents[2] / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"
P = 4
SMALL = ["model.profile=megatron", "model.num_layers=8", f"parallel.pp={P}", "training.seq_len=1024",
         "model.mtp_layers=0", "model.n_routed_experts=16", "parallel.dp=8"]


@cache
def sim(kind: str = "1f1b", m: int = 8, vpp: int = 1, allocator: str = "ideal"):
    layout = [8 // (P * vpp)] * (P * vpp)
    run = load_run(SHIPPED, [*SMALL, f"parallel.layout={layout}", f"parallel.vpp={vpp}",
                             f"training.num_microbatches={m}", f"schedule.kind={kind}",
                             f"allocator.kind={allocator}"])
    return build_timeline(run)


def act_max(tl, d: int) -> int:
    return int(tl.series(d).by_category["activations"].max())


def chunk_bytes(tl) -> dict[int, int]:
    """Each chunk's saved bytes per micro-batch: its template's, or its class's (a chunk sharing another's)."""
    own = {c: t.activation_bytes for c, t in tl.sim.templates.items()}
    return own | {c: own[rep] for c, (rep, _) in tl.sim.template_shifts.items()}


def in_flight_peak(tl, d: int) -> int:
    """Largest sum of saved bytes over (chunk, micro-batch) pairs whose forward has ended and
    whose backward has not started, taken at the end of every forward (no I/W split)."""
    a = chunk_bytes(tl)
    live: set[tuple[int, int]] = set()
    best = 0
    for s in tl.sim.spans[d]:
        if s.iteration or s.kind == "step":
            continue
        if s.kind == "F":
            live.add((s.stage, s.microbatch))
            best = max(best, sum(a[c] for c, _ in live))
        else:
            live.discard((s.stage, s.microbatch))
    return best


@pytest.mark.parametrize("m", [4, 8, 12])
def test_1f1b_rank_r_holds_p_minus_r_microbatches(m):
    tl = sim("1f1b", m)
    for r in range(P):
        assert act_max(tl, r) == min(P - r, m) * tl.sim.activation_bytes_per_microbatch[r]


def test_1f1b_peak_does_not_grow_past_p_microbatches():
    for r in range(P):
        assert sim("1f1b", 8).peak(r).requested_bytes == sim("1f1b", 12).peak(r).requested_bytes


def test_gpipe_holds_every_microbatch():
    tl = sim("gpipe", 6)
    for r in range(P):
        assert act_max(tl, r) == 6 * tl.sim.activation_bytes_per_microbatch[r]


def test_interleaved_follows_megatrons_warmup():
    tl = sim("interleaved", 8, vpp=2)
    for r in range(P):
        warmup = min((P - r - 1) * 2 + (2 - 1) * P, 8 * 2)  # Megatron's rule, group = pp
        forwards = [s for s in tl.sim.spans[r] if s.iteration == 0 and s.kind != "step"]
        first_b = next(i for i, s in enumerate(forwards) if s.kind == "B")
        assert first_b == warmup + 1  # warm-up forwards, then the first steady-state forward
        assert act_max(tl, r) == in_flight_peak(tl, r)


def test_zb_h1_never_holds_more_than_1f1b():
    """ZB-H1's memory limit is 1F1B's peak, p micro-batches of a stage (Qi et al. 2023, §3): rank 0
    holds exactly 1F1B's peak; later ranks keep W's GEMM inputs past I, so they hold more than
    their own 1F1B share but never more than p micro-batches' worth."""
    zb, ref = sim("zb-h1", 8), sim("1f1b", 8)
    assert act_max(zb, 0) == act_max(ref, 0)
    for r in range(P):
        per_mb = zb.sim.activation_bytes_per_microbatch[r]
        assert act_max(ref, r) <= act_max(zb, r) <= P * per_mb


def test_dualpipe_holds_twice_the_parameters_and_pp_plus_one_chunks():
    dp, ref = sim("dualpipe", 8), sim("1f1b", 8)
    a = chunk_bytes(dp)
    for r in range(P):
        w = dp.sim.devices[r].weights_bytes
        assert w == ref.sim.devices[r].weights_bytes + ref.sim.devices[P - 1 - r].weights_bytes
        # DualPipe README: PP + 1 chunk-micro-batches of activations in flight, at most
        assert act_max(dp, r) <= (P + 1) * max(a.values())


def test_v_schedules_hold_at_most_2pp_plus_one_chunks():
    for kind, limit in (("zbv", 2 * P), ("dualpipev", 2 * P + 1)):
        tl = sim(kind, 8, vpp=2)
        a = chunk_bytes(tl)
        for r in range(P):
            assert act_max(tl, r) <= limit * max(a[c] for c in tl.sim.devices[r].stages)


def test_collective_buffers_hold_their_exact_bytes():
    tl = sim("1f1b", 4)
    ev, names = tl.events(1), np.array(tl.sim.names)
    h, b, s, tp, top_k = 7168, 1, 1024, 2, 8
    allocs = ev.sign > 0
    gathered = ev.size[allocs & (names[ev.tensor] == "layers.2.mlp.linear_fc1.gathered")]
    assert len(gathered) and (gathered == b * s * h * 2).all()  # SP all-gather: the full sequence
    received = ev.size[allocs & (names[ev.tensor] == "layers.3.mlp.dispatch.received")]
    assert len(received) and (received == (b * s // tp) * top_k * h * 2).all()  # EP all-to-all rows


@pytest.mark.parametrize("allocator", ["ideal", "caching"])
def test_every_tensor_freed_once_and_categories_sum(allocator):
    tl = sim("1f1b", 8, allocator=allocator)
    for d in range(P):
        s = tl.series(d)
        np.testing.assert_array_equal(sum(s.by_category[c] for c in CATEGORIES), s.requested)
        ev, fi = tl.events(d), tl.free_index(d)
        allocs = np.flatnonzero(ev.sign > 0)
        never = [tl.sim.names[ev.tensor[i]] for i in allocs if fi[i] < 0]
        # static state and workspaces persist, and so does the last received input of a receiving chunk
        # with its gradient (Megatron's TransformerBlock keeps it, tests/sim/test_kept_input.py), and what
        # each MoE layer's alltoall dispatcher references (tests/sim/test_dispatcher_kept.py)
        held = tuple(f".mlp.{k}" for k in DISPATCHER_HELD["alltoall"])
        assert all(n.startswith(("static.", "workspace.")) or n in ("input", "grad:input") or n.endswith(held)
                   for n in never)
        receiving = sum(1 for c in tl.sim.devices[d].stages if c > 0)
        assert never.count("input") == never.count("grad:input") == receiving
        assert (ev.sign < 0).sum() + sum(1 for i in allocs if fi[i] < 0) == len(allocs)
        assert (s.allocated >= s.requested).all() and (s.reserved >= s.allocated).all()


def test_skewed_routing_simulates_each_ep_rank():
    run = load_run(SHIPPED, [*SMALL, "parallel.layout=[2,2,2,2]", "training.num_microbatches=4",
                             "training.routing=skew", "training.routing_skew=1.5"])
    tl = build_timeline(run)
    balanced = sim("1f1b", 4)
    ep, stride = 8, 2 * 8  # tp·cp·dp = 16 ranks per pipeline rank, 8 EP ranks
    assert len(tl.sim.devices) == P * ep
    for r in range(P):
        devs = [d for d in range(len(tl.sim.devices)) if tl.sim.devices[d].pp_rank == r]
        assert sum(tl.sim.devices[d].represents for d in devs) == stride
        assert len({tl.sim.devices[d].device for d in devs}) == ep
        acts = [tl.sim.activation_bytes_per_microbatch[d] for d in devs]
        if r == 0:  # layers 0-1 are dense (first_k_dense_replace = 3): routing changes nothing
            assert len(set(acts)) == 1
            continue
        assert acts == sorted(acts, reverse=True) and acts[0] > acts[-1]
        assert acts[0] > balanced.sim.activation_bytes_per_microbatch[r] > acts[-1]


def test_dualpipe_overlapped_pairs_hide_communication():
    """An overlapped F&B pair takes the longer of its computation and its communication; both halves
    span that time (their events interleave); run one after the other it would take F + B."""
    from timeline.sim.cost import CostModel
    from timeline.sim.plan import compile_templates
    from timeline.sim.timing import overlapped_us

    tl = sim("dualpipe", 8)
    compiled = compile_templates(tl.sim.templates, CostModel.of(tl.sim.run.hardware, tl.sim.run.parallel))
    pairs = 0
    for r in range(P):
        spans = {(s.iteration, s.position): s for s in tl.sim.spans[r] if s.kind != "step"}
        for pos in tl.sim.schedule.overlapped[r]:
            f, b = spans[(0, pos)], spans[(0, pos + 1)]
            pf, pb = compiled[(f.stage, f.kind)], compiled[(b.stage, b.kind)]
            assert (f.start_us, f.end_us) == (b.start_us, b.end_us) and b.overlapped and not f.overlapped
            assert b.end_us - f.start_us == pytest.approx(overlapped_us(pf, pb), rel=1e-12)
            assert b.end_us - f.start_us < pf.duration_us + pb.duration_us
            pairs += 1
    assert pairs > 0


def test_peak_context_names_the_action_and_the_microbatches_in_flight():
    tl = sim("1f1b", 8)
    for r in range(P):
        ctx = tl.peak_context(r)
        if r == 0:  # the embedding's dense weight gradient (129,280 / 2 × 7,168 bf16, 0.86 GiB) outweighs one
            # micro-batch of two layers' activations at s = 1,024: rank 0 peaks in the first backward
            live = {t["tensor"] for t in tl.top_tensors(0, tl.peak(0).event_index, 3)}
            assert "embedding.word_embeddings.wgrad" in live and len(ctx["in_flight"]) == P - 1
        else:
            assert len(ctx["in_flight"]) == P - r  # 1F1B: rank r holds p - r micro-batches at its peak
        assert {s for s, _ in ctx["in_flight"]} == set(tl.sim.devices[r].stages)
        stage, kind = int(ctx["action"][0]), ctx["action"][1]
        assert stage == r and kind in "FB"
