"""``summary.json`` of a serving run (schema ``timeline.serve/1``): the resolved deployment, the
engine's budget, the KV pool in blocks and tokens, max concurrency at ``max_model_len``, the
longest context that fits, request latencies and the memory peak and when. Formats only."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from typing import BinaryIO

import numpy as np

from timeline.serve.budget import Budget
from timeline.serve.run import ServeResult

FILENAME = "summary.json"
SCHEMA = "timeline.serve/1"


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


def kv_groups(res: ServeResult, b: Budget) -> dict:
    """The hybrid layout (vLLM ``KVCacheConfig``): tensors, page, and per group its layers and the
    blocks one ``max_model_len`` request holds in it at most."""
    layout, sv = b.kv_layout, res.run.serving
    mml, bs = res.run.max_model_len, layout.block_size
    rows = []
    for g in layout.groups:
        most = -(-mml // bs) if not g.sliding_window else \
            -(-min(g.sliding_window - 1 + sv.max_num_batched_tokens, mml) // bs) + 1
        rows.append({"kind": g.kind, "sliding_window": g.sliding_window or None, "layers": list(g.layers),
                     "padding_layers": layout.group_size - len(g.layers),
                     "max_blocks_per_request": most})
    return {"num_tensors": layout.group_size, "page_bytes": layout.page_bytes,
            "tensor_bytes": layout.page_bytes * b.num_kv_blocks,
            "block_bytes": layout.page_bytes * layout.group_size, "groups": rows}


def device_row(res: ServeResult, b: Budget, peaks: tuple[int, int, float], extra: dict) -> dict:
    """One device's row: its KV layout and pool, the budget, max concurrency, longest context, peaks."""
    run, layout = res.run, b.kv_layout
    # vLLM _report_kv_cache_config: num_blocks // groups · block_size tokens
    pool_tokens = b.num_kv_blocks // len(layout.groups) * b.block_size
    mml, mnbt = run.max_model_len, run.serving.max_num_batched_tokens
    blocks_per_max = layout.max_request_blocks(mml, mnbt)
    longest = min(pool_tokens, mml) if not layout.hybrid else layout.longest_context(b.num_kv_blocks, mml, mnbt)
    return {
        **extra, "represents": run.parallel.tp * run.parallel.dp,
        "kv_bytes_per_token": b.kv_bytes_per_token, "kv_bytes_per_token_layer": b.kv_bytes_per_token_layer,
        "kv_layers": b.kv_layers, "block_size": b.block_size, "num_kv_blocks": b.num_kv_blocks,
        "kv_pool_bytes": b.kv_pool_bytes, "kv_pool_tokens": pool_tokens,
        "budget": {"total_bytes": b.total_bytes, "requested_bytes": b.requested_bytes,
                   "weights_bytes": b.weights_bytes, "non_torch_bytes": b.non_torch_bytes,
                   "activation_peak_bytes": b.activation_peak_bytes, "cuda_graph_bytes": b.cuda_graph_bytes,
                   "cuda_graph_subtracted": b.cuda_graph_subtracted, "kv_pool_bytes": b.kv_pool_bytes,
                   "req_to_token_bytes": b.req_to_token_bytes,
                   **({"vision_weights_bytes": b.vision_weights_bytes} if b.vision_weights_bytes else {})},
        # hf has no pool: its cache grows until the device is full (null here)
        "max_concurrency_at_max_model_len": (b.num_kv_blocks // blocks_per_max if blocks_per_max else 0)
        if b.engine != "hf" else None,
        "longest_context_tokens": longest if b.engine != "hf" else None,
        "peak_allocated_bytes": peaks[0], "peak_reserved_bytes": int(peaks[1]),
        "peak_time_us": round(peaks[2], 3), "capacity_bytes": b.total_bytes,
        "max_kv_blocks_used": res.sched.max_blocks_used, "failure": b.failure,
        **({"kv_cache_groups": kv_groups(res, b)} if layout.hybrid else {}),
    }


def summary(res: ServeResult) -> dict:
    run = res.run
    b = res.budget
    states = res.sched.states
    done = [s for s in states if s.finish_us >= 0]
    ttft = [s.first_token_us - s.req.arrival_us for s in done]
    tpot = [(s.finish_us - s.first_token_us) / (s.req.output_tokens - 1) for s in done if s.req.output_tokens > 1]
    mml = run.max_model_len
    if res.stages:  # pp > 1: one row per pipeline stage (its TP ranks are alike); the timeline is stage 0's
        devices = [device_row(res, st.budget, (st.peak_allocated_bytes, st.peak_reserved_bytes, st.peak_time_us),
                              {"device": st.stage, "pp_stage": st.stage, "layers": [st.layers.start, st.layers.stop],
                               "worker_num_kv_blocks": st.budget.worker_kv_blocks})
                   for st in res.stages]
    elif res.ranks:  # dp > 1: one row per DP rank (its GPUs alike), each with its own requests and timeline
        devices = [device_row(replace(res, sched=rk.sched), rk.budget,
                              (rk.peak_allocated_bytes, rk.peak_reserved_bytes, rk.peak_time_us),
                              {"device": rk.rank, "dp_rank": rk.rank, "requests": rk.requests,
                               "steps": len(rk.sched.steps), "eager_steps": rk.num_eager_steps,
                               "dummy_steps": sum(st.dummy for st in rk.sched.steps)})
                   for rk in res.ranks]
        for row in devices:  # a DP rank's GPUs: its attention group
            row["represents"] = res.data_parallel["attention_tp"]
    else:
        devices = [device_row(res, b, (res.peak_allocated_bytes, res.peak_reserved_bytes, res.peak_time_us),
                              {"device": 0})]
    steps = [(len(rk.sched.steps), rk.num_eager_steps) for rk in res.ranks] or \
        [(len(res.sched.steps), res.num_eager_steps)]
    total, eager = sum(n for n, _ in steps), sum(e for _, e in steps)
    serving = asdict(run.serving)
    if not serving["enable_dp_attention"]:  # SGLang's flag, shown where it is set
        del serving["enable_dp_attention"]
    return {
        "schema": SCHEMA,
        "run": {"name": run.name, "model": run.model.name, "model_source": run.model_source,
                "parallel": asdict(run.parallel), "hardware": asdict(run.hardware),
                "serving": serving, "load": asdict(run.load) if run.load else None,
                "max_model_len": mml},
        "engine": {"name": b.engine, "version": b.engine_version},
        "activation_graph": "eager",
        "devices": devices,
        "cuda_graph_capture_sizes": list(res.capture_sizes),
        "steps": {"total": total, "eager": eager, "replayed": total - eager},  # over every DP rank
        **({"data_parallel": {**res.data_parallel, "requests_per_rank": [rk.requests for rk in res.ranks]}}
           if res.ranks else {}),
        "requests": {"total": len(states), "finished": len(done),
                     "rejected": sum(bool(s.rejected) for s in states),
                     "preemptions": sum(s.preemptions for s in states),
                     "ttft_ms": {"p50": _pct([t / 1e3 for t in ttft], 50), "p99": _pct([t / 1e3 for t in ttft], 99)},
                     "tpot_ms": {"p50": _pct([t / 1e3 for t in tpot], 50), "p99": _pct([t / 1e3 for t in tpot], 99)},
                     "makespan_us": round(max((s.finish_us for s in done), default=0.0), 3)},
    }


def write(res: ServeResult, handle: BinaryIO, options: dict | None = None) -> None:
    handle.write((json.dumps(summary(res), indent=1, sort_keys=False) + "\n").encode())
