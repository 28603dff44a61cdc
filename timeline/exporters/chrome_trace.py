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
and streamed to the handle: no giant ``json.dumps``; the op slices and counter samples go through
one template each, filled from columns (:mod:`text_rows`, compiled where built), so no Python
string is made per op or sample. Only the subset of the format that every Perfetto version
imports the same way is emitted (../shared/reference/perfetto.md §1.6).
"""

from __future__ import annotations

import functools
import gzip
import json
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from timeline.exporters.text_rows import SLOT, Slot, render
from timeline.exporters.trace_common import (
    MARKS_NAME,
    Actions,
    action_label,
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
    body = _Body(out)
    for d in range(tl.num_devices):
        device_lines(body.write, tl, d, max_samples)
    out.write(b"\n]}\n")


#: what precedes every line but the first
SEP = ",\n"


class _Body:
    """The trace's lines, each after :data:`SEP` but the first."""

    def __init__(self, out: BinaryIO | gzip.GzipFile) -> None:
        self.out, self.first = out, True

    def write(self, chunk: bytes) -> None:
        if chunk:
            self.out.write(memoryview(chunk)[len(SEP):] if self.first else chunk)
            self.first = False


@functools.lru_cache(maxsize=1 << 14)
def _s(text: str) -> str:
    """``text`` as a JSON string (remembered: keys, labels and tensor names repeat line after line)."""
    return json.dumps(text, ensure_ascii=False)


def _lines(lines: list[str]) -> bytes:
    return "".join(SEP + line for line in lines).encode()


def _table(values: np.ndarray, make: Callable[[int], str]) -> Slot:
    """An ``s`` slot: ``make(v)`` of each value, each distinct value formatted once."""
    distinct, index = np.unique(np.asarray(values, dtype=np.int64), return_inverse=True)
    return Slot("s", index.reshape(-1), [make(v) for v in distinct.tolist()])


def device_lines(write: Callable[[bytes], Any], tl: Timeline, d: int, max_samples: int = 0) -> None:
    """The JSON objects of device ``d`` — metadata, slices, counters, instants — one per line,
    each line after :data:`SEP`, to ``write``. Each kind of line is one template filled from whole columns
    (:func:`text_rows.render`), every distinct name, phase, layer, micro-batch and stage
    formatted once; only the few metadata lines, action slices and instants are made one by one."""
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
    write(_lines(lines))
    ops = tl.ops[d]
    allocated = op_allocated_bytes(tl, d)
    op_name, phase = np.asarray(ops.name), np.asarray(ops.phase)
    mb, stage, layer = np.asarray(ops.microbatch), np.asarray(ops.stage), np.asarray(ops.layer)
    # an action slice leads a flow (id: its own) to every comm-stream op in it (flow v2 binding)
    flows_to = {int(k) for th in ths if th.name != "compute" for k in acts.of_op[th.index].tolist() if k >= 0}
    comm = _Comm(acts, pid)
    for th in ths:
        is_op = th.index >= 0
        lines = []
        for k, t0, dur in zip((-1 - th.index[~is_op]).tolist(), th.start_ns[~is_op].tolist(),
                              th.dur_ns[~is_op].tolist(), strict=True):  # action slices: the parents
            args = ",".join(f"{_s(key)}:{_s(v) if isinstance(v, str) else v}" for key, v in acts.args(k).items())
            out = f',"bind_id":{flow_id(pid, k)},"flow_out":true' if k in flows_to else ""
            lines.append(f'{{"ph":"X","pid":{pid},"tid":{th.tid},"ts":{fmt_us(t0)},"dur":{fmt_us(dur)},'
                         f'"name":{_s(acts.name(k))},"cat":"action"{out},"args":{{{args}}}}}')
        write(_lines(lines))
        idx = th.index[is_op]
        if th.name == "compute":
            m, st = mb[idx], stage[idx]
            extra = flow = Slot("s", np.zeros(len(idx), dtype=np.int64), [""])
        else:  # a comm op names the action it serves, and a flow leads to it from that action
            m, st, extra, flow = comm.fields(idx, mb[idx], stage[idx])
        ph = _table(phase[idx], names.__getitem__)
        template = (f'{{"ph":"X","pid":{pid},"tid":{th.tid},"ts":{SLOT},"dur":{SLOT},"name":{SLOT},"cat":"{SLOT}"'
                    f'{SLOT},"args":{{"phase":"{SLOT}"{SLOT}{SLOT}{SLOT},"allocated_bytes":{SLOT}{SLOT}}}}}')
        render(write, template, [
            Slot("u", th.start_ns[is_op]), Slot("u", th.dur_ns[is_op]),
            _table(op_name[idx], lambda c: _s(names[c])), ph, flow, ph,
            _table(layer[idx], lambda v: f',"layer":{v}' if v >= 0 else ""),
            _table(m, lambda v: f',"microbatch":{v}' if v >= 0 else ""),
            _table(st, lambda v: f',"stage":{v}' if v >= 0 else ""),
            Slot("d", allocated[idx]), extra])
    c = counters(tl, d, max_samples)
    vals = ",".join(f'"{k} ({UNIT})":{SLOT}' for k in c.keys)
    # values in GiB: bytes / 2**30 is exact, and repr() spells it in shortest round-trip form
    render(write, f'{{"ph":"C","pid":{pid},"tid":1,"name":"{COUNTER_NAME}","ts":{SLOT},"args":{{{vals}}}}}',
                 [Slot("u", c.t_ns), *(Slot("r", c.values[k] / GIB) for k in c.keys)])
    lines = []
    for inst in instants(tl, d):
        args = ",".join(f"{_s(k)}:{_s(v) if isinstance(v, str) else v}" for k, v in inst.args.items())
        lines.append(f'{{"ph":"i","s":"t","pid":{pid},"tid":{marks_tid},"ts":{fmt_us(inst.t_ns)},'
                     f'"name":{_s(inst.name)},"args":{{{args}}}}}')
    write(_lines(lines))


