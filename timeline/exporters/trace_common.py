"""What both trace formats (Chrome JSON and Perfetto protobuf) show, computed once.

Devices become processes numbered and named by their global rank (``pid`` = rank + 1, as pid 0
is reserved by the trace processor; ``rank R · pp P · ×N``) in global-rank order; each op stream
becomes a thread (compute first, then the communication streams); the timed actions become slices
on the compute thread, parents of the ops they run (:func:`actions`); op slices get
integer-nanosecond bounds that nest strictly per thread; the memory counters are
the Timeline's series with unchanged rows dropped and, on request, capped per device by a
downsampling that keeps every peak; instants mark each device's peaks and OOMs. This module
formats nothing and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from timeline.exporters import compiled
from timeline.result.categories import CATEGORIES
from timeline.result.timeline import DeviceInfo, Span, Timeline

#: thread order of the streams a template names; any other stream follows, alphabetically
STREAM_ORDER = ("compute", "tp", "cp", "ep", "dp", "pp")
#: every counter series a device may have, in track order: the three totals, one per category,
#: then the capacity (a device shows the categories it ever holds: no always-empty track)
COUNTERS: tuple[str, ...] = ("requested", "allocated", "reserved", *CATEGORIES, "capacity")
TOTALS = ("requested", "allocated", "reserved")
#: the track (protobuf) or thread (JSON) of each device's peak and OOM instants
MARKS_NAME = "peaks & OOMs"


def flow_id(pid: int, i: int) -> int:
    """The id of the flow from op ``i``'s action slice to that (comm-stream) op, unique in a trace."""
    return pid << 32 | i


def process_name(dev: DeviceInfo) -> str:
    """``rank R · pp P · ×N`` — the global rank first, as every other view numbers devices; the
    stages follow where they are not just the pipeline rank's own (V-shaped and DualPipe
    schedules): ``rank 0 · pp 0 · stages 0,31 · ×64``. A replayed snapshot's devices have no
    pipeline: ``rank R``."""
    if not dev.stages:
        return f"rank {dev.device}" + (f" · ×{dev.represents}" if dev.represents != 1 else "")
    stages = "" if tuple(dev.stages) == (dev.pp_rank,) else f" · stages {','.join(str(s) for s in dev.stages)}"
    return f"rank {dev.device} · pp {dev.pp_rank}{stages} · ×{dev.represents}"


def pid_of(dev: DeviceInfo) -> int:
    """The trace process id of a device: its global rank + 1 (pid 0 is the trace processor's)."""
    return dev.device + 1


def to_ns(t_us: np.ndarray) -> np.ndarray:
    """Run-relative µs → integer ns (what Perfetto stores; 3 decimals of a µs timestamp)."""
    return np.rint(np.asarray(t_us, dtype=np.float64) * 1000.0).astype(np.int64)


def fmt_us(ns: int) -> str:
    """An integer ns as a fixed 3-decimal µs literal (exact: no float formatting involved)."""
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


