"""The version-dependent engine rules of issue 27 round 2, each on a real published config: vLLM 0.19's
profile run (Triton sampler, kept MoE workspace, cuBLAS workspace), the reserved-peak profilers before
0.6.4, the eager profile's held tensors, MXFP4 on Hopper by version, the measured non-torch memory,
SGLang's pool and its default ``mem_fraction_static``, and the GPU totals PyTorch reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from timeline.cli import main
from timeline.errors import SpecError
from timeline.io.serve_runfile import load_serve_run
from timeline.serve.budget import compute_budget, compute_budgets, samples, with_engine_requests
from timeline.serve.non_torch import (
    CONTEXT,
    CONTEXT_REFERENCE,
    context_bytes,
    dist_bytes,
    measured_init,
    measured_non_torch,
    window,
)
from timeline.serve.run import capture_sizes
from timeline.spec.engine_versions import (
    sglang_max_running_requests,
    sglang_server_defaults,
    vllm_capture_sizes,
)
from timeline.spec.run import HardwareSpec

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "tests" / "data" / "hf"
MIB, GIB = 1 << 20, 1 << 30


def _run(tmp_path: Path, config: str, serving: str, tp: int = 1, gpu: str = "h100", hw: str = "", ep: int = 1):
    path = tmp_path / "r.toml"
    path.write_text(f'[model]\nhf_config = "{HF / config / "config.json"}"\n[parallel]\ntp = {tp}\nep = {ep}\n'
                    f'[hardware]\ngpu = "{gpu}"\n{hw}[serving]\n{serving}\n[serving.load]\nnum_requests = 1\n')
    return load_serve_run(path)


def test_vllm_019_profile_peak_is_the_triton_sampler(tmp_path):
    """Llama-3.1-8B, vLLM 0.19 on an H100 (8,192 tokens, 1,024 dummy rows): the cuBLAS workspace, the kept
    [132, vocab] fp32 Triton buffer, the model's last hidden states, the rows' hidden states and their random
    copy, the bf16 logits and three fp32 copies of them (cast, probabilities, noise); no sort."""
    b = compute_budget(_run(tmp_path, "llama-3.1-8b", 'engine_version = "0.19.0"\nmax_model_len = 8192'))
    n, vocab, hidden = 1024, 128_256, 4096
    expected = 32 * MIB + 132 * vocab * 4 + 8192 * hidden * 2 + 2 * n * hidden * 2 + n * vocab * (2 + 3 * 4)
    assert b.activation_peak_bytes == pytest.approx(expected, abs=4 * MIB)  # small tensors and 512-B rounding
    # the same model under the 0.11 rules sorts: 24 more bytes per logit (sort values, indices, reverse indices,
    # CUB's alternate buffers) less the Triton buffer and the rows' hidden states
    old = compute_budget(_run(tmp_path, "llama-3.1-8b", 'engine_version = "0.11.0"\nmax_model_len = 8192'))
    diff = 24 * n * vocab - 132 * vocab * 4 - 2 * n * hidden * 2
    assert old.activation_peak_bytes - b.activation_peak_bytes == pytest.approx(diff, abs=4 * MIB)


def test_vllm_019_moe_workspace_is_kept(tmp_path):
    """Qwen3-30B-A3B at 0.19: the modular kernel's workspace13 (M·top_k·max(I, K)) and workspace2
    (M·top_k·max(2I, K)) stay allocated under the sampler's peak."""
    b = compute_budget(_run(tmp_path, "qwen3-30b-a3b", 'engine_version = "0.19.0"\nmax_model_len = 8192'))
    m, topk, inter, k = 8192, 8, 768, 2048
    workspace = m * topk * max(inter, k) * 2 + m * topk * max(2 * inter, k) * 2
    n, vocab = 1024, 151_936
    sampler = 132 * vocab * 4 + 8192 * k * 2 + 2 * n * k * 2 + n * vocab * (2 + 3 * 4)
    assert b.activation_peak_bytes == pytest.approx(32 * MIB + workspace + sampler, abs=4 * MIB)


def test_before_064_the_budget_takes_the_reserved_peak(tmp_path):
    """0.4.1 (init_free − free) keeps the profile step's cached segments; 0.2.5 (total − free) also the
    memory in use before the weights (the H100's context, 0.51 GiB); 0.6.4 reads allocated bytes (and counts
    the context among its non-torch bytes, compared apart here)."""
    serving = 'max_model_len = 4096\ngpu_memory_utilization = 0.9\nengine_version = "{}"'
    b041, b025, b064 = (compute_budget(_run(tmp_path, "llama-2-7b", serving.format(v), hw="capacity_gib = 79.19\n"))
                        for v in ("0.4.1", "0.2.5", "0.6.4"))
    assert b041.non_torch_bytes == 0 and b064.non_torch_bytes == int(0.51 * GIB)
    assert b041.kv_pool_bytes < b064.kv_pool_bytes + b064.non_torch_bytes  # cached segments count as used
    assert b041.kv_pool_bytes - b025.kv_pool_bytes == int(0.51 * GIB)
    assert b041.weights_bytes == b064.weights_bytes


