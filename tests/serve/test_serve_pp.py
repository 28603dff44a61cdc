"""Pipeline parallelism in `timeline serve` (vLLM): the stages' layers (``vllm/distributed/utils.py``
``get_pp_indices``), each stage's weights, KV layers and profile peak, and the pool as the smallest
worker's (``vllm/v1/core/kv_cache_utils.py`` ``get_kv_cache_configs``: ``min_num_blocks`` over workers,
groups projected to a worker by ``_project_kv_cache_groups_to_worker``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from timeline.cli import main
from timeline.exporters.serve_summary import summary
from timeline.io.serve_runfile import load_serve_run
from timeline.serve.budget import compute_budget, compute_budgets, rope_cache_bytes
from timeline.serve.graph_view import pp_layers
from timeline.serve.run import serve

ROOT = Path(__file__).resolve().parents[2]
LLAMA_RUN = ROOT / "schedules" / "llama3.1-8b-h100-serve.toml"
GPT_OSS_RUN = ROOT / "schedules" / "gpt-oss-20b-h100-serve.toml"


@pytest.mark.parametrize("layers,pp,expected", [(32, 2, [16, 16]), (61, 4, [15, 15, 16, 15]),
                                                 (24, 5, [5, 5, 5, 5, 4]), (7, 3, [2, 3, 2])])
def test_stages_split_as_get_pp_indices(layers, pp, expected):
    run = load_serve_run(LLAMA_RUN, [f"parallel.pp={pp}"])
    run = replace(run, model=replace(run.model, num_hidden_layers=layers))
    ranges = pp_layers(run)
    assert [len(r) for r in ranges] == expected
    assert ranges[0].start == 0 and ranges[-1].stop == layers
    assert all(a.stop == b.start for a, b in zip(ranges, ranges[1:], strict=False))


def test_each_stage_holds_its_layers_weights_and_kv():
    one = compute_budget(load_serve_run(LLAMA_RUN))
    run = load_serve_run(LLAMA_RUN, ["parallel.pp=2"])
    first, last = (compute_budget(run, s) for s in (0, 1))
    # the embedding on stage 0, the final norm and LM head on stage 1; every stage has its rope cache
    assert first.weights_bytes + last.weights_bytes == one.weights_bytes + rope_cache_bytes(run)
    assert last.weights_bytes - first.weights_bytes == 4096 * 2  # the final RMSNorm's weight
    for b in (first, last):
        assert b.kv_layers == 16 and b.kv_bytes_per_token == 16 * 4096 == 65_536
        assert b.worker_kv_blocks == b.kv_pool_bytes // (16 * 4096) // 16
    # the sampler (logits over the vocabulary, the profile run's sort) runs on the last stage only
    assert last.activation_peak_bytes > first.activation_peak_bytes


def test_the_pool_is_the_smallest_workers():
    run = load_serve_run(LLAMA_RUN, ["parallel.pp=2"])
    budgets = compute_budgets(run)
    own = [b.worker_kv_blocks for b in budgets]
    assert own[0] > own[1] and all(b.num_kv_blocks == min(own) for b in budgets)
    assert compute_budgets(load_serve_run(LLAMA_RUN))[0] == compute_budget(load_serve_run(LLAMA_RUN))


def test_hybrid_groups_project_to_each_stage():
    budgets = compute_budgets(load_serve_run(GPT_OSS_RUN, ["parallel.pp=2"]))
    for stage, b in enumerate(budgets):
        layout = b.kv_layout
        assert layout.group_size == 6 and len(layout.groups) == 2
        assert layout.groups[0].layers == tuple(range(12 * stage, 12 * stage + 12, 2))  # sliding
        assert layout.groups[1].layers == tuple(range(12 * stage + 1, 12 * stage + 12, 2))  # full
        assert b.worker_kv_blocks == b.kv_pool_bytes // 32_768 // 6


def test_summary_has_a_row_per_stage_and_the_timeline_is_stage_0s():
    res = serve(load_serve_run(LLAMA_RUN, ["parallel.pp=2", "serving.load.num_requests=10"]))
    rows = summary(res)["devices"]
    assert [(r["pp_stage"], r["layers"]) for r in rows] == [(0, [0, 16]), (1, [16, 32])]
    blocks = rows[0]["num_kv_blocks"]
    assert rows[1]["num_kv_blocks"] == blocks == min(r["worker_num_kv_blocks"] for r in rows)
    assert res.memory["kv_cache_bytes"][0] == blocks * 16 * 4096 * 16
    assert rows[0]["peak_allocated_bytes"] == res.peak_allocated_bytes
    assert all(r["max_concurrency_at_max_model_len"] == blocks // 1000 for r in rows)  # cdiv(16000, 16)


@pytest.mark.parametrize("overrides,key", [(["parallel.pp=2", "serving.engine=sglang"], "parallel.pp"),
                                           (["parallel.pp=33"], "parallel.pp"),
                                           (["parallel.vpp=2"], "parallel.vpp")])
def test_unmodelled_pipelines_are_one_error_line(tmp_path, capsys, overrides, key):
    args = [a for o in overrides for a in ("--set", o)]
    assert main(["serve", str(LLAMA_RUN), *args, "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0]
