"""Allocator models: PyTorch's CUDA caching allocator, an ideal lower bound, snapshot replay.

``CachingAllocator`` reproduces ``c10/cuda/CUDACachingAllocator.cpp`` (v2.6) decision by
decision; ``IdealAllocator`` packs perfectly; ``replay_snapshot`` checks the former against real
``torch.cuda.memory._dump_snapshot`` traces. Imports only the stdlib and ``timeline.errors``.
"""

from timeline.alloc.caching import AllocatorStats, CachingAllocator, SegmentView
from timeline.alloc.config import AllocatorConfig, allocation_size, round_size
from timeline.alloc.ideal import IdealAllocator
from timeline.alloc.protocol import KINDS, Allocator, create_allocator
from timeline.alloc.replay import DeviceReplay, replay_report, replay_snapshot

__all__ = [
    "KINDS",
    "Allocator",
    "AllocatorConfig",
    "AllocatorStats",
    "CachingAllocator",
    "DeviceReplay",
    "IdealAllocator",
    "SegmentView",
    "allocation_size",
    "create_allocator",
    "replay_report",
    "replay_snapshot",
    "round_size",
]