class _Comm:
    """What a comm-stream op's line adds for the action it runs in (``Actions.comm_fields``
    from tables): one row per action slice and half of a pair — label, iteration, micro-batch,
    stage — and per slice the flow it ends."""

    def __init__(self, acts: Actions, pid: int) -> None:
        self.acts = acts
        rows = [sp for group in acts.spans for sp in group]
        sizes = np.array([len(group) for group in acts.spans], dtype=np.int64)
        self.base, self.paired = np.cumsum(sizes) - sizes, sizes > 1
        self.mb = np.array([sp.microbatch for sp in rows], dtype=np.int64)
        self.stage = np.array([sp.stage for sp in rows], dtype=np.int64)
        labels = [action_label(sp) for sp in rows]
        # an op outside every action (index len(rows)) adds nothing
        self.extra = [f',"action":{_s(a)},"iteration":{sp.iteration}' if a else ""
                      for a, sp in zip(labels, rows, strict=True)] + [""]
        self.flow = [f',"bind_id":{flow_id(pid, k)},"flow_in":true' for k in range(len(acts.spans))] + [""]

    def fields(self, idx: np.ndarray, mb: np.ndarray, stage: np.ndarray) -> tuple[np.ndarray, np.ndarray, Slot, Slot]:
        """(micro-batch, stage, extra, flow) of the comm-stream ops ``idx``: the op's own micro-batch
        and stage, else its action's."""
        k = self.acts.of_op[idx]
        inside = k >= 0
        kk = np.where(inside, k, 0)
        row = self.base[kk] + np.where(self.paired[kk], self.acts.half[idx], 0) if len(self.base) else kk
        m = np.where(inside & (mb < 0), self.mb[row] if len(self.mb) else mb, mb)
        st = np.where(inside & (stage < 0), self.stage[row] if len(self.stage) else stage, stage)
        return (m, st, Slot("s", np.where(inside, row, len(self.extra) - 1), self.extra),
                Slot("s", np.where(inside, k, len(self.flow) - 1), self.flow))
