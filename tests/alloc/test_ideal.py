"""The ideal allocator: reserved == allocated == requested, a lower bound on the caching model."""

from __future__ import annotations

import pytest

from timeline.alloc import CachingAllocator, IdealAllocator, create_allocator
from timeline.errors import UserError

MIB = 1 << 20


def test_exact_bytes_no_rounding():
    a = IdealAllocator()
    x = a.malloc(1000)
    y = a.malloc(3 * MIB + 1)
    assert a.reserved_bytes == a.allocated_bytes == a.requested_bytes == 1000 + 3 * MIB + 1
    a.free(x)
    assert a.reserved_bytes == 3 * MIB + 1
    a.free(y)
    assert a.stats().peak_reserved_bytes == 1000 + 3 * MIB + 1 and a.reserved_bytes == 0


def test_zero_bytes_is_null_and_bad_free_raises():
    a = IdealAllocator()
    assert a.malloc(0) == 0 and a.free(0)
    with pytest.raises(ValueError):
        a.free(12345)


def test_oom_virtual_or_none():
    a = IdealAllocator(capacity_bytes=10 * MIB)
    assert a.try_malloc(11 * MIB) is None and a.num_ooms == 1
    assert a.malloc(11 * MIB) and a.last_oom and a.reserved_bytes == 11 * MIB


def test_record_stream_does_not_delay():
    a = IdealAllocator()
    x = a.malloc(MIB)
    a.record_stream(x, 3)
    assert a.free(x) and a.reserved_bytes == 0


def test_lower_bound_of_caching_on_a_fragmenting_sequence():
    ideal, caching = IdealAllocator(), CachingAllocator()
    handles = []
    for i in range(50):
        size = (i % 7 + 1) * 3 * MIB + 123
        handles.append((ideal.malloc(size), caching.malloc(size)))
        if i % 3 == 0:
            hi, hc = handles.pop(0)
            ideal.free(hi)
            caching.free(hc)
        assert ideal.reserved_bytes <= caching.reserved_bytes
    assert ideal.stats().peak_reserved_bytes <= caching.stats().peak_reserved_bytes


def test_factory():
    assert isinstance(create_allocator("ideal"), IdealAllocator)
    assert isinstance(create_allocator("caching"), CachingAllocator)
    with pytest.raises(UserError):
        create_allocator("buddy")
