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

:data:`MEASURED_INIT` is the device memory in use once the worker's CUDA context and distributed groups
exist, before the weights load (vLLM 0.19's ``worker init memory snapshot``, ``cuda_memory``): SGLang
sizes its pool from the free memory at that moment (:mod:`timeline.serve.budget`), so it subtracts it.
Only vLLM prints it; its NCCL groups are the ones SGLang creates too (the custom all-reduce buffers
differ by engine and are not in it). ``hardware.non_pytorch_gib`` overrides it.
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


#: (gpu preset, tp, pp > 1) → (GiB in use before the weights load, the calibration logs that print it)
MEASURED_INIT: dict[tuple[str, int, bool], tuple[float, str]] = {
    ("h100", 1, False): (0.51, "llm-d-planner 0.19.0 TP1 logs (cuda_memory=0.51GiB)"),
    ("h100", 2, False): (1.53, "llm-d-planner 0.19.0 TP2 logs: Llama-3.1-8B, Llama-3.3-70B FP8"),
    ("h100", 4, False): (1.55, "llm-d-planner 0.19.0 TP4 logs: Llama-3.1-8B, Llama-3.3-70B FP8"),
    ("h100", 1, True): (1.48, "llm-d-planner 0.19.0 Llama-3.1-8B PP4 log"),
}


def measured_init(run: ServeRunSpec) -> tuple[int, str]:
    """(bytes, source) in use on a device before the weights load (:data:`MEASURED_INIT`; the largest
    measured tp not above the run's, else 0)."""
    if run.hardware.non_pytorch_gib:
        return int(run.hardware.non_pytorch_gib * GIB), "hardware.non_pytorch_gib"
    par = run.parallel
    near = [k for k in MEASURED_INIT if k[0] == run.hardware.gpu and k[2] == (par.pp > 1) and k[1] <= par.tp]
    if not near:
        return 0, "no published measurement for this GPU and layout: 0"
    best = max(near, key=lambda k: k[1])
    return int(MEASURED_INIT[best][0] * GIB), MEASURED_INIT[best][1]


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
