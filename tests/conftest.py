"""Shared fixtures: the repository root, the shipped run file, and a small-run writer."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"
SHARED = ROOT.parent / "shared"


@pytest.fixture
def write_run(tmp_path):
    """Write a run file from TOML text and return its path."""

    def write(text: str, name: str = "run.toml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write
