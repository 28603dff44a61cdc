"""Serving: KV bytes per token against the engines' formulas, the vLLM budget, the scheduler's
invariants, the command's errors and deterministic outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from timeline.cli import main
from timeline.io.hf_config import read_hf_config
from timeline.io.serve_runfile import load_serve_run
from timeline.serve.budget import compute_budget
from timeline.serve.kv import kv_bytes_per_token, kv_bytes_per_token_layer
from timeline.serve.weights import quantized_bytes
from timeline.sim.batching import Engine, SchedulerConfig, blocks_for, simulate_requests
from timeline.spec.serving import Request

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "tests" / "data" / "hf"
LLAMA_RUN = ROOT / "schedules" / "llama3.1-8b-h100-serve.toml"
DSV3_RUN = ROOT / "schedules" / "deepseek-v3-tp8-fp8-h200-serve.toml"


def model(name: str):
    return read_hf_config(HF / name / "config.json")


# -- KV bytes per token (vllm/v1/kv_cache_interface.py FullAttentionSpec / MLAAttentionSpec
#    real_page_size_bytes; vllm/config/model.py get_num_kv_heads = max(1, h_kv // tp)) --------------

def test_deepseek_v3_latent_is_70272_bytes_over_61_layers_whatever_the_tp():
    m = model("deepseek-v3")
    for tp in (1, 8, 16):
        assert kv_bytes_per_token_layer(m, tp, "auto", "bf16") == (512 + 64) * 2
        assert kv_bytes_per_token(m, tp, "auto", "bf16") == 70_272


def test_fp8_ds_mla_is_656_bytes_a_token_a_layer():
    assert kv_bytes_per_token(model("deepseek-v3"), 8, "fp8_ds_mla", "bf16") == 656 * 61


def test_llama_3_1_8b_is_131072_bytes_over_32_layers_at_tp1():
    m = model("llama-3.1-8b")
    assert kv_bytes_per_token(m, 1, "auto", "bf16") == 131_072
    assert kv_bytes_per_token(m, 2, "auto", "bf16") == 65_536
    assert kv_bytes_per_token(m, 1, "fp8", "bf16") == 65_536


def test_kv_heads_replicate_when_tp_exceeds_them():
    m = model("llama-3.1-8b")  # 8 key/value heads: tp 16 keeps one head per rank, not half
    assert kv_bytes_per_token(m, 8, "auto", "bf16") == kv_bytes_per_token(m, 16, "auto", "bf16") == 32 * 2 * 128 * 2


@pytest.mark.parametrize("name,expected", [("qwen3-30b-a3b", 48 * 4 * 2 * 128 * 2), ("mixtral-8x7b", 32 * 8 * 2 * 128 * 2)])
def test_gqa_families(name, expected):
    assert kv_bytes_per_token(model(name), 1, "auto", "bf16") == expected


# -- weights and budget ----------------------------------------------------------------------------

def test_fp8_block_scales_are_fp32_per_128x128_block():
    assert quantized_bytes((7168, 2048), "fp8", 128) == 7168 * 2048 + 56 * 16 * 4
    assert quantized_bytes((100, 130), "fp8", 128) == 13_000 + 1 * 2 * 4  # partial blocks count whole
    # GPTQ int4: packed weight + fp16 scales + packed zeros per (in/g) × out + int32 g_idx per input row
    assert quantized_bytes((4096, 4096), "int4", 128) == 4096 * 4096 // 2 + 32 * 4096 * 2 + 32 * 4096 // 2 + 4096 * 4


def test_llama_budget_is_vllms_formula():
    run = load_serve_run(LLAMA_RUN, ["serving.engine_version=0.11+35d5cda"])  # before the Triton sampler (0.17)
    b = compute_budget(run)
    # vLLM logs "Model loading took 14.9888 GiB" for Llama-3.1-8B: the BF16 parameters (64-padded
    # vocabulary) and the 131,072 × 128 rotary cos/sin cache
    assert b.weights_bytes == 16_060_522_496 + 131_072 * 128 * 2 == 16_094_076_928
    assert b.total_bytes == int(79.18 * 2**30) and b.requested_bytes == int(b.total_bytes * 0.9)
    assert b.kv_pool_bytes == b.requested_bytes - b.weights_bytes - b.activation_peak_bytes - b.non_torch_bytes
    assert b.num_kv_blocks == b.kv_pool_bytes // (16 * 4096) // 32
    # the profile run's peak is the sampler's sort over 256 × 128,256 fp32 logits (9.5 fp32-sized
    # buffers: bf16 logits, fp32 logits, sorted values, int64 indices, reverse indices, CUB's
    # alternate keys and values) with the 8,192-token step's hidden states still alive
    n = 256 * 128_256
    sampler = n * 2 + n * 4 + n * 4 + n * 8 + n * 8 + n * 12
    assert b.activation_peak_bytes >= sampler and b.activation_peak_bytes - sampler < 2 * 8192 * 4096 * 2 + 2**21


def test_a_pool_too_small_is_the_engines_failure():
    run = load_serve_run(LLAMA_RUN, ["serving.gpu_memory_utilization=0.19"])
    b = compute_budget(run)  # 15.2 GiB requested < 14.99 GiB weights + the profile run's 1.2 GiB peak
    assert b.num_kv_blocks == 0 and b.failure == "no memory for cache blocks"
    b = compute_budget(load_serve_run(LLAMA_RUN, ["serving.gpu_memory_utilization=0.21"]))
    assert 0 < b.num_kv_blocks < 1000 and f"needs 1000 KV blocks and the pool has {b.num_kv_blocks}" in b.failure


def test_sglang_pool_is_rest_memory_over_cell_size():
    run = load_serve_run(LLAMA_RUN, ["serving.engine=sglang", "serving.mem_fraction_static=0.8"])
    b = compute_budget(run)
    # profile_max_num_token: its total is the free memory after distributed init (H100 tp 1: 0.51 GiB in use)
    free0 = int(79.18 * 2**30) - int(0.51 * 2**30)
    rest = free0 - b.weights_bytes - (free0 - int(free0 * 0.8))
    # the file's block_size = 16 is SGLang's --page-size: the pool is whole pages (init_memory_pool)
    assert b.num_kv_blocks == rest // 131_072 // 16 * 16 and b.block_size == 1
    assert b.num_kv_blocks != rest // 131_072  # the alignment takes tokens off here
    one = compute_budget(load_serve_run(LLAMA_RUN, ["serving.engine=sglang", "serving.mem_fraction_static=0.8",
                                                    "serving.block_size=1"]))
    assert one.num_kv_blocks == rest // 131_072
    # the file's max_num_seqs = 256 is --max-running-requests: 256 rows of max_model_len + 4 int32 (0.4: one more)
    assert b.max_running_requests == 256 and b.req_to_token_bytes == 257 * (run.max_model_len + 4) * 4


# -- scheduler invariants ------------------------------------------------------------------------

def cfg(**kw) -> SchedulerConfig:
    base = dict(num_blocks=64, block_size=16, max_num_seqs=8, max_num_batched_tokens=256, max_model_len=4096,
                enable_chunked_prefill=True, enable_prefix_caching=True)
    base.update(kw)
    return SchedulerConfig(**base)


def reqs(n: int, prompt: int, output: int, gap: float = 10.0, prefix: str = "", shared: int = 0):
    return tuple(Request(rid=i, arrival_us=i * gap, prompt_tokens=prompt, output_tokens=output, prefix_id=prefix,
                         prefix_tokens=shared) for i in range(n))


def test_blocks_never_exceed_the_pool_and_every_fitting_request_finishes():
    c = cfg(num_blocks=40)
    res = simulate_requests(c, reqs(30, 200, 60), lambda batch: 100.0)
    assert all(0 <= s.blocks_used <= c.num_blocks for s in res.steps)
    assert all(s.finish_us >= 0 and not s.rejected for s in res.states)
    assert sum(s.preemptions for s in res.states) > 0  # 30 × 17 blocks do not fit in 40


def test_sglang_runs_a_prompt_over_the_prefill_budget_alone():
    """Without chunked prefill, SGLang admits a prompt longer than --max-prefill-tokens as the first of its prefill
    batch (PrefillAdder.add_one_req); vLLM's validation keeps such prompts out, so its scheduler waits."""
    long = (Request(rid=0, arrival_us=0.0, prompt_tokens=600, output_tokens=2),
            Request(rid=1, arrival_us=0.0, prompt_tokens=100, output_tokens=2))
    sglang = Engine(cfg(enable_chunked_prefill=False, oversized_prompt_alone=True), long)
    for st in sglang.states:
        sglang.arrive(st)
    batch, _ = sglang.schedule()
    assert [(st.req.rid, new) for st, new in batch] == [(0, 600)]  # whole, alone: the short one waits
    res = simulate_requests(cfg(enable_chunked_prefill=False, oversized_prompt_alone=True), long, lambda b: 100.0)
    assert all(st.finish_us >= 0 for st in res.states)
    stuck = simulate_requests(cfg(enable_chunked_prefill=False), long, lambda b: 100.0)
    assert stuck.states[0].finish_us < 0


