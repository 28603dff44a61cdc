"""The Timeline owns its data: built from a simulation (devices, meta and op modules carried over
from the run) or from replay records (no run, no simulator output behind it); and the queries the
CLI and ``compare`` format — the peak explanation, the worst device, the per-device metrics — with
exact numbers on the exporter tests' tiny run (tests/exporters/tiny.py: pp = 2, 4 micro-batches,
2 iterations, one synthetic layer per stage saving x = 3 MiB and h = 5 MiB + 3 per micro-batch)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from timeline.alloc.config import AllocatorConfig
from timeline.result.build import build_timeline
from timeline.result.metrics import device_metrics, memory_trace
from timeline.result.queries import explain_peak, worst_device
from timeline.result.replayed import timeline_from_replay
from timeline.result.timeline import DeviceInfo, Timeline

MIB = 1 << 20
GIB = 1 << 30
ACT_PER_MB = 3 * MIB + 5 * MIB + 3  # x + h of one micro-batch on one stage


def _tiny():
    path = Path(__file__).resolve().parents[1] / "exporters" / "tiny.py"
    spec = importlib.util.spec_from_file_location("tiny_for_result_tests", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tl() -> Timeline:
    tiny = _tiny()
    return build_timeline(tiny.tiny_run(), tiny.synthetic_template)


# -- from_replay ------------------------------------------------------------------------------

#: (t_us, sign, requested, block, address, reserved after, frame) per snapshot device index
RECORDS = {
    0: [(100.0, 1, 1000, 1024, 4096, 2 << 20, "a"), (102.5, 1, 10, 512, 8192, 2 << 20, "b"),
        (110.0, -1, 1000, 1024, 4096, 2 << 20, "a")],
    1: [(101.0, 1, 300, 512, 4096, 2 << 20, "c"), (103.0, -1, 300, 512, 4096, 0, "c"),
        (104.0, -1, 7, 512, 9999, 0, "?")],  # a free of a block the trace never allocated
}
LABELS = {0: {"device": 4, "pp_rank": 1, "stages": [1], "represents": 2}}


def test_from_replay_builds_the_timeline_directly():
    tl = Timeline.from_replay(RECORDS, LABELS)
    assert tl.sim is None and tl.meta.run is None and tl.meta.replayed
    assert tl.meta.capacity_bytes is None and tl.meta.allocator is None and tl.meta.iteration_time_us == 0.0
    assert tl.devices == [DeviceInfo(device=4, pp_rank=1, stages=(1,), represents=2),
                          DeviceInfo(device=1, pp_rank=0, stages=(), represents=1)]
    assert tl.num_devices == 2 and tl.num_events == 6
    # a free is named by its alloc's frame ("unknown" is interned at the first free, as outputs have it)
    assert tl.names == ["a", "b", "unknown", "c"]
    ev0, ev1 = tl.events(0), tl.events(1)
    assert ev0.t_us.tolist() == [0.0, 2.5, 10.0] and ev1.t_us.tolist() == [1.0, 3.0, 4.0]  # from the first event
    assert ev0.tensor.tolist() == [0, 1, 0] and ev1.tensor.tolist() == [3, 3, 2]
    assert ev0.sign.tolist() == [1, 1, -1] and ev0.size.tolist() == [1000, 10, 1000]
    assert set(ev0.cat.tolist()) == {6} and set(ev0.action.tolist()) == {-1}  # temporary; no actions
    assert tl.memory[0].block_bytes.tolist() == [1024, 512, -1024]
    assert tl.memory[0].address.tolist() == [4096, 8192, 4096] and tl.memory[1].reserved.tolist() == [2 << 20, 0, 0]
    assert all(len(o.t_start_us) == 0 for o in tl.ops) and tl.spans == [[], []]
    # queries work without a run
    pk = tl.peak(0)
    assert (pk.requested_bytes, pk.requested_time_us, pk.allocated_bytes, pk.reserved_bytes) == (1010, 2.5, 1536, 2 << 20)
    assert pk.fragmentation_bytes == (2 << 20) - 1536 and pk.breakdown_bytes["temporary"] == 1010
    assert tl.alloc_ids(0).tolist() == [0, 1, 0] and tl.alloc_ids(1).tolist() == [0, 0, 2]  # paired by address
    assert tl.event_iterations(0).tolist() == [-1, -1, -1] and tl.peak_iteration(0) == -1
    assert tl.iteration_starts(0) == [] and tl.iteration_at(0, np.array([0.0, 5.0])).tolist() == [-1, -1]


def test_from_replay_is_timeline_from_replay():
    a, b = Timeline.from_replay(RECORDS), timeline_from_replay(RECORDS)
    assert a.devices == b.devices and a.names == b.names and a.meta == b.meta
    assert [e.t_us.tolist() for e in (a.events(1), b.events(1))] == [[1.0, 3.0, 4.0]] * 2
    assert a.devices[0] == DeviceInfo(device=0, pp_rank=0, stages=(), represents=1)  # no labels: the index


# -- from_simulation ------------------------------------------------------------------------------

def test_from_simulation_carries_the_run_facts(tl):
    run = tl.meta.run
    assert run is not None and not tl.meta.replayed
    m = tl.meta
    assert (m.name, m.profile, m.schedule_kind, m.capacity_bytes) == ("tiny", "megatron", "1f1b", 80 * GIB)
    assert (m.iterations, m.warmup_iterations, m.report_start_us) == (2, 0, 0.0)
    assert m.iteration_time_us == tl.sim.iteration_time_us > 0
    assert m.allocator == run.allocator and m.allocator_settings == AllocatorConfig.from_spec(run.allocator).to_dict()
    assert [(d.device, d.pp_rank, d.stages, d.represents, d.layers) for d in tl.devices] == [
        (0, 0, (0,), 2, (0,)), (2, 1, (1,), 2, (1,))]
    assert [d.activation_bytes_per_microbatch for d in tl.devices] == [ACT_PER_MB] * 2
    for dev, sd in zip(tl.devices, tl.sim.devices, strict=True):
        assert (dev.weights_bytes, dev.grads_bytes, dev.optimizer_bytes) == (
            sd.weights_bytes, sd.grads_bytes, sd.optimizer_bytes)
        assert dict(dev.params_by_module) == sd.params_by_module
    assert tl.names is tl.sim.names and tl.events(1) is tl.sim.events[1]  # owned, not copied
    assert tl.op_modules["layers.1.all_gather"] == "layers.1.self_attn"
    assert tl.op_modules["layers.0.mlp.backward"] == "layers.0.mlp" and len(tl.op_modules) == 14


def test_iteration_is_read_in_one_place(tl):
    for d in range(tl.num_devices):
        it = tl.event_iterations(d)  # the event log's own column: each event's action's iteration
        of_span = np.array([sp.iteration if sp.kind != "init" else -1 for sp in tl.spans[d]], dtype=np.int32)
        ev = tl.events(d)
        assert np.array_equal(it, np.where(ev.action >= 0, of_span[np.maximum(ev.action, 0)], -1))
        assert set(it.tolist()) == {-1, 0, 1}  # static state, then two iterations
        assert tl.peak_iteration(d) == it[tl.peak(d).event_index]
        assert [p["iteration"] for p in tl.iteration_peaks(d)] == [0, 1]


# -- queries ----------------------------------------------------------------------------------------

def test_worst_device_is_the_highest_reserved_peak(tl):
    reserved = [tl.peak(d).reserved_bytes for d in range(tl.num_devices)]
    assert reserved[1] > reserved[0]
    assert worst_device(tl) == 1 and worst_device(tl, [0]) == 0


def test_peak_explanation(tl):
    # 1F1B on 2 ranks: rank 0 peaks in the backward of micro-batch 0 holding micro-batches 0 and 1
    # (P − r = 2 in flight), rank 1 in the backward of micro-batch 0 holding it alone
    e0, e1 = explain_peak(tl, 0), explain_peak(tl, 1)
    assert (e0.action, e0.in_flight, e0.stages) == ("0B0", ((0, 0), (0, 1)), [0])
    assert (e1.action, e1.in_flight, e1.stages) == ("1B0", ((1, 0),), [1])
    assert e0.index == 0 and e0.device == tl.devices[0] and e0.peak == tl.peak(0)
    assert [(t["tensor"], t["bytes"], t["category"], t["microbatch"]) for t in e0.largest] == [
        ("workspace.te_cublas", 32 * MIB, "temporary", -1), ("h", 5 * MIB + 3, "activations", 0),
        ("h", 5 * MIB + 3, "activations", 1)]
    assert [t["bytes"] for t in e1.largest] == [32 * MIB] * 3
    assert all(t["category"] not in ("weights", "grads", "optimizer") for t in e0.largest + e1.largest)
    assert len(explain_peak(tl, 0, n=1).largest) == 1


def test_device_metrics(tl):
    m0, m1 = device_metrics(tl)
    cap = 80 * GIB
    for d, m in enumerate((m0, m1)):
        pk = tl.peak(d)
        assert (m.device, m.pp_rank, m.represents) == (tl.devices[d].device, d, 2)
        assert (m.peak_requested_bytes, m.peak_allocated_bytes, m.peak_reserved_bytes) == (
            pk.requested_bytes, pk.allocated_bytes, pk.reserved_bytes)
        assert m.headroom_bytes == cap - pk.reserved_bytes and m.capacity_bytes == cap and m.fits
        assert m.activation_bytes_per_microbatch == ACT_PER_MB and not m.oom
        assert m.recompute_flops == 4 * 1e8  # the recomputed norm: 1e8 FLOPs × 4 micro-batches per iteration
        assert m.iteration_time_us == tl.meta.iteration_time_us
    assert (m0.activations_at_peak_bytes, m0.peak_activation_bytes) == (2 * ACT_PER_MB, 2 * ACT_PER_MB)
    assert (m1.activations_at_peak_bytes, m1.peak_activation_bytes) == (ACT_PER_MB, ACT_PER_MB)
    trace = memory_trace(tl, 1, "v")
    assert (trace.label, trace.device, trace.pp_rank, trace.capacity_bytes) == ("v", 2, 1, cap)
    assert trace.iteration_starts_us == tuple(tl.iteration_starts(1)) and len(trace.iteration_starts_us) == 2


def test_metrics_need_a_run():
    with pytest.raises(ValueError, match="no capacity"):
        device_metrics(Timeline.from_replay(RECORDS))
