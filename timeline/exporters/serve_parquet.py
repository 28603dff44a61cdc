"""``memory.parquet`` and ``requests.parquet`` of a serving run (schemas ``timeline.serve.memory/1``,
``timeline.serve.requests/1``): one memory row per engine step (at its start: bytes by part at the
step's peak, KV blocks used / free, requests running / waiting, preemptions in the step) and one
row per request (arrival, first token, finish, preemptions, rejection reason). Formats only."""

from __future__ import annotations

from typing import BinaryIO

import numpy as np

from timeline.exporters.parquet_util import write_table
from timeline.serve.run import ServeResult

MEMORY_SCHEMA = "timeline.serve.memory/1"
EVENTS_SCHEMA = "timeline.serve.events/1"
ACTIONS = ("alloc", "free", "segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom")
REQUESTS_SCHEMA = "timeline.serve.requests/1"


def write_memory(res: ServeResult, handle: BinaryIO, options: dict | None = None) -> None:
    """One row per engine step of the representative device, or of every DP rank's (``device`` =
    the DP rank) in rank order."""
    parts = [rk.memory for rk in res.ranks] or [res.memory]
    cols = {k: np.concatenate([m[k] for m in parts]) for k in res.memory}
    cols["device"] = np.concatenate([np.full(len(m["t_us"]), d, dtype=np.int32) for d, m in enumerate(parts)])
    order = ["device", "t_us", "allocated_bytes", "reserved_bytes", "weights_bytes", "kv_cache_bytes",
             "cuda_graph_bytes", "temporary_bytes", "kv_blocks_used", "kv_blocks_free", "requests_running",
             "requests_waiting", "requests_preempted"]
    write_table({k: cols[k] for k in order}, handle, MEMORY_SCHEMA)


def write_requests(res: ServeResult, handle: BinaryIO, options: dict | None = None) -> None:
    st = res.sched.states
    write_table({
        "request": np.array([s.req.rid for s in st], dtype=np.int64),
        "arrival_us": np.array([s.req.arrival_us for s in st], dtype=np.float64),
        "prompt_tokens": np.array([s.req.prompt_tokens for s in st], dtype=np.int64),
        "output_tokens": np.array([s.req.output_tokens for s in st], dtype=np.int64),
        "prefix_id": [s.req.prefix_id for s in st],
        "first_token_us": np.array([s.first_token_us for s in st], dtype=np.float64),
        "finish_us": np.array([s.finish_us for s in st], dtype=np.float64),
        "preemptions": np.array([s.preemptions for s in st], dtype=np.int64),
        "rejected": [s.rejected for s in st],
        **({"dp_rank": np.array(res.rank_of, dtype=np.int32)} if res.ranks else {}),  # the rank it was routed to
    }, handle, REQUESTS_SCHEMA)


def write_events(res: ServeResult, handle: BinaryIO, options: dict | None = None) -> None:
    """Every allocator event of the run (weights, KV tensors, eager steps' transients, segment
    events), in order: ``seq``, ``t_us`` (the step's start), ``action``, ``address``, ``size_bytes``,
    ``tensor``; graph-replayed steps have none."""
    from timeline.exporters.parquet_util import dictionary

    tr = res.alloc_trace
    names = sorted({e[4] for e in tr})
    code = {n: i for i, n in enumerate(names)}
    write_table({
        "device": np.zeros(len(tr), dtype=np.int32),
        "seq": np.arange(len(tr), dtype=np.int64),
        "t_us": np.array([e[3] for e in tr], dtype=np.float64),
        "action": dictionary([ACTIONS.index(e[0]) for e in tr], list(ACTIONS)),
        "address": np.array([e[1] for e in tr], dtype=np.int64),
        "size_bytes": np.array([e[2] for e in tr], dtype=np.int64),
        "tensor": dictionary([code[e[4]] for e in tr], names),
    }, handle, EVENTS_SCHEMA)


#: serve output name → (file name, writer)
SERVE_OUTPUTS = {"summary": None, "memory": ("memory.parquet", write_memory),
                 "requests": ("requests.parquet", write_requests)}
