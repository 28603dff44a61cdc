"""One device's event stream with its verified periodic stretches skipped, and its allocator
pass over what is kept (the method and why it is exact: :mod:`timeline.sim.periodic`).

For each run of a rank's spans (:func:`timeline.sim.periodic.span_runs`) the device keeps the
first ``c`` periods (``c`` ≥ 2) and skips the rest when

1. every period from ``c − 1`` on lays its events out in the same order, never interleaving
   with the next period or with a static-state event (checked on the times the event log
   would hold, :func:`timeline.sim.periodic.period_order`);
2. in the replay of the kept stream, period ``c − 1`` has no segment event and leaves the
   allocated blocks (address, block bytes, requested bytes, category) held by the same tensors
   as it found them, each one micro-batch step on.

A run failing (2) is retried keeping twice as many periods, then replayed whole; the stream is
replayed until every skip it makes is verified in that same replay.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from timeline.placement.devices import StaticDevice
from timeline.sim.compiled import CompiledPhase
from timeline.sim.engine import Span
from timeline.sim.expand import kept_events
from timeline.sim.memory import AllocatorPass, batch_replayable, pairing, run_allocator_paired
from timeline.sim.output import DeviceEvents, Names
from timeline.sim.periodic import Run, pairing_microbatch, period_order
from timeline.sim.plan import Compiled
from timeline.sim.static_state import DeviceState, resolve
from timeline.spec.run import AllocatorSpec, TrainingSpec

#: replays of one device's kept stream before every unverified run is replayed whole
MAX_ATTEMPTS = 4
#: the allocator pass of an attempt that never reached the allocator
_NO_PASS = AllocatorPass(*(np.zeros(0, dtype=np.int64) for _ in range(4)), [], [], [])


@dataclass(slots=True)
class FastDevice:
    """A device's kept events (true labels), each event's position among its action's events,
    the allocator pass over them (its ``pair`` pairs under the shifted key), the micro-batch
    steps skipped before each event, and what was skipped."""

    events: DeviceEvents
    positions: np.ndarray
    alloc: AllocatorPass
    shift: np.ndarray
    skipped_events: int
    skipped_spans: frozenset[int]


def fast_device(tr: TrainingSpec, dev: StaticDevice, state: DeviceState, spans: list[Span], compiled: Compiled,
                names: Names, runs: list[Run], spec: AllocatorSpec, capacity_bytes: int,
                core: str | None = None) -> FastDevice | None:
    """Device ``dev``'s kept stream and allocator pass, or None where this path does not apply
    (another allocator, per-parameter static state, a stream the batch replay cannot take): the
    caller then replays the whole stream."""
    if not batch_replayable(spec) or state.per_parameter:
        return None
    gather = state.gathered_bytes > 0
    orders = [_order(run, spans, compiled, gather, state) for run in runs]
    keep = [_first_keep(run, order, 2) for run, order in zip(runs, orders, strict=True)]
    attempts = 0
    while True:
        out = _attempt(tr, dev, state, spans, compiled, names, runs, keep, spec, capacity_bytes, core, gather)
        if out is None:
            return None
        fd, failed = out
        if not failed:
            return fd
        attempts += 1
        for r in failed:  # keep twice as many periods; past the last attempt, keep the run whole
            keep[r] = runs[r].periods if attempts >= MAX_ATTEMPTS else _first_keep(runs[r], orders[r], 2 * keep[r])


def _order(run: Run, spans: list[Span], compiled: Compiled, gather: bool,
           state: DeviceState) -> np.ndarray:
    """Per period of ``run``, whether skipping from the period after it on keeps the event order
    (condition 1 of the module docstring, for that period onwards)."""
    phases = [compiled.get((spans[j].stage, spans[j].kind)) for j in run.period(0)]
    if not _balanced(phases):  # a period that leaves tensors behind never repeats the allocator's state
        return np.zeros(run.periods, dtype=bool)
    ok, lo, hi = period_order(phases, [[spans[j] for j in run.period(k)] for k in range(run.periods)], gather)
    nxt = run.first + run.periods * run.length
    if nxt < len(spans) and hi[-1] > spans[nxt].start_us:
        ok[-1] = False
    first_bwd = min((s.start_us for s in spans if s.kind in ("B", "I")), default=0.0)
    first_step = min((s.start_us for s in spans if s.kind == "step"), default=0.0)
    static = np.array([t for t, _, _, _ in resolve(state.allocs, first_bwd, first_step)], dtype=np.float64)
    # from period k on every period keeps its order; a static event inside the skipped time breaks it
    suffix = np.logical_and.accumulate(ok[::-1])[::-1]
    for k in range(run.periods - 1):
        if suffix[k] and len(static) and np.any((static >= lo[k + 1]) & (static <= hi[-1])):
            suffix[k] = False
    return suffix


def _balanced(phases: list[CompiledPhase | None]) -> bool:
    """Whether a period's phases free as many tensors, and bytes of each category, as they allocate."""
    sign = np.concatenate([ph.ev_sign for ph in phases if ph is not None] or [np.zeros(0, dtype=np.int8)])
    size = np.concatenate([ph.ev_size for ph in phases if ph is not None] or [np.zeros(0, dtype=np.int64)])
    cat = np.concatenate([ph.ev_cat for ph in phases if ph is not None] or [np.zeros(0, dtype=np.int8)])
    signed = sign.astype(np.int64) * size
    return int(sign.astype(np.int64).sum()) == 0 and all(int(signed[cat == c].sum()) == 0 for c in np.unique(cat))


