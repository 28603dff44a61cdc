"""The bytes a device loads for a checkpoint as published (``run.quant``, its ``quantization_config``).

Every layout is vLLM's ``create_weights`` of the method at the 0.11.0 PyPI wheel
(``vllm/model_executor/layers/quantization/``), per device shard (out × in of one tensor-parallel rank):

* ``fp8`` (``fp8.py`` ``Fp8LinearMethod.create_weights`` / ``Fp8MoEMethod.create_weights``): one byte per
  element; with ``weight_block_size`` [bn, bk] an fp32 ``weight_scale_inv`` of ``ceil(out/bn) × ceil(in/bk)``,
  else one fp32 ``weight_scale`` per weight. Embeddings, the LM head and a ``quant_config=None`` router stay
  in the model dtype (:func:`timeline.serve.weights.is_quantized`).
* ``awq`` (``awq.py`` ``AWQLinearMethod.create_weights``): int32 ``qweight`` (in, out/pack), ``qzeros``
  (in/g, out/pack), model-dtype ``scales`` (in/g, out); pack = 32/bits.
* ``gptq`` (``gptq.py`` ``GPTQLinearMethod.create_weights``): ``qweight`` (in/pack, out), int32 ``g_idx`` (in),
  ``qzeros`` (in/g, out/pack), ``scales`` (in/g, out); ``group_size = -1`` is one group of ``in``.
* ``compressed-tensors``: fp8 (``CompressedTensorsW8A8Fp8.create_weights``: one byte per element and an fp32
  scale per output channel, or per tensor) and W8A8 int8 (``CompressedTensorsW8A8Int8.create_weights``: the
  same with int8 elements); weight-only int4/int8 (``CompressedTensorsWNA16.create_weights``:
  ``weight_packed`` (out, in/pack) int32, ``weight_scale`` (out, in/g) in the model dtype, ``weight_zero_point``
  (out/pack, in/g) int32 when asymmetric, an int64 ``weight_shape`` of 2).
* ``mxfp4`` (``mxfp4.py`` ``Mxfp4MoEMethod.create_weights``): experts only (``Mxfp4Config.get_quant_method``:
  a linear layer must be in ``modules_to_not_convert``); uint8 weights of two values a byte, a uint8 scale per
  32 values and model-dtype biases, the intermediate and hidden sizes padded for the backend
  ``get_mxfp4_backend`` picks by compute capability: Marlin below sm 90 (intermediate to 128, hidden to 256),
  Triton on sm 90 where ``triton_kernels`` is importable (intermediate to 64; else Marlin,
  :func:`mxfp4_padding`), FlashInfer on sm 100 (both to 256).

From vLLM 0.19 on sm 90 the Triton backend's ``process_weights_after_loading``
(``fused_moe/oracle/mxfp4.py`` ``convert_to_mxfp4_moe_kernel_format`` → ``utils/mxfp4_utils.py``
``_swizzle_mxfp4``, read at 0.19.0 with its vendored ``triton_kernels``) rewrites the experts once loaded
(:func:`mxfp4_swizzled_expert_bytes`): each weight, transposed to (in/2, out), becomes a
``HopperMXValueLayout`` copy with both dims padded to 64 bytes (``swizzle_data``; the loaded one is
``del``-eted); each scale, transposed, a ``HopperMXScaleLayout`` copy with its rows padded to
2·num_warps·2·8 = 256 (num_warps 8) and its columns to 2 — the loaded ``w13_weight_scale`` /
``w2_weight_scale`` stay registered, so the scales exist twice; the biases become fp32
(``w13_bias.to(torch.float32)``, ``replace_parameter``). 0.12 … 0.18 vendor other revisions of these
layouts and were not read for it (their experts are counted as loaded).

Modules named in ``modules_to_not_convert`` / ``ignore`` (Hugging Face names, ``model.`` dropped, ``*`` a
wildcard, ``re:`` a regular expression) stay in the model dtype (``utils/quant_utils.py``
``is_layer_skipped``).
"""

from __future__ import annotations

import fnmatch
import re

from timeline.graph.tensors import DTYPE_BYTES, TensorDef
from timeline.spec.engine_versions import parse_version, triton_kernels_vendored
from timeline.spec.quant import CheckpointQuant
from timeline.spec.serving import ServeRunSpec


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _cdiv(a, b) * b


def skipped(name: str, patterns: tuple[str, ...]) -> bool:
    """A parameter of a module the checkpoint keeps unquantized."""
    module = name.rsplit(".", 1)[0]
    for raw in patterns:
        p = raw.removeprefix("model.")
        if p.startswith("re:"):
            if re.fullmatch(p[3:].removeprefix(".*").removeprefix("model."), module) or re.search(p[3:], module):
                return True
        elif fnmatch.fnmatch(module, p) or fnmatch.fnmatch(module, p + ".*") or module.endswith("." + p):
            return True
    return False


