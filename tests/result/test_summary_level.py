"""The summary-level build (``build_timeline(summary_only=True)``, what ``simulate --format
summary`` runs): one device at a time, reduced to its summaries — ``summary.json`` byte for byte
the full build's, under both allocator cores, skewed or balanced, with OOMs, warm-up iterations
and allocators the batch replay does not take, DualPipe's mirrored ranks taken from each other; and
the per-load template classes of the plan."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers_run import TINY_RUN_TOML, tiny_run

from timeline.cli import main
from timeline.exporters.summary import summary_dict
from timeline.graph.source import model_source
from timeline.io.runfile import load_run
from timeline.result.build import build_timeline
from timeline.result.summary_level import SummaryTimeline
from timeline.sim.cost import CostModel
from timeline.sim.plan import chunk_classes, load_templates, plan_pipeline

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"
#: a small DeepSeek-V3-style run: 4 pipeline ranks × 8 EP ranks under skewed routing
SKEWED = ["model.profile=megatron", "model.num_layers=8", "parallel.pp=4", "training.seq_len=1024",
          "model.mtp_layers=0", "model.n_routed_experts=16", "parallel.dp=8", "parallel.layout=[2,2,2,2]",
          "training.num_microbatches=8", "schedule.kind=dualpipe", "training.routing=skew",
          "training.routing_skew=1.5"]


def summary_bytes(run, **kw) -> bytes:
    return json.dumps(summary_dict(build_timeline(run, **kw)), indent=1, default=list).encode()


def same_summaries(run) -> dict:
    full, fast = summary_bytes(run), summary_bytes(run, summary_only=True)
    assert fast == full
    return json.loads(full)


@pytest.fixture(params=["compiled", "python"])
def core(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setenv("TIMELINE_ALLOC_CORE", "python")
    else:
        monkeypatch.delenv("TIMELINE_ALLOC_CORE", raising=False)
    return request.param


def test_skewed_summary_is_the_full_builds(core):
    out = same_summaries(load_run(SHIPPED, SKEWED))
    devices = out["devices"]
    assert len(devices) == 4 * 8 and out["num_events"] > 0
    for r in (1, 3):  # stages holding MoE layers: the busiest EP rank peaks above the lightest
        ranks = [d for d in devices if d["pp_rank"] == r]
        assert ranks[0]["peak_requested_bytes"] > ranks[-1]["peak_requested_bytes"]
        assert ranks[0]["top_tensors_at_peak"] and ranks[0]["microbatches_in_flight_at_peak"]


def test_balanced_and_warmup_summaries_are_the_full_builds(core):
    run = tiny_run(pp=4, num_microbatches=8)
    out = same_summaries(run)
    assert [d["pp_rank"] for d in out["devices"]] == [0, 1, 2, 3]
    warm = same_summaries(replace(run, training=replace(run.training, warmup_iterations=1)))
    assert all(len(d["per_iteration"]) == 2 for d in warm["devices"])
    assert warm["devices"][0]["peak_iteration"] >= 1


def test_oom_summary_is_the_full_builds(core):
    out = same_summaries(tiny_run(pp=2, num_microbatches=8, capacity_gib=0.05))
    assert all(d["num_ooms"] > 0 and d["oom"]["request_bytes"] > 0 for d in out["devices"])
    # DualPipe's mirrored ranks share a stream up to micro-batch numbers: their OOMs are renamed
    skewed = same_summaries(load_run(SHIPPED, [*SKEWED, "hardware.capacity_gib=15"]))
    mirrored = [d for d in skewed["devices"] if d["pp_rank"] in (0, 3)]
    assert all(d["num_ooms"] > 0 for d in mirrored)
    first, last = mirrored[0], mirrored[len(mirrored) // 2]
    assert first["oom"]["t_us"] == last["oom"]["t_us"] and first["oom"]["microbatch"] != last["oom"]["microbatch"]


@pytest.mark.parametrize("allocator", [{"allocator": "ideal"}, {"expandable_segments": True}])
def test_allocators_without_batch_replay(allocator):
    out = same_summaries(tiny_run(pp=2, **allocator))
    assert out["devices"][0]["peak_reserved_bytes"] >= out["devices"][0]["peak_allocated_bytes"] > 0


def test_summary_timeline_keeps_no_series():
    tl = build_timeline(tiny_run(pp=2), summary_only=True)
    assert isinstance(tl, SummaryTimeline)
    assert tl.num_events == build_timeline(tiny_run(pp=2)).num_events
    with pytest.raises(ValueError, match="no memory series"):
        tl.series(0)


def test_a_load_builds_one_template_per_chunk_class():
    """Under a skewed load the DeepSeek-V3 PP16 layout's 16 chunks build 3 templates (the first,
    one of the 14 four-MoE-layer chunks, the last); every chunk's compiled phases equal those of
    building it itself, field for field."""
    run = load_run(ROOT / "schedules" / "deepseek-v3-2048.toml", ["training.routing=skew",
                                                                  "training.routing_skew=1.5"])
    pipe = plan_pipeline(run.schedule, run.parallel, run.training.num_microbatches, run.hardware)
    cost = CostModel.of(run.hardware, run.parallel)
    source = model_source(run)
    n = pipe.schedule.num_chunks
    classes = chunk_classes(source, n)
    assert sorted(set(classes.values())) == [0, 1, 15]
    t0, c0 = load_templates(source, pipe.holders, n, cost, None)
    light = source.under(routing_skew=0.5)
    shared_t, shared = load_templates(light, pipe.holders, n, cost, (t0, c0, classes))
    own_t, own = load_templates(light, pipe.holders, n, cost, None)
    assert sorted(shared_t) == [0, 1, 15] and shared.keys() == own.keys()
    for key, ph in own.items():
        got = shared[key]
        for field in ph.__dataclass_fields__:
            a, b = getattr(got, field), getattr(ph, field)
            assert (np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b), (key, field)
    assert own[(7, "F")].ev_size.sum() != c0[(7, "F")].ev_size.sum()  # the load changes the bytes
    for c in range(n):
        assert own_t[c].activation_bytes == shared_t[classes[c]].activation_bytes


@pytest.mark.parametrize("schedule, sets, reps", [
    ("deepseek-v3-pp16-tp2-ep8.toml", [], [0, 1, 15]),
    ("deepseek-v3-pp16-tp2-ep8.toml", ["recompute.policy=selective", "model.profile=megatron"], [0, 1, 15]),
    ("deepseek-v3-dualpipev-megatron.toml", ["recompute.policy=none"], [0, 1, 2, 30, 31]),
])
def test_the_first_load_builds_one_template_per_chunk_class(schedule, sets, reps):
    """Under an ops-only policy the first load builds one template per chunk class too: the other
    chunks' compiled phases are the class's first chunk's with the decoder layers renumbered, equal
    field for field to building each chunk itself; the timeline's op → module map is the one every
    chunk's own template gives."""
    run = load_run(ROOT / "schedules" / schedule, sets)
    pipe = plan_pipeline(run.schedule, run.parallel, run.training.num_microbatches, run.hardware)
    cost = CostModel.of(run.hardware, run.parallel)
    source = model_source(run)
    n = pipe.schedule.num_chunks
    classes = chunk_classes(source, n)
    assert sorted(set(classes.values())) == reps
    shared_t, shared = load_templates(source, pipe.holders, n, cost, None, classes)
    own_t, own = load_templates(source, pipe.holders, n, cost, None)
    assert sorted(shared_t) == reps and list(shared) == list(own)
    for key, ph in own.items():
        got = shared[key]
        for field in ph.__dataclass_fields__:
            a, b = getattr(got, field), getattr(ph, field)
            assert (np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b), (key, field)
    assert own[(7, "F")].op_names != own[(1, "F")].op_names  # renamed, not the same names
    modules = {op.name: op.module for t in own_t.values() for op in (*t.forward, *t.backward_i, *t.backward_w)}
    assert build_timeline(run, summary_only=True).op_modules == modules


