"""Sliding-window and full-attention layers in vLLM's KV cache groups (GPT-OSS), against the formulas
of vllm-project/vllm 001cabc: ``kv_cache_utils.py`` ``_get_kv_cache_groups_uniform_page_size`` (group
size, ``layers[i::num_groups]``), ``get_kv_cache_config_from_groups`` / ``get_num_blocks``
(``available // page // group_size``), ``kv_cache_interface.py`` ``SlidingWindowSpec.max_memory_usage_bytes``
(``cdiv(min(window − 1 + max_num_batched_tokens, max_model_len), block_size) + 1``) and
``single_type_kv_cache_manager.py`` ``SlidingWindowManager`` (blocks before
``(computed − window + 1) // block_size`` freed)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from timeline.cli import main
from timeline.exporters.serve_summary import summary
from timeline.io.hf_config import read_hf_config
from timeline.io.serve_runfile import load_serve_run
from timeline.serve.budget import compute_budget
from timeline.serve.kv import kv_bytes_per_token_layer, kv_layout
from timeline.serve.run import serve
from timeline.sim.batching import Engine, SchedulerConfig, blocks_for, simulate_requests
from timeline.spec.serving import Request

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "tests" / "data" / "hf"
GPT_OSS_RUN = ROOT / "schedules" / "gpt-oss-20b-h100-serve.toml"


def gpt_oss(name: str = "gpt-oss-20b"):
    return read_hf_config(HF / name / "config.json")


def test_gpt_oss_20b_page_is_16_tokens_8_heads_k_and_v_64_dims_bf16():
    m = gpt_oss()
    assert kv_bytes_per_token_layer(m, 1, "auto", "bf16") == 8 * 2 * 64 * 2 == 2048
    assert kv_bytes_per_token_layer(m, 2, "auto", "bf16") == 1024  # 4 heads a rank
    layout = kv_layout(m, range(24), 16, 16 * 2048)
    assert layout.page_bytes == 32_768 and layout.group_size == 12
    assert [(g.kind, g.sliding_window, g.layers) for g in layout.groups] == [
        ("sliding_attention", 128, tuple(range(0, 24, 2))), ("full_attention", 0, tuple(range(1, 24, 2)))]
    assert layout.tensor_names()[0] == "0+1" and len(layout.tensor_names()) == 12


def test_gpt_oss_120b_is_two_groups_of_18():
    layout = kv_layout(gpt_oss("gpt-oss-120b"), range(36), 16, 32_768)
    assert layout.group_size == 18 and [len(g.layers) for g in layout.groups] == [18, 18]


def test_group_size_is_the_fewest_layers_of_a_type_or_the_most_within_1_5x():
    m = gpt_oss()
    gemma_like = replace(m, num_hidden_layers=12, layer_types=tuple(
        "full_attention" if i % 6 == 5 else "sliding_attention" for i in range(12)))
    layout = kv_layout(gemma_like, range(12), 16, 4096)  # 10 sliding, 2 full: group size 2
    assert layout.group_size == 2 and len(layout.groups) == 6
    assert layout.groups[0].layers == (0, 6) and layout.groups[1].layers == (1, 7)
    assert layout.groups[5].layers == (5, 11)
    eagle_like = replace(m, num_hidden_layers=25, layer_types=tuple(
        "sliding_attention" if i % 2 == 0 and i < 24 else "full_attention" for i in range(25)))
    layout = kv_layout(eagle_like, range(25), 16, 4096)  # 12 sliding + 13 full: padded to 13 and 13
    assert layout.group_size == 13 and [len(g.layers) for g in layout.groups] == [12, 13]
    assert kv_layout(m, range(24), 16, 4096, hybrid_manager=False).group_size == 24  # all full, one group


def test_a_request_bound_sums_the_groups():
    layout = kv_layout(gpt_oss(), range(24), 16, 32_768)
    assert layout.max_request_blocks(32_768, 8192) == 2048 + (-(-(127 + 8192) // 16) + 1) == 2048 + 521
    assert layout.max_request_blocks(100, 8192) == 7 + 7 + 1  # the window is capped by max_model_len
    assert layout.longest_context(2569, 32_768, 8192) == 32_768
    n = layout.longest_context(1000, 32_768, 8192)
    assert layout.max_request_blocks(n, 8192) <= 1000 < layout.max_request_blocks(n + 1, 8192)
    assert n == 499 * 16  # below 127 + 8192 tokens the window bound is cdiv(L, 16) + 1: 2 · 499 + 1 ≤ 1000


def test_budget_blocks_are_the_pool_over_page_over_group_size():
    b = compute_budget(load_serve_run(GPT_OSS_RUN))
    assert b.kv_layout.group_size == 12 and b.kv_layout.page_bytes == 32_768
    assert b.num_kv_blocks == b.kv_pool_bytes // 32_768 // 12
    assert b.kv_bytes_per_token == 24 * 2048 and b.failure == ""


def window_cfg(**kw) -> SchedulerConfig:
    base = dict(num_blocks=1000, block_size=16, max_num_seqs=8, max_num_batched_tokens=512, max_model_len=4096,
                enable_chunked_prefill=True, enable_prefix_caching=True, full_groups=1, sliding_windows=(128,))
    base.update(kw)
    return SchedulerConfig(**base)


def test_a_sliding_group_frees_the_blocks_that_leave_the_window():
    eng = Engine(window_cfg(), (Request(rid=0, arrival_us=0.0, prompt_tokens=300, output_tokens=40),))
    st = eng.states[0]
    eng.arrive(st)
    held = []
    while st.finish_us < 0:
        computed = st.computed
        batch, _ = eng.schedule()
        tokens = computed + batch[0][1]
        # full group: cdiv(tokens, 16); sliding group: the same less the blocks before the window
        assert st.own_blocks == 2 * blocks_for(tokens, 16) - max(0, computed - 127) // 16
        assert eng.used_blocks == st.own_blocks
        held.append(st.own_blocks)
        eng.finish_step(batch, 1.0)
    assert held[:3] == [38, 19 + 19 - 10, 19 + 19 - 10]  # prefill 300 tokens; then (300 − 127) // 16 = 10 freed
    assert held[-1] == 2 * blocks_for(339, 16) - (338 - 127) // 16 == 22 + 22 - 13
    assert eng.free_blocks == 1000  # everything returns at the finish


def test_a_sliding_window_run_keeps_its_invariants():
    c = window_cfg(num_blocks=120)
    res = simulate_requests(c, tuple(Request(rid=i, arrival_us=10.0 * i, prompt_tokens=400, output_tokens=300)
                                     for i in range(12)), lambda batch: 100.0)
    assert all(0 <= s.blocks_used <= c.num_blocks for s in res.steps)
    assert all(s.finish_us >= 0 and not s.rejected for s in res.states)
    assert sum(s.preemptions for s in res.states) > 0  # 12 × (44 full + up to 26 window blocks) exceed 120


def test_the_admission_bound_counts_the_window_blocks():
    res = simulate_requests(window_cfg(num_blocks=50, max_num_batched_tokens=256),
                            (Request(rid=0, arrival_us=0.0, prompt_tokens=400, output_tokens=10),), lambda b: 1.0)
    assert "needs 51 KV blocks; the pool has 50" in res.states[0].rejected  # 26 full + cdiv(383, 16) + 1


def test_serve_summary_reports_the_groups():
    res = serve(load_serve_run(GPT_OSS_RUN, ["serving.load.num_requests=20"]))
    dev = summary(res)["devices"][0]
    kg = dev["kv_cache_groups"]
    assert kg["num_tensors"] == 12 and kg["page_bytes"] == 32_768 and kg["block_bytes"] == 393_216
    assert [g["max_blocks_per_request"] for g in kg["groups"]] == [521, 2048]
    assert kg["tensor_bytes"] == 32_768 * dev["num_kv_blocks"]
    assert dev["max_concurrency_at_max_model_len"] == dev["num_kv_blocks"] // (521 + 2048)
    assert dev["kv_pool_tokens"] == dev["num_kv_blocks"] // 2 * 16
    assert res.memory["kv_cache_bytes"][0] == 12 * 32_768 * dev["num_kv_blocks"]
    assert res.sched.max_blocks_used <= dev["num_kv_blocks"]


def test_a_pool_below_one_max_model_len_request_is_the_engines_refusal():
    # 0.21: the checkpoint's MXFP4 covers the experts only (attention stays bf16) and vLLM 0.11 has no
    # triton_kernels on an H100, so Marlin pads the experts (13.69 GiB); 0.19 leaves no block at all
    b = compute_budget(load_serve_run(GPT_OSS_RUN, ["serving.gpu_memory_utilization=0.21",
                                                    "serving.engine_version=0.11+35d5cda"]))
    assert 0 < b.num_kv_blocks < 2569
    assert b.failure.startswith("max_model_len=32768 needs 2569 KV blocks")


@pytest.mark.parametrize("override,key", [("serving.engine=sglang", "serving.engine"),
                                          ("serving.engine=hf", "serving.engine")])
def test_unmodelled_sliding_combinations_are_one_error_line(tmp_path, capsys, override, key):
    assert main(["serve", str(GPT_OSS_RUN), "--set", override, "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0]


def test_a_prefix_trace_with_sliding_layers_is_refused(tmp_path, capsys):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_us,prompt_tokens,output_tokens,prefix_id\n0,100,10,sys\n")
    run_file = tmp_path / "run.toml"
    text = GPT_OSS_RUN.read_text().replace("../tests/data/hf", str(HF))
    text = text.split("[serving.load]")[0].replace('quant_group_size = 32\n', f'quant_group_size = 32\nrequests = "{trace}"\n')
    run_file.write_text(text)
    assert main(["serve", str(run_file), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "serving.enable_prefix_caching" in err[0]
    assert main(["serve", str(run_file), "--set", "serving.enable_prefix_caching=false",
                 "-o", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["requests"]["finished"] == 1
