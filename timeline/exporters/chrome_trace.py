"""``trace.json`` (``trace.json.gz`` with ``gzip``): a Chrome trace for Perfetto and chrome://tracing.

Per simulated device one process (``pid = index + 1``), named ``rank R · stages … · represents
N`` and sorted by pipeline rank; per op stream one thread (compute, then tp/cp/ep/dp/pp);
ops as complete events (``X``) named by op with args ``layer``, ``microbatch``, ``stage``,
``phase`` (F/B/I/W, R for recompute, step) and ``allocated_bytes`` (requested bytes the op
allocates); one counter event ``memory`` per sample with keys requested, allocated, reserved
and one per category, in bytes (Perfetto shows tracks ``memory requested`` …); process-scoped
instants ``peak requested``, ``peak reserved`` and ``out of memory``.

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
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

from timeline.exporters.trace_common import (
    COUNTERS,
    counters,
    fmt_us,
    instants,
    op_allocated_bytes,
    process_name,
    threads,
)
from timeline.result.timeline import Timeline

FILENAME = "trace.json"
#: the CLI appends ``.gz`` to FILENAME when the ``gzip`` option is set
GZIP = True
COUNTER_NAME = "memory"
_FLUSH_LINES = 20000


def write(tl: Timeline, handle: BinaryIO, options: dict | None = None) -> None:
    options = options or {}
    if options.get("gzip"):
        with gzip.GzipFile(filename="", mode="wb", fileobj=handle, mtime=0) as gz:
            _write(tl, gz, options)
    else:
        _write(tl, handle, options)


def _write(tl: Timeline, out: BinaryIO, options: dict) -> None:
    max_samples = int(options.get("max_samples") or 0)
    out.write(b'{"traceEvents":[\n')
    first = True
    for d in range(tl.num_devices):
        buf: list[str] = []
        for line in device_events(tl, d, max_samples):
            buf.append(line)
            if len(buf) >= _FLUSH_LINES:
                first = _flush(out, buf, first)
        first = _flush(out, buf, first)
    out.write(b"\n]}\n")


def _flush(out: BinaryIO, lines: list[str], first: bool) -> bool:
    if lines:
        out.write((("" if first else ",\n") + ",\n".join(lines)).encode("utf-8"))
        lines.clear()
        return False
    return first


def _s(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def device_events(tl: Timeline, d: int, max_samples: int = 0) -> Iterator[str]:
    """The JSON objects (one per line) of device ``d``: metadata, slices, counters, instants."""
    dev = tl.sim.devices[d]
    pid = d + 1
    names = tl.sim.names
    yield f'{{"ph":"M","name":"process_name","pid":{pid},"args":{{"name":{_s(process_name(dev))}}}}}'
    yield f'{{"ph":"M","name":"process_sort_index","pid":{pid},"args":{{"sort_index":{dev.pp_rank}}}}}'
    ths = threads(tl, d)
    for th in ths:
        yield f'{{"ph":"M","name":"thread_name","pid":{pid},"tid":{th.tid},"args":{{"name":{_s(th.name)}}}}}'
        yield f'{{"ph":"M","name":"thread_sort_index","pid":{pid},"tid":{th.tid},"args":{{"sort_index":{th.tid}}}}}'
    ops = tl.sim.ops[d]
    allocated = op_allocated_bytes(tl, d).tolist()
    quoted = {}
    op_name, phase = np.asarray(ops.name).tolist(), np.asarray(ops.phase).tolist()
    mb, stage, layer = (np.asarray(ops.microbatch).tolist(), np.asarray(ops.stage).tolist(),
                        np.asarray(ops.layer).tolist())
    for th in ths:
        head = f'{{"ph":"X","pid":{pid},"tid":{th.tid},"ts":'
        for i, t0, dur in zip(th.index.tolist(), th.start_ns.tolist(), th.dur_ns.tolist(), strict=True):
            code = op_name[i]
            if code not in quoted:
                quoted[code] = _s(names[code])
            ph = names[phase[i]]
            args = [f'"phase":"{ph}"']
            if layer[i] >= 0:
                args.append(f'"layer":{layer[i]}')
            if mb[i] >= 0:
                args.append(f'"microbatch":{mb[i]}')
            if stage[i] >= 0:
                args.append(f'"stage":{stage[i]}')
            args.append(f'"allocated_bytes":{allocated[i]}')
            yield (f'{head}{fmt_us(t0)},"dur":{fmt_us(dur)},"name":{quoted[code]},"cat":"{ph}",'
                   f'"args":{{{",".join(args)}}}}}')
    c = counters(tl, d, max_samples)
    cols = [c.values[k].tolist() for k in COUNTERS]
    keys = [f'"{k}":' for k in COUNTERS]
    head = f'{{"ph":"C","pid":{pid},"name":"{COUNTER_NAME}","ts":'
    for j, t in enumerate(c.t_ns.tolist()):
        vals = ",".join(f"{k}{col[j]}" for k, col in zip(keys, cols, strict=True))
        yield f'{head}{fmt_us(t)},"args":{{{vals}}}}}'
    for inst in instants(tl, d):
        args = ",".join(f"{_s(k)}:{_s(v) if isinstance(v, str) else v}" for k, v in inst.args.items())
        yield (f'{{"ph":"i","s":"p","pid":{pid},"tid":1,"ts":{fmt_us(inst.t_ns)},"name":{_s(inst.name)},'
               f'"args":{{{args}}}}}')
