"""``trace.json`` of a serving run: a Chrome trace for ui.perfetto.dev. One process (the
representative device), one track of engine steps (each slice names its tokens, requests and
whether it ran eagerly or replayed a CUDA graph), one track per request (queued → running → done),
and counters: allocated / reserved bytes, KV blocks used, requests running and waiting. Formats
only; deterministic (sorted keys, fixed float formatting)."""

from __future__ import annotations

import json
from typing import BinaryIO

from timeline.serve.run import ServeResult

FILENAME = "trace.json"
PID = 0


def events(res: ServeResult) -> list[dict]:
    """The representative device's process, or one process per DP rank (``pid`` = the rank) with
    its steps, counters and requests."""
    if not res.ranks:
        return _device(res, PID, res.sched.steps, res.memory, res.sched.states, "")
    out: list[dict] = []
    for rk in res.ranks:
        out += _device(res, rk.rank, rk.sched.steps, rk.memory, rk.sched.states, f", DP rank {rk.rank}")
    return out


def _device(res: ServeResult, pid: int, steps: list, mem: dict, states: list, label: str) -> list[dict]:
    out: list[dict] = [
        {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"device {pid} ({res.budget.engine}{label})"}},
        {"ph": "M", "pid": pid, "tid": 0, "name": "thread_name", "args": {"name": "engine steps"}},
    ]
    for k, step in enumerate(steps):
        kind = "decode" if step.decode_only else "prefill+decode"
        start, end = round(step.t_start_us, 3), round(step.t_end_us, 3)  # back to back: never overlapping
        out.append({"ph": "X", "pid": pid, "tid": 0, "name": f"{kind} {step.num_tokens} tok",
                    "ts": start, "dur": round(end - start, 3),
                    "args": {"tokens": step.num_tokens, "requests": step.num_reqs,
                             "temporary_bytes": int(mem["temporary_bytes"][k]),
                             "preempted": step.preempted}})
        t = round(step.t_start_us, 3)
        out.append({"ph": "C", "pid": pid, "name": "memory (bytes)", "ts": t,
                    "args": {"allocated": int(mem["allocated_bytes"][k]), "reserved": int(mem["reserved_bytes"][k])}})
        out.append({"ph": "C", "pid": pid, "name": "KV blocks", "ts": t,
                    "args": {"used": int(mem["kv_blocks_used"][k]), "free": int(mem["kv_blocks_free"][k])}})
        out.append({"ph": "C", "pid": pid, "name": "requests", "ts": t,
                    "args": {"running": step.running, "waiting": step.waiting}})
    for st in states:  # one async track per request: waiting until its first token, then decoding
        if st.rejected:
            out.append({"ph": "i", "pid": pid, "tid": 0, "s": "p", "name": f"request {st.req.rid} rejected",
                        "ts": round(st.req.arrival_us, 3), "args": {"reason": st.rejected}})
            continue
        rid = st.req.rid
        base = {"pid": pid, "cat": "request", "id": rid}
        out.append({**base, "ph": "b", "name": f"request {rid}", "ts": round(st.req.arrival_us, 3),
                    "args": {"prompt_tokens": st.req.prompt_tokens, "output_tokens": st.req.output_tokens,
                             "preemptions": st.preemptions}})
        out.append({**base, "ph": "e", "name": f"request {rid}", "ts": round(st.finish_us, 3)})
    return out


def write(res: ServeResult, handle: BinaryIO, options: dict | None = None) -> None:
    doc = {"traceEvents": events(res), "displayTimeUnit": "ms",
           "metadata": {"schema": "timeline.serve.trace/1"}}
    handle.write(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
