"""``summary.json``: the resolved run and, per device, its peaks, when, what is live at the
peak, static bytes, activation bytes per micro-batch, capacity and the iteration time.

Each peak has its own time: ``peak_time_us`` is the requested peak's (the breakdown and the top
tensors are at that instant), ``peak_allocated_time_us`` and ``peak_reserved_time_us`` the
others'; ``fragmentation_bytes_at_peak`` is reserved − allocated at the requested peak."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, BinaryIO

from timeline.result.timeline import Timeline

#: summary.json key -> Peak attribute
SUMMARY_KEYS: dict[str, str] = {
    "peak_requested_bytes": "requested_bytes",
    "peak_allocated_bytes": "allocated_bytes",
    "peak_reserved_bytes": "reserved_bytes",
    "peak_time_us": "requested_time_us",
    "peak_allocated_time_us": "allocated_time_us",
    "peak_reserved_time_us": "reserved_time_us",
    "peak_breakdown_bytes": "breakdown_bytes",
    "fragmentation_bytes_at_peak": "fragmentation_bytes",
}

FILENAME = "summary.json"
SCHEMA = "timeline.summary/1"


#: the ``[recompute]`` fields that mean something under each policy
RECOMPUTE_FIELDS = {"none": ("policy",), "selective": ("policy", "modules"),
                    "full": ("policy", "method", "num_layers")}


def resolved_run(tl: Timeline) -> dict[str, Any]:
    run = tl.meta.run
    if run is None:
        raise ValueError("a replayed Timeline has no run to write")
    out = dataclasses.asdict(run)
    out.pop("source", None)  # an absolute path would make outputs differ between checkouts
    out.pop("notes", None)  # how the inputs were read: printed once, not part of the result
    out.pop("csv_rows", None)  # the rows of ``schedule.csv``, which names them
    rc = out["recompute"]
    out["recompute"] = {k: rc[k] for k in RECOMPUTE_FIELDS[run.recompute.policy]}
    return out


def _context(tl: Timeline, d: int) -> dict[str, Any]:
    ctx = tl.peak_context(d)
    return {"peak_action": ctx["action"],
            "microbatches_in_flight_at_peak": [{"stage": s, "microbatch": m} for s, m in ctx["in_flight"]]}


def summary_dict(tl: Timeline) -> dict[str, Any]:
    devices = []
    for d, dev in enumerate(tl.devices):
        peak = tl.peak(d)
        mem = tl.memory[d]
        devices.append({
            "device": dev.device, "pp_rank": dev.pp_rank, "stages": list(dev.stages),
            "represents": dev.represents, "layers": list(dev.layers),
            **{key: getattr(peak, field) for key, field in SUMMARY_KEYS.items()},
            "capacity_bytes": tl.meta.capacity_bytes,
            "static_bytes": {"weights": dev.weights_bytes, "grads": dev.grads_bytes,
                             "optimizer": dev.optimizer_bytes},
            "params_by_module": dict(dev.params_by_module),
            "activation_bytes_per_microbatch": dev.activation_bytes_per_microbatch,
            **_context(tl, d),
            "peak_iteration": tl.peak_iteration(d),
            "iteration_time_us": tl.meta.iteration_time_us,
            "per_iteration": tl.iteration_peaks(d),
            "iteration_starts_us": tl.iteration_starts(d),
            "top_tensors_at_peak": tl.top_tensors(d, peak.event_index) if peak.event_index >= 0 else [],
            "oom": mem.oom[0] if mem.oom else None,
            "num_ooms": len(mem.oom),
        })
    return {"schema": SCHEMA, "run": resolved_run(tl), "devices": devices, "num_events": tl.num_events}


def write(tl: Timeline, handle: BinaryIO, options: dict | None = None) -> None:
    handle.write(json.dumps(summary_dict(tl), indent=1, default=list).encode() + b"\n")