def _first_keep(run: Run, suffix: np.ndarray, least: int) -> int:
    """The fewest periods to keep, at least ``least``, such that the periods from the last kept
    one on keep their order; ``run.periods`` (skip nothing) if none."""
    for c in range(max(least, 2), run.periods):
        if suffix[c - 1]:
            return c
    return run.periods


def _attempt(tr: TrainingSpec, dev: StaticDevice, state: DeviceState, spans: list[Span], compiled: Compiled,
             names: Names, runs: list[Run], keep: list[int], spec: AllocatorSpec, capacity_bytes: int,
             core: str | None, gather: bool) -> tuple[FastDevice, list[int]] | None:
    skipped: set[int] = set()
    span_shift = np.zeros(len(spans), dtype=np.int64)
    skipped_events = 0
    for run, c in zip(runs, keep, strict=True):
        if c >= run.periods:
            continue
        for k in range(c, run.periods):
            for j in run.period(k):
                skipped.add(j)
                ph = compiled.get((spans[j].stage, spans[j].kind))
                skipped_events += (len(ph.ev_offset) if ph is not None else 0) + (2 if gather else 0)
        span_shift[run.first + run.periods * run.length:] += (run.periods - c) * run.step
    frozen = frozenset(skipped)
    ev, pos = kept_events(tr, dev, state, spans, compiled, names, frozen)
    act = ev.action
    shift = np.where(act >= 0, span_shift[np.maximum(act, 0)], 0)
    key = pairing_microbatch(ev.microbatch, shift)
    pair = pairing(replace(ev, microbatch=key))
    if not isinstance(pair, np.ndarray):  # a free left without its alloc: the last skip before it failed
        a = int(ev.action[pair])
        blame = [r for r, (run, c) in enumerate(zip(runs, keep, strict=True))
                 if c < run.periods and run.first + run.periods * run.length <= a]
        if not blame:
            return None
        return FastDevice(events=ev, positions=pos, alloc=_NO_PASS, shift=shift, skipped_events=skipped_events,
                          skipped_spans=frozen), blame[-1:]
    res = run_allocator_paired(spec, capacity_bytes, ev, pair, names.items, core)
    if res is None:
        return None
    n = len(act)
    last = np.full(len(spans), -1, dtype=np.int64)
    has = act >= 0
    np.maximum.at(last, act[has], np.flatnonzero(has))
    free_of = np.full(n, n, dtype=np.int64)  # the free ending each alloc (n: never)
    frees = np.flatnonzero(pair >= 0)
    free_of[pair[frees]] = frees
    seg_at = np.array([e[0] for e in res.segment_events], dtype=np.int64)
    failed = []
    for r, (run, c) in enumerate(zip(runs, keep, strict=True)):
        if c >= run.periods:
            continue
        q1 = int(max(last[j] for j in run.period(c - 2)))
        q2 = int(max(last[j] for j in run.period(c - 1)))
        if np.any((seg_at > q1) & (seg_at <= q2)) or not _same_blocks(ev, key, res, free_of, q1, q2, run.step):
            failed.append(r)
    return FastDevice(events=ev, positions=pos, alloc=res, shift=shift, skipped_events=skipped_events,
                      skipped_spans=frozen), failed


def _same_blocks(ev: DeviceEvents, key: np.ndarray, res: AllocatorPass, free_of: np.ndarray, q1: int, q2: int,
                 step: int) -> bool:
    """Whether the blocks allocated just after event ``q2`` are those just after ``q1``, each
    held by the same tensor one micro-batch ``step`` on (same address, block, request, category)."""
    def live(q: int, moved: int) -> np.ndarray:
        allocs = np.flatnonzero(ev.sign[:q + 1] > 0)
        idx = allocs[free_of[allocs] > q]
        k = key[idx]
        cols = (ev.tensor[idx].astype(np.int64), np.where(k >= 0, k + moved, k), ev.stage[idx].astype(np.int64),
                res.address[idx], res.block[idx], ev.size[idx], ev.cat[idx].astype(np.int64))
        table = np.stack(cols)
        return table[:, np.lexsort(table[::-1])]

    a, b = live(q1, step), live(q2, 0)
    return a.shape == b.shape and bool(np.array_equal(a, b))