def test_preemption_exactly_when_a_step_cannot_get_a_block():
    c = cfg(num_blocks=1000)
    res = simulate_requests(c, reqs(30, 200, 60), lambda batch: 100.0)
    assert sum(s.preemptions for s in res.states) == 0 and all(s.preempted == 0 for s in res.steps)


def test_a_request_holds_ceil_tokens_over_block_size_less_its_shared_prefix():
    eng = Engine(cfg(), reqs(2, 100, 5, prefix="sys", shared=64))
    for st in eng.states:
        eng.arrive(st)
    batch, _ = eng.schedule()
    eng.finish_step(batch, 1.0)  # both prefill fully in one step; the first publishes its prefix
    first, second = eng.states
    assert first.own_blocks + first.shared_blocks == blocks_for(first.computed, 16)
    assert first.shared_blocks == 4
    eng3 = Engine(cfg(), reqs(2, 100, 5, gap=1000.0, prefix="sys", shared=64))
    eng3.arrive(eng3.states[0])
    b, _ = eng3.schedule()
    eng3.finish_step(b, 1.0)
    eng3.arrive(eng3.states[1])
    b, _ = eng3.schedule()
    late = eng3.states[1]
    assert late.shared_blocks == 4 and late.own_blocks == blocks_for(100, 16) - 4
    assert eng3.prefix["sys"] == [4, 2]
    assert eng3.used_blocks == (blocks_for(101, 16)) + blocks_for(100, 16) - 4


