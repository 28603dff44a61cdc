"""The CLI as a process: it keeps freed memory for reuse where the C library is glibc (an array
freed and made again does not fault its pages in again; elsewhere nothing happens, without
failing), and leaves the objects of a finished run out of the interpreter's last collection; as a
function called with arguments (tests, other programs) it changes neither."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from timeline.cli.malloc import keep_freed_memory

FAULTS = """
import resource, sys
import numpy as np
from timeline.cli.malloc import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
np.ones(1 << 20)  # numpy's own first-use allocations
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):  # a device's columns, made and freed together, device after device
    columns = [np.ones(1 << 20) for _ in range(4)]
    del columns
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    return int(subprocess.run([sys.executable, "-c", FAULTS, mode], check=True, capture_output=True,
                              text=True).stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")
def test_freed_arrays_are_reused_under_glibc():
    pages = 4 * (8 << 20) // 4096  # one device's columns
    assert _faults("default") > 2 * pages  # glibc hands them back to the kernel and faults them in again
    assert _faults("keep") < pages // 2  # kept: reused


def test_elsewhere_it_does_nothing(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert keep_freed_memory() is False


def test_the_program_skips_the_last_collection_a_call_does_not():
    code = ("import gc, sys\n"
            "from timeline.cli import main\n"
            "assert main(['presets']) == 0 and gc.get_freeze_count() == 0\n"
            "sys.argv = ['timeline', 'presets']\n"
            "assert main() == 0 and gc.get_freeze_count() > 1000\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
