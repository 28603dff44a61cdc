"""The event log's noted chunks (``_Log.push_phase``, ``_Log.push_timed``) lay out exactly what pushing
each chunk's columns would: the same events in the same order, ties at equal times in push order."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline.sim.expand import _ACTION_COLUMNS, _EVENT_COLUMNS, _Log

DTYPES = [dt for _, dt in _EVENT_COLUMNS]


def phase(rng: np.random.Generator, n: int) -> tuple[np.ndarray, ...]:
    """A phase's columns (offsets on a coarse grid, so that times tie)."""
    offsets = np.sort(rng.integers(0, 4, n)).astype(np.float64)
    return (offsets, rng.choice([-1, 1], n).astype(np.int8), rng.integers(0, 1 << 40, n).astype(np.int64),
            rng.integers(0, 8, n).astype(np.int8), rng.integers(0, 50, n).astype(np.int32),
            rng.integers(-1, 20, n).astype(np.int32))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), steps=st.lists(st.sampled_from(["push", "phase", "timed"]), min_size=1,
                                                       max_size=40))
def test_noted_chunks_are_the_pushed_ones(seed, steps):
    rng = np.random.default_rng(seed)
    phases = [phase(rng, int(rng.integers(1, 6))) for _ in range(3)]
    noted, pushed = _Log(), _Log()
    for k, step in enumerate(steps):
        scalars = (int(rng.integers(-1, 4)), int(rng.integers(-1, 3)), k, int(rng.integers(0, 2)))
        p = int(rng.integers(0, len(phases)))
        cols = phases[p]
        if step == "phase":
            start, scale = float(rng.integers(0, 6)), float(rng.choice([1.0, 0.5, 2.0]))
            noted.push_phase(("p", p), cols, start, scale, *scalars)
            pushed.push(cols[0] * scale + start, *cols[1:], *scalars)
        elif step == "timed":
            times = rng.integers(0, 8, len(cols[0])).astype(np.float64)
            noted.push_timed(("t", p), cols[1:], times, *scalars)
            pushed.push(times, *cols[1:], *scalars)
        else:
            n = int(rng.integers(1, 4))
            own = [rng.integers(0, 8, n).astype(dt) for dt in DTYPES]
            stream = int(rng.integers(0, 2))  # the noted chunks run on stream 0, a pushed one on any
            noted.push(*own, *scalars, stream)
            pushed.push(*own, *scalars, stream)
    a, b = noted.events(), pushed.events()
    for name in a.__slots__:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    # and the pushed log is its chunks concatenated, then stably sorted by time
    rows = {k: np.concatenate(pushed.arrays[k]) for k, _ in _EVENT_COLUMNS}
    lengths = np.array(pushed.lengths)
    for j, (k, dt) in enumerate(_ACTION_COLUMNS):
        rows[k] = np.repeat(np.array([s[j] for s in pushed.scalars], dtype=dt), lengths)
    order = np.argsort(rows["t_us"], kind="stable")
    for name in b.__slots__:
        want = rows[name][order]
        got = getattr(b, name)
        assert got.dtype == want.dtype and np.array_equal(got, want), name