def test_a_request_larger_than_the_pool_is_rejected_with_a_reason():
    res = simulate_requests(cfg(num_blocks=10), reqs(1, 400, 10), lambda batch: 1.0)
    assert "needs 26 KV blocks; the pool has 10" in res.states[0].rejected


# -- the command ----------------------------------------------------------------------------------

def test_simulate_refuses_a_serving_file(capsys):
    assert main(["simulate", str(LLAMA_RUN)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "timeline serve" in err[0]


@pytest.mark.parametrize("override,key", [("serving.block_size=0", "serving.block_size"),
                                          ("serving.kv_cache_dtype=fp8_ds_mla", "serving.kv_cache_dtype"),
                                          ("serving.bogus=1", "serving.bogus"),
                                          ("serving.load.rate_per_s=-1", "serving.load.rate_per_s")])
def test_bad_values_are_one_error_line(tmp_path, capsys, override, key):
    assert main(["serve", str(LLAMA_RUN), "--set", override, "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and key in err[0]
    assert not (tmp_path / "out").exists()


def test_serve_writes_identical_bytes_twice(tmp_path):
    outs = []
    for k in range(2):
        out = tmp_path / f"run{k}"
        assert main(["serve", str(LLAMA_RUN), "--set", "serving.load.num_requests=40", "-o", str(out)]) == 0
        outs.append({p.name: p.read_bytes() for p in out.iterdir() if p.name != "timeline-output.json"})
    assert outs[0] == outs[1] and set(outs[0]) == {"summary.json", "memory.parquet", "requests.parquet", "events.parquet", "trace.json",
                                                "snapshot.pickle"}


def test_requests_csv_trace(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_us,prompt_tokens,output_tokens,prefix_id\n0,100,4,a\n10,120,4,a\n20,50,3,\n")
    run_file = tmp_path / "r.toml"
    text = LLAMA_RUN.read_text().replace("../tests/data/hf", str(HF))
    text = text.split("[serving.load]")[0] + 'requests = "t.csv"\n'
    run_file.write_text(text)
    run = load_serve_run(run_file)
    assert [r.prefix_tokens for r in run.requests] == [100, 100, 0]
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_us,prompt_tokens,output_tokens,prefix_id\n0,x,4,\n")
    run_file.write_text(run_file.read_text().replace('"t.csv"', '"bad.csv"'))
    with pytest.raises(Exception, match=r"bad.csv:2: prompt_tokens must be a whole number"):
        load_serve_run(run_file)


def test_snapshot_accounts_weights_kv_and_transients():
    import pickle

    from timeline.exporters.serve_snapshot import snapshot
    from timeline.serve.run import serve

    res = serve(load_serve_run(LLAMA_RUN, ["serving.load.num_requests=10"]), record_entries=100_000)
    snap = pickle.loads(pickle.dumps(snapshot(res)))
    b = res.budget
    live = [blk for seg in snap["segments"] for blk in seg["blocks"] if blk["state"] == "active_allocated"]
    assert sorted(blk["requested_size"] for blk in live) == sorted(
        [b.weights_bytes] + [b.num_kv_blocks * 16 * 4096] * 32)
    trace = snap["device_traces"][0]
    allocs = sum(e["action"] == "alloc" for e in trace)
    frees = sum(e["action"] == "free_completed" for e in trace)
    assert allocs - frees == 33 and res.num_eager_steps > 0
    for seg in snap["segments"]:  # accounting: blocks tile their segment
        assert sum(blk["size"] for blk in seg["blocks"]) == seg["total_size"]


def test_a_finished_prefix_stays_cached_until_its_space_is_needed():
    eng = Engine(cfg(num_blocks=12), (
        Request(rid=0, arrival_us=0.0, prompt_tokens=100, output_tokens=1, prefix_id="sys", prefix_tokens=64),
        Request(rid=1, arrival_us=1.0, prompt_tokens=100, output_tokens=1, prefix_id="sys", prefix_tokens=64),
        Request(rid=2, arrival_us=2.0, prompt_tokens=150, output_tokens=1)))
    first, second, third = eng.states
    eng.arrive(first)
    b, _ = eng.schedule()
    eng.finish_step(b, 1.0)  # done: its 4 prefix blocks are free but cached
    assert eng.used_blocks == 0 and eng.cached == {"sys": 4}
    eng.arrive(second)
    b, _ = eng.schedule()
    assert second.shared_blocks == 4 and second.computed == 64  # a hit: 64 tokens not recomputed
    assert b[0][1] == 100 - 64
    eng.finish_step(b, 2.0)
    assert eng.cached == {"sys": 4}
    eng.arrive(third)  # 150 + 1 tokens need 10 of the 12 blocks: the cached prefix is evicted
    b, _ = eng.schedule()
    assert third.own_blocks == blocks_for(150, 16) and not eng.cached and eng.cached_blocks == 0


def test_events_parquet_pairs_every_alloc_with_a_free_but_the_static_ones(tmp_path):
    import pyarrow.parquet as pq

    out = tmp_path / "ev"
    assert main(["serve", str(LLAMA_RUN), "--set", "serving.load.num_requests=10", "-o", str(out),
                 "--format", "events"]) == 0
    t = pq.read_table(out / "events.parquet").to_pydict()
    allocs = [a for a, act in zip(t["address"], t["action"], strict=True) if act == "alloc"]
    frees = [a for a, act in zip(t["address"], t["action"], strict=True) if act == "free"]
    assert len(allocs) - len(frees) == 33  # the weights and one KV tensor per layer stay
    named = [n for n, act in zip(t["tensor"], t["action"], strict=True) if act == "alloc"]
    assert named[:2] == ["weights", "kv_cache.layers.0"] and t["action"][0] == "segment_alloc"
    assert t["seq"] == list(range(len(t["seq"])))


def test_a_load_beyond_max_steps_is_refused_before_any_work(tmp_path, capsys):
    from timeline.serve.work import min_steps

    run = load_serve_run(LLAMA_RUN)
    # 200 requests of 1,024 + 128 tokens: 128 output steps at least, 28.1 steps of 8,192 tokens
    assert min_steps(run) == 128
    assert main(["serve", str(LLAMA_RUN), "--max-steps", "127", "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "at least 128 engine steps" in err[0] and not (tmp_path / "o").exists()


def test_a_run_naming_no_vllm_is_the_default_releases_and_says_so(tmp_path, capsys):
    """Without serving.engine_version every version-dependent rule runs at VLLM_DEFAULT (0.19.0), scheduler
    defaults included: the same budget as the run that names it, and a note that says which release was read.
    Before, such a run took the 0.11 rule set for some rules and the newest for others, silently."""
    from timeline.spec.engine_versions import VLLM_DEFAULT

    named = LLAMA_RUN.read_text()
    assert f'engine_version = "{VLLM_DEFAULT}"' in named
    bare = tmp_path / "bare.toml"
    bare.write_text(named.replace(f'engine_version = "{VLLM_DEFAULT}"\n', "")
                    .replace('hf_config = "../', f'hf_config = "{ROOT}/'))
    run = load_serve_run(bare)
    assert run.serving.engine_version == VLLM_DEFAULT
    assert any(f"read as vLLM {VLLM_DEFAULT}" in n for n in run.notes)
    assert compute_budget(run) == compute_budget(load_serve_run(LLAMA_RUN))
    # 0.19's H100 server defaults (1,024 sequences) where the file leaves max_num_seqs out, not the spec's 256
    no_seqs = tmp_path / "no_seqs.toml"
    no_seqs.write_text("\n".join(ln for ln in bare.read_text().splitlines() if not ln.startswith("max_num_seqs")))
    assert load_serve_run(no_seqs).serving.max_num_seqs == 1024
    assert main(["serve", str(bare), "--format", "summary", "-o", str(tmp_path / "out")]) == 0
    assert f"serving.engine_version is not given: read as vLLM {VLLM_DEFAULT}" in capsys.readouterr().err
    assert load_serve_run(bare, ['serving.engine_version=""']).serving.engine_version == VLLM_DEFAULT  # empty: none
