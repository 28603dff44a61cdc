"""Checkpoints vLLM refuses to load, each as the engine refuses it (``run.quant`` against the device and the
version): a method's minimum compute capability (``QuantizationConfig.get_min_capability``, checked by
``config/vllm.py`` ``_get_quantization_config``), and the loaders' own errors. Read at vLLM 0.11.0 and 0.19.0
(``vllm/model_executor/layers/quantization/``); a version between takes 0.11.0's rule up to the release
:data:`~timeline.spec.engine_versions.VLLM_FP4_019` names.
"""

from __future__ import annotations

import difflib

from timeline.spec.engine_versions import VLLM_FP4_019, parse_version
from timeline.spec.quant import CheckpointQuant
from timeline.spec.serving import ServeRunSpec

#: ``--quantization`` values vLLM takes: ``QuantizationMethods`` of ``model_executor/layers/quantization/__init__.py``
#: at 0.11.0 and at 0.19.0 (their union; "marlin" is older versions' name for the Marlin upgrade)
VLLM_QUANT_METHODS = (
    "awq", "awq_marlin", "auto-round", "bitblas", "bitsandbytes", "compressed-tensors", "cpu_awq", "deepspeedfp",
    "experts_int8", "fbgemm_fp8", "fp8", "fp_quant", "gguf", "gptq", "gptq_bitblas", "gptq_marlin", "gptq_marlin_24",
    "hqq", "inc", "ipex", "marlin", "modelopt", "modelopt_fp4", "modelopt_mixed", "modelopt_mxfp8", "moe_wna16",
    "mxfp4", "mxfp8", "petit_nvfp4", "ptpc_fp8", "quark", "rtn", "torchao", "tpu_int8")


def _version(run: ServeRunSpec) -> tuple[int, int, int] | None:
    return parse_version(run.serving.engine_version) if run.serving.engine_version else None


def quant_problems(run: ServeRunSpec) -> list[tuple[str, str]]:
    """(field, problem) for a checkpoint the engine would refuse on this device and version; a checkpoint with
    per-layer schemes is refused for any of them (ModelOpt MIXED_PRECISION needs compute capability 8.9 itself:
    ``ModelOptMixedPrecisionConfig.get_min_capability``)."""
    q, given = run.quant, run.serving.quantization
    if given and given not in VLLM_QUANT_METHODS:
        near = difflib.get_close_matches(given, VLLM_QUANT_METHODS, n=1)
        return [("serving.quantization", f"{given!r} is no vLLM quantization method"
                 + (f"; did you mean {near[0]!r}?" if near else f" (one of {', '.join(VLLM_QUANT_METHODS)})"))]
    if q is None or run.serving.engine != "vllm":
        return []
    if q.schemes and q.method == "modelopt" and int(run.hardware.sm) < 89:
        return [("model.hf_config", f"{q.source}: vLLM refuses ModelOpt MIXED_PRECISION below compute capability 8.9 "
                 f"(ModelOptMixedPrecisionConfig.get_min_capability; this device is sm {int(run.hardware.sm)})")]
    out: list[tuple[str, str]] = []
    for sub in [sub for _, sub in q.schemes] or [q]:
        out += [p for p in _scheme_problems(run, sub) if p not in out]
    return out


def _scheme_problems(run: ServeRunSpec, q: CheckpointQuant) -> list[tuple[str, str]]:
    sm, v = int(run.hardware.sm), _version(run)
    new = v is None or v >= VLLM_FP4_019
    out: list[tuple[str, str]] = []

    def refuse(why: str) -> None:
        out.append(("model.hf_config", f"{q.source}: {why}"))

    if q.method == "modelopt" and q.weight_dtype == "fp8" and sm < 89:
        refuse(f"vLLM refuses ModelOpt FP8 below compute capability 8.9 (ModelOptFp8Config.get_min_capability; this "
               f"device is sm {sm}): it has no Marlin fallback for it")
    if q.weight_dtype == "nvfp4" and sm < (75 if new else 80):
        refuse(f"vLLM {'0.19' if new else '0.11'} serves NVFP4 from compute capability {7.5 if new else 8.0} "
               f"(ModelOptNvFp4Config / CompressedTensorsW4A16Fp4.get_min_capability); this device is sm {sm}")
    if q.method == "compressed-tensors" and q.weight_dtype == "mxfp4" and not new:
        refuse("compressed-tensors MXFP4 has no vLLM scheme at 0.11.0 (CompressedTensorsW4A16Mxfp4 is read at 0.19.0; "
               "the releases between are not read): name engine_version 0.19.0 or later")
    if q.method == "compressed-tensors" and q.weight_dtype == "nvfp4" and q.weight_only and run.model.is_moe \
            and v is not None and v < (0, 11, 1):
        refuse("vLLM 0.11.0 has no weight-only NVFP4 MoE method (compressed_tensors_moe.py get_moe_method reads "
               "input_activations.num_bits of None: AttributeError); 0.19.0 serves it on Marlin")
    if q.method == "bitsandbytes" and run.parallel.tp > 1:
        refuse("vLLM refuses a pre-quantized bitsandbytes checkpoint under tensor parallelism "
               "(bitsandbytes_loader.py: 'Prequant BitsAndBytes models with tensor parallelism is not supported'); "
               "use pp, or quantize at load (--quantization bitsandbytes on the unquantized checkpoint)")
    if q.method == "bitsandbytes" and q.weight_dtype == "int8" and run.model.is_moe:
        refuse("vLLM has no 8-bit bitsandbytes MoE method (BitsAndBytesMoEMethod._create_weights_8bit raises)")
    return out
