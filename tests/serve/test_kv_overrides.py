"""The KV pool a user sizes by hand: vLLM's ``--num-gpu-blocks-override`` and ``--kv-cache-memory-bytes``, SGLang's
``--max-total-tokens`` — each as the engine's source applies it (``timeline/serve/budget.py``), against the pool the
same run gets from its memory budget."""

from __future__ import annotations

import pytest
from serve_runfiles import hf_run_file

from timeline.errors import SpecError
from timeline.io.serve_runfile import load_serve_run
from timeline.serve.budget import compute_budgets

GIB = 1 << 30
#: Llama-3.1-8B's KV page of one layer: 16 tokens × 2 (K, V) × 8 KV heads × 128 × 2 B (bf16) = 65,536 B; a block
#: spans the 32 layers (group_size 32): 2 MiB
PAGE = 16 * 2 * 8 * 128 * 2


def _budget(tmp_path, extra: str, version: str = "0.11.0", engine: str = "vllm"):
    run = load_serve_run(hf_run_file(tmp_path / "run.toml", "llama-3.1-8b", tp=1, gpu="h100", engine=engine,
                                     version=version, extra='max_model_len = 8192\n' + extra))
    return compute_budgets(run)[0]


def test_num_gpu_blocks_override_sets_the_blocks_not_the_budget(tmp_path):
    plain = _budget(tmp_path, "")
    b = _budget(tmp_path, "num_gpu_blocks_override = 2000\n")
    # the memory budget is the engine's "Available KV cache memory", as without the override; the count is the user's
    assert b.kv_pool_bytes == plain.kv_pool_bytes and plain.num_kv_blocks == plain.kv_pool_bytes // (PAGE * 32)
    assert b.num_kv_blocks == 2000 and b.failure == ""
    # V1 checks one max_model_len request against the memory, then overrides: 100 blocks (1,600 tokens) start
    assert _budget(tmp_path, "num_gpu_blocks_override = 100\n").failure == ""
    # V0 overrides first, and raise_if_cache_size_invalid reads the override: 8,192 tokens need 512 blocks
    v0 = _budget(tmp_path, "num_gpu_blocks_override = 100\n", version="0.6.4.post1")
    assert v0.num_kv_blocks == 100 and "needs 512 KV blocks and the pool has 100" in v0.failure
    assert "raise_if_cache_size_invalid" in v0.failure


def test_an_override_past_the_free_memory_fails_allocating(tmp_path):
    b = _budget(tmp_path, "num_gpu_blocks_override = 40000\n")
    free = b.total_bytes - b.weights_bytes - b.non_torch_bytes
    assert 40000 * PAGE * 32 > free and b.failure.startswith("CUDA out of memory allocating the KV cache")
    fits = free // (PAGE * 32)  # the most blocks the device holds after the weights: allocated, past the budget
    assert _budget(tmp_path, f"num_gpu_blocks_override = {fits}\n").failure == ""
    assert _budget(tmp_path, f"num_gpu_blocks_override = {fits + 1}\n").failure != ""


def test_kv_cache_memory_bytes_is_the_budget(tmp_path):
    b = _budget(tmp_path, f"kv_cache_memory_bytes = {20 * GIB}\n")
    assert b.kv_pool_bytes == 20 * GIB and b.num_kv_blocks == 20 * GIB // (PAGE * 32) == 10240
    # gpu_memory_utilization is not read: a lower one gives the same pool
    low = _budget(tmp_path, f"kv_cache_memory_bytes = {20 * GIB}\ngpu_memory_utilization = 0.3\n")
    assert low.num_kv_blocks == 10240 and low.failure == ""
    assert _budget(tmp_path, f"kv_cache_memory_bytes = {70 * GIB}\n").failure.startswith("CUDA out of memory")


def test_sglang_max_total_tokens_caps_the_pool_after_max_num_reqs(tmp_path):
    plain = _budget(tmp_path, "", version="0.5.5", engine="sglang")
    b = _budget(tmp_path, "max_total_tokens = 50000\n", version="0.5.5", engine="sglang")
    assert plain.num_kv_blocks > 50000 and b.num_kv_blocks == 50000 and b.kv_pool_bytes == 50000 * 4096 * 32
    # max_num_reqs comes from the profiled tokens, before the cap (init_memory_pool): the request table is the same
    assert b.req_to_token_bytes == plain.req_to_token_bytes
    # a cap above the profiled tokens leaves them (SGLang warns and uses the profiled value)
    assert _budget(tmp_path, "max_total_tokens = 10000000\n", version="0.5.5",
                   engine="sglang").num_kv_blocks == plain.num_kv_blocks


@pytest.mark.parametrize(("engine", "extra", "key"), [
    ("sglang", "num_gpu_blocks_override = 100\n", "serving.num_gpu_blocks_override"),
    ("vllm", "max_total_tokens = 100\n", "serving.max_total_tokens"),
    ("vllm", "cuda_graph_max_bs = 64\n", "serving.cuda_graph_max_bs"),
    ("vllm", 'prefill_cuda_graph = "off"\n', "serving.prefill_cuda_graph"),
])
def test_an_engine_option_on_the_other_engine_is_named(tmp_path, engine, extra, key):
    with pytest.raises(SpecError) as err:
        _budget(tmp_path, extra, version="0.5.5" if engine == "sglang" else "0.11.0", engine=engine)
    assert key in str(err.value)


def test_kv_cache_memory_bytes_before_0_10_2_is_named(tmp_path):
    with pytest.raises(SpecError) as err:
        _budget(tmp_path, f"kv_cache_memory_bytes = {GIB}\n", version="0.10.1.1")
    assert "serving.kv_cache_memory_bytes" in str(err.value) and "0.10.2" in str(err.value)