def test_eager_profile_holds_the_mlp_input_and_gate_up(tmp_path):
    """V0 (0.6.4) profiles eagerly: at the MLP the layer's input (1 unit of tokens × hidden × 2 B), the
    residual (1), gate_up (7), the SiLU product (3.5) and the down projection (1) are alive: 13.5 units for
    Llama-3.1-8B, 2 more than a graph that frees at last use (V1 under torch.compile)."""
    tokens = 20_000
    serving = f'max_model_len = {tokens}\nengine_version = "{{}}"\nenforce_eager = {{}}'
    eager = compute_budget(_run(tmp_path, "llama-3.1-8b", serving.format("0.6.4", "false"), gpu="rtx3090"))
    unit = tokens * 4096 * 2
    assert eager.activation_peak_bytes == pytest.approx(13.5 * unit + 8.125 * MIB, abs=2 * MIB)


def _mxfp4_experts(inter: int, hidden: int) -> int:
    """One GPT-OSS-20B layer's 32 experts as loaded: w13, w2 (half a byte, a scale per 32), bf16 biases."""
    w13 = 2 * inter * hidden // 2 + 2 * inter * (hidden // 32)
    w2 = hidden * inter // 2 + hidden * -(-inter // 32)
    return 32 * (w13 + w2 + (2 * inter + hidden) * 2)


def test_mxfp4_on_hopper_is_marlin_until_triton_kernels_ships(tmp_path):
    """GPT-OSS-20B on an H100: at 0.11.0 Marlin pads the experts (intermediate 2880 → 2944, hidden → 3072);
    from 0.12 (vendored triton_kernels) Triton pads the intermediate to 64 only (2880 stays)."""
    b11 = compute_budget(_run(tmp_path, "gpt-oss-20b", 'engine_version = "0.11.0"'))
    b18 = compute_budget(_run(tmp_path, "gpt-oss-20b", 'engine_version = "0.18.0"'))
    b12 = compute_budget(_run(tmp_path, "gpt-oss-20b", 'engine_version = "0.12.0"'))
    assert b11.weights_bytes - b18.weights_bytes == 24 * (_mxfp4_experts(2944, 3072) - _mxfp4_experts(2880, 2880))
    assert b12.weights_bytes == b18.weights_bytes


