"""Every run-file key is in the README's run-file table (or, for ``[serving]``, its key paragraph):
a key added to a spec without a line for users fails here, naming the key and the section."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from timeline.spec import run as runspec
from timeline.spec.framework import FrameworkSpec
from timeline.spec.serving import ServingSpec

README = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
SECTIONS = {"parallel": runspec.ParallelSpec, "training": runspec.TrainingSpec,
            "recompute": runspec.RecomputeSpec, "schedule": runspec.ScheduleSpec,
            "allocator": runspec.AllocatorSpec, "hardware": runspec.HardwareSpec, "framework": FrameworkSpec}


def table_row(section: str) -> str:
    rows = [line for line in README.splitlines() if line.startswith(f"| `[{section}]`")]
    assert len(rows) == 1, f"README has {len(rows)} table rows for [{section}]"
    return rows[0]


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_key_of_a_training_section_is_in_the_table(section):
    row = table_row(section)
    missing = [f.name for f in dataclasses.fields(SECTIONS[section]) if f"`{f.name}`" not in row]
    assert not missing, f"README's [{section}] row lacks {missing}"


def test_every_serving_key_is_in_the_key_paragraph():
    start = README.index("`[serving]` keys")
    para = README[start:README.index("\n\n", start)]
    missing = [f.name for f in dataclasses.fields(ServingSpec)
               if f"`{f.name}`" not in para and f"`{f.name} =" not in para]
    assert not missing, f"README's [serving] paragraph lacks {missing}"
