"""The compiled allocator core against the Python model, event for event.

Random alloc/free streams under random settings (max_split_size, rounding divisions, capacities
small enough to force the release-and-retry paths and OOMs) go through
:func:`timeline.alloc.batch.replay` on both cores, and through a plain
:class:`~timeline.alloc.caching.CachingAllocator` one call at a time: addresses, block sizes,
reserved bytes, segments, segment events, OOMs and the end state must agree. Then whole
simulated runs: the batch allocator pass against the event-by-event reference. Without the
extension built, the compiled half skips and says so.
"""

from __future__ import annotations

from array import array

import numpy as np
import pytest
from helpers_run import tiny_run
from hypothesis import given, settings
from hypothesis import strategies as st
from sources import plan_of

from timeline.alloc import AllocatorConfig, CachingAllocator
from timeline.alloc.batch import active_core, compiled_available, replay, replay_python
from timeline.cli.common import templates
from timeline.sim.memory import pair_index, run_allocator, run_allocator_events
from timeline.sim.simulate import simulate

MIB = 1 << 20
needs_compiled = pytest.mark.skipif(not compiled_available(), reason="the compiled core is not built "
                                    "(no C compiler at install time): only the Python model runs")

SIZES = st.one_of(st.integers(1, MIB), st.integers(MIB, 12 * MIB), st.integers(10 * MIB, 90 * MIB),
                  st.sampled_from([1, 512, 513, MIB, MIB + 1, 10 * MIB, 20 * MIB, 20 * MIB + 1]))
#: (size, which live block to free): size 0 frees, anything else allocates
STREAMS = st.lists(st.tuples(st.one_of(SIZES, st.just(0)), st.integers(0, 1000)), max_size=200)
CONFIGS = st.builds(lambda mss, divs, rounding: AllocatorConfig.from_options(
    max_split_size_mb=mss, roundup_power2_divisions=divs, max_non_split_rounding_mb=rounding),
    st.sampled_from([None, 32, 64]), st.sampled_from([0, 2, 4, {"1MB": 2, "64MB": 8, ">": 4}]),
    st.sampled_from([0, 20]))
CAPACITIES = st.sampled_from([None, 48 * MIB, 128 * MIB, 512 * MIB])


def _columns(stream: list[tuple[int, int]]) -> tuple[array, array]:
    """(size, pair) of a stream: a free takes one of the blocks live then."""
    size, pair, live = array("q"), array("q"), []
    for sz, k in stream:
        if sz:
            live.append(len(size))
            size.append(sz)
            pair.append(-1)
        elif live:
            size.append(0)
            pair.append(live.pop(k % len(live)))
    return size, pair


def _run(core: str, config, capacity, size, pair):
    cols = [array("q", bytes(8 * len(size))) for _ in range(4)]
    res = replay(config, capacity, size, pair, *cols, core=core)
    return res, [c.tolist() for c in cols]


@settings(max_examples=300, deadline=None)
@given(config=CONFIGS, capacity=CAPACITIES, stream=STREAMS)
def test_python_batch_is_the_model_one_call_at_a_time(config, capacity, stream):
    size, pair = _columns(stream)
    res, (block, reserved, address, _) = _run("python", config, capacity, size, pair)
    model = CachingAllocator(config, capacity_bytes=capacity)
    addrs: list[int] = []
    for i, p in enumerate(pair):
        addrs.append(model.malloc(size[i]) if p < 0 else addrs[p])
        if p >= 0:
            assert block[i] == -model.block_size(addrs[p])
            model.free(addrs[p])
        else:
            assert block[i] == model.block_size(addrs[i])
        assert (address[i], reserved[i]) == (addrs[i], model.reserved_bytes)
    assert res.end_segments == model.segments()
    model.check_invariants()


@needs_compiled
@settings(max_examples=500, deadline=None)
@given(config=CONFIGS, capacity=CAPACITIES, stream=STREAMS)
def test_compiled_core_matches_the_python_model(config, capacity, stream):
    size, pair = _columns(stream)
    ref, ref_cols = _run("python", config, capacity, size, pair)
    got, got_cols = _run("compiled", config, capacity, size, pair)
    assert got is not None, "the compiled core declined a stream the simulator can produce"
    assert got_cols == ref_cols
    assert got.segment_events == ref.segment_events
    assert got.ooms == ref.ooms
    assert got.end_segments == ref.end_segments


@needs_compiled
def test_compiled_core_declines_what_it_does_not_model():
    size, pair = array("q", [0]), array("q", [-1])  # a 0-byte request: address 0, no block
    assert _run("compiled", AllocatorConfig(), None, size, pair)[0] is None


@pytest.mark.parametrize("overrides", [
    {},
    {"max_split_size_mb": 64, "roundup_power2_divisions": 4, "capacity_gib": 0.02},
    {"capacity_gib": 0.01, "num_microbatches": 8},
])
@pytest.mark.parametrize("core", ["compiled", "python"])
def test_allocator_pass_matches_the_event_by_event_reference(core, overrides):
    if core == "compiled" and not compiled_available():
        pytest.skip("the compiled core is not built")
    run = tiny_run(pp=2, **overrides)
    sim = simulate(plan_of(run, templates()))
    for ev in sim.events:
        spec, cap = run.allocator, run.hardware.capacity_bytes
        got, ref = run_allocator(spec, cap, ev, sim.names, core=core), run_allocator_events(spec, cap, ev, sim.names)
        for col in ("block", "reserved", "address", "segment"):
            assert np.array_equal(getattr(got, col), getattr(ref, col)), col
        assert (got.ooms, got.segment_events, got.end_segments) == (ref.ooms, ref.segment_events, ref.end_segments)


def test_pairs_follow_the_live_keys():
    run = tiny_run(pp=2)
    ev = simulate(plan_of(run, templates())).events[0]
    pair = pair_index(ev)
    live: dict[tuple[int, int, int], int] = {}
    for i, (s, t, m, st_) in enumerate(zip(ev.sign.tolist(), ev.tensor.tolist(), ev.microbatch.tolist(),
                                           ev.stage.tolist(), strict=True)):
        if s > 0:
            live[(t, m, st_)] = i
            assert pair[i] == -1
        else:
            assert pair[i] == live.pop((t, m, st_))


def test_active_core_can_be_forced_to_python(monkeypatch):
    monkeypatch.setenv("TIMELINE_ALLOC_CORE", "python")
    assert active_core() == "python"
    monkeypatch.delenv("TIMELINE_ALLOC_CORE")
    assert active_core() == ("compiled" if compiled_available() else "python")


def test_replay_python_refuses_expandable_segments():
    with pytest.raises(ValueError, match="plain segments"):
        replay(AllocatorConfig(expandable_segments=True), None, array("q"), array("q"), *[array("q")] * 4)
    assert replay_python  # the reference stays importable for tools/bench_alloc.py


def test_version_names_the_active_core(monkeypatch):
    from timeline.cli import version_line

    monkeypatch.setenv("TIMELINE_ALLOC_CORE", "python")
    assert "(allocator core: python" in version_line()
    monkeypatch.delenv("TIMELINE_ALLOC_CORE")
    assert f"(allocator core: {active_core()}" in version_line()