def test_mxfp4_experts_whole_under_expert_parallelism(tmp_path):
    """vLLM's ``--enable-expert-parallel`` (ep = tp): each rank loads half of GPT-OSS-20B's 32 experts at their
    full width (``FusedMoE``'s ``tp_size`` is 1 under EP), not half the experts at half the width. Without EP the
    two ranks split each expert (1440 → 1472, padded to 64 by the Triton backend at 0.18)."""
    serving = 'engine_version = "0.18.0"'
    split = compute_budget(_run(tmp_path, "gpt-oss-20b", serving, tp=2))
    whole = compute_budget(_run(tmp_path, "gpt-oss-20b", serving, tp=2, ep=2))
    assert whole.weights_bytes - split.weights_bytes == \
        24 * (_mxfp4_experts(2880, 2880) // 2 - _mxfp4_experts(1472, 2880))


def test_mxfp4_hopper_swizzle_at_019(tmp_path):
    """0.19's Triton backend rewrites the loaded experts: values transposed and padded to 64 bytes a dim
    (1440 → 1472), swizzled scale copies (rows to 256: 5760 → 5888, 2880 → 3072) beside the loaded scales,
    fp32 biases. The llm-d-planner logs print 13.64 GiB (TP1) and 7.01 GiB (TP2) for the weights."""
    b18 = compute_budget(_run(tmp_path, "gpt-oss-20b", 'engine_version = "0.18.0"'))
    b19 = compute_budget(_run(tmp_path, "gpt-oss-20b", 'engine_version = "0.19.0"'))
    w13 = 1472 * 5760 + 5760 * 90 + 5888 * 90
    w2 = 1472 * 2880 + 2880 * 90 + 3072 * 90
    swizzled = 32 * (w13 + w2 + (5760 + 2880) * 4)
    assert b19.weights_bytes - b18.weights_bytes == 24 * (swizzled - _mxfp4_experts(2880, 2880))
    assert b19.weights_bytes / GIB == pytest.approx(13.64, rel=0.003)
    tp2 = compute_budget(_run(tmp_path, "gpt-oss-20b", 'engine_version = "0.19.0"', tp=2))
    assert tp2.weights_bytes / GIB == pytest.approx(7.01, rel=0.006)


def test_non_torch_from_published_measurements(tmp_path):
    llama = "llama-3.1-8b"
    tp2 = _run(tmp_path, llama, 'engine_version = "0.19.0"', tp=2)
    assert measured_non_torch(tp2)[0] == int(2.07 * GIB)  # 0.19 counts the run part only (after_init)
    tp8 = _run(tmp_path, llama, 'engine_version = "0.19.0"', tp=8)
    assert measured_non_torch(tp8)[0] == int(2.17 * GIB) and "(measured at tp=4)" in measured_non_torch(tp8)[1]
    given = _run(tmp_path, llama, 'engine_version = "0.19.0"\nnon_torch_gib = 1.5', tp=2)
    assert measured_non_torch(given) == (int(1.5 * GIB), "serving.non_torch_gib")
    assert measured_init(tp2)[0] == int(0.51 * GIB) + int(1.02 * GIB)  # context + distributed groups


@pytest.mark.parametrize(("version", "expected"), [
    ("0.2.7", "total"), ("0.4.1", "init"), ("0.6.3.post1", "init"), ("0.6.4.post1", "absolute"), ("0.6.5", "baseline"),
    ("0.7.3", "baseline"), ("0.8.5", "absolute"), ("0.9.2", "baseline"), ("0.10.1.1", "baseline"),
    ("0.11.0", "after_init"), ("0.19.0", "after_init")])
def test_non_torch_window_by_version(version, expected):
    assert window("vllm", version) == expected


def test_non_torch_parts_by_window(tmp_path):
    """Each version counts its window's parts: the 3090's context (0.35) at 0.6.4, none of it from 0.6.5; the
    PCIe TP2 groups (0.30) at 0.7.3 and for another Ada card; V1's run part (0.25) everywhere at tp 1."""
    llama = "llama-3.1-8b"
    assert measured_non_torch(_run(tmp_path, llama, 'engine_version = "0.6.4.post1"', gpu="rtx3090"))[0] == int(0.35 * GIB)
    assert measured_non_torch(_run(tmp_path, llama, 'engine_version = "0.7.3"', gpu="rtx3090"))[0] == 0
    for gpu in ("l40s", "rtx4090"):
        assert measured_non_torch(_run(tmp_path, llama, 'engine_version = "0.7.3"', tp=2, gpu=gpu))[0] == int(0.30 * GIB)
    l40s_v1 = measured_non_torch(_run(tmp_path, llama, 'engine_version = "0.8.5"', gpu="l40s"))
    # 0.8.x: the context is in it; the run part without 0.18's CUDA-graph profiling (0.13, version sweep)
    assert l40s_v1[0] == context_bytes(HardwareSpec.preset("l40s"))[0] + int(0.13 * GIB)
    assert measured_non_torch(_run(tmp_path, llama, 'engine_version = "0.19.0"', gpu="a6000"))[0] == int(0.25 * GIB)


def test_context_carried_by_local_memory():
    """Another GPU's context is the H100's with its own stack reservation (SMs × resident threads × 1 KiB);
    on the RTX 3090 that gives 0.372 GiB against the 0.35 its log measures."""
    h100 = int(0.51 * GIB)
    assert context_bytes(HardwareSpec.preset("h100"))[0] == h100
    assert context_bytes(HardwareSpec.preset("l40s"))[0] == h100 - 132 * 2048 * 1024 + 142 * 1536 * 1024
    assert context_bytes(HardwareSpec.preset("a6000"))[0] == h100 - 132 * 2048 * 1024 + 84 * 1536 * 1024
    carried_3090 = h100 - 132 * 2048 * 1024 + 82 * 1536 * 1024
    assert carried_3090 / GIB == pytest.approx(0.372, abs=0.001)
    assert context_bytes(HardwareSpec.preset("rtx3090"))[0] == int(0.35 * GIB)  # measured wins


def test_symmetric_memory_groups_not_carried_before_011(tmp_path):
    """0.19's H100 distributed measurement holds the symmetric-memory all-reduce of 0.11+: a 0.9 run at tp 2
    does not take it (not measured), a 0.11 one does."""
    llama = "llama-3.1-8b"
    old = _run(tmp_path, llama, 'engine_version = "0.9.2"', tp=2)
    assert dist_bytes(old)[0] == 0 and "not measured" in dist_bytes(old)[1]
    assert dist_bytes(_run(tmp_path, llama, 'engine_version = "0.11.0"', tp=2))[0] == int(1.02 * GIB)


def test_v0_out_of_place_all_reduce_and_worker_rank(tmp_path):
    """V0 at tp 2: a worker that does not sample peaks in the MLP, where from 0.6.5 the all-reduce's new output
    is one more hidden-sized tensor (0.6.4 reduces in place); the driver samples; blocks are the minimum."""
    serving = 'engine_version = "{}"\nmax_model_len = 4096'
    old = _run(tmp_path, "llama-3.1-8b", serving.format("0.6.4.post1"), tp=2)
    new = _run(tmp_path, "llama-3.1-8b", serving.format("0.7.3"), tp=2)
    assert not samples(new, 0, 1) and samples(new, 0, 0)
    grown = compute_budget(new, 0, 1).activation_peak_bytes - compute_budget(old, 0, 1).activation_peak_bytes
    assert grown == 4096 * 4096 * 2
    driver, worker = compute_budget(new, 0, 0), compute_budget(new, 0, 1)
    assert driver.activation_peak_bytes > worker.activation_peak_bytes
    assert compute_budgets(new)[0].num_kv_blocks == min(driver.num_kv_blocks, worker.num_kv_blocks)
    v1 = _run(tmp_path, "llama-3.1-8b", serving.format("0.11.0"), tp=2)
    assert samples(v1, 0, 1)  # V1 all-gathers the logits: every rank samples


def test_sglang_pool_and_default_fraction(tmp_path):
    """profile_max_num_token's total is the free memory after init; mem_fraction_static's default by version
    (H100: nvidia-smi 81,559 MiB)."""
    assert sglang_server_defaults("0.4.9", 81_559, 1).mem_fraction_static == 0.874  # (81,559 − 10 GiB) / 81,559
    assert sglang_server_defaults("0.5.5", 81_559, 1).mem_fraction_static == 0.835  # 512 + 8,192·1.5 + 256·2 + 128 MiB reserved
    assert sglang_server_defaults("0.5.5", 24_564, 1).mem_fraction_static == 0.847  # RTX 4090: 512 + 2,048·1.5 + 24·2 + 128 MiB
    run = _run(tmp_path, "llama-3.1-8b", 'engine = "sglang"\nengine_version = "0.5.5"')
    assert run.serving.mem_fraction_static == 0.835
    b = compute_budget(run)
    free0 = int(79.19 * GIB) - int(0.51 * GIB)
    rest = free0 - b.weights_bytes - (free0 - int(free0 * 0.835))
    assert b.num_kv_blocks == rest // (32 * 8 * 2 * 128 * 2)


def test_a_gpu_without_capacity_takes_what_pytorch_reports(tmp_path):
    for gpu, gib in (("h100", 79.19), ("l40s", 44.42), ("a6000", 47.54), ("rtx3090", 23.58), ("rtx4090", 23.64),
                     ("rtx5090", 31.36)):
        assert _run(tmp_path, "llama-3.1-8b", "", gpu=gpu).hardware.capacity_gib == gib


def test_the_rtx5090_context_follows_its_sms():
    # no measured context on the RTX 5090: the H100's, with 170 SMs × 1,536 threads of 1 KiB stack instead of
    # 132 × 2,048 (timeline.serve.non_torch.context_bytes)
    size, source = context_bytes(HardwareSpec.preset("rtx5090"))
    ref = int(CONTEXT[CONTEXT_REFERENCE][0] * GIB)
    assert size == ref - 132 * 2048 * 1024 + 170 * 1536 * 1024 and "170 SMs" in source


def test_opt_serves_with_learned_positions(tmp_path):
    """OPT-125m under vLLM: no rotary cache (its positions are a learned weight, with OPTLearnedPositionalEmbedding's
    two offset rows, vllm/model_executor/models/opt.py as transformers'); the weights are the parameters with the
    vocabulary padded to 64 (50,272 → 50,304 rows, the head tied), in fp16."""
    b = compute_budget(_run(tmp_path, "opt-125m", 'engine_version = "0.4.1"\ndtype = "fp16"', gpu="a6000"))
    assert b.rope_cache_bytes == 0
    assert b.weights_bytes == (125_239_296 + 32 * 768) * 2


def test_triton_sampler_from_017(tmp_path):
    """The Triton top-k/top-p path arrives at 0.17.0 (0.16.0 still sorts): Qwen3-14B's profile peak drops by the
    sort's 24 bytes a logit less the Triton buffer and the rows' hidden states (5.64 GiB at 0.15.0, 2.23 at
    0.17.0 in the llm-d-planner version sweep)."""
    serving = 'engine_version = "{}"\nmax_model_len = 8192\ngpu_memory_utilization = 0.95'
    b16 = compute_budget(_run(tmp_path, "qwen3-14b", serving.format("0.16.0")))
    b17 = compute_budget(_run(tmp_path, "qwen3-14b", serving.format("0.17.0")))
    n, vocab, hidden = 1024, 151_936, 5120
    diff = 24 * n * vocab - 132 * vocab * 4 - 2 * n * hidden * 2
    assert b16.activation_peak_bytes - b17.activation_peak_bytes == pytest.approx(diff, abs=4 * MIB)
    b15 = compute_budget(_run(tmp_path, "qwen3-14b", serving.format("0.15.0")))
    assert b15.activation_peak_bytes == b16.activation_peak_bytes
    assert b15.activation_peak_bytes / GIB == pytest.approx(5.64, rel=0.01)  # the sweep's 0.15.0 and 0.17.0 logs
    assert b17.activation_peak_bytes / GIB == pytest.approx(2.23, rel=0.01)


def test_cuda_graph_profiling_enters_the_window_at_018(tmp_path):
    """From 0.18 the CUDA-graph memory profiling runs inside the window: its residue (0.25 − 0.13 GiB at TP1)
    is in the run part; before, or under enforce_eager, the run part is the version sweep's 0.13 GiB; at TP2
    the H100 measurement less the same residue."""
    llama = "llama-3.1-8b"
    run17 = measured_non_torch(_run(tmp_path, llama, 'engine_version = "0.17.0"'))
    assert run17[0] == int(0.13 * GIB) and "version sweep" in run17[1]
    assert measured_non_torch(_run(tmp_path, llama, 'engine_version = "0.18.0"'))[0] == int(0.25 * GIB)
    eager = measured_non_torch(_run(tmp_path, llama, 'engine_version = "0.19.0"\nenforce_eager = true'))
    assert eager[0] == int(0.13 * GIB)
    tp2 = measured_non_torch(_run(tmp_path, llama, 'engine_version = "0.17.0"', tp=2))
    assert tp2[0] == int(2.07 * GIB) - (int(0.25 * GIB) - int(0.13 * GIB))


def test_flashinfer_sampler_keeps_three_fp32_copies(tmp_path):
    """With FlashInfer's sampler (0.10.1.1 when installed) the profile's sampler holds the bf16 logits and
    three fp32 copies (cast, top-k mask, softmax): 14 bytes a logit, no sort and no kept buffer. Qwen2-7B on
    an A100 at 0.25 of 79.19 GiB: the log prints 5,867 blocks."""
    serving = ('engine_version = "0.10.1.1"\nmax_model_len = 16384\ngpu_memory_utilization = 0.25\n'
               "max_num_batched_tokens = 2048\nmax_num_seqs = 256\n")
    hw = "capacity_gib = 79.19\n"
    sort = compute_budget(_run(tmp_path, "qwen2-7b-instruct", serving, gpu="a100", hw=hw))
    fi = compute_budget(_run(tmp_path, "qwen2-7b-instruct", serving + "flashinfer_sampler = true", gpu="a100", hw=hw))
    n, vocab = 256, 152_064
    assert sort.activation_peak_bytes - fi.activation_peak_bytes == pytest.approx(
        24 * n * vocab - 2 * n * 3584 * 2, abs=4 * MIB)
    assert fi.num_kv_blocks == pytest.approx(5867, rel=0.015)
    with pytest.raises(Exception, match="serving.flashinfer_sampler"):
        _run(tmp_path, "qwen2-7b-instruct", 'engine_version = "0.7.3"\nflashinfer_sampler = true')


def test_no_peer_access_keeps_nccl_buffers_in_host_memory(tmp_path):
    """Ranks without peer access (other nodes, P2P off): NCCL's SHM/NET transports put no measured buffer on the
    device, the run part is TP1's; 2×A100 without P2P at 0.10.1.1 print 74,510 blocks."""
    serving = ('engine_version = "0.10.1.1"\nmax_model_len = 16384\ngpu_memory_utilization = 0.5\n'
               "max_num_batched_tokens = 2048\nmax_num_seqs = 256\nflashinfer_sampler = true\n")
    hw = "capacity_gib = 79.19\n"
    p2p = _run(tmp_path, "qwen2-7b-instruct", serving, tp=2, gpu="a100", hw=hw)
    host = _run(tmp_path, "qwen2-7b-instruct", serving + "peer_access = false", tp=2, gpu="a100", hw=hw)
    assert dist_bytes(host) == (0, dist_bytes(host)[1]) and "host memory" in dist_bytes(host)[1]
    assert measured_non_torch(host)[0] == int(0.13 * GIB)
    assert measured_non_torch(p2p)[0] > measured_non_torch(host)[0]
    assert compute_budget(host).num_kv_blocks == pytest.approx(74_510, rel=0.002)


def test_cuda_graph_capture_sizes_by_version():
    """``VllmConfig._set_cudagraph_sizes``: by 8 up to the cap at 0.11.0 (one ``--cuda-graph-sizes`` value is the
    cap), by 8 below 256 and by 16 from 256 at 0.12.0 on, capped by ``--max-cudagraph-capture-size``; the
    speculative tokens widen the default cap from 0.14.0; never above ``max_num_batched_tokens``."""
    by8 = (1, 2, 4, *range(8, 513, 8))
    assert vllm_capture_sizes("0.11.0", 256, 8192) == by8
    assert vllm_capture_sizes("0.11.0", 256, 8192, given=(64,)) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert vllm_capture_sizes("0.11.0", 256, 8192, given=(64, 1, 3)) == (1, 3, 64)
    assert vllm_capture_sizes("0.11.0", 256, 256) == (1, 2, 4, *range(8, 257, 8))
    by16 = (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))
    assert vllm_capture_sizes("0.12.0", 256, 8192) == by16 and len(by16) == 51
    assert vllm_capture_sizes("0.19.0", 1024, 8192, max_size=64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert vllm_capture_sizes("0.19.0", 1024, 8192, given=(64,)) == (64,)  # a list as given from 0.12
    assert vllm_capture_sizes("0.12.0", 64, 8192, spec_tokens=3)[-1] == 128
    assert vllm_capture_sizes("0.19.0", 64, 8192, spec_tokens=3)[-1] == 512


def test_from_vllm_maps_the_capture_cap(tmp_path):
    out = tmp_path / "run.toml"
    assert main(["from-vllm", "vllm serve m --max-cudagraph-capture-size 32", "--hf-config",
                 str(HF / "llama-3.1-8b"), "--engine-version", "0.19.0", "--gpu", "h100", "-o", str(out)]) == 0
    run = load_serve_run(out)
    assert run.serving.max_cudagraph_capture_size == 32 and capture_sizes(run) == (32, 24, 16, 8, 4, 2, 1)


def test_disable_custom_all_reduce_leaves_its_buffers_out(tmp_path, capsys):
    """vLLM's custom all-reduce holds two cudaMalloc'd IPC buffers per tensor-parallel rank — the 2,560-byte signal
    block with an 8 MiB staging buffer, and an 8 MiB buffer — each in whole 2 MiB pages: 10 + 8 MiB, inside every
    measured distributed part. `--disable-custom-all-reduce` leaves them out; with vLLM 0.19's symmetric-memory
    all-reduce on sm 90 its buffers shrink to CUSTOM_ALL_REDUCE_MAX_SIZES (tp 8: 256 KiB → one page each). Without
    NVLink it runs for two ranks only; 0.7.3 V0 subtracts the distributed part from the KV budget, so the pool grows
    by what the flag frees."""
    from timeline.serve.non_torch import custom_all_reduce_bytes, dist_bytes

    llama = "llama-3.1-8b"
    on = _run(tmp_path, llama, 'engine_version = "0.19.0"', tp=2)
    off = _run(tmp_path, llama, 'engine_version = "0.19.0"\ndisable_custom_all_reduce = true', tp=2)
    assert custom_all_reduce_bytes(on) == 18 * MIB
    assert dist_bytes(on)[0] - dist_bytes(off)[0] == 18 * MIB
    assert custom_all_reduce_bytes(_run(tmp_path, llama, 'engine_version = "0.19.0"', tp=8)) == 4 * MIB
    assert custom_all_reduce_bytes(_run(tmp_path, llama, 'engine_version = "0.19.0"', tp=4, gpu="rtx4090")) == 0
    v0 = 'engine_version = "0.7.3"\nmax_model_len = 8192'
    pool_on = compute_budget(_run(tmp_path, llama, v0, tp=2, gpu="l40s")).kv_pool_bytes
    pool_off = compute_budget(_run(tmp_path, llama, v0 + "\ndisable_custom_all_reduce = true", tp=2,
                                   gpu="l40s")).kv_pool_bytes
    assert 0 < pool_off - pool_on <= 18 * MIB  # whole KV blocks of what it frees
    out = tmp_path / "from-vllm.toml"
    assert main(["from-vllm", "vllm serve m -tp 2 --disable-custom-all-reduce", "--hf-config", str(HF / llama),
                 "--engine-version", "0.19.0", "--gpu", "h100", "-o", str(out)]) == 0
    assert load_serve_run(out).serving.disable_custom_all_reduce


def test_sglang_request_slots_by_version(tmp_path):
    """max_running_requests and the ReqToTokenPool's rows as each version derives them: up to 0.5.9 the pool's
    requests from the profiled tokens clamped to [2,048, 4,096] (init_memory_pool), the scheduler's at most half
    the capacity (TpModelWorker); from 0.5.10 at most half the final capacity (_resolve_max_num_reqs), a given one
    capped by the estimate (0.5.10 … 0.5.13) or by half the capacity (0.5.14 on); one more row from 0.5.12 and up
    to 0.4.6."""
    assert sglang_max_running_requests("0.5.9", 400_000, 400_000, 131_072, 0) == (2048, 2048)
    assert sglang_max_running_requests("0.5.9", 2_000_000, 2_000_000, 8192, 0) == (4096, 4096)
    assert sglang_max_running_requests("0.5.9", 3000, 3000, 8192, 0) == (1500, 2048)
    assert sglang_max_running_requests("0.4.6", 3000, 3000, 8192, 0) == (1500, 2049)
    assert sglang_max_running_requests("0.5.10", 3000, 3000, 8192, 0) == (1500, 1500)
    assert sglang_max_running_requests("0.5.12", 3000, 3000, 8192, 0) == (1500, 1501)
    assert sglang_max_running_requests("0.5.9", 3000, 3000, 8192, 9000) == (9000, 9000)
    assert sglang_max_running_requests("0.5.10", 3000, 3000, 8192, 9000) == (2048, 2048)
    assert sglang_max_running_requests("0.5.14", 3000, 3000, 8192, 9000) == (1500, 1501)
    # a run without --max-running-requests gets the version's own, derived from the pool it sizes
    small = 'engine = "sglang"\nengine_version = "0.5.10"\nmax_total_tokens = 3000'
    assert _run(tmp_path, "llama-3.1-8b", small).serving.max_num_seqs == 0  # the run file leaves it to the engine
    run = with_engine_requests(_run(tmp_path, "llama-3.1-8b", small))
    b = compute_budget(run)
    assert b.num_kv_blocks == 3000 and b.max_running_requests == 1500 and run.serving.max_num_seqs == 1500
    assert b.req_to_token_bytes == 1500 * (run.max_model_len + 4) * 4
    assert any("max_running_requests: 1,500" in n for n in run.notes)
    old = with_engine_requests(_run(tmp_path, "llama-3.1-8b", small.replace("0.5.10", "0.5.9")))
    assert old.serving.max_num_seqs == 1500 and compute_budget(old).req_to_token_bytes == 2048 * (
        old.max_model_len + 4) * 4  # the pool's rows from the profiled tokens, before the cap
    given = with_engine_requests(_run(tmp_path, "llama-3.1-8b", small + "\nmax_num_seqs = 64"))
    assert given.serving.max_num_seqs == 64 and compute_budget(given).max_running_requests == 64


def test_sglang_default_fraction_as_each_release_computes_it():
    """66 launches (0.5.5 … 0.5.23; 16 … 180 GiB GPUs; tp 1 … 8; MLA or not; prefill graphs on, off, opted in;
    given chunked prefill, decode batch, context length, --max-total-tokens, --disable-cuda-graph; DP attention
    over 1 … 8 workers): the default
    mem_fraction_static each release's own handlers give (tests/data/sglang_mfs_cases.json, computed by running
    ``_handle_gpu_memory_settings`` / ``handle_gpu_memory_settings`` of each wheel on stubbed server arguments)."""
    cases = json.loads((Path(__file__).parents[1] / "data" / "sglang_mfs_cases.json").read_text())
    checked = 0
    for case in cases:
        extras = case.get("extras") or {}
        if set(extras) - {"enable_piecewise_cuda_graph", "disable_prefill_cuda_graph", "dsa", "dp_attention",
                          "dp_size"} or case["multimodal"]:
            continue  # inputs a run file does not hold (KDA, a vision tower's size)
        prefill = "on" if extras.get("enable_piecewise_cuda_graph") else \
            "off" if extras.get("disable_prefill_cuda_graph") else "auto"
        d = sglang_server_defaults(".".join(map(str, case["version"])), case["gpu_mem_mib"], case["tp"], case["pp"],
                                   mla=case["mla"], architectures=tuple(case["architectures"]),
                                   model_path=case["model_path"], chunked_prefill_size=case["chunked_prefill_size"] or 0,
                                   cuda_graph_max_bs=case["cuda_graph_max_bs"] or 0,
                                   disable_cuda_graph=case["disable_cuda_graph"], prefill_cuda_graph=prefill,
                                   max_running_requests=case["max_running_requests"] or 0,
                                   max_total_tokens=case["max_total_tokens"] or 0,
                                   context_length=case["context_length"] or 0, dsa=bool(extras.get("dsa")),
                                   dp_attention=bool(extras.get("dp_attention")), dp_size=extras.get("dp_size", 1))
        assert d.mem_fraction_static == case["mem_fraction_static"], (case["name"], case["derivation"])
        assert d.reserved_mib == case["derived"]["reserved_mem"], case["name"]
        checked += 1
    assert checked >= 60


def test_sglang_pool_is_whole_pages(tmp_path):
    """--page-size (serving.block_size): the pool is rounded down to whole pages (init_memory_pool …
    _resolve_token_capacity); SGLang's default page is one token."""
    one = compute_budget(_run(tmp_path, "llama-3.1-8b", 'engine = "sglang"\nengine_version = "0.5.10"'))
    paged = compute_budget(_run(tmp_path, "llama-3.1-8b",
                                'engine = "sglang"\nengine_version = "0.5.10"\nblock_size = 64'))
    assert paged.num_kv_blocks == one.num_kv_blocks // 64 * 64 and one.num_kv_blocks % 64


def test_sglang_versions_from_0_3_on_are_read(tmp_path):
    """Every release from 0.3.0 has its rules (0.5.23 the newest read; a later one runs them); 0.2 is refused."""
    for version in ("0.3.0", "0.3.6", "0.4.3", "0.5.6", "0.5.12", "0.5.23", "0.6.1"):
        assert _run(tmp_path, "llama-3.1-8b", f'engine = "sglang"\nengine_version = "{version}"').serving \
            .mem_fraction_static > 0
    with pytest.raises(SpecError, match="SGLang 0.2.15"):
        _run(tmp_path, "llama-3.1-8b", 'engine = "sglang"\nengine_version = "0.2.15"')


@pytest.mark.parametrize(("version", "mib", "tp", "expected"), [
    # ServerArgs.__post_init__ of each sdist: mem_fraction_static by tp, the value at tp 8 moving 0.83 → 0.82 → 0.81
    ("0.3.0", 81559, 8, (8192, 160, 0.83)),
    ("0.3.6", 81559, 8, (8192, 160, 0.82)),
    ("0.3.6", 24564, 1, (2048, 4, 0.88)),  # a quarter of the chunk and 4 graphs below 25,000 MiB (from 0.3.5.post2)
    ("0.3.5.post1", 24564, 1, (8192, 160, 0.88)),
    ("0.4.0", 24564, 4, (2048, 8, 0.85)),
    ("0.4.0.post1", 24564, 4, (2048, 80, 0.85)),
    ("0.4.3", 81559, 2, (8192, 160, 0.87)),
    ("0.4.5.post3", 143771, 8, (8192, 160, round((143771 - 13 * 1024) / 143771, 6))),
    # from 0.4.6.post2 tp·pp counts and a large device takes min(0.88 + 48 GiB·0.12/gpu, (gpu − 18 GiB)/gpu)
    ("0.4.6.post2", 143771, 8, (8192, 160, round(min(0.88 + 48 * 1024 * 0.12 / 143771, (143771 - 18 * 1024) / 143771), 6))),
    ("0.4.7", 183359, 8, (16384, 160, 0.79)),  # B200: above 180,000 MiB
])
def test_sglang_0_3_to_0_4_7_defaults_by_release(version, mib, tp, expected):
    from timeline.spec.engine_versions import sglang_server_defaults

    d = sglang_server_defaults(version, mib, tp)
    assert (d.chunked_prefill_size, d.cuda_graph_max_bs, round(d.mem_fraction_static, 6)) == expected
    # 0.4.7.post1 takes the reserve rule: (9.5 + tp/2) GiB below 90 GiB
    assert sglang_server_defaults("0.4.7.post1", 81559, 8).mem_fraction_static == round((81559 - 13.5 * 1024) / 81559, 3)


def test_sglang_request_table_by_release():
    """init_memory_pool: 0.3.0 caps the requests at 5,120 and 0.3.0 … 0.3.1.post1 make one row per request and
    8 columns beyond the context; later releases cap at 4,096 with one more row (to 0.4.6) and 4 columns."""
    from timeline.spec.engine_versions import sglang_max_running_requests, sglang_req_to_token_width

    assert sglang_max_running_requests("0.3.0", 10**7, 10**7, 1000, 0) == (5120, 5120)
    assert sglang_max_running_requests("0.3.1.post2", 10**7, 10**7, 1000, 0) == (4097, 4097)
    assert sglang_max_running_requests("0.4.7", 10**7, 10**7, 1000, 0) == (4096, 4096)
    assert [sglang_req_to_token_width(v) for v in ("0.3.0", "0.3.1.post1", "0.3.1.post2", "0.5.10")] == [8, 8, 4, 4]