def nest(start_ns: np.ndarray, end_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(order, duration, clipped) so that the slices of one thread nest strictly.

    ``order`` sorts by (start, longer first) — the parent first, as Perfetto decides equal
    starts. A slice that starts inside an open one and ends after it (a partial overlap, which
    Perfetto drops) is clipped to end with it; ``clipped`` counts them (0 for simulator output,
    whose ops run back to back, unless float rounding made ends cross).
    """
    dur = np.maximum(end_ns - start_ns, 0)
    order = np.lexsort((-dur, start_ns))
    s, d = start_ns[order], dur[order].copy()
    clipped = 0
    if len(s) and bool(np.all(s[1:] >= (s + d)[:-1])):  # back to back: nothing nests, nothing to clip
        out = np.empty_like(d)
        out[order] = d  # back to the slices' own order
        return order, out, clipped
    writer = compiled.writers()
    if writer is not None:  # the same loop, compiled
        ends = np.ascontiguousarray(s + d, dtype=np.int64)
        clipped = writer.clip_nested(np.ascontiguousarray(s, dtype=np.int64), ends)
        d = ends - s
    else:
        stack: list[int] = []  # end times of the open slices
        for i, (t0, t1) in enumerate(zip(s.tolist(), (s + d).tolist(), strict=True)):
            while stack and stack[-1] <= t0:
                stack.pop()
            if stack and t1 > stack[-1]:
                t1 = stack[-1]
                d[i] = t1 - t0
                clipped += 1
            stack.append(t1)
    out = np.empty_like(d)
    out[order] = d  # back to the slices' own order
    return order, out, clipped


@dataclass(slots=True)
class Thread:
    tid: int
    name: str
    #: op indices of this stream in output order (parents first); on the compute thread an entry
    #: ``−1 − k`` is action slice ``k`` of :func:`actions`, the parent of the ops it contains
    index: np.ndarray
    start_ns: np.ndarray
    dur_ns: np.ndarray
    clipped: int


def action_label(sp: Span) -> str:
    """``1F14`` (stage, kind, micro-batch), or ``step`` / ``init`` — as ``explain`` names actions."""
    return sp.kind if sp.kind in ("step", "init") else f"{sp.stage}{sp.kind}{sp.microbatch}"


@dataclass(slots=True)
class Actions:
    """Device ``d``'s timed actions as slices: one per action, or one per overlapped F&B pair
    (``0F5 & 31B2``, both halves spanning the same time), with the action's own bounds."""

    start_ns: np.ndarray
    dur_ns: np.ndarray
    spans: list[list[Span]]  # the action (or the pair's two halves) of each slice
    of_op: np.ndarray  # per op of the device: the slice it runs in (−1: none)
    half: np.ndarray  # per op: 1 where it belongs to a pair's backward half (its phase is not F)

    def name(self, k: int) -> str:
        return " & ".join(action_label(sp) for sp in self.spans[k])

    def args(self, k: int) -> dict[str, int | str]:
        group = self.spans[k]
        out: dict[str, int | str] = {}
        for sp in group:
            suffix = "" if len(group) == 1 else f"_{sp.kind}"
            out["kind" + suffix] = sp.kind
            if sp.microbatch >= 0:
                out["microbatch" + suffix] = sp.microbatch
            if sp.stage >= 0:
                out["stage" + suffix] = sp.stage
        out["iteration"] = group[0].iteration
        return out

    def comm_fields(self, tl: Timeline, d: int, index: np.ndarray) -> tuple[list[str], list[int], list[int], list[int]]:
        """For the comm-stream ops ``index`` in an action: the action label, its iteration, and
        the op's micro-batch and stage (the action's where the op has none); ("", −1, …) outside one."""
        ops = tl.ops[d]
        labels, its, mbs, sts = [], [], [], []
        for i, m, st in zip(index.tolist(), ops.microbatch[index].tolist(), ops.stage[index].tolist(), strict=True):
            if self.of_op[i] < 0:
                labels.append("")
                its.append(-1)
                mbs.append(m)
                sts.append(st)
                continue
            sp = self.of(i)
            labels.append(action_label(sp))
            its.append(sp.iteration)
            mbs.append(m if m >= 0 else sp.microbatch)
            sts.append(st if st >= 0 else sp.stage)
        return labels, its, mbs, sts

    def of(self, i: int) -> Span:
        """The action op ``i`` runs in (the pair's half matching its phase)."""
        group = self.spans[int(self.of_op[i])]
        return group[int(self.half[i])] if len(group) > 1 else group[0]


def actions(tl: Timeline, d: int) -> Actions:
    """The action slices of device ``d`` and the slice each op runs in: the last one starting
    at or before the op's start and ending at or after it (ops of a replayed snapshot: none)."""
    ops, names = tl.ops[d], tl.names
    groups: list[list[Span]] = []
    for sp in sorted(tl.spans[d], key=lambda s: (s.start_us, s.end_us, s.overlapped)):
        g = groups[-1] if groups else None
        if g is not None and sp.overlapped and (g[0].start_us, g[0].end_us) == (sp.start_us, sp.end_us):
            g.append(sp)
        else:
            groups.append([sp])
    n = len(ops.t_start_us)
    start = to_ns(np.array([g[0].start_us for g in groups], dtype=np.float64))
    end = to_ns(np.array([g[0].end_us for g in groups], dtype=np.float64))
    op_start = to_ns(ops.t_start_us)
    k = np.searchsorted(start, op_start, side="right") - 1 if len(groups) else np.full(n, -1)
    of_op = np.where((k >= 0) & (op_start <= end[np.maximum(k, 0)] if len(groups) else False), k, -1)
    phase = np.asarray(ops.phase)
    forward = [c for c in np.unique(phase).tolist() if names[c] == "F"]
    half = (~np.isin(phase, forward)).astype(np.int64) if n else np.zeros(0, np.int64)
    # an op whose end rounds past its action's is clipped to it by nest() (counted in clipped);
    # widening the action instead would clip the next action to a sliver
    return Actions(start_ns=start, dur_ns=end - start, spans=groups, of_op=of_op.astype(np.int64), half=half)


def threads(tl: Timeline, d: int, acts: Actions | None = None) -> list[Thread]:
    """One thread per op stream of device ``d``, tids from 1 in :data:`STREAM_ORDER`; the compute
    thread also holds the action slices of ``acts`` (:func:`actions`)."""
    ops = tl.ops[d]
    names = tl.names
    if not len(ops.t_start_us):
        return []
    codes = sorted(np.unique(np.asarray(ops.stream)).tolist(), key=lambda c: _stream_key(names[c]))
    start, end = to_ns(ops.t_start_us), to_ns(ops.t_end_us)
    out = []
    for tid, code in enumerate(codes, start=1):
        idx = np.flatnonzero(ops.stream == code)
        s, e = start[idx], end[idx]
        if acts is not None and names[code] == "compute" and len(acts.start_ns):
            # actions first: an action and an op with the same bounds nest the op inside (stable sort)
            idx = np.concatenate([-1 - np.arange(len(acts.start_ns)), idx])
            s = np.concatenate([acts.start_ns, s])
            e = np.concatenate([acts.start_ns + acts.dur_ns, e])
        order, dur, clipped = nest(s, e)
        out.append(Thread(tid=tid, name=names[code], index=idx[order], start_ns=s[order],
                          dur_ns=dur[order], clipped=clipped))
    return out


def _stream_key(name: str) -> tuple[int, str]:
    return (STREAM_ORDER.index(name) if name in STREAM_ORDER else len(STREAM_ORDER), name)


def op_allocated_bytes(tl: Timeline, d: int) -> np.ndarray:
    """Requested bytes each op allocates (an op allocates its outputs at its start, so its
    allocations are the events with its name at its start time)."""
    ev, ops = tl.events(d), tl.ops[d]
    n_names = max(len(tl.names), 1)
    mask = (ev.sign > 0) & (ev.op >= 0)
    ev_key = to_ns(ev.t_us[mask]) * n_names + ev.op[mask]
    op_key = to_ns(ops.t_start_us) * n_names + np.asarray(ops.name, dtype=np.int64)
    if not len(ev_key):
        return np.zeros(len(op_key), dtype=np.int64)
    keys, inverse = np.unique(ev_key, return_inverse=True)
    sums = np.bincount(inverse, weights=ev.size[mask].astype(np.float64)).astype(np.int64)
    pos = np.clip(np.searchsorted(keys, op_key), 0, len(keys) - 1)
    return np.where(keys[pos] == op_key, sums[pos], 0)


@dataclass(slots=True)
class Counters:
    t_ns: np.ndarray
    values: dict[str, np.ndarray]  # keys → int64 bytes, rows aligned with t_ns
    source_rows: np.ndarray  # indices into Timeline.series(d) rows
    keys: tuple[str, ...] = COUNTERS  # this device's series, in COUNTERS order


def counters(tl: Timeline, d: int, max_samples: int = 0) -> Counters:
    """Device ``d``'s memory series as counter samples: the last row of each nanosecond, rows
    equal to the previous one dropped (the first and last rows always kept), then, if
    ``max_samples`` > 0 and more remain, :func:`downsample`. Every kept row is an exact row of
    ``Timeline.series(d)`` — the last one at its nanosecond."""
    s = tl.series(d)
    cols = {"requested": s.requested, "allocated": s.allocated, "reserved": s.reserved,
            **{c: s.by_category[c] for c in CATEGORIES if s.by_category[c].any()}}
    if tl.meta.capacity_bytes is not None:  # a replayed snapshot has no capacity
        cols["capacity"] = np.full(len(s.t_us), tl.meta.capacity_bytes, dtype=np.int64)
    t_ns = to_ns(s.t_us)
    # distinct µs floats can share a nanosecond: keep the last row of each nanosecond
    rows = np.flatnonzero(np.append(t_ns[1:] != t_ns[:-1], True)) if len(t_ns) else np.zeros(0, np.int64)
    keep = np.zeros(len(rows), dtype=bool)
    if len(rows):
        keep[0] = keep[-1] = True
        for v in cols.values():
            w = v[rows]
            keep[1:] |= w[1:] != w[:-1]
    rows = rows[keep]
    if max_samples and len(rows) > max_samples:
        rows = rows[downsample(np.stack([cols[k][rows] for k in ("requested", "allocated", "reserved")]),
                               max_samples)]
    keys = tuple(k for k in COUNTERS if k in cols)
    return Counters(t_ns=t_ns[rows], values={k: np.asarray(cols[k][rows], dtype=np.int64) for k in keys},
                    source_rows=rows, keys=keys)


def downsample(series: np.ndarray, max_samples: int) -> np.ndarray:
    """Indices (sorted) of at most ``max_samples`` rows of ``series`` (k × n) that keep the peaks.

    The rows are cut into ``(max_samples − 1) // (k + 1)`` equal buckets; each bucket keeps its
    row where each series peaks and its last row (the level after the bucket), and the first row
    is kept. So every series' global maximum survives, each bucket's local maxima survive, and
    nothing is averaged: a kept sample is a true value at a true time. (With ``max_samples``
    under ``k + 2`` one bucket is used and up to ``k + 2`` rows come back.)
    """
    k, n = series.shape
    buckets = max(1, min(n, (max_samples - 1) // (k + 1)))
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    keep = {0, n - 1}
    for a, b in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
        if b <= a:
            continue
        keep.add(b - 1)
        for row in series[:, a:b]:
            keep.add(a + int(np.argmax(row)))
    return np.array(sorted(keep), dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Instant:
    t_ns: int
    name: str
    args: dict[str, int | str]


def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"


def instants(tl: Timeline, d: int) -> list[Instant]:
    """The device's requested and reserved peaks, then each OOM, in time order; each named with
    its bytes (``peak reserved 93.04 GiB``, ``out of memory +0.22 GiB``) so the labels read
    apart when several pile up at one instant."""
    pk = tl.peak(d)
    out = [Instant(int(to_ns(np.array([pk.requested_time_us]))[0]), f"peak requested {_gib(pk.requested_bytes)}",
                   {"requested_bytes": pk.requested_bytes, "fragmentation_bytes": pk.fragmentation_bytes,
                    **{f"{c}_bytes": int(v) for c, v in pk.breakdown_bytes.items()}}),
           Instant(int(to_ns(np.array([pk.reserved_time_us]))[0]), f"peak reserved {_gib(pk.reserved_bytes)}",
                   {"reserved_bytes": pk.reserved_bytes})]
    ooms = tl.memory[d].oom
    oom_ns = to_ns(np.array([oom["t_us"] for oom in ooms], dtype=np.float64)).tolist()
    for oom, t_ns in zip(ooms, oom_ns, strict=True):
        out.append(Instant(t_ns,
                           f"out of memory +{_gib(int(oom['request_bytes']))}",
                           {"request_bytes": int(oom["request_bytes"]), "tensor": str(oom["tensor"]),
                            "reserved_bytes": int(oom["reserved_bytes"]),
                            "capacity_bytes": int(oom["capacity_bytes"])}))
    return sorted(out, key=lambda i: (i.t_ns, i.name))
