"""The data ``timeline report`` embeds in its page, from what a run folder holds: the run's
settings, the per-device table, each device's memory over time (thinned to what a chart can
show, peaks kept), the breakdown and top tensors at each peak, and the schedule (one bar per
action, from ops.parquet when the folder has it). For a ``compare`` folder: the comparison rows
and each variant's own run data.

Pure functions of the dictionaries and arrays the readers return: no I/O, no HTML. Numbers are
rounded (GiB to 4 decimals, ms to 3) so the page stays small and the same folder gives the same
bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from timeline.result.categories import CATEGORIES

SCHEMA = "timeline.report/1"
GIB = 2**30
#: points per device chart: a few per pixel column of a wide screen
MAX_POINTS = 1500
#: top tensors shown per device
TOP_TENSORS = 10
#: the per-device table's fields (summary.json keys)
DEVICE_FIELDS = ("device", "pp_rank", "stages", "represents", "peak_requested_bytes", "peak_allocated_bytes",
                 "peak_reserved_bytes", "peak_time_us", "peak_reserved_time_us", "fragmentation_bytes_at_peak",
                 "activation_bytes_per_microbatch", "capacity_bytes", "peak_action", "num_ooms")


def _gib(values: np.ndarray) -> list[float]:
    return np.round(np.asarray(values, dtype=np.float64) / GIB, 4).tolist()


def thin_rows(t_us: np.ndarray, total: np.ndarray, max_points: int = MAX_POINTS) -> np.ndarray:
    """Row indices to draw: all rows, or in each of ``max_points`` equal slices of time the row
    with the largest ``total`` (so every peak survives)."""
    n = len(t_us)
    if n <= max_points:
        return np.arange(n)
    edges = np.linspace(float(t_us[0]), float(t_us[-1]), max_points + 1)[1:-1]
    starts = np.unique(np.concatenate([[0], np.searchsorted(t_us, edges, side="left")]))
    starts = starts[starts < n]
    bucket = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
    return np.lexsort((-total.astype(np.float64), bucket))[starts]


def device_series(mem: Mapping[str, np.ndarray], device: int, max_points: int = MAX_POINTS) -> dict[str, Any]:
    """One device's memory over time: ms, and GiB per category, allocated and reserved (the
    reserved value of a slice is its maximum, so the line is an envelope)."""
    rows = np.flatnonzero(mem["device"] == device)
    t = mem["t_us"][rows]
    cats = [c for c in CATEGORIES if c in mem and mem[c][rows].any()]
    total = sum((mem[c][rows] for c in cats), np.zeros(len(rows), dtype=np.int64))
    keep = thin_rows(t, total, max_points)
    reserved = mem["reserved_bytes"][rows]
    if len(keep) < len(rows):
        reserved = np.maximum.reduceat(reserved, np.sort(keep)) if len(keep) else reserved[:0]
    else:
        reserved = reserved[keep]
    return {"t_ms": np.round(t[keep] / 1e3, 3).tolist(), "allocated": _gib(mem["allocated_bytes"][rows][keep]),
            "reserved": _gib(reserved), "categories": {c: _gib(mem[c][rows][keep]) for c in cats}}


def schedule_bars(ops: Mapping[str, np.ndarray] | None, device: int) -> list[list]:
    """The device's actions as ``[label, phase, start_ms, end_ms]`` bars: consecutive compute-stream
    ops of one (phase, micro-batch, stage), e.g. ``3F12``; recomputation (R) and the step are
    their own bars."""
    if ops is None:
        return []
    sel = np.flatnonzero((ops["device"] == device) & (ops["stream"] == "compute"))
    if not len(sel):
        return []
    sel = sel[np.argsort(ops["t_start_us"][sel], kind="stable")]
    phase, mb, st = ops["phase"][sel], ops["microbatch"][sel], ops["stage"][sel]
    change = np.ones(len(sel), dtype=bool)
    change[1:] = (phase[1:] != phase[:-1]) | (mb[1:] != mb[:-1]) | (st[1:] != st[:-1])
    starts = np.flatnonzero(change)
    ends = np.append(starts[1:], len(sel)) - 1
    t0, t1 = ops["t_start_us"][sel], ops["t_end_us"][sel]
    bars = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        p = str(phase[a])
        label = p if p in ("step", "init") or mb[a] < 0 else f"{st[a]}{p}{mb[a]}"
        bars.append([label, p, round(float(t0[a]) / 1e3, 3), round(float(t1[a: b + 1].max()) / 1e3, 3)])
    return bars


def run_data(summary: Mapping[str, Any], mem: Mapping[str, np.ndarray], ops: Mapping[str, np.ndarray] | None,
             *, kind: str, max_points: int = MAX_POINTS) -> dict[str, Any]:
    """Everything the page shows for one simulated (or replayed) run."""
    devices = []
    for d in summary["devices"]:
        entry = {k: d.get(k) for k in DEVICE_FIELDS}
        entry["breakdown_at_peak_bytes"] = d.get("peak_breakdown_bytes") or {}
        entry["top_tensors"] = (d.get("top_tensors_at_peak") or [])[:TOP_TENSORS]
        entry["iteration_starts_ms"] = [round(t / 1e3, 3) for t in d.get("iteration_starts_us") or []]
        entry["first_oom"] = d.get("oom")
        entry["series"] = device_series(mem, int(d["device"]), max_points)
        entry["schedule"] = schedule_bars(ops, int(d["device"]))
        devices.append(entry)
    return {"kind": kind, "run": summary.get("run"), "iteration_time_us": _first(summary, "iteration_time_us"),
            "num_events": summary.get("num_events"), "devices": devices}


def _first(summary: Mapping[str, Any], key: str) -> Any:
    devices = summary.get("devices") or []
    return devices[0].get(key) if devices else None


def compare_data(rows: Mapping[str, np.ndarray], variants: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """A comparison: its rows (one per variant × device) and each variant's :func:`run_data`."""
    table = [{k: (v[i].item() if hasattr(v[i], "item") else v[i]) for k, v in rows.items()}
             for i in range(len(rows["variant"]))]
    return {"kind": "compare", "rows": table, "variants": [{"name": n, **data} for n, data in variants]}


def report_document(data: Mapping[str, Any], title: str) -> dict[str, Any]:
    return {"schema": SCHEMA, "title": title, **data}
