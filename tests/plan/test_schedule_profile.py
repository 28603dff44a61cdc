"""The bound's schedule profile read from a reduced micro-batch count equals the profile of the
whole schedule, for every generated kind over a grid of pipeline sizes and counts."""

from __future__ import annotations

import pytest

from timeline.plan.schedule_profile import full_profile, period, reduced_count, schedule_profile, warmup
from timeline.spec.schedule_rules import schedule_problems

CASES = [("1f1b", 1), ("zb-h1", 1), ("dualpipe", 1), ("interleaved", 2), ("interleaved", 3), ("zbv", 2),
         ("dualpipev", 2)]


def _counts(kind: str, pp: int, vpp: int, group: int) -> list[int]:
    """Valid micro-batch counts past the reduction's threshold (and a few more)."""
    lo = warmup(pp, vpp, group) + 3 * period(kind, pp, vpp, group)
    return [m for m in range(lo, lo + 2 * period(kind, pp, vpp, group) + 3)
            if not schedule_problems(kind, pp=pp, vpp=vpp, num_microbatches=m, microbatch_group_size=group)]


@pytest.mark.parametrize(("kind", "vpp"), CASES)
@pytest.mark.parametrize("pp", [1, 2, 3, 4, 6])
def test_reduced_profile_equals_the_whole_schedule(kind, vpp, pp):
    if kind == "dualpipe" and pp % 2:
        pytest.skip("dualpipe needs an even pp")
    groups = [0, pp + 1] if kind == "interleaved" and pp > 1 else [0]
    reduced = 0
    for group in groups:
        for m in _counts(kind, pp, vpp, group)[::3]:
            small = reduced_count(kind, pp, vpp, m, group)
            reduced += small is not None and small < m
            assert schedule_profile(kind, pp, vpp, m, group) == full_profile(kind, pp, vpp, m, group), (group, m)
    assert reduced, "the grid must exercise the reduction"


def test_gpipe_and_small_counts_build_the_whole_schedule():
    assert reduced_count("gpipe", 4, 1, 400, 0) is None  # its in-flight count grows with m
    assert reduced_count("1f1b", 4, 1, 20, 0) is None  # below warm-up + two periods


def test_large_counts_are_read_from_a_small_one():
    """15,360 micro-batches on pp = 16 (DeepSeek-V3 at dp = 1): read from fewer than 200."""
    small = reduced_count("dualpipev", 16, 2, 15_360, 0)
    assert small is not None and small < 200
    (_, counts), overlapped = schedule_profile("dualpipev", 16, 2, 15_360, 0)
    full_f = {key: n for key, n in counts[0].items() if key[1] == "F"}
    assert overlapped and set(full_f.values()) == {15_360}  # every micro-batch passes both chunks of rank 0
