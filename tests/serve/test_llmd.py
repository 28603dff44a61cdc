"""The vLLM budget against llm-d's measured startup breakdowns (llm-d/llm-d-benchmark
``config_explorer/empirical-vllm-memory-results.md`` at 2593348; H100 79.18 GiB, util 0.9,
max-model-len 16000, prefix caching, block 128, vLLM's H100 API-server defaults max_num_seqs 1024
and max_num_batched_tokens 8192): weights within 3 %, activation peak within 15 %, KV pool within
max(5 %, 0.5 GiB), and the TP=1 70B row refused with "no memory for cache blocks". The logged
non-torch memory is an input. The rows of models the project reads (tools/compare_llmd.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from compare_llmd import ROWS, run_row  # noqa: E402

GIB = 2**30


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_llmd_row(tmp_path, row):
    label, model, tp, extra, non_torch, weights, activation, kv = row
    b = run_row(tmp_path, model, tp, extra, non_torch)
    if weights is not None:
        assert abs(b.weights_bytes / GIB - weights) <= 0.03 * weights
    if activation is not None:
        assert abs(b.activation_peak_bytes / GIB - activation) <= 0.15 * activation
    if isinstance(kv, str):
        assert b.failure.startswith(kv)
    else:
        assert not b.failure
        assert abs(b.kv_pool_bytes / GIB - kv) <= max(0.05 * kv, 0.5)
