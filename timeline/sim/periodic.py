"""Fast-forwarding the periodic part of a device's event stream, exactly.

In a pipeline's steady state a rank repeats the same few actions with the micro-batch advanced
by the same step (DualPipe's ``*0F15 15B67 *15F68 0B0``, then ``*0F16 15B68 *15F69 0B1`` …), so
its allocator sees the same requests period after period. The allocator models are
deterministic functions of their state and requests (:class:`timeline.alloc.caching.CachingAllocator`,
its port ``_ccore.c``): under plain segments (no expandable segments, one stream) the state
that decides every later request is the set of segments and of allocated blocks — free blocks
are the gaps between them, as ``free`` merges every free neighbour (``try_merge_blocks``) — and
the next segment address, which only a segment allocation moves. So if a period leaves the
allocator as it found it, up to the micro-batch step (same segments, no segment event, the same
blocks at the same addresses held by the same tensors one step on), and the next periods make
the same requests in the same order, they produce the same columns and leave the same state:
they are skipped, never assumed — a period that does not repeat is replayed.

Nothing is lost to a summary: a skipped period's memory equals the kept one before it, so no
peak is first reached there (every peak comes no later); it holds no OOM (an OOM is a segment
event); its net bytes per category are zero. Later frees of tensors a skipped period made are
paired with the kept period's tensors they correspond to (the pairing key's micro-batch is
shifted back by the skipped steps; :func:`pairing_microbatch`), and a tensor live at a reported
peak reports the micro-batch and allocation time it has in the full stream
(:func:`true_identity`).

Runs are found on the spans alone (:func:`find_runs`); what a device must check — the order of
its events in every skipped period, its allocator state — :mod:`timeline.sim.fast_device` does.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from timeline.sim.compiled import CompiledPhase
from timeline.sim.engine import Span

#: the longest period looked for, in actions (DualPipe's steady state repeats every 4)
MAX_PERIOD = 8
#: periods a run needs before it is worth checking: two kept, at least one skipped
MIN_PERIODS = 3
#: added to a pairing micro-batch so that a shifted one never meets −1 (no micro-batch)
KEY_OFFSET = 1 << 40


@dataclass(frozen=True, slots=True)
class Run:
    """``periods`` back-to-back copies of the ``length`` spans from index ``first``, each the
    previous one with every micro-batch advanced by ``step``."""

    first: int
    length: int
    periods: int
    step: int

    def period(self, k: int) -> range:
        """Span indices of period ``k``."""
        start = self.first + k * self.length
        return range(start, start + self.length)


def find_runs(keys: Sequence[Hashable], microbatches: Sequence[int], *, max_period: int = MAX_PERIOD,
              min_periods: int = MIN_PERIODS) -> list[Run]:
    """Maximal runs of ``keys`` repeating with a period of at most ``max_period`` items while
    ``microbatches`` advance by one step per period (items with micro-batch −1 never repeat),
    greedily from the start, the longest cover at each position (the shortest period on ties)."""
    n = len(keys)
    runs: list[Run] = []
    i = 0
    while i < n:
        best: Run | None = None
        for length in range(1, max_period + 1):
            if i + 2 * length > n:
                break
            step = microbatches[i + length] - microbatches[i]
            j = i
            while (j + length < n and microbatches[j] >= 0 and microbatches[j + length] >= 0
                   and keys[j + length] == keys[j] and microbatches[j + length] - microbatches[j] == step):
                j += 1
            periods = (j - i + length) // length
            if periods >= min_periods and (best is None or periods * length > best.periods * best.length):
                best = Run(first=i, length=length, periods=periods, step=step)
        if best is None:
            i += 1
        else:
            runs.append(best)
            i = best.first + best.periods * best.length
    return runs


def span_runs(spans: Sequence[Span]) -> list[Run]:
    """The periodic runs of one rank's spans: same iteration, stage, kind, stretch and overlap
    (so the same compiled phase laid out the same way), micro-batch one step on."""
    keys = [(s.iteration, s.stage, s.kind, s.scale, s.overlapped) for s in spans]
    mbs = [s.microbatch if s.kind not in ("step", "init") else -1 for s in spans]
    return find_runs(keys, mbs)


def pairing_microbatch(microbatch: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """The micro-batch an event's tensor is paired under: its own less the micro-batch steps
    skipped before it (``shift``, per event), offset so that −1 (no micro-batch) stays apart."""
    mb = microbatch.astype(np.int64)
    return np.where(mb >= 0, mb - shift + KEY_OFFSET, -1)


def period_order(phases: Sequence[CompiledPhase | None], periods: Sequence[Sequence[Span]],
                 gather: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per period of a run (its spans; ``phases``: the compiled phase of each span of a period,
    None for none): whether its events sort the same way as the last period's (the stable sort
    of their times, as the event log sorts them) and end no later than the next period begins
    (so periods never interleave); and the first and last of its event times."""
    times = [_period_times(phases, spans, gather) for spans in periods]
    ref = np.argsort(times[-1], kind="stable")
    up = np.diff(ref) > 0
    ok = np.zeros(len(periods), dtype=bool)
    lo = np.array([t.min() if len(t) else np.inf for t in times])
    hi = np.array([t.max() if len(t) else -np.inf for t in times])
    for k, t in enumerate(times):
        d = np.diff(t[ref])
        ok[k] = bool(np.all((d > 0) | ((d == 0) & up))) and (k + 1 == len(times) or hi[k] <= lo[k + 1])
    return ok, lo, hi


def _period_times(phases: Sequence[CompiledPhase | None], spans: Sequence[Span], gather: bool) -> np.ndarray:
    """The times of a period's events in push order (as :mod:`timeline.sim.expand` pushes them)."""
    out: list[np.ndarray] = []
    for ph, sp in zip(phases, spans, strict=True):
        if ph is None:
            continue
        if gather:
            out.append(np.array([sp.start_us]))
        offsets = ph.ev_offset if sp.scale == 1.0 else ph.ev_offset * sp.scale
        out.append(offsets + sp.start_us)
        if gather:
            out.append(np.array([sp.end_us]))
    return np.concatenate(out) if out else np.zeros(0)


def true_identity(spans: Sequence[Span], phases: dict[tuple[int, str], CompiledPhase], *, action: int,
                  position: int, microbatch: int, t_us: float, moved: int) -> tuple[int, float, int]:
    """(micro-batch, allocation time, span index) in the full stream of a tensor allocated by
    event ``position`` of span ``action`` whose counterpart is ``moved`` micro-batch steps on
    (0: itself): the same event of the span with the same iteration, stage and kind that works
    on that micro-batch."""
    if moved == 0 or microbatch < 0:
        return microbatch, t_us, action
    sp = spans[action]
    mb = microbatch + moved
    target = next((i for i, s in enumerate(spans) if s.iteration == sp.iteration and s.stage == sp.stage
                   and s.kind == sp.kind and s.microbatch == mb), None)
    if target is None:
        raise AssertionError(f"no span works on micro-batch {mb} of stage {sp.stage} {sp.kind}")
    tsp = spans[target]
    ph = phases[(tsp.stage, tsp.kind)]
    if position < 0:
        return mb, tsp.start_us, target
    if position >= len(ph.ev_offset):
        return mb, tsp.end_us, target
    off = ph.ev_offset[position:position + 1]
    return mb, float(((off if tsp.scale == 1.0 else off * tsp.scale) + tsp.start_us)[0]), target
