"""Tiny captured models shared by the capture tests (each capture takes about a second)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from captures import DSV3, LLAMA, QWEN3_MOE, capture_config  # noqa: E402


@pytest.fixture(scope="session")
def llama_run(tmp_path_factory) -> Path:
    return capture_config(LLAMA, tmp_path_factory.mktemp("llama") / "llama.parquet")


@pytest.fixture(scope="session")
def dsv3_run(tmp_path_factory) -> Path:
    return capture_config(DSV3, tmp_path_factory.mktemp("dsv3") / "dsv3.parquet")


@pytest.fixture(scope="session")
def qwen3_moe_run(tmp_path_factory) -> Path:
    return capture_config(QWEN3_MOE, tmp_path_factory.mktemp("qwen3moe") / "qwen3moe.parquet")
