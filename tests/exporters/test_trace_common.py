

def test_nest_returns_durations_in_the_slices_own_order():
    """Slices given out of time order keep their own durations (three slices: a rotation, not a swap)."""
    import numpy as np

    from timeline.exporters.trace_common import nest

    order, dur, clipped = nest(np.array([20, 0, 10]), np.array([21, 5, 13]))
    assert order.tolist() == [1, 2, 0] and dur.tolist() == [1, 5, 3] and clipped == 0
    order, dur, clipped = nest(np.array([20, 0, 10, 1]), np.array([21, 5, 13, 9]))  # 1–9 overlaps 0–5
    assert dur.tolist() == [1, 5, 3, 4] and clipped == 1
