"""The static bound never rules out a candidate that fits: on small models, under every schedule,
profile, ZeRO level and recompute policy, each pipeline rank's memory bound is at most its
simulated peak requested bytes (≤ allocated ≤ reserved), and the time bound at most the
simulated iteration time."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sources import bound_of, candidate_run, coarse_bound_of

from timeline.compare.metrics import device_metrics
from timeline.io.runfile import load_run
from timeline.plan.schedule_profile import schedule_profile
from timeline.plan.search import bound_block
from timeline.plan.space import build_space, candidates
from timeline.result.build import build_timeline

TINY = Path(__file__).with_name("tiny_moe.toml")
SCHEDULES = [("1f1b", 1), ("interleaved", 2), ("dualpipe", 1), ("dualpipev", 2), ("gpipe", 1), ("zb-h1", 1),
             ("zbv", 2)]
POLICIES = ["none", "selective:moe_act", "selective:core_attn+layernorm", "selective:mla_up_proj+moe",
            "full:uniform:1", "full:block:1"]


def _run(tp, pp, ep, sched, mbs, policy, profile, zero, routing):
    case = _case(tp, pp, ep, sched, mbs, policy, profile, zero, routing)
    return None if case is None else case[3]


def _case(tp, pp, ep, sched, mbs, policy, profile, zero, routing):
    """(base run, space, its one candidate, the candidate's run), or None where it cannot run."""
    if profile == "megatron" and zero > 1:
        return None
    base = load_run(TINY, [f"model.profile={profile}", f"training.zero={zero}"] +
                    (["training.routing=skew", "training.routing_skew=1.5"] if routing else []))
    kind, vpp = sched
    table = {"parallel.tp": [tp], "parallel.pp": [pp], "parallel.cp": [1], "parallel.ep": [ep],
             "parallel.etp": [1], "parallel.vpp": [vpp], "training.micro_batch_size": [mbs],
             "schedule.kind": [kind], "recompute": [policy]}
    space = build_space(base.model, table, world=8, global_batch=8 * 2 * pp // (tp * pp), selective=())
    (cand,) = list(candidates(space))
    run, _, _ = candidate_run(base, cand, space)
    return None if run is None else (base, space, cand, run)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2, 4]), ep=st.sampled_from([1, 2]),
       sched=st.sampled_from(SCHEDULES), mbs=st.sampled_from([1, 2]), policy=st.sampled_from(POLICIES),
       profile=st.sampled_from(["megatron", "paper"]), zero=st.sampled_from([0, 1, 2]),
       routing=st.booleans())
def test_bound_never_exceeds_the_simulation(tp, pp, ep, sched, mbs, policy, profile, zero, routing):
    case = _case(tp, pp, ep, sched, mbs, policy, profile, zero, routing)
    assume(case is not None)
    base, space, cand, run = case
    b = bound_of(run)
    devices = device_metrics(build_timeline(run))
    for r, want in enumerate(b.per_rank_bytes):  # skewed routing: the busiest EP rank's bound
        assert want <= max(d.peak_requested_bytes for d in devices if d.pp_rank == r), (r, b, devices)
    assert b.time_us <= devices[0].iteration_time_us
    assert max(b.per_rank_bytes) == b.memory_bytes > 0
    coarse = coarse_bound_of(run)  # the layout's coarse bound lies below the policy's own
    assert all(c <= e for c, e in zip(coarse.per_rank_bytes, b.per_rank_bytes, strict=True)), (coarse, b)
    assert coarse.time_us <= b.time_us * (1 + 1e-9)
    # the planner's path: a worker bounds the candidate's layout group once for its policies
    (group,) = bound_block((base, space, (cand,)))
    assert group.invalid == ("",) and group.bounds[0] == (coarse.memory_bytes, coarse.memory_rank, coarse.time_us,
                                                         coarse.memory_bytes > run.hardware.capacity_bytes)


@pytest.mark.parametrize("profile", ["megatron", "paper"])
@pytest.mark.parametrize("sched", [("1f1b", 1), ("dualpipev", 2)])
def test_coarse_bound_is_below_every_policy(profile, sched):
    """One coarse bound per layout stands for all its recompute policies (plan.bound.coarse_stats):
    at most each policy's exact bound, and equal to it for no recompute in time."""
    runs = {p: _run(2, 2, 2, sched, 1, p, profile, 1, False) for p in POLICIES + ["selective:layernorm"]}
    coarse = coarse_bound_of(runs["none"])
    for policy, run in runs.items():
        assert coarse_bound_of(run).time_us == coarse.time_us
        exact = bound_of(run)
        assert coarse_bound_of(run).memory_bytes <= exact.memory_bytes, policy
        assert coarse.time_us <= exact.time_us * (1 + 1e-9), policy
    assert coarse.time_us == bound_of(runs["none"]).time_us
    assert coarse_bound_of(runs["none"]).memory_bytes < bound_of(runs["none"]).memory_bytes  # it does prune less


