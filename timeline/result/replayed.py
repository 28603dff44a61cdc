"""A Timeline of a replayed PyTorch snapshot, so a real run can be written like a simulated one.

The records come from :func:`timeline.alloc.replay.replay_snapshot` (one tuple per model
allocation and free). A snapshot carries no tensor categories, so every byte is counted under
``temporary``; there are no ops, stages or micro-batches. Times are relative to the first
recorded event across devices, in µs. A snapshot that ``timeline`` wrote names each index's
global rank in ``timeline_devices``; given as ``devices``, the replayed devices keep those
numbers (and pipeline ranks), so a replay reads like the run it came from. The Timeline is built
directly: there is no run, no schedule and no simulator output behind it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from timeline.graph.tensors import CATEGORIES, Category
from timeline.result.timeline import (
    DeviceEvents,
    DeviceInfo,
    DeviceMemory,
    DeviceOps,
    RunMeta,
    Span,
    Timeline,
)

TEMPORARY = CATEGORIES.index(Category.TEMPORARY.value)


def timeline_from_replay(records: Mapping[int, Sequence[tuple]],
                         devices: Mapping[int, Mapping] | None = None) -> Timeline:
    """The replay ``records`` (per snapshot device index) as a Timeline; ``devices`` maps an index
    to its ``{"device", "pp_rank", "stages", "represents"}`` (a timeline snapshot's own labels)."""
    devices_info = devices or {}
    names: list[str] = []
    index: dict[str, int] = {}

    def name(s: str) -> int:
        if s not in index:
            index[s] = len(names)
            names.append(s)
        return index[s]

    t0 = min((r[0][0] for r in records.values() if r), default=0.0)
    infos: list[DeviceInfo] = []
    events: list[DeviceEvents] = []
    ops: list[DeviceOps] = []
    memory: list[DeviceMemory] = []
    spans: list[list[Span]] = []
    for d in sorted(records):
        rec = records[d]
        n = len(rec)
        t = np.array([r[0] for r in rec], dtype=np.float64) - t0
        sign = np.array([r[1] for r in rec], dtype=np.int8)
        order = np.argsort(t, kind="stable")
        # a freed block's name is its allocation's frame
        alloc_name: dict[int, int] = {}
        tensor = np.zeros(n, dtype=np.int32)
        for i, r in enumerate(rec):
            if r[1] > 0:
                tensor[i] = alloc_name[r[4]] = name(r[6])
            else:
                tensor[i] = alloc_name.pop(r[4], name("unknown"))
        events.append(DeviceEvents(
            t_us=t[order], sign=sign[order],
            size=np.array([r[2] for r in rec], dtype=np.int64)[order],
            cat=np.full(n, TEMPORARY, dtype=np.int8), tensor=tensor[order], op=np.full(n, -1, dtype=np.int32),
            microbatch=np.full(n, -1, dtype=np.int32), stage=np.full(n, -1, dtype=np.int16),
            action=np.full(n, -1, dtype=np.int32), stream=np.zeros(n, dtype=np.int8),
            iteration=np.full(n, -1, dtype=np.int32)))
        block = np.array([r[1] * r[3] for r in rec], dtype=np.int64)[order]
        memory.append(DeviceMemory(block_bytes=block, reserved=np.array([r[5] for r in rec], dtype=np.int64)[order],
                                   address=np.array([r[4] for r in rec], dtype=np.int64)[order],
                                   segment=np.full(n, -1, dtype=np.int64), oom=[]))
        empty_i, empty_f = np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float64)
        ops.append(DeviceOps(name=empty_i, stream=empty_i, t_start_us=empty_f, t_end_us=empty_f, phase=empty_i,
                             microbatch=empty_i, stage=empty_i, layer=empty_i, flops=empty_f))
        info = devices_info.get(d, {})
        infos.append(DeviceInfo(device=int(info.get("device", d)), pp_rank=int(info.get("pp_rank", 0)),
                                stages=tuple(int(s) for s in info.get("stages", ())),
                                represents=int(info.get("represents", 1))))
        spans.append([])
    meta = RunMeta(run=None, name="replay", profile=None, schedule_kind=None, capacity_bytes=None,
                   iteration_time_us=0.0, iterations=0, warmup_iterations=0, report_start_us=0.0, allocator=None,
                   replayed=True)
    return Timeline(devices=infos, events=events, ops=ops, spans=spans, names=names, memory=memory, meta=meta)
