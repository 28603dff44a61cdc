"""reserved_gap: the free space inside segments at the reserved peak, named by what last occupied
it, sums exactly to reserved − allocated (plain and expandable segments)."""

from __future__ import annotations

import pytest
from helpers_run import tiny_run

from timeline.result.build import build_timeline
from timeline.result.reserved_gap import reserved_gap


@pytest.mark.parametrize("expandable", [False, True])
def test_gap_is_exactly_reserved_minus_allocated(expandable):
    tl = build_timeline(tiny_run(pp=2, layers=4, expandable_segments=expandable))
    for d in range(tl.num_devices):
        g = reserved_gap(tl, d)
        pk = tl.peak(d)
        assert g["reserved_bytes"] == pk.reserved_bytes
        # at the reserved peak (Peak.fragmentation_bytes is taken at the requested peak)
        assert g["gap_bytes"] == pk.reserved_bytes - g["allocated_bytes"] == g["explained_bytes"]
        assert sum(g["by_last_occupant"].values()) == g["gap_bytes"]
        assert all(gap["bytes"] > 0 for gap in g["gaps"])


def test_ideal_allocator_has_no_gap():
    tl = build_timeline(tiny_run(allocator="ideal"))
    assert reserved_gap(tl, 0)["gap_bytes"] == 0
