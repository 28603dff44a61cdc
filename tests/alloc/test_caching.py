"""Rules of the caching allocator model, one reference rule per test (allocator.md §1-§8)."""

from __future__ import annotations

import pytest

from timeline.alloc import AllocatorConfig, CachingAllocator, allocation_size, round_size
from timeline.alloc.restore import restore_segment
from timeline.errors import UserError

MIB = 1 << 20


def _alloc(config: AllocatorConfig | None = None, **kw) -> tuple[CachingAllocator, list[tuple[str, int, int, int]]]:
    events: list[tuple[str, int, int, int]] = []
    a = CachingAllocator(config, listener=lambda *e: events.append(e), **kw)
    return a, events


def test_round_size_512_and_power2_divisions():
    plain = AllocatorConfig()
    assert [round_size(s, plain) for s in (1, 511, 512, 513, 1200)] == [512, 512, 512, 1024, 1536]
    four = AllocatorConfig.from_options(roundup_power2_divisions=4)
    assert round_size(1200 * MIB, four) == 1280 * MIB  # next quarter of [1 GiB, 2 GiB)
    assert round_size(1024 * MIB, four) == 1024 * MIB  # powers of two unchanged
    assert round_size(1200, four) == 1536  # ≤ 512·d: plain rounding


def test_allocation_size_segments():
    assert allocation_size(512) == 2 * MIB
    assert allocation_size(MIB) == 2 * MIB
    assert allocation_size(MIB + 512) == 20 * MIB
    assert allocation_size(10 * MIB) == 10 * MIB
    assert allocation_size(10 * MIB + 512) == 12 * MIB


def test_small_pool_splits_front_first():
    a, events = _alloc()
    x = a.malloc(1000)
    y = a.malloc(1000)
    assert y == x + 1024
    assert events == [("segment_alloc", x, 2 * MIB, 0)]
    assert a.reserved_bytes == 2 * MIB and a.allocated_bytes == 2048 and a.requested_bytes == 2000


def test_large_split_needs_more_than_1mib_remaining():
    a, _ = _alloc()
    x = a.malloc(19 * MIB)  # 20 MiB segment, remainder exactly 1 MiB: not split
    assert a.block_size(x) == 20 * MIB and a.allocated_bytes == 20 * MIB
    a.free(x)
    y = a.malloc(18 * MIB)  # the cached 20 MiB block, remainder 2 MiB: split
    assert y == x and a.block_size(y) == 18 * MIB
    assert a.malloc(1536 * 1024) == y + 18 * MIB  # a 1.5 MiB (large) request takes the remainder


def test_best_fit_smallest_then_lowest_address_and_merge():
    a, events = _alloc()
    blocks = [a.malloc(2 * MIB) for _ in range(9)]  # one 20 MiB segment, 2 MiB slices (+2 MiB tail)
    assert len(events) == 1
    a.free(blocks[1])
    a.free(blocks[5])
    assert a.malloc(2 * MIB) == blocks[1]  # equal sizes: lowest address
    a.free(blocks[6])  # merges with 5: 4 MiB free
    assert a.malloc(3 * MIB) == blocks[5]
    a.check_invariants()


def test_streams_have_disjoint_caches():
    a, events = _alloc()
    x = a.malloc(4 * MIB, stream=0)
    a.free(x)
    y = a.malloc(4 * MIB, stream=1)
    assert y != x and len(events) == 2
    a.check_invariants()


def test_a_private_pool_keeps_its_cached_blocks_through_a_release():
    """A stream standing for a CUDA graph's private pool: ``release_cached_blocks`` (here ``empty_cache``)
    frees the general pools' cached segments, not the pool's while its graphs live."""
    events: list = []
    a = CachingAllocator(private_streams=frozenset({1}), listener=lambda *e: events.append(e))
    pool, general = a.malloc(4 * MIB, stream=1), a.malloc(4 * MIB, stream=0)
    a.free(pool)
    a.free(general)
    a.empty_cache()
    assert [e[0] for e in events] == ["segment_alloc", "segment_alloc", "segment_free"]
    assert events[-1][1] == general and a.reserved_bytes == 20 * MIB and a.allocated_bytes == 0  # the pool's segment
    assert a.malloc(4 * MIB, stream=0) != pool  # eager requests never take the pool's blocks
    a.check_invariants()


def test_max_split_size_filters_and_no_split():
    cfg = AllocatorConfig.from_options(max_split_size_mb=64)
    a, events = _alloc(cfg)
    big = a.malloc(100 * MIB)
    a.free(big)
    small = a.malloc(30 * MIB)  # < max_split: never takes an oversize block
    assert small != big and len(events) == 2
    again = a.malloc(90 * MIB)  # oversize request: block < request + 20 MiB is reused, unsplit
    assert again == big and a.block_size(again) == 100 * MIB
    a.free(again)
    assert a.malloc(70 * MIB) != big  # 100 ≥ 70 + 20: rejected


def test_max_split_size_must_exceed_20mib():
    with pytest.raises(UserError):
        AllocatorConfig.from_options(max_split_size_mb=20)


