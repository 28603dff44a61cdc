"""The data ``timeline report`` embeds for a ``timeline serve`` folder: the run's serving settings,
the engine's budget per device (per pipeline stage when there are several, with the KV cache groups
of a hybrid model), memory over time by part with KV blocks used / free and requests running /
waiting / preempted (memory.parquet, one row per engine step), and a summary of the request table
(requests.parquet: TTFT / TPOT percentiles, preemptions, rejections by reason).

Pure functions of the dictionaries and arrays the readers return: no I/O, no HTML. Unlike a training
run's page the numbers are the folder's own (bytes as integers, times as written): a serving run has
one row per engine step, few enough to embed; beyond :data:`MAX_STEPS` rows the steps are thinned
(peaks kept) and ``row`` names the rows kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from timeline.exporters.report_data import thin_rows

#: memory.parquet columns the page draws, in the order it stacks the parts
PARTS = ("weights_bytes", "kv_cache_bytes", "cuda_graph_bytes", "temporary_bytes")
COLUMNS = ("t_us", "allocated_bytes", "reserved_bytes", *PARTS, "kv_blocks_used", "kv_blocks_free",
           "requests_running", "requests_waiting", "requests_preempted")
#: engine steps embedded before thinning
MAX_STEPS = 20_000
#: latency percentiles of the request table
PERCENTILES = (50, 90, 99)
#: a device row's fields (summary.json keys) the page shows
DEVICE_FIELDS = ("device", "dp_rank", "requests", "pp_stage", "layers", "represents", "kv_bytes_per_token", "kv_bytes_per_token_layer",
                 "kv_layers", "block_size", "num_kv_blocks", "worker_num_kv_blocks", "kv_pool_bytes",
                 "kv_pool_tokens", "budget", "max_concurrency_at_max_model_len", "longest_context_tokens",
                 "peak_allocated_bytes", "peak_reserved_bytes", "peak_time_us", "capacity_bytes",
                 "max_kv_blocks_used", "failure", "kv_cache_groups")


def step_series(mem: Mapping[str, np.ndarray], device: int, max_steps: int = MAX_STEPS) -> dict[str, Any]:
    """One device's rows of memory.parquet, column by column, as written (``row``: the file's row
    of each point)."""
    rows = np.flatnonzero(mem["device"] == device)
    keep = rows[thin_rows(mem["t_us"][rows], mem["allocated_bytes"][rows], max_steps)]
    return {"row": keep.tolist(), **{c: mem[c][keep].tolist() for c in COLUMNS if c in mem}}


def _percentiles(values: np.ndarray) -> dict[str, float | None]:
    """Milliseconds, rounded as summary.json rounds them."""
    out: dict[str, float | None] = {f"p{q}": (round(float(np.percentile(values / 1e3, q)), 3) if len(values) else None)
                                    for q in PERCENTILES}
    out["mean"] = round(float(np.mean(values / 1e3)), 3) if len(values) else None
    out["max"] = round(float(np.max(values / 1e3)), 3) if len(values) else None
    return out


def request_stats(req: Mapping[str, np.ndarray] | None) -> dict[str, Any] | None:
    """The request table in a few numbers: counts, TTFT and TPOT percentiles (of the finished
    requests; TPOT over requests of more than one output token), preemptions, rejections by reason."""
    if req is None:
        return None
    done = req["finish_us"] >= 0
    ttft = (req["first_token_us"] - req["arrival_us"])[done]
    multi = done & (req["output_tokens"] > 1)
    tpot = (req["finish_us"] - req["first_token_us"])[multi] / (req["output_tokens"][multi] - 1)
    reasons: dict[str, int] = {}
    for r in req["rejected"].tolist():
        if r:
            reasons[str(r)] = reasons.get(str(r), 0) + 1
    pre = req["preemptions"]
    return {"total": len(req["request"]), "finished": int(done.sum()), "rejected": int(sum(reasons.values())),
            "rejections": dict(sorted(reasons.items())), "preemptions": int(pre.sum()),
            "preempted_requests": int((pre > 0).sum()), "max_preemptions": int(pre.max()) if len(pre) else 0,
            "prompt_tokens": int(req["prompt_tokens"].sum()), "output_tokens": int(req["output_tokens"].sum()),
            "ttft_ms": _percentiles(ttft), "tpot_ms": _percentiles(tpot),
            "makespan_us": round(float(req["finish_us"][done].max()), 3) if done.any() else 0.0}


def serve_data(summary: Mapping[str, Any], mem: Mapping[str, np.ndarray] | None,
               req: Mapping[str, np.ndarray] | None, *, max_steps: int = MAX_STEPS) -> dict[str, Any]:
    """Everything the page shows for one serving run. memory.parquet holds the first device's
    (stage 0's) steps; each device row gets its own rows, if any."""
    devices = []
    for d in summary.get("devices") or []:
        entry = {k: d[k] for k in DEVICE_FIELDS if k in d}
        has_rows = mem is not None and bool((mem["device"] == int(d["device"])).any())
        entry["series"] = step_series(mem, int(d["device"]), max_steps) if has_rows and mem is not None else None
        devices.append(entry)
    return {"kind": "serve", "run": summary.get("run"), "engine": summary.get("engine"),
            "activation_graph": summary.get("activation_graph"),
            "cuda_graph_capture_sizes": summary.get("cuda_graph_capture_sizes"), "steps": summary.get("steps"),
            "requests_summary": summary.get("requests"), "requests": request_stats(req), "devices": devices}
