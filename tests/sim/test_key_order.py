"""The allocator's pairing order (``sim/memory.py: _key_order``) is the stable sort of the events by
(tensor, micro-batch, stage) — whether it sorts composite keys (the event index in their low bits) or,
where the index does not fit beside the key, falls back to a stable argsort of the keys."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline.sim.memory import _key_order
from timeline.sim.output import DeviceEvents


def events(tensor: np.ndarray, mb: np.ndarray, stage: np.ndarray) -> DeviceEvents:
    n = len(tensor)
    zeros = np.zeros(n)
    return DeviceEvents(t_us=zeros, sign=np.ones(n, dtype=np.int8), size=np.ones(n, dtype=np.int64),
                        cat=np.zeros(n, dtype=np.int8), tensor=tensor.astype(np.int32), op=np.zeros(n, dtype=np.int32),
                        microbatch=mb.astype(np.int32), stage=stage.astype(np.int16),
                        action=np.zeros(n, dtype=np.int32), stream=np.zeros(n, dtype=np.int8),
                        iteration=np.zeros(n, dtype=np.int32))


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300), wide=st.booleans())
def test_key_order_is_the_stable_sort(seed, n, wide):
    rng = np.random.default_rng(seed)
    # ``wide``: keys spread so far that the index does not fit beside them (the stable argsort)
    hi = 2**31 - 1 if wide else 6
    tensor = rng.integers(0, hi, n)
    mb, stage = rng.integers(-1, 4 if not wide else 30_000, n), rng.integers(-1, 3 if not wide else 30_000, n)
    ev = events(tensor, mb, stage)
    order, key = _key_order(ev)
    want = np.lexsort((np.arange(n), ev.stage, ev.microbatch, ev.tensor))
    assert np.array_equal(order, want)
    if key is not None:  # the keys come back in that order, nondecreasing
        assert len(key) == n and bool((np.diff(key) >= 0).all())
