"""The memory vLLM's profiler counts outside PyTorch's allocator, as published startup logs measured it.

Nothing in an engine's source fixes this number: it is the CUDA context, cuBLAS/cuDNN handles, loaded
kernel images and, above one GPU, NCCL's buffers (on NVSwitch H100s its NVLS multicast buffers) —
driver- and machine-dependent. What *is* in the source is which part the KV budget subtracts, and
that changed with the version:

* ``v0.6.4`` — V0 ``worker.py`` ``determine_num_available_blocks`` @0.6.4.post1: device memory in use
  after the profile run minus PyTorch's allocated bytes, so the CUDA context is in it.
* ``v0.6.5`` — V0 from 0.6.5 (``vllm/utils.py`` ``memory_profiling``, the 0.6.6.post1 and 0.7.3 wheels):
  the increase since the worker's baseline, taken after the context exists.
* ``v1`` — V1 from 0.9 (``vllm/utils/mem_utils.py`` ``memory_profiling`` with the worker's
  ``init_snapshot``, ``non_torch_increase``; #19312, 0.9.2 and the 0.22.0 wheel): the increase from
  device init to after the profile run (and the CUDA-graph estimate).

:data:`MEASURED` holds what the calibration side of ``tests/data/serving_logs.json`` printed, per
(era, hardware preset, tensor-parallel size, pipeline size > 1), each with the logs it comes from. A
run whose key is not in it gets the entry of the largest measured ``tp`` not above its own (same era,
GPU and pipeline kind), else 0 with a note; ``serving.non_torch_gib`` overrides it.
"""

from __future__ import annotations

from timeline.spec.engine_versions import parse_version
from timeline.spec.serving import ServeRunSpec

GIB = 1 << 30

#: (era, gpu preset, tp, pp > 1) → (GiB, the calibration logs that print it)
MEASURED: dict[tuple[str, str, int, bool], tuple[float, str]] = {
    ("v0.6.4", "rtx3090", 1, False): (0.35, "vllm-project/vllm#10517 (Llama-3.1-8B, 0.6.4.post1)"),
    ("v0.6.5", "l40s", 2, False): (0.30, "vllm-project/vllm#15815 (Qwen2.5-32B TP2, 0.7.3)"),
    ("v1", "h100", 1, False): (0.25, "llm-d-planner 0.19.0 TP1 logs: Llama-3.1-8B, Qwen2.5-7B, CodeLlama-7b "
                                     "0.24-0.25, Qwen3-30B-A3B 0.27, DeepSeek-V2-Lite 0.26"),
    ("v1", "h100", 2, False): (2.07, "llm-d-planner 0.19.0 TP2 logs: Llama-3.1-8B, Mixtral-8x7B, gpt-oss-20b 2.07, "
                                     "Llama-3.3-70B FP8 2.10"),
    ("v1", "h100", 4, False): (2.17, "llm-d-planner 0.19.0 TP4 logs: Llama-3.1-8B 2.13, Llama-3.3-70B FP8 2.21"),
    ("v1", "h100", 1, True): (0.07, "llm-d-planner 0.19.0 Llama-3.1-8B PP4 log"),
}


def era(engine: str, version: str) -> str:
    """Which accounting a vLLM version's profiler uses (module docstring); "" for none modelled."""
    v = parse_version(version or "0.11")
    if engine != "vllm" or v is None:
        return ""
    if v < (0, 6, 5):
        return "v0.6.4"
    if v < (0, 8, 0):
        return "v0.6.5"
    return "v1" if v >= (0, 9, 0) else ""


def measured_non_torch(run: ServeRunSpec) -> tuple[int, str]:
    """(bytes, where they come from) of the non-PyTorch memory vLLM's budget subtracts for ``run``."""
    sv, par = run.serving, run.parallel
    if sv.non_torch_gib is not None:
        return int(sv.non_torch_gib * GIB), "serving.non_torch_gib"
    key = (era(sv.engine, sv.engine_version), run.hardware.gpu, par.tp, par.pp > 1)
    near = [k for k in MEASURED if k[0] == key[0] and k[1] == key[1] and k[3] == key[3] and k[2] <= key[2]]
    if not near:
        return 0, "no published measurement for this engine version, GPU and layout: 0"
    best = max(near, key=lambda k: k[2])
    gib, source = MEASURED[best]
    return int(gib * GIB), source if best == key else f"{source} (measured at tp={best[2]})"
