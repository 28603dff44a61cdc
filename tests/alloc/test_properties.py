"""Accounting identities of the caching model over random alloc/free sequences (hypothesis).

At every step: reserved = allocated + pending-free + cached bytes, blocks tile each segment
without overlap, requested ≤ allocated, free lists hold exactly the cached blocks — and the
ideal allocator never reserves more than the caching one.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from timeline.alloc import AllocatorConfig, CachingAllocator, IdealAllocator

MIB = 1 << 20

SIZES = st.one_of(
    st.integers(1, MIB),
    st.integers(MIB, 12 * MIB),
    st.integers(10 * MIB, 90 * MIB),
    st.sampled_from([1, 512, 513, MIB, MIB + 1, 10 * MIB, 20 * MIB, 20 * MIB + 1]),
)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("malloc"), SIZES, st.integers(0, 1)),
        st.tuples(st.just("free"), st.integers(0, 1000), st.just(0)),
        st.tuples(st.just("record"), st.integers(0, 1000), st.integers(0, 2)),
        st.tuples(st.just("complete"), st.integers(0, 2), st.just(0)),
        st.tuples(st.just("empty"), st.just(0), st.just(0)),
    ),
    max_size=120,
)
CONFIGS = st.builds(
    lambda exp, mss, divs: AllocatorConfig.from_options(expandable_segments=exp, max_split_size_mb=mss,
                                                        roundup_power2_divisions=divs),
    st.booleans(), st.sampled_from([None, 32, 64]), st.sampled_from([0, 4]),
)


@settings(max_examples=150, deadline=None)
@given(config=CONFIGS, capacity=st.sampled_from([None, 64 * MIB, 256 * MIB]), ops=OPS)
def test_identities_hold_at_every_step(config, capacity, ops):
    caching = CachingAllocator(config, capacity_bytes=capacity)
    ideal = IdealAllocator(capacity_bytes=capacity)
    live: list[tuple[int, int]] = []
    for op, x, stream in ops:
        if op == "malloc":
            live.append((caching.malloc(x, stream), ideal.malloc(x, stream)))
        elif op == "free" and live:
            c, i = live.pop(x % len(live))
            caching.free(c)
            ideal.free(i)
        elif op == "record" and live:
            caching.record_stream(live[x % len(live)][0], stream)
        elif op == "complete":
            caching.complete_stream_events(x)
        elif op == "empty":
            caching.empty_cache()
        caching.check_invariants()
        assert caching.requested_bytes <= caching.allocated_bytes <= caching.reserved_bytes
        assert ideal.reserved_bytes == ideal.requested_bytes == caching.requested_bytes
        assert ideal.reserved_bytes <= caching.reserved_bytes
    assert ideal.peak_reserved_bytes <= caching.peak_reserved_bytes
    for c, i in live:
        caching.free(c)
        ideal.free(i)
    caching.empty_cache()
    caching.check_invariants()
    assert caching.allocated_bytes == caching.requested_bytes == 0
    assert caching.reserved_bytes == 0 and caching.segments() == []