def test_bound_is_tight_on_the_static_part():
    """On a small megatron run the bound comes within 10 % of the simulated peak requested."""
    run = _run(1, 2, 2, ("1f1b", 1), 1, "none", "megatron", 1, False)
    b = bound_of(run)
    (vectors, _), overlapped = schedule_profile("1f1b", 2, 1, run.training.num_microbatches, 0)
    # 1F1B: rank r of p holds at most p − r micro-batches (DESIGN §6)
    assert vectors == (((2,),), ((1,),)) and not overlapped
    devices = device_metrics(build_timeline(run))
    for d in devices:  # within 10 % of the simulated peak requested on this small run
        assert 0.9 * d.peak_requested_bytes <= b.per_rank_bytes[d.pp_rank] <= d.peak_requested_bytes


def test_dualpipe_pairs_count_only_after_the_pair():
    (vectors, counts), overlapped = schedule_profile("dualpipe", 4, 1, 8, 0)
    assert overlapped
    # half the micro-batches go each way: each of a rank's two chunks runs 4 forwards and 4
    # backwards (B, or I then W)
    for n in counts:
        for chunk in {c for c, _ in n}:
            assert n[(chunk, "F")] == 4 and n.get((chunk, "B"), 0) + n.get((chunk, "I"), 0) == 4
            assert n.get((chunk, "W"), 0) == n.get((chunk, "I"), 0)
    # rank 0 holds at most 4 micro-batches of its first chunk: the pairs' insides never count
    assert vectors[0] == ((3, 1), (4, 0)) and vectors[3] == ((0, 4), (1, 3))


def test_more_capacity_never_adds_pruning():
    run = _run(1, 2, 2, ("1f1b", 1), 1, "none", "megatron", 1, False)
    b = bound_of(run)
    small = replace(run, hardware=replace(run.hardware, capacity_gib=b.memory_bytes / 2**30 * 0.99))
    assert bound_of(small).memory_bytes == b.memory_bytes > small.hardware.capacity_bytes


@pytest.mark.parametrize("sched", SCHEDULES)
def test_timing_alone_gives_the_simulated_time(sched):
    """The search times a candidate before it simulates its memory (plan.search.time_summary): the
    same iteration time as the summary-level simulation, to the bit, under every schedule."""
    from timeline.plan.search import simulate_summary, time_summary

    run = _run(1, 2, 2, sched, 1, "selective:moe_act", "megatron", 1, False)
    assert run is not None
    t = time_summary(run)
    assert t == simulate_summary(run).iteration_time_us
    assert bound_of(run).time_us <= t


def test_the_head_counts_in_the_time_bound():
    """The output layer and its loss run outside decoder layers (``layer`` None) after the last one
    in the forward and first in a backward; the probe gives them to the head by their place, and the
    embedding's lookup to the embedding. Held against the ops' own names: the head's forward time is
    the cost of ``final_norm`` and the ``output.*`` ops, the embedding's that of ``embedding``."""
    from timeline.graph.ops import OpCost
    from timeline.graph.source import model_source
    from timeline.plan.bound import Probe, probe_stats
    from timeline.profiles import profile
    from timeline.sim.cost import CostModel

    run = _run(1, 2, 2, ("1f1b", 1), 1, "none", "megatron", 1, False)
    probe = Probe.of(run.model, run.recompute, run.parallel, run.training)
    source = model_source(replace(run, **probe.edits()))
    st = probe_stats(source, run.hardware, probe.parallel, profile(run.profile).params.expert_state_group,
                     probe.kinds, False)
    cost = CostModel.of(run.hardware, probe.parallel)
    forward = source.template(0).forward

    def named(pred) -> float:
        return sum(cost.op_us(OpCost.of(op)) for op in forward if op.layer is None and pred(op.name))

    head = named(lambda n: n == "final_norm" or n.startswith("output."))
    assert head > 0 and st.head.compute_us["F"] == pytest.approx(head, rel=1e-12)
    embedding = named(lambda n: n == "embedding")
    assert embedding > 0 and st.embedding.compute_us["F"] == pytest.approx(embedding, rel=1e-12)
