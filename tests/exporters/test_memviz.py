"""snapshot.pickle: the memory_viz snapshot of a simulated run.

Without torch: the shape of ``_dump_snapshot``'s dict; the trace replayed forwards from empty
ends in the snapshot's segments and in the Timeline's final bytes; our backward reconstruction
(timeline.alloc.reconstruct, what MemoryViz's "Allocator State History" does) of a full trace
starts from nothing, and of a capped trace from the reserved bytes at the cut; frames name the
tensor, op, module, phase, micro-batch and stage; the golden file. With CPU torch installed:
PyTorch's own ``torch.cuda._memory_viz`` reads the file offline (segsum, trace, segments with a
formatting function) and its totals equal ours.
"""

from __future__ import annotations

import importlib.util
import io
import pickle
import re

import helpers_run
import pytest
from tiny import GOLDEN, golden_bytes, synthetic_template

from timeline.alloc.reconstruct import reconstruct
from timeline.exporters import memviz_snapshot
from timeline.io.snapshot import loads_snapshot
from timeline.result.build import build_timeline
from timeline.sim.memory import allocator_config

ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"}
# (expandable segments: segment_map / segment_unmap instead of segment_alloc / segment_free)


def export(tl, **options) -> bytes:
    buf = io.BytesIO()
    memviz_snapshot.write(tl, buf, options)
    return buf.getvalue()


def final(tl, d: int) -> tuple[int, int, int]:
    s = tl.series(d)
    return int(s.requested[-1]), int(s.allocated[-1]), int(s.reserved[-1])


def test_shape_and_safe_loading(tiny_timeline):
    data = export(tiny_timeline)
    assert data[:2] == b"\x80\x04"  # protocol 4, like torch's _dump_snapshot
    snap = loads_snapshot(data)  # the project's restricted unpickler accepts it
    assert len(snap["device_traces"]) == tiny_timeline.num_devices
    seg = snap["segments"][0]
    assert set(seg) >= {"device", "address", "total_size", "allocated_size", "active_size", "requested_size",
                        "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
    assert set(seg["blocks"][0]) == {"address", "size", "requested_size", "state", "frames"}
    entries = [e for t in snap["device_traces"] for e in t]
    assert {e["action"] for e in entries} == ACTIONS - {"oom", "segment_free"}
    assert all(isinstance(e["time_us"], int) and e["frames"] for e in entries)
    # out of memory, the allocator frees its cached segments and retries (then goes over capacity); without
    # a TP stream a segment only the micro-batches' transients used is free at the retry
    oom = pickle.loads(export(build_timeline(helpers_run.tiny_run(pp=2, num_microbatches=4, zero=1,
                                                                  capacity_gib=40 / 1024), synthetic_template)))
    assert {e["action"] for t in oom["device_traces"] for e in t} == ACTIONS
    assert snap["allocator_settings"]["expandable_segments"] is False


@pytest.mark.parametrize("fixture", ["tiny_timeline", "ideal_timeline", "oom_timeline", "expandable_timeline"])
def test_forward_replay_ends_in_segments_and_timeline(fixture, request):
    tl = request.getfixturevalue(fixture)
    snap = pickle.loads(export(tl))
    for d, trace in enumerate(snap["device_traces"]):
        live, segs, mapped = {}, {}, 0
        for e in trace:
            if e["action"] == "alloc":
                assert e["addr"] not in live
                live[e["addr"]] = e["size"]
            elif e["action"] == "free_completed":
                assert live.pop(e["addr"]) == e["size"]
            elif e["action"] == "segment_alloc":
                segs[e["addr"]] = e["size"]
            elif e["action"] == "segment_free":
                assert segs.pop(e["addr"]) == e["size"]
            elif e["action"] in ("segment_map", "segment_unmap"):
                mapped += e["size"] if e["action"] == "segment_map" else -e["size"]
        mine = [s for s in snap["segments"] if s["device"] == d]
        if fixture == "expandable_timeline":
            assert not segs and mapped > 0 and all(s["is_expandable"] for s in mine)
            segs = {s["address"]: s["total_size"] for s in mine}
            assert sum(segs.values()) == mapped
        assert {s["address"]: s["total_size"] for s in mine} == segs
        blocks = {b["address"]: b["requested_size"] for s in mine for b in s["blocks"]
                  if b["state"] == "active_allocated"}
        assert blocks == live
        requested, allocated, reserved = final(tl, d)
        assert sum(live.values()) == requested
        assert sum(s["allocated_size"] for s in mine) == allocated
        assert sum(segs.values()) == reserved
        for s in mine:  # the accounting identity segsum asserts
            assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
    if fixture == "oom_timeline":
        ooms = [e for t in snap["device_traces"] for e in t if e["action"] == "oom"]
        assert len(ooms) == sum(len(m.oom) for m in tl.memory) and ooms[0]["device_free"] >= 0


def test_backward_reconstruction(oom_timeline):
    tl = oom_timeline
    config = allocator_config(tl.sim.run.allocator)
    full = pickle.loads(export(tl))
    capped = pickle.loads(export(tl, max_entries=40))
    for d in range(tl.num_devices):
        segs = [s for s in full["segments"] if s["device"] == d]
        assert reconstruct(segs, full["device_traces"][d], config).reserved_bytes == 0
        trace = capped["device_traces"][d]
        assert 39 <= len(trace) <= 40 and trace == full["device_traces"][d][-len(trace):]
        start = reconstruct(segs, trace, config)
        cut = full["device_traces"][d][: -len(trace)]
        reserved = sum(e["size"] * (1 if e["action"] == "segment_alloc" else -1) for e in cut
                       if e["action"] in ("segment_alloc", "segment_free"))
        assert start.reserved_bytes == reserved > 0


def test_frames_name_tensor_op_module_and_action(tiny_timeline):
    snap = pickle.loads(export(tiny_timeline))
    e = next(e for e in snap["device_traces"][0] if e["action"] == "alloc" and "[recompute]" in e["frames"][0]["name"])
    tensor, op, action = e["frames"]
    assert tensor == {"filename": "layers.0.norm", "line": 0, "name": "r [recompute]"}
    assert op == {"filename": "layers.0.norm", "line": 0, "name": "layers.0.norm"}
    assert re.fullmatch(r"B microbatch \d stage 0 iteration [01]", action["name"])
    static = snap["device_traces"][0][1]
    # Megatron's model construction makes each parameter on its own first (its first is the embedding)
    assert [f["name"] for f in static["frames"]] == ["static.weights.embedding.word_embeddings.weight [weights]",
                                                     "static state"]


def test_deterministic_and_golden(oom_timeline):
    assert export(oom_timeline) == export(oom_timeline)
    assert golden_bytes("snapshot.pickle") == (GOLDEN / "snapshot.pickle").read_bytes(), \
        "snapshot.pickle changed: review, then tools/regen_goldens.py snapshot.pickle"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="CPU torch is not installed (optional: pip install torch==2.13.0); "
                           "PyTorch's _memory_viz is what this test runs")
