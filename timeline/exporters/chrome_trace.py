"""``trace.json`` (``trace.json.gz`` with ``gzip``): a Chrome trace for Perfetto and chrome://tracing.

Per simulated device one process (``pid`` = global rank + 1), named ``rank R · pp P · ×N``
(``process_sort_index`` = pipeline rank, which the UI does not read: it orders processes by its
own heuristic — use ``--format perfetto`` for a fixed order); per op stream one thread (compute,
then tp/cp/ep/dp/pp), then a thread ``peaks & OOMs``. On the compute thread one complete event
(``X``, cat ``action``) per action — ``0F5`` (stage, kind, micro-batch), ``step``, or an
overlapped pair ``0F5 & 31B2`` — args kind, microbatch, stage, iteration, the parent of the
compute ops it runs. Ops are complete events named by op, cat and arg ``phase`` (F/B/I/W, R for
recompute, step), args ``layer``, ``microbatch``, ``stage``, ``allocated_bytes`` (requested
bytes the op allocates); a comm-stream op adds ``action`` and ``iteration`` and ends a flow
(v2: ``bind_id``/``flow_in``) from its action's slice (``flow_out``). One counter event
``memory`` per sample, keys ``requested (GiB)``, ``allocated (GiB)``, ``reserved (GiB)``, one
per category the device holds and ``capacity (GiB)``, values GiB (bytes / 2**30, exact, written
in shortest round-trip form); Perfetto shows tracks ``memory allocated (GiB)`` …. Thread-scoped
instants on ``peaks & OOMs``: ``peak requested 92.74 GiB``, ``peak reserved 93.04 GiB``,
``out of memory +0.22 GiB``.

Timestamps are run-relative µs written with exactly three decimals from integer nanoseconds,
so Perfetto stores the same integers this module nested (see :mod:`trace_common`). Options:
``max_samples`` (counter samples per device, 0 = all; see :func:`trace_common.downsample`),
``gzip`` (deterministic: no name, mtime 0). The JSON is formatted by hand, a device at a time,
and streamed to the handle: no giant ``json.dumps``. Only the subset of the format that every
Perfetto version imports the same way is emitted (../shared/reference/perfetto.md §1.6).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from typing import BinaryIO

import numpy as np

from timeline.exporters.trace_common import (
    MARKS_NAME,
    Thread,
    actions,
    counters,
    flow_id,
    fmt_us,
    instants,
    op_allocated_bytes,
    pid_of,
    process_name,
    threads,
)
from timeline.result.timeline import Timeline

FILENAME = "trace.json"
#: the CLI appends ``.gz`` to FILENAME when the ``gzip`` option is set
GZIP = True
COUNTER_NAME = "memory"
#: counter values are GiB (bytes / 2**30, exact), named with it: ``memory allocated (GiB)``
UNIT = "GiB"
GIB = 2**30


def write(tl: Timeline, handle: BinaryIO, options: dict | None = None) -> None:
    options = options or {}
    if options.get("gzip"):
        with gzip.GzipFile(filename="", mode="wb", fileobj=handle, mtime=0) as gz:
            _write(tl, gz, options)
    else:
        _write(tl, handle, options)


def _write(tl: Timeline, out: BinaryIO | gzip.GzipFile, options: dict) -> None:
    max_samples = int(options.get("max_samples") or 0)
    out.write(b'{"traceEvents":[\n')
    first = True
    for d in range(tl.num_devices):
        lines = device_lines(tl, d, max_samples)
        if lines:
            out.write((("" if first else ",\n") + ",\n".join(lines)).encode("utf-8"))
            first = False
    out.write(b"\n]}\n")


def _s(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def device_events(tl: Timeline, d: int, max_samples: int = 0) -> Iterator[str]:
    """The JSON objects (one per line) of device ``d``: metadata, slices, counters, instants."""
    yield from device_lines(tl, d, max_samples)


def _lookup(codes: list[int], make: Callable[[int], str]) -> list[str]:
    """``make(code)`` for every code, each distinct code formatted once."""
    table = {c: make(c) for c in set(codes)}
    return list(map(table.__getitem__, codes))


def device_lines(tl: Timeline, d: int, max_samples: int = 0) -> list[str]:
    """:func:`device_events` as a list. Each kind of line is one %-template filled from whole
    columns (``map`` over ``zip``), every distinct name, phase, layer, micro-batch and stage
    formatted once: no per-event f-string or join."""
    dev = tl.devices[d]
    pid = pid_of(dev)
    names = tl.names
    lines = [f'{{"ph":"M","name":"process_name","pid":{pid},"args":{{"name":{_s(process_name(dev))}}}}}',
             f'{{"ph":"M","name":"process_sort_index","pid":{pid},"args":{{"sort_index":{dev.pp_rank}}}}}']
    acts = actions(tl, d)
    ths = threads(tl, d, acts)
    marks_tid = len(ths) + 1  # the peaks & OOMs thread follows the op streams
    for tid, name in [(th.tid, th.name) for th in ths] + [(marks_tid, MARKS_NAME)]:
        lines.append(f'{{"ph":"M","name":"thread_name","pid":{pid},"tid":{tid},"args":{{"name":{_s(name)}}}}}')
        lines.append(f'{{"ph":"M","name":"thread_sort_index","pid":{pid},"tid":{tid},'
                     f'"args":{{"sort_index":{tid}}}}}')
    ops = tl.ops[d]
    allocated = op_allocated_bytes(tl, d)
    op_name, phase = np.asarray(ops.name), np.asarray(ops.phase)
    mb, stage, layer = np.asarray(ops.microbatch), np.asarray(ops.stage), np.asarray(ops.layer)
    # an action slice leads a flow (id: its own) to every comm-stream op in it (flow v2 binding)
    flows_to = {int(k) for th in ths if th.name != "compute" for k in acts.of_op[th.index].tolist() if k >= 0}
    for th in ths:
        is_op = th.index >= 0
        for k, t0, dur in zip((-1 - th.index[~is_op]).tolist(), th.start_ns[~is_op].tolist(),
                              th.dur_ns[~is_op].tolist(), strict=True):  # action slices: the parents
            args = ",".join(f"{_s(key)}:{_s(v) if isinstance(v, str) else v}" for key, v in acts.args(k).items())
            out = f',"bind_id":{flow_id(pid, k)},"flow_out":true' if k in flows_to else ""
            lines.append(f'{{"ph":"X","pid":{pid},"tid":{th.tid},"ts":{fmt_us(t0)},"dur":{fmt_us(dur)},'
                         f'"name":{_s(acts.name(k))},"cat":"action"{out},"args":{{{args}}}}}')
        idx, t0, dur = th.index[is_op], th.start_ns[is_op], th.dur_ns[is_op]
        flow: list[str]
        if th.name == "compute":
            extra, m, st = [""] * len(idx), mb[idx].tolist(), stage[idx].tolist()
            flow = extra
        else:  # a comm op names the action it serves, and a flow leads to it from that action
            labels, its, m, st = acts.comm_fields(tl, d, idx)
            extra = [f',"action":{_s(a)},"iteration":{it}' if a else "" for a, it in zip(labels, its, strict=True)]
            flow = [f',"bind_id":{flow_id(pid, int(k))},"flow_in":true' if k >= 0 else ""
                    for k in acts.of_op[idx].tolist()]
        if len(idx) and (t0.min() < 0 or dur.min() < 0):  # fmt_us spells negatives
            lines += _slices_slow(tl, d, pid, th, idx, t0, dur, allocated, m, st, extra, flow)
            continue
        ph = _lookup(phase[idx].tolist(), names.__getitem__)
        tmpl = (f'{{"ph":"X","pid":{pid},"tid":{th.tid},"ts":%d.%03d,"dur":%d.%03d,"name":%s,"cat":"%s"%s,'
                f'"args":{{"phase":"%s"%s%s%s,"allocated_bytes":%d%s}}}}')
        lines += map(tmpl.__mod__, zip(
            (t0 // 1000).tolist(), (t0 % 1000).tolist(), (dur // 1000).tolist(), (dur % 1000).tolist(),
            _lookup(op_name[idx].tolist(), lambda c: _s(names[c])), ph, flow, ph,
            _lookup(layer[idx].tolist(), lambda v: f',"layer":{v}' if v >= 0 else ""),
            _lookup(m, lambda v: f',"microbatch":{v}' if v >= 0 else ""),
            _lookup(st, lambda v: f',"stage":{v}' if v >= 0 else ""),
            allocated[idx].tolist(), extra, strict=True))
    c = counters(tl, d, max_samples)
    cols = [_gib_texts(c.values[k]) for k in c.keys]
    vals = ",".join(f'"{k} ({UNIT})":%s' for k in c.keys)
    if len(c.t_ns) and c.t_ns.min() < 0:
        times = [fmt_us(t) for t in c.t_ns.tolist()]
        tmpl = f'{{"ph":"C","pid":{pid},"tid":1,"name":"{COUNTER_NAME}","ts":%s,"args":{{{vals}}}}}'
        lines += map(tmpl.__mod__, zip(times, *cols, strict=True))
    else:
        tmpl = f'{{"ph":"C","pid":{pid},"tid":1,"name":"{COUNTER_NAME}","ts":%d.%03d,"args":{{{vals}}}}}'
        lines += map(tmpl.__mod__, zip((c.t_ns // 1000).tolist(), (c.t_ns % 1000).tolist(), *cols, strict=True))
    for inst in instants(tl, d):
        args = ",".join(f"{_s(k)}:{_s(v) if isinstance(v, str) else v}" for k, v in inst.args.items())
        lines.append(f'{{"ph":"i","s":"t","pid":{pid},"tid":{marks_tid},"ts":{fmt_us(inst.t_ns)},'
                     f'"name":{_s(inst.name)},"args":{{{args}}}}}')
    return lines


def _gib_texts(values: np.ndarray) -> list[str]:
    """Each byte count as GiB in shortest round-trip form (exact: a power-of-two divisor), formatted
    once per distinct value — a column repeats few values (2.9 M samples, 93 k distinct on the
    shipped run)."""
    distinct, index = np.unique(values, return_inverse=True)
    texts = [repr(v) for v in (distinct / GIB).tolist()]
    return [texts[i] for i in index.tolist()]


def _slices_slow(tl: Timeline, d: int, pid: int, th: Thread, idx: np.ndarray, start: np.ndarray,
                 dur_ns: np.ndarray, allocated: np.ndarray, mb: list[int], stage: list[int],
                 extra: list[str], flow: list[str]) -> list[str]:
    """One thread's op slices line by line (only for negative times, which the templates do not spell)."""
    names, ops = tl.names, tl.ops[d]
    out = []
    head = f'{{"ph":"X","pid":{pid},"tid":{th.tid},"ts":'
    for j, (i, t0, dur) in enumerate(zip(idx.tolist(), start.tolist(), dur_ns.tolist(), strict=True)):
        ph = names[int(ops.phase[i])]
        args = [f'"phase":"{ph}"']
        for key, v in (("layer", int(ops.layer[i])), ("microbatch", mb[j]), ("stage", stage[j])):
            if v >= 0:
                args.append(f'"{key}":{v}')
        args.append(f'"allocated_bytes":{int(allocated[i])}{extra[j]}')
        out.append(f'{head}{fmt_us(t0)},"dur":{fmt_us(dur)},"name":{_s(names[int(ops.name[i])])},"cat":"{ph}"'
                   f'{flow[j]},"args":{{{",".join(args)}}}}}')
    return out
