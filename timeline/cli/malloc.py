"""The command-line process keeps the memory it frees, for the arrays it allocates next.

glibc hands a freed block of 128 KiB or more back to the kernel (``munmap``, or trimming the
heap's top), so the next array of that size is fresh memory whose every page faults in on first
touch; a run allocates and frees column-sized arrays per device, per phase and per exporter. On a
virtual machine a page fault costs several µs: on the shipped DeepSeek-V3 run (all outputs) about
40 % of the faults, and a quarter of the CPU time, went to memory the process had just given back.
Fixing the mmap threshold at 32 MiB (``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit in glibc's
malloc/malloc.c, where its own dynamic threshold stops rising) and the trim threshold at 1 GiB
keeps freed blocks in the heap for reuse; the peak resident memory does not change (a freed block
is reused, not added to). What a
library user's process does with its memory is not ours to change: only the CLI calls this.
Elsewhere than glibc (musl, macOS, Windows) it does nothing.
"""

from __future__ import annotations

import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc malloc.h
MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Set glibc's thresholds; True where they were taken."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