def mxfp4_padding(sm: int, version: str = "") -> tuple[int, int]:
    """(intermediate, hidden) multiples the MXFP4 MoE backend pads to (module docstring). The Triton
    backend needs the ``triton_kernels`` package (``get_mxfp4_backend``: ``has_triton_kernels()``, else
    Marlin): the vLLM wheel neither requires it up to 0.11 (0.11.0's ``Requires-Dist`` has no
    triton_kernels, flashinfer only as an extra) nor vendors it (``vllm/third_party`` holds pynvml
    alone), so below :data:`~timeline.spec.engine_versions.VLLM_TRITON_KERNELS_VENDORED` sm 90 is Marlin
    too; from it ``vllm/third_party/triton_kernels`` ships with the wheel (the 0.19.0 calibration logs load
    it; read in the 0.22.0 wheel)."""
    if sm < 90 or (sm < 100 and not triton_kernels_vendored(version)):
        return 128, 256
    if sm < 100:
        return 64, 1
    return 256, 256


#: the first vLLM release whose Triton MXFP4 swizzle is read (module docstring)
VLLM_MXFP4_SWIZZLE_READ = (0, 19, 0)


def mxfp4_triton_moe(run: ServeRunSpec) -> bool:
    """The run's experts are MXFP4 on the Triton backend (sm 90 with ``triton_kernels``, :func:`mxfp4_padding`)."""
    q = run.quant
    return q is not None and q.experts_only and mxfp4_padding(int(run.hardware.sm), run.serving.engine_version) == (64, 1)


def mxfp4_swizzled(sm: int, version: str) -> bool:
    """The Hopper Triton backend rewrites the experts after loading (module docstring)."""
    v = parse_version(version) if version else None
    return mxfp4_padding(sm, version) == (64, 1) and v is not None and v >= VLLM_MXFP4_SWIZZLE_READ


def mxfp4_swizzled_expert_bytes(out: int, inp: int, half_of_w13: bool) -> int:
    """One expert's share of a swizzled MXFP4 weight ``out × in`` — gate or up (``half_of_w13``: half of
    w13, whose 2·out rows are padded as one), or down (w2) — with the loaded scales that stay and the
    swizzled copy (module docstring)."""
    value = _round_up(inp // 2, 64) * _round_up(out, 64)  # 2·out of w13 is a multiple of 128: halves pad alike
    cols = _cdiv(inp, 32)
    rows = _round_up(2 * out, 256) // 2 if half_of_w13 else _round_up(out, 256)
    return value + out * cols + rows * _round_up(cols, 2)


def linear_bytes(q: CheckpointQuant, out: int, inp: int, act_bytes: int) -> int:
    """One quantized out × in weight with its scales, zeros and indices."""
    n = out * inp
    if q.weight_dtype == "fp8" or q.int8_activations:
        if q.block_rows:
            return n + _cdiv(out, q.block_rows) * _cdiv(inp, q.group_size) * 4
        return n + (out * 4 if q.group_size == 0 else 4)
    bits = q.bits
    groups = 1 if q.group_size <= 0 else _cdiv(inp, q.group_size)
    packed = n * bits // 8
    if q.method == "compressed-tensors":
        return packed + out * groups * act_bytes + (out * bits // 8 * groups if q.zero_point else 0) + 16
    zeros = groups * out * bits // 8 if q.zero_point else 0
    g_idx = inp * 4 if q.method == "gptq" else 0
    return packed + groups * out * act_bytes + zeros + g_idx


def _expert_dims(run: ServeRunSpec, t: TensorDef) -> tuple[int, ...]:
    """MXFP4's padded shape of an expert weight or bias (gate/up: intermediate × hidden, down: the reverse)."""
    pad_i, pad_h = mxfp4_padding(int(run.hardware.sm), run.serving.engine_version)
    inter = run.model.moe_intermediate_size // run.parallel.etp
    i_p, h_p = _round_up(inter, pad_i), _round_up(run.model.hidden_size, pad_h)
    down = ".down_proj." in t.name
    if len(t.shape) == 1:
        return (h_p,) if down else (i_p,)
    return (h_p, i_p) if down else (i_p, h_p)


def checkpoint_bytes(run: ServeRunSpec, params: list[TensorDef]) -> tuple[int, int]:
    """(quantized bytes, model-dtype bytes) of one device's parameters under ``run.quant``."""
    from timeline.serve.weights import is_quantized

    q = run.quant
    assert q is not None
    act = DTYPE_BYTES[run.serving.dtype]
    quant = dense = 0
    for t in params:
        expert = ".experts." in t.name
        if q.experts_only:
            swizzled = mxfp4_swizzled(int(run.hardware.sm), run.serving.engine_version)
            if expert and len(t.shape) == 2:
                out, inp = _expert_dims(run, t)
                if swizzled:
                    quant += mxfp4_swizzled_expert_bytes(out, inp, ".down_proj." not in t.name)
                else:
                    quant += out * inp // 2 + out * _cdiv(inp, 32)
            elif expert:
                dense += _expert_dims(run, t)[0] * (4 if swizzled else act)
            else:
                dense += t.numel * (act if t.dtype in ("bf16", "fp16") else DTYPE_BYTES[t.dtype])
            continue
        if is_quantized(t) and not skipped(t.name, q.not_converted):
            quant += linear_bytes(q, t.shape[0], t.shape[1], act)
        else:
            dense += t.numel * (act if t.dtype in ("bf16", "fp16") else DTYPE_BYTES[t.dtype])
    return quant, dense
