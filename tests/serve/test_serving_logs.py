"""The serving budget against the calibration side of the public startup logs (issue 27).

``tools/compare_serving_logs.py`` builds every record of ``tests/data/serving_logs.json``; these tests
hold the *calibration* records at the errors the tool reaches today, each tolerance stated. The unseen
side is never asserted (it is reported by the tool, not tuned on).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from timeline.errors import SpecError
from timeline.io.serve_runfile import load_serve_run
from timeline.serve.budget import compute_budget
from timeline.spec.engine_versions import vllm_scheduler_defaults

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "tests" / "data" / "hf"


def _tool():
    spec = importlib.util.spec_from_file_location("compare_serving_logs", ROOT / "tools" / "compare_serving_logs.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["compare_serving_logs"] = mod
    spec.loader.exec_module(mod)
    return mod


TOOL = _tool()
RECORDS = {r["id"]: r for r in json.loads(TOOL.LOGS.read_text())["records"]}

#: calibration record → (metric, relative error reached, tolerance); every start and refusal agrees
REACHED = {
    # vLLM 0.6.4 V0 on an RTX 3090: the eager profile run keeps each sub-block's input and gate_up alive
    "vllm-10517-3090-llama31-8b-20k": [("weights", -0.0, 0.001),
                                       ("activation", -0.0015, 0.005),
                                       ("kv", 0.0005, 0.002)],
    "vllm-10517-3090-llama31-8b-29k": [("weights", -0.0, 0.001), ("activation", 0.0012, 0.005), ("kv", 0.0, 0.002)],
    # 0.9.2 counts the distributed groups and the run (baseline window): the run part TP4's at 0.19 less the
    # CUDA-graph profiling 0.18 put in the window, the groups not measured at 0.9 (0.19's hold 0.11+'s
    # symmetric-memory all-reduce), so 0; SGLang's pool from the free memory after init
    "vllm-21348-h100x4-qwen3-235b-fp8": [("kv", 0.0375, 0.005)],
    "sglang-21348-h100x4-qwen3-235b-fp8": [("kv", 0.0374, 0.005)],
    # MXFP4 experts Marlin-padded on Hopper at 0.11.0 (no triton_kernels): the refusal is reproduced; 0.11's run
    # part (0.13, no CUDA-graph profiling in the window) leaves 0.15 GiB more pool than printed (open: only the
    # pool is printed)
    "vllm-27508-h100-gpt-oss-120b": [("kv", 0.0881, 0.005)],
    # V0 TP2: the driver (rank 0) samples, the worker (rank 1) does not; both printed 1.26 GiB, so the driver's
    # sampler is below its forward peak there, which the sort model misses (open); the worker's forward holds
    # the out-of-place all-reduce of 0.6.5+ and the row-parallel input through it
    "vllm-15815-l40sx2-qwen25-32b": [("weights", -0.0061, 0.002),
                                     ("activation", 0.2056, 0.01),
                                     ("kv", -0.0094, 0.002)],
    "vllm-15815-l40sx2-qwen25-32b-rank1": [("weights", -0.0061, 0.002),
                                           ("activation", -0.076, 0.01),
                                           ("kv", -0.0094, 0.002)],
    # V1's run part of the non-torch memory (0.25 GiB, measured on H100) carried to the A100 at tp 1
    "vllm-myoceane-a100-gpt-oss-20b": [("weights", -0.0024, 0.001), ("kv", 0.0019, 0.002)],
    # vLLM 0.19.0 on H100 (llm-d-planner): Triton sampler, kept MoE workspace, cuBLAS workspace, measured non-torch
    "vllm-llmd-deepseek-ai-deepseek-v2-tp1-8192": [("weights", -0.0017, 0.001),
                                                   ("activation", 0.0019, 0.005),
                                                   ("kv", 0.0012, 0.002)],
    "vllm-llmd-meta-llama-llama-3-1-8b-tp1-8192": [("weights", -0.0001, 0.001),
                                                   ("activation", -0.0012, 0.005),
                                                   ("kv", -0.0001, 0.002)],
    # a stage without the sampler: the compiled forward's peak is 0.3 GiB above the eager graph's (open)
    "vllm-llmd-meta-llama-llama-3-1-8b-tp1pp4dp1-8192": [("weights", -0.0, 0.001),
                                                         ("activation", -0.2857, 0.01),
                                                         ("kv", 0.0018, 0.002)],
    "vllm-llmd-meta-llama-llama-3-1-8b-tp2-8192": [("weights", 0.0, 0.001),
                                                   ("activation", -0.0012, 0.005),
                                                   ("kv", -0.0, 0.002)],
    "vllm-llmd-meta-llama-llama-3-1-8b-tp4-8192": [("weights", 0.0003, 0.001),
                                                   ("activation", -0.0012, 0.005),
                                                   ("kv", -0.0005, 0.002)],
    "vllm-llmd-mistralai-mixtral-8x7b-i-tp2-8192": [("weights", -0.0001, 0.001),
                                                    ("activation", 0.0013, 0.005),
                                                    ("kv", 0.0002, 0.002)],
    "vllm-llmd-qwen-qwen2-5-7b-instruct-tp1-8192": [("weights", -0.004, 0.001),
                                                    ("activation", -0.0024, 0.005),
                                                    ("kv", 0.0008, 0.002)],
    "vllm-llmd-qwen-qwen2-5-7b-instruc-tp1-32768": [("weights", -0.004, 0.001),
                                                    ("activation", -0.0024, 0.005),
                                                    ("kv", 0.0008, 0.002)],
    "vllm-llmd-qwen-qwen3-30b-a3b-tp1-8192": [("weights", 0.0, 0.001),
                                              ("activation", -0.0018, 0.005),
                                              ("kv", 0.0011, 0.002)],
    "vllm-llmd-w8a8-redhatai-llam-tp1-8192-dtf16": [("weights", 0.0005, 0.001),
                                                    ("activation", -0.0012, 0.005),
                                                    ("kv", -0.0, 0.002)],
    "vllm-llmd-codellama-codellama-7b-h-tp1-8192": [("weights", -0.0003, 0.001),
                                                    ("activation", -0.2034, 0.01),
                                                    ("kv", 0.0025, 0.002)],
    "vllm-llmd-fp8dyn-llama-3-3-70b-tp2-8192": [("weights", 0.0, 0.001),
                                                ("activation", 0.003, 0.005),
                                                ("kv", 0.0009, 0.002)],
    "vllm-llmd-fp8dyn-llama-3-3-70b-tp4-8192": [("weights", -0.0, 0.001),
                                                ("activation", -0.0021, 0.005),
                                                ("kv", 0.0008, 0.002)],
    "vllm-llmd-fp8dyn-redhatai-qwen2-5-tp1-8192": [("weights", -0.0023, 0.001),
                                                   ("activation", -0.0024, 0.005),
                                                   ("kv", 0.0003, 0.002)],
    "vllm-llmd-meta-llama-llama-3-tp1-8192-qfp8": [("weights", 0.0005, 0.001),
                                                   ("activation", -0.0012, 0.005),
                                                   ("kv", -0.0001, 0.002)],
    # MXFP4 on Hopper at 0.19: the Triton backend's swizzled experts and the kept scales; no kept MoE workspace
    "vllm-llmd-openai-gpt-oss-20b-tp2-8192": [("weights", -0.0052, 0.002),
                                              ("activation", 0.0011, 0.005),
                                              ("kv", 0.0006, 0.002)],
    "vllm-llmd-w8a8-redhatai-qwen2-5-7b-tp1-8192": [("weights", -0.0023, 0.001),
                                                    ("activation", -0.0024, 0.005),
                                                    ("kv", 0.0003, 0.002)],
    # Granite: the run adds 0.46 GiB outside torch, not the 0.25 of every other TP1 log of the sweep (open)
    "vllm-llmd-ibm-granite-granite-3-3-tp1-8192": [("weights", 0.0001, 0.001),
                                                   ("activation", -0.0706, 0.01),
                                                   ("kv", 0.0047, 0.002)],
    # round 4 (the same sweep): max_model_len below the 8,192-token budget moves nothing, as V1 profiles
    # max_num_batched_tokens; families read from their configs (Gemma's gated GeLU, Phi-3/4, Granite)
    "vllm-llmd-meta-llama-llama-tp1-8192-dtbf16": [("weights", -0.0001, 0.001),
                                                   ("activation", -0.0012, 0.005),
                                                   ("kv", -0.0, 0.002)],
    "vllm-llmd-meta-llama-llama-3-1-8b-tp1-2048": [("weights", -0.0001, 0.001),
                                                   ("activation", -0.0012, 0.005),
                                                   ("kv", -0.0001, 0.002)],
    "vllm-llmd-meta-llama-llama-3-1-8b-tp1-4096": [("weights", -0.0001, 0.001),
                                                   ("activation", -0.0012, 0.005),
                                                   ("kv", -0.0001, 0.002)],
    # Phi-4: 0.08 GiB of weights the config does not explain (open)
    "vllm-llmd-microsoft-phi-4-tp1-8192": [("weights", -0.0029, 0.001),
                                           ("activation", -0.0013, 0.005),
                                           ("kv", 0.0017, 0.002)],
    # Phi-2 (round 6): one input norm feeding attention and the MLP side by side, biased head; 12 MiB of the
    # printed weights (± 5 MiB of its rounding) not explained (the partial-rotary cos/sin cache is 0.13 MiB, not modelled)
    "vllm-llmd-microsoft-phi-2-tp1-2048": [("weights", -0.0023, 0.001),
                                           ("activation", -0.0012, 0.005),
                                           ("kv", 0.0001, 0.002)],
    # Mistral-Small-3.1 W8A8 (round 6, vision-language): the int8 language model beside the bf16 Pixtral tower and
    # projector; the encoder profile (2 images of 1540², one dense [S, S] mask) holds tp 1's peak in a vision MLP,
    # 0.12 GiB under the printed one (open); at tp 2 the sampler's peak over the kept encoder outputs
    "vllm-llmd-w8a8-mistral-small-24b-tp1-8192": [("weights", -0.0001, 0.001),
                                                  ("activation", -0.0532, 0.01),
                                                  ("kv", 0.0025, 0.002)],
    "vllm-llmd-w8a8-mistral-small-24b-tp2pp1dp1-8192": [("weights", -0.0044, 0.002),
                                                        ("activation", 0.0119, 0.005),
                                                        ("kv", 0.0005, 0.002)],
    "vllm-llmd-qwen-qwen2-5-7b-instruct-tp1-2048": [("weights", -0.004, 0.001),
                                                    ("activation", -0.0024, 0.005),
                                                    ("kv", 0.0008, 0.002)],
    "vllm-llmd-qwen-qwen2-5-7b-instruct-tp1-4096": [("weights", -0.004, 0.001),
                                                    ("activation", -0.0024, 0.005),
                                                    ("kv", 0.0008, 0.002)],
    "vllm-llmd-google-gemma-7b-tp1-8192": [("weights", -0.0002, 0.001),
                                           ("activation", 0.001, 0.005),
                                           ("kv", 0.0, 0.002)],
    "vllm-llmd-granite-3-1-2b-tp1-8192": [("weights", -0.0011, 0.001),
                                          ("activation", 0.0012, 0.005),
                                          ("kv", 0.0031, 0.002)],
    "vllm-llmd-meta-llama-llama-3-1-8b-tp1-16384": [("weights", -0.0001, 0.001),
                                                    ("activation", -0.0012, 0.005),
                                                    ("kv", -0.0001, 0.002)],
    "vllm-llmd-openai-gpt-oss-20b-tp1-8192-failed": [("weights", -0.0016, 0.001),
                                                     ("activation", 0.0011, 0.005),
                                                     ("kv", 0.0003, 0.002)],
    # round 5: the sweep's first runs (run records: weights and pool only); TP>1 weights up to 1.3 % short (open)
    "vllm-llmd-run1-deepseek-ai-deepseek-v2--tp2--8192": [("weights", -0.0065, 0.002), ("kv", 0.002, 0.002)],
    "vllm-llmd-run1-deepseek-ai-deepseek-v2--tp4--8192": [("weights", -0.0134, 0.002), ("kv", 0.001, 0.002)],
    "vllm-llmd-run1-ibm-granite-granite-3-1--tp2--8192": [("weights", -0.0019, 0.001), ("kv", 0.0007, 0.002)],
    "vllm-llmd-run1-ibm-granite-granite-3-3--tp2--8192": [("weights", 0.0002, 0.001), ("kv", 0.001, 0.002)],
    "vllm-llmd-run1-ibm-granite-granite-3-3--tp4--8192": [("weights", -0.0086, 0.002), ("kv", 0.0006, 0.002)],
    "vllm-llmd-run1-microsoft-phi-4-tp2--8192": [("weights", -0.0082, 0.002), ("kv", 0.002, 0.002)],
    "vllm-llmd-run1-mistralai-mixtral-8x7b-i-tp4--8192": [("weights", -0.0001, 0.001), ("kv", -0.0005, 0.002)],
    "vllm-llmd-run1-qwen-qwen2-5-7b-in-tp1--8192-dtf16": [("weights", -0.004, 0.001), ("kv", 0.0008, 0.002)],
    "vllm-llmd-run1-redhatai-llama-3-1-tp1--8192-dtf16": [("weights", 0.0005, 0.001), ("kv", 0.0, 0.002)],
    # W8A8 Llama-3.3-70B on one H100: 57 blocks (0.28 GiB) more than printed, no peak printed to place them (open)
    "vllm-llmd-run1-redhatai-llama-3-3-70b-i-tp1--8192": [("weights", 0.0, 0.001), ("kv", 0.0556, 0.005)],
    "vllm-llmd-run1-redhatai-llama-3-3-70b-i-tp4--8192": [("weights", -0.0, 0.001), ("kv", 0.0009, 0.002)],
    # the version sweep: 0.15 sorts, 0.17 takes the Triton sampler; both without 0.18's CUDA-graph profiling
    "vllm-llmd-vsweep-qwen3-14b-vllm-v0-15-0-tp1--8192": [("weights", -0.0001, 0.001),
                                                          ("activation", -0.0038, 0.005),
                                                          ("kv", 0.0006, 0.002)],
    "vllm-llmd-vsweep-qwen3-14b-vllm-v0-17-0-tp1--8192": [("weights", -0.0001, 0.001),
                                                          ("activation", 0.0016, 0.005),
                                                          ("kv", 0.0001, 0.002)],
    # vLLM 0.10.1.1 on A100s (dennislee22): FlashInfer's sampler where the log says it runs; TP groups without
    # peer access (other nodes, P2P off) keep NCCL's buffers in host memory; 80 GB totals taken as the H100's
    "vllm-dennislee-a100-qwen2-7b-u025": [("weights", -0.0039, 0.001), ("kv", -0.0143, 0.005)],
    "vllm-dennislee-a100-qwen2-7b-u050": [("weights", -0.0039, 0.001), ("kv", -0.0035, 0.002)],
    "vllm-dennislee-a100-40gb-qwen2-7b-tp2-2nodes": [("weights", -0.003, 0.001), ("kv", -0.0006, 0.002)],
    "vllm-dennislee-a100-qwen2-7b-tp2-u050": [("weights", -0.003, 0.001), ("kv", -0.0001, 0.002)],
    "vllm-dennislee-a100-gpt-oss-120b-tp4-4nodes": [("weights", -0.0012, 0.001), ("kv", 0.0001, 0.002)],
}

#: calibration records whose start or refusal the budget does not reproduce, and why (open)
START_DIFFERS = {
    # the engine allocated its KV cache, captured its CUDA graphs (1.84 GiB: a 626 MiB pool, the rest outside
    # PyTorch), then warmed up the sampler with 1,024 dummy requests (0.19.0 gpu_worker.py
    # compile_or_warm_up_model: _dummy_sampler_run after capture_model) and ran out of memory with 1.78 GiB
    # reserved but unallocated: a failure after the budget; the graphs' memory outside PyTorch is not modelled
    "vllm-llmd-openai-gpt-oss-20b-tp1-8192-failed",
}


def test_split_follows_its_rule():
    split = json.loads(TOOL.SPLIT.read_text())
    for entry in split["logs"]:
        h = int(hashlib.sha256(b"timeline-serving-v1:" + entry["url"].encode()).hexdigest(), 16)
        assert entry["side"] == ("unseen" if h % 3 == 0 else "calibration"), entry["url"]
    sides = {e["url"]: e["side"] for e in split["logs"]}
    assert len(split["logs"]) >= 40
    for rec in RECORDS.values():
        assert sides[rec["url"]] == rec["side"], rec["id"]
        assert "quotes" not in rec  # numbers and inputs only: no text of the sources is kept


@pytest.mark.parametrize("rid", sorted(REACHED))
def test_calibration_record_errors(rid, tmp_path):
    rec = RECORDS[rid]
    assert rec["side"] == "calibration"
    row = TOOL.compare(rec, tmp_path, before=False)
    assert not row.refused, row.refused
    for metric, reached, tol in REACHED[rid]:
        assert row.errors[metric] == pytest.approx(reached, abs=tol), (metric, row.cells[metric])
    assert row.cells["start"].startswith("ok") or rid in START_DIFFERS


def test_calibration_starts_and_refusals(tmp_path):
    built = [TOOL.compare(r, tmp_path, False) for r in RECORDS.values() if r["side"] == "calibration"]
    compared = [r for r in built if not r.refused]
    # round 8 added ten Gemma-3 records, round 9 twenty-five of gated delta-net hybrids, round 10 three of vLLM 0.20+:
    # none buildable (no published config, GPU preset or log lines beside their numbers; round 9's cache layouts are
    # held in tests/serve/test_gdn.py); the T4 and RTX PRO 4500 presets (stop 60) made two more comparable (the
    # RTX PRO 4500's gpt-oss-120b at TP 8 reads weights −13.5 % on Marlin's padding, sm 120's backend at every
    # release since stop 61; the 9.98 GiB is a comment's table, not an engine line). The T4's gemma-3-27b (vLLM 0.8.2) is refused since
    # stop 61: on a GPU below compute capability 8.0 vLLM's oracle runs V0, whose vision-language profile is not
    # modelled (as V1 it read activation 2.42 vs 1.66 GiB and refused to start where vLLM started)
    assert len(compared) == 58 and len(built) == 104
    v0 = next(r for r in built if r.rec["id"] == "vllm-15766-gemma3-27b-tp8-v0")
    assert v0.refused.startswith("tool error: serving.engine: a vision-language checkpoint (Gemma3ForConditional")
    assert set(REACHED) <= {r.rec["id"] for r in compared}
    # a record whose log does not say whether the engine started (its "starts" unknown) has no start to disagree on
    assert {r.rec["id"] for r in compared if not r.cells.get("start", "ok").startswith("ok")} == START_DIFFERS


def test_enough_logs_on_both_sides(tmp_path):
    """At least 40 logs build, a real share of them on the unseen side (only counted here, never scored)."""
    rows = [TOOL.compare(r, tmp_path, False) for r in RECORDS.values()]
    built = [r for r in rows if not r.refused]
    unseen = [r for r in built if r.rec["side"] == "unseen"]
    assert len(built) >= 40 and len(unseen) >= len(built) // 3


def _run(tmp_path: Path, config: str, serving: str, tp: int = 1, gpu: str = "h100"):
    path = tmp_path / "r.toml"
    path.write_text(f'[model]\nhf_config = "{HF / config / "config.json"}"\n[parallel]\ntp = {tp}\n'
                    f'[hardware]\ngpu = "{gpu}"\n[serving]\n{serving}\n[serving.load]\nnum_requests = 1\n')
    return load_serve_run(path)


def test_mxfp4_experts_only_with_marlin_padding(tmp_path):
    """GPT-OSS-20B on an A100 (sm 80, Marlin): attention bf16, experts 2880 → 2944 × 3072 padded."""
    run = _run(tmp_path, "gpt-oss-20b", 'engine_version = "0.11.0"', gpu="a100")
    assert run.quant is not None and run.quant.experts_only and run.serving.weight_dtype == "mxfp4"
    b = compute_budget(run)
    # 24 layers × 32 experts × 3 padded matrices of 2944 × 3072 (half a byte each + a byte per 32) + biases,
    # plus the bf16 rest; vLLM 0.19.0 printed 13.72 GiB on an A100
    assert b.weights_bytes / 2**30 == pytest.approx(13.72, rel=0.005)


def test_fp8_blocks_from_the_config(tmp_path):
    run = _run(tmp_path, "qwen3-235b-a22b-fp8", "", tp=4)
    assert run.quant is not None and (run.quant.block_rows, run.quant.group_size) == (128, 128)
    assert run.serving.weight_dtype == "fp8" and run.serving.quant_group_size == 128


def test_contradicting_weight_dtype_is_one_line(tmp_path):
    with pytest.raises(SpecError) as err:
        _run(tmp_path, "qwen3-235b-a22b-fp8", 'weight_dtype = "int4"', tp=4)
    assert "serving.weight_dtype" in str(err.value) and "contradicts the checkpoint's quantization_config" in str(err.value)


def test_scheduler_defaults_by_version():
    # V0 (0.6.4): one max_model_len-token profile step; > 32K turns chunked prefill on (512, 2048 from 0.6.6)
    assert vllm_scheduler_defaults("0.6.4.post1", 20000, 23.58, "h100").max_num_batched_tokens == 20000
    assert vllm_scheduler_defaults("0.6.4.post1", 40000, 79.2, "h100").max_num_batched_tokens == 512
    assert vllm_scheduler_defaults("0.7.3", 40000, 79.2, "h100").max_num_batched_tokens == 2048
    # V1: 8192 / 1024 on an H100, 2048 / 256 on an A100 (0.9+) or a 24 GiB card
    h100 = vllm_scheduler_defaults("0.11.0", 131072, 79.19, "h100")
    assert (h100.max_num_batched_tokens, h100.max_num_seqs) == (8192, 1024)
    a100 = vllm_scheduler_defaults("0.11.0", 131072, 79.19, "a100")
    assert (a100.max_num_batched_tokens, a100.max_num_seqs) == (2048, 256)
    # the offline LLM class (UsageContext.LLM_CLASS): 16384 / 8192 tokens, the server's max_num_seqs; V0 one default
    for version in ("0.8.5", "0.9.2", "0.11.0", "0.19.0"):
        assert vllm_scheduler_defaults(version, 131072, 79.19, "h100", usage="llm_class").max_num_batched_tokens \
            == 16384
        assert vllm_scheduler_defaults(version, 131072, 79.19, "a100", usage="llm_class").max_num_batched_tokens \
            == (16384 if version == "0.8.5" else 8192)
    assert vllm_scheduler_defaults("0.6.4.post1", 20000, 79.2, "h100", usage="llm_class").max_num_batched_tokens \
        == 20000
    # an engine built from EngineArgs elsewhere (ENGINE_CONTEXT): SchedulerConfig's own 2048 / 128, any device
    for version in ("0.8.5", "0.11.0", "0.19.0"):
        d = vllm_scheduler_defaults(version, 131072, 79.19, "h100", usage="engine_context")
        assert (d.max_num_batched_tokens, d.max_num_seqs) == (2048, 128)


def test_unread_old_versions_refused_by_name(tmp_path):
    for version in ("0.3.1", "0.2.0"):
        with pytest.raises(SpecError, match=f"vLLM {version}: the profiler of 0.2.5-0.2.7 and 0.3.3 onwards"):
            _run(tmp_path, "llama-3.1-8b", f'engine_version = "{version}"')


def test_printed_kv_tokens_are_blocks_over_the_groups(tmp_path):
    """vLLM prints ``GPU KV cache size`` as ``num_blocks // len(kv_cache_groups) · block_size`` (0.9.1's and 0.19.0's
    ``kv_cache_utils.py``): a hybrid layout's tokens are its blocks over its groups, as the compare tool reads them."""
    rec = {"id": "gemma3-1b-tokens", "url": "", "engine": "vllm", "engine_version": "0.19.0", "gpu": "H100 80GB",
           "capacity_gib": 79.19, "tp": 1, "hf_config": "gemma-3-1b-it", "max_model_len": 32768,
           "gpu_memory_utilization": 0.9, "measured": {"kv_tokens": 1}, "side": "calibration"}
    row = TOOL.compare(rec, tmp_path, False)
    b = row.budget
    assert len(b.kv_layout.groups) == 7
    assert row.cells["kv"].startswith(f"{b.num_kv_blocks // 7 * 16:,} / 1 tok")


