"""What the static bound reads of a pipeline schedule — per rank, the maximal in-flight vectors at
action boundaries and the action counts per (chunk, kind) — without building schedules of
thousands of micro-batches.

A plan on 2,048 GPUs meets micro-batch counts up to the global batch (15,360 at dp = 1), and
building and checking such a schedule takes seconds. The schedules this project generates are
periodic once past their warm-up: after ``T`` micro-batches every further period of ``P`` adds the
same actions in the same pattern, so the in-flight vectors stop growing and each (chunk, action
kind) count grows by a fixed step per period (DualPipe's cool-down splits a fixed number of
backwards into I and W whatever ``m``). The profile of ``m`` micro-batches is therefore read from
``m' = m − k·P`` (the largest ``k`` that keeps ``m' ≥ T``; ``m' ≡ m`` mod ``P`` keeps every
divisibility rule of :mod:`timeline.spec.schedule_rules`): the vectors of ``m'`` and the counts
extrapolated by ``k`` steps. The reduction is taken only when it proves itself on the schedule at
hand — the profiles of ``m'``, ``m' + P`` and ``m' + 2P`` have the same vectors and every count
steps by the same amount — and otherwise the whole schedule is built (GPipe, whose in-flight count
grows with ``m``, always is). ``tests/plan/test_schedule_profile.py`` holds the reduced profile
equal to the whole one over every generated kind and a grid of sizes.
"""

from __future__ import annotations

import math
from functools import lru_cache

from timeline.pipeline import generate

#: (per rank: the maximal in-flight vectors, per rank: counts per (chunk, kind)), overlapped
Profile = tuple[tuple[tuple[tuple[tuple[int, ...], ...], ...], tuple[dict[tuple[int, str], int], ...]], bool]


def period(kind: str, pp: int, vpp: int, group: int) -> int:
    """A multiple of the schedule's steady-state period in micro-batches: interleaved works in groups
    (``microbatch_group_size``, 0 = pp), DualPipe sends half each way; a common multiple of the
    candidates is always safe."""
    base = (group or pp) if kind == "interleaved" else 1
    return math.lcm(2, base, pp * vpp)


def warmup(pp: int, vpp: int, group: int) -> int:
    """Micro-batches after which the schedules' warm-up is over (every rule's minimum, 2·pp, and the
    interleaved group, with room for two periods)."""
    return 4 * max(pp * vpp, group, 1)


@lru_cache(maxsize=4096)
def full_profile(kind: str, pp: int, vpp: int, m: int, group: int) -> Profile:
    """The profile read off the whole built schedule of ``m`` micro-batches. Inside an overlapped
    F&B pair memory is in between, so only the boundary after the pair counts."""
    sched = generate(kind, pp=pp, vpp=vpp, num_microbatches=m, microbatch_group_size=group)  # counted, not run
    vectors: list[tuple[tuple[int, ...], ...]] = []
    counts: list[dict[tuple[int, str], int]] = []
    for r, row in enumerate(sched.actions):
        chunks = sched.stages_of_rank[r]
        index = {c: i for i, c in enumerate(chunks)}
        pairs = set(sched.overlapped[r]) if r < len(sched.overlapped) else set()
        held = [0] * len(chunks)
        best: set[tuple[int, ...]] = set()
        n: dict[tuple[int, str], int] = {}
        for pos, a in enumerate(row):
            n[(a.stage, a.kind)] = n.get((a.stage, a.kind), 0) + 1
            if a.kind == "F":
                held[index[a.stage]] += 1
            elif a.kind in ("B", "I"):
                held[index[a.stage]] -= 1
            if pos not in pairs:  # the first half of an overlapped pair ends no boundary
                best.add(tuple(held))
        maximal = tuple(v for v in best if not any(w != v and all(x >= y for x, y in zip(w, v, strict=True))
                                                   for w in best))
        vectors.append(tuple(sorted(maximal)))
        counts.append(n)
    return (tuple(vectors), tuple(counts)), bool(any(sched.overlapped))


def _extrapolated(points: tuple[Profile, ...], periods: int) -> Profile | None:
    """The profile ``periods`` periods past the first of ``points`` (profiles one period apart), if
    the points have the same vectors and keys and every count grows by the same step each period;
    else None."""
    (vectors, counts), overlapped = points[0]
    for (v, c), _ in points[1:]:
        if v != vectors or [set(r) for r in c] != [set(r) for r in counts]:
            return None
    out = []
    for r, rank in enumerate(counts):
        row = {}
        for key, n in rank.items():
            steps = {points[i + 1][0][1][r][key] - points[i][0][1][r][key] for i in range(len(points) - 1)}
            if len(steps) != 1:
                return None
            row[key] = n + periods * steps.pop()
        out.append(row)
    return (vectors, tuple(out)), overlapped


def _points(kind: str, pp: int, vpp: int, small: int, group: int) -> tuple[Profile, ...]:
    p = period(kind, pp, vpp, group)
    return tuple(full_profile(kind, pp, vpp, small + i * p, group) for i in range(3))


def _reduction(kind: str, pp: int, vpp: int, m: int, group: int) -> tuple[int, Profile] | None:
    """(``m'``, the profile of ``m`` extrapolated from it) when the schedule proves periodic past its
    warm-up, else None (GPipe, too few micro-batches to gain, or no steady step)."""
    p, t = period(kind, pp, vpp, group), warmup(pp, vpp, group)
    if kind == "gpipe" or m < t + 3 * p:
        return None
    small = t + (m - t) % p
    out = _extrapolated(_points(kind, pp, vpp, small, group), (m - small) // p)
    return None if out is None else (small, out)


def reduced_count(kind: str, pp: int, vpp: int, m: int, group: int) -> int | None:
    """The micro-batch count ``m'`` the profile of ``m`` is read from, or None when the whole
    schedule is built."""
    r = _reduction(kind, pp, vpp, m, group)
    return None if r is None else r[0]


@lru_cache(maxsize=4096)
def schedule_profile(kind: str, pp: int, vpp: int, m: int, group: int) -> Profile:
    """The profile of ``kind`` with ``m`` micro-batches: read from a reduced count when the schedule
    proves periodic there (module docstring), else from the whole schedule."""
    r = _reduction(kind, pp, vpp, m, group)
    return full_profile(kind, pp, vpp, m, group) if r is None else r[1]
