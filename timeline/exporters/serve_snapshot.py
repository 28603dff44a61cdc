"""``snapshot.pickle`` of a serving run, for pytorch.org/memory_viz: the shape
``torch.cuda.memory._dump_snapshot`` writes (as :mod:`timeline.exporters.memviz_snapshot`), one
device — the representative rank. ``segments`` are the allocator's end state with the weights and
the KV pool still allocated; ``device_traces`` are the last entries of the run (the weights, one KV
tensor per layer, every eager step's transients, segment allocs and frees; graph-replayed steps
allocate nothing). Frames name the tensor. Formats only; pickle protocol 4, deterministic."""

from __future__ import annotations

import pickle
from typing import Any, BinaryIO

from timeline.exporters.memviz_snapshot import _alloc_conf, _segment
from timeline.serve.run import ServeResult

FILENAME = "snapshot.pickle"


def snapshot(res: ServeResult, max_entries: int = 0) -> dict[str, Any]:
    """The snapshot dict; ``max_entries`` > 0 keeps the last N recorded entries (PyTorch's ring
    buffer: blocks allocated before them then carry no frames)."""
    frames_at: dict[int, list[dict]] = {}
    trace: list[dict] = []
    entries = res.alloc_trace[-max_entries:] if max_entries else res.alloc_trace
    for action, addr, size, t_us, name in entries:
        frames = [{"filename": "timeline/serve", "line": 0, "name": name or action}]
        if action == "alloc":
            frames_at[addr] = frames
            trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": int(round(t_us)),
                          "frames": frames})
        elif action == "free":
            frames = frames_at.pop(addr, frames)
            for step in ("free_requested", "free_completed"):
                trace.append({"action": step, "addr": addr, "size": size, "stream": 0, "time_us": int(round(t_us)),
                              "frames": frames})
        else:  # segment_alloc / segment_free / oom from the allocator's listener
            trace.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": int(round(t_us)),
                          "frames": frames})
    segments = [_segment(0, v.address, v.size, v.stream, v.is_small, v.expandable, v.blocks, frames_at)
                for v in res.end_segments]
    run = res.run
    alloc_conf = _alloc_conf(run.allocator)  # a serving run has the same [allocator] section
    return {"segments": segments, "device_traces": [trace],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": alloc_conf},
            "external_annotations": [], "timeline_devices": [{"device": 0, "represents": run.parallel.tp}]}


def write(res: ServeResult, handle: BinaryIO, options: dict | None = None) -> None:
    pickle.dump(snapshot(res, int((options or {}).get("max_entries") or 0)), handle, protocol=4)