def test_summary_only_simulate_is_bounded_per_device(tmp_path, capsys):
    """The 2,048-GPU skewed run (1,024 devices, about 156 M events) is refused with every output,
    naming the summary-level formats, and accepted with them (checked before any work: the
    run itself takes about half a minute)."""
    from timeline.cli.common import check_work

    spec = load_run(ROOT / "schedules" / "deepseek-v3-2048.toml", ["training.routing=skew",
                                                                   "training.routing_skew=1.5"])
    est = check_work(spec, 50_000_000, ["summary"], per_device=True)
    assert est.devices == 1024 and est.memory_events > 50_000_000 >= est.device_events
    run = tmp_path / "run.toml"
    run.write_text((ROOT / "schedules" / "deepseek-v3-2048.toml").read_text())
    argv = ["simulate", str(run), "--set", "training.routing=skew", "--set", "training.routing_skew=1.5",
            "-o", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--format summary,devices" in err[0] and "--max-events 50,000,000" in err[0]
    assert not (tmp_path / "o").exists()
    tiny = tmp_path / "tiny.toml"
    tiny.write_text(TINY_RUN_TOML)
    assert main(["simulate", str(tiny), "--format", "summary", "-o", str(tmp_path / "t"), "--max-events", "100",
                 "--no-progress"]) == 2
    assert "one device of this run would make about" in capsys.readouterr().err


def test_an_ep_rank_routed_no_tokens(core):
    """``routing_skew = 2`` routes the lightest EP rank no tokens: its expert tensors are 0-byte
    requests, which reach no allocator (PyTorch hands out a null pointer); every pass agrees."""
    from timeline.sim.memory import run_allocator, run_allocator_events

    run = load_run(SHIPPED, [*SKEWED, "training.routing_skew=2.0", "training.iterations=1"])
    out = same_summaries(run)
    lightest = [d for d in out["devices"] if d["pp_rank"] == 1][-1]
    assert lightest["peak_requested_bytes"] > 0
    tl = build_timeline(run)
    d = next(i for i, dev in enumerate(tl.devices) if dev.device == lightest["device"])
    ev = tl.events(d)
    zero = ev.size == 0
    assert zero.sum() > 0
    cap = run.hardware.capacity_bytes
    batch, events = run_allocator(run.allocator, cap, ev, tl.names), run_allocator_events(run.allocator, cap, ev,
                                                                                          tl.names)
    for col in ("block", "reserved", "address", "segment"):
        assert np.array_equal(getattr(batch, col), getattr(events, col)), col
    assert (batch.block[zero] == 0).all() and (batch.address[zero] == 0).all() and (batch.segment[zero] == -1).all()
    assert batch.segment_events == events.segment_events and batch.ooms == events.ooms


def test_dualpipe_mirrored_ranks_are_one_stream_renamed():
    """DualPipe's ranks r and pp − 1 − r run the same two chunks at the same times on the other
    direction's micro-batches (8 micro-batches: 0–3 one way, 4–7 the other); other ranks differ."""
    from timeline.sim.timing import microbatch_map

    tl = build_timeline(load_run(SHIPPED, SKEWED))
    rank = [next(d for d, dev in enumerate(tl.devices) if dev.pp_rank == r) for r in range(4)]
    assert microbatch_map(tl.spans[rank[0]], tl.spans[rank[3]]) == {-1: -1, **{m: (m + 4) % 8 for m in range(8)}}
    assert microbatch_map(tl.spans[rank[1]], tl.spans[rank[2]]) == {-1: -1, **{m: (m + 4) % 8 for m in range(8)}}
    assert microbatch_map(tl.spans[rank[0]], tl.spans[rank[1]]) is None
    assert microbatch_map(tl.spans[rank[0]], tl.spans[rank[0]][:-1]) is None