def test_release_available_cached_blocks_with_max_split():
    cfg = AllocatorConfig.from_options(max_split_size_mb=64)
    a, events = _alloc(cfg, capacity_bytes=300 * MIB)
    x = a.malloc(200 * MIB)
    a.free(x)
    y = a.malloc(150 * MIB)  # 200 ≥ 150 + 20: not reused; cudaMalloc fails; the oversize block is released
    assert [e[0] for e in events] == ["segment_alloc", "segment_free", "segment_alloc"]
    assert a.num_alloc_retries == 0 and a.reserved_bytes == 150 * MIB and y


def test_free_all_cached_and_retry():
    a, events = _alloc(capacity_bytes=40 * MIB)
    x = a.malloc(15 * MIB)  # 16 MiB segment
    small = a.malloc(1000)  # 2 MiB small segment stays in use
    a.free(x)
    a.malloc(30 * MIB)  # 16 + 2 + 30 > 40: release the cached 16 MiB segment, retry
    assert a.num_alloc_retries == 1 and a.num_ooms == 0
    assert [e[0] for e in events] == ["segment_alloc", "segment_alloc", "segment_free", "segment_alloc"]
    assert small and a.reserved_bytes == 32 * MIB


def test_oom_goes_virtual_or_returns_none():
    a, events = _alloc(capacity_bytes=100 * MIB)
    assert a.try_malloc(200 * MIB) is None
    assert a.num_ooms == 1 and a.last_oom and a.reserved_bytes == 0
    addr = a.malloc(200 * MIB)
    assert addr and a.num_ooms == 2 and a.reserved_bytes == 200 * MIB  # beyond capacity, by 100 MiB
    assert ("oom", 0, 200 * MIB, 0) in events
    a.malloc(1000)
    assert not a.last_oom or a.num_ooms == 3


def test_record_stream_delays_free_until_event_and_next_malloc():
    a, _ = _alloc()
    x = a.malloc(4 * MIB)
    a.record_stream(x, 7)
    assert a.free(x) is False
    assert a.allocated_bytes == 0 and a.stats().active_bytes == 4 * MIB
    y = a.malloc(4 * MIB)  # event not complete: x is not reusable
    assert y != x
    a.free(y)
    a.complete_stream_events(7)
    assert a.malloc(4 * MIB) == x  # process_events at the start of malloc freed x (lower address)
    a.check_invariants()


def test_empty_cache_releases_only_unsplit_segments():
    a, events = _alloc()
    x = a.malloc(4 * MIB)
    y = a.malloc(4 * MIB)
    z = a.malloc(30 * MIB)
    a.free(x)
    a.free(z)
    a.empty_cache()
    assert [e[0] for e in events].count("segment_free") == 1  # z's segment; x's is split (y lives)
    assert a.reserved_bytes == 20 * MIB
    a.free(y)
    a.empty_cache()
    assert a.reserved_bytes == 0 and a.segments() == []


def test_expandable_maps_pages_for_the_rounded_request():
    cfg = AllocatorConfig(expandable_segments=True)
    a, events = _alloc(cfg)
    x = a.malloc(1000)
    assert events[-1][0] == "segment_map" and events[-1][2] == 2 * MIB
    y = a.malloc(30 * MIB)  # 30 MiB → two 20 MiB pages
    assert events[-1][2] == 40 * MIB and a.reserved_bytes == 42 * MIB
    z = a.malloc(12 * MIB)  # fits the 10 MiB tail + one more page, contiguous
    assert z == y + 30 * MIB and events[-1][2] == 20 * MIB
    assert len(a.segments()) == 2  # small range + one contiguous large range
    a.free(y)
    a.free(z)
    a.empty_cache()
    assert a.reserved_bytes == 2 * MIB and x
    assert [e[0] for e in events].count("segment_unmap") == 1
    a.check_invariants()


def test_expandable_split_at_512_in_large_pool():
    a, _ = _alloc(AllocatorConfig(expandable_segments=True))
    x = a.malloc(19 * MIB + 512)
    assert a.block_size(x) == 19 * MIB + 512
    assert a.malloc(2 * MIB) == x + 19 * MIB + 512


def test_config_parse_pytorch_string():
    cfg = AllocatorConfig.parse("expandable_segments:True,max_split_size_mb:128,"
                                "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]")
    assert cfg.expandable_segments and cfg.max_split_size_bytes == 128 * MIB
    assert cfg.roundup_power2_divisions[:9] == (1,) * 9
    assert cfg.roundup_power2_divisions[9] == 2 and cfg.roundup_power2_divisions[10] == 4
    assert cfg.roundup_power2_divisions[11:] == (8,) * 5


def test_restore_segment_then_free_merges():
    a, _ = _alloc()
    base = 1 << 40
    restore_segment(a, base, 20 * MIB, 0, False, [(base + 4 * MIB, 4 * MIB, 4 * MIB - 100)])
    assert a.reserved_bytes == 20 * MIB and a.allocated_bytes == 4 * MIB
    assert a.malloc(3 * MIB) == base
    a.free(base + 4 * MIB)
    a.check_invariants()
    assert len(a.segments()[0].blocks) == 2
