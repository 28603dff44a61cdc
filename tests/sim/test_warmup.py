"""``[training] warmup_iterations``: simulated first, left out of every reported peak and of
``per_iteration``; their state and cache history stay."""

from __future__ import annotations

from helpers_run import tiny_run

from timeline.result.build import build_timeline


def test_warmup_iterations_are_simulated_but_not_reported():
    cold = build_timeline(tiny_run(pp=2, iterations=3, profile="hf"))
    warm = build_timeline(tiny_run(pp=2, iterations=2, warmup_iterations=1, profile="hf"))
    for d in range(cold.num_devices):
        per_cold, per_warm = cold.iteration_peaks(d), warm.iteration_peaks(d)
        assert [p["iteration"] for p in per_cold] == [0, 1, 2]
        assert [p["iteration"] for p in per_warm] == [1, 2]
        # the same three iterations ran; the warm run reports the last two of them
        assert per_warm == per_cold[1:]
        assert warm.peak(d).allocated_bytes == max(p["peak_allocated_bytes"] for p in per_cold[1:])
        assert warm.peak(d).requested_time_us >= warm.sim.report_start_us > 0
    # hf: gradients and moments are created in iteration 0, so the first iteration differs
    assert per_cold[0] != per_cold[1]