@pytest.mark.parametrize("fixture", ["tiny_timeline", "ideal_timeline", "expandable_timeline"])
def test_pytorch_memory_viz_reads_it(fixture, request):
    from torch.cuda import _memory_viz as mv

    tl = request.getfixturevalue(fixture)
    snap = pickle.loads(export(tl))
    finals = [final(tl, d) for d in range(tl.num_devices)]
    requested = sum(f[0] for f in finals)
    reserved = sum(f[2] for f in finals)
    summary = mv.segsum(snap)  # asserts free + allocated == reserved per segment and in total
    assert f"segments: {len(snap['segments'])}\n" in summary
    assert f"total_reserved: {mv.Bytes(reserved)}\n" in summary
    assert f"total_allocated: {mv.Bytes(requested)}\n" in summary  # segsum counts requested bytes
    text = mv.trace(snap)
    for d, trace in enumerate(snap["device_traces"]):
        assert f"Device {d} ----------------\n{len(trace)} entries\n" in text
    assert text.count("cudaMalloc(") == sum(e["action"] == "segment_alloc" for t in snap["device_traces"] for e in t)
    lines: list[str] = []
    mv.segments(snap, format_flamegraph=lambda flame: lines.append(flame) or "")
    sizes = [line.rsplit(" ", 1) for line in lines[0].splitlines()]
    assert sum(int(n) for _, n in sizes) == reserved  # every byte of every segment, once
    active = sum(int(n) for stack, n in sizes if ";active_allocated;" in stack)
    assert active == requested
    assert any("static.param_buffer.chunk" in stack and "[weights]" in stack for stack, _ in sizes)
