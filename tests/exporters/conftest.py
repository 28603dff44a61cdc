"""Fixtures for the exporter tests (the run itself is in ``tiny.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # tiny
sys.path.insert(0, str(HERE.parents[1] / "tools"))  # perfetto_engine: the Node driver's Python side

from tiny import synthetic_template, tiny_run  # noqa: E402

from timeline.result.build import build_timeline  # noqa: E402
from timeline.result.timeline import Timeline  # noqa: E402


@pytest.fixture(scope="session")
def tiny_timeline() -> Timeline:
    return build_timeline(tiny_run(), synthetic_template)


@pytest.fixture(scope="session")
def ideal_timeline() -> Timeline:
    return build_timeline(tiny_run(allocator="ideal"), synthetic_template)


@pytest.fixture(scope="session")
def oom_timeline() -> Timeline:
    """Capacity of 40 MiB: rank 0 runs out during the warm-up."""
    return build_timeline(tiny_run(capacity_gib=40 / 1024), synthetic_template)


@pytest.fixture(scope="session")
def expandable_timeline() -> Timeline:
    return build_timeline(tiny_run(expandable=True), synthetic_template)
