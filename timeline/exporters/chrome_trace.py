"""``trace.json`` (``trace.json.gz`` with ``gzip``): a Chrome trace for Perfetto and chrome://tracing.

Per simulated device one process (``pid`` = global rank + 1), named ``rank R · pp P · ×N``
and sorted by pipeline rank; per op stream one thread (compute, then tp/cp/ep/dp/pp);
ops as complete events (``X``) named by op with args ``layer``, ``microbatch``, ``stage``,
``phase`` (F/B/I/W, R for recompute, step) and ``allocated_bytes`` (requested bytes the op
allocates); one counter event ``memory`` per sample with keys requested, allocated, reserved
and one per category, in bytes (Perfetto shows tracks ``memory requested`` …); process-scoped
instants ``peak requested 92.74 GiB``, ``peak reserved 93.04 GiB`` and ``out of memory +0.22 GiB``
(their bytes in the label). A device's counter keys are the totals, the categories it ever holds
and ``capacity``.

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
    Thread,
    counters,
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
    ths = threads(tl, d)
    for th in ths:
        lines.append(f'{{"ph":"M","name":"thread_name","pid":{pid},"tid":{th.tid},"args":{{"name":{_s(th.name)}}}}}')
        lines.append(f'{{"ph":"M","name":"thread_sort_index","pid":{pid},"tid":{th.tid},'
                     f'"args":{{"sort_index":{th.tid}}}}}')
    ops = tl.ops[d]
    allocated = op_allocated_bytes(tl, d)
    op_name, phase = np.asarray(ops.name), np.asarray(ops.phase)
    mb, stage, layer = np.asarray(ops.microbatch), np.asarray(ops.stage), np.asarray(ops.layer)
    for th in ths:
        idx = th.index
        if len(idx) and (th.start_ns.min() < 0 or th.dur_ns.min() < 0):  # fmt_us spells negatives
            lines += _slices_slow(tl, d, pid, th, allocated)
            continue
        ph = _lookup(phase[idx].tolist(), names.__getitem__)
        tmpl = (f'{{"ph":"X","pid":{pid},"tid":{th.tid},"ts":%d.%03d,"dur":%d.%03d,"name":%s,"cat":"%s",'
                f'"args":{{"phase":"%s"%s%s%s,"allocated_bytes":%d}}}}')
        t0, dur = th.start_ns, th.dur_ns
        lines += map(tmpl.__mod__, zip(
            (t0 // 1000).tolist(), (t0 % 1000).tolist(), (dur // 1000).tolist(), (dur % 1000).tolist(),
            _lookup(op_name[idx].tolist(), lambda c: _s(names[c])), ph, ph,
            _lookup(layer[idx].tolist(), lambda v: f',"layer":{v}' if v >= 0 else ""),
            _lookup(mb[idx].tolist(), lambda v: f',"microbatch":{v}' if v >= 0 else ""),
            _lookup(stage[idx].tolist(), lambda v: f',"stage":{v}' if v >= 0 else ""),
            allocated[idx].tolist(), strict=True))
    c = counters(tl, d, max_samples)
    cols = [c.values[k].tolist() for k in c.keys]
    vals = ",".join(f'"{k}":%d' for k in c.keys)
    if len(c.t_ns) and c.t_ns.min() < 0:
        times = [fmt_us(t) for t in c.t_ns.tolist()]
        tmpl = f'{{"ph":"C","pid":{pid},"tid":1,"name":"{COUNTER_NAME}","ts":%s,"args":{{{vals}}}}}'
        lines += map(tmpl.__mod__, zip(times, *cols, strict=True))
    else:
        tmpl = f'{{"ph":"C","pid":{pid},"tid":1,"name":"{COUNTER_NAME}","ts":%d.%03d,"args":{{{vals}}}}}'
        lines += map(tmpl.__mod__, zip((c.t_ns // 1000).tolist(), (c.t_ns % 1000).tolist(), *cols, strict=True))
    for inst in instants(tl, d):
        args = ",".join(f"{_s(k)}:{_s(v) if isinstance(v, str) else v}" for k, v in inst.args.items())
        lines.append(f'{{"ph":"i","s":"p","pid":{pid},"tid":1,"ts":{fmt_us(inst.t_ns)},"name":{_s(inst.name)},'
                     f'"args":{{{args}}}}}')
    return lines


def _slices_slow(tl: Timeline, d: int, pid: int, th: Thread, allocated: np.ndarray) -> list[str]:
    """One thread's slices line by line (only for negative times, which the templates do not spell)."""
    names, ops = tl.names, tl.ops[d]
    out = []
    head = f'{{"ph":"X","pid":{pid},"tid":{th.tid},"ts":'
    for i, t0, dur in zip(th.index.tolist(), th.start_ns.tolist(), th.dur_ns.tolist(), strict=True):
        ph = names[int(ops.phase[i])]
        args = [f'"phase":"{ph}"']
        for key, v in (("layer", int(ops.layer[i])), ("microbatch", int(ops.microbatch[i])),
                       ("stage", int(ops.stage[i]))):
            if v >= 0:
                args.append(f'"{key}":{v}')
        args.append(f'"allocated_bytes":{int(allocated[i])}')
        out.append(f'{head}{fmt_us(t0)},"dur":{fmt_us(dur)},"name":{_s(names[int(ops.name[i])])},"cat":"{ph}",'
                   f'"args":{{{",".join(args)}}}}}')
    return out