def test_mxfp4_backend_padding_by_compute_capability():
    """get_mxfp4_backend / the oracle's select_mxfp4_moe_backend: Marlin below sm 90 or without triton_kernels (the
    wheel vendors it from 0.12), FlashInfer on the sm 100 family only, Triton on sm 90 alone — its kernels are gated
    to (9, 0) <= capability < (11, 0) from 0.12.0 to 0.28.0, so sm 110 and the RTX PRO / GeForce Blackwell's sm 120
    take Marlin at every release; only Hopper's swizzle is read."""
    from timeline.serve.quant_layout import mxfp4_padding, mxfp4_swizzled

    assert mxfp4_padding(80, "0.19.0") == (128, 256) and mxfp4_padding(120, "0.11.0") == (128, 256)
    assert mxfp4_padding(100, "0.11.0") == mxfp4_padding(103, "0.19.0") == (256, 256)
    assert mxfp4_padding(90, "0.19.0") == (64, 1) and mxfp4_padding(90, "0.11.0") == (128, 256)
    assert mxfp4_padding(120, "0.19.0") == mxfp4_padding(110, "0.28.0") == mxfp4_padding(120, "0.28.0") == (128, 256)
    assert mxfp4_swizzled(90, "0.19.0") and not mxfp4_swizzled(120, "0.19.0")
