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
  :func:`mxfp4_padding`), FlashInfer on the sm 100 family (both to 256). Sm 110 and the RTX PRO / GeForce
  Blackwell's sm 120 take Marlin at every release: before 0.12 no ``triton_kernels`` is installed with the wheel,
  and from 0.12.0 (the release that vendors it) the Triton path is gated to ``(9, 0) <= capability < (11, 0)`` —
  ``get_mxfp4_backend``'s ``triton_kernels_supported`` (read at 0.12.0, 0.13.0, 0.14.0, 0.16.0, 0.17.0, 0.18.0: "SM110
  fails …, SM120 needs this fix"), then the oracle's ``_triton_kernel_moe_supports_current_device`` /
  ``OAITritonExperts._supports_current_device`` (``fused_moe/oracle/mxfp4.py: select_mxfp4_moe_backend``, read at
  0.19.0, 0.20.0, 0.22.0, 0.24.0 … 0.28.0), where FlashInfer's TRT-LLM kernels need the sm 100 family and its CUTLASS
  BF16 kernel sm 90, so the first BF16 backend left is Marlin, padded by
  ``mxfp4_round_up_hidden_size_and_intermediate_size`` (intermediate to 128, hidden to 256) and repacked in place
  with its e8m0 scales (``marlin_utils_fp4.py: prepare_moe_mxfp4_layer_for_marlin``: the same bytes).

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

Read besides at 0.19.0 (and 0.11.0 where they differ), per vLLM layer — merged projections (``qkv_proj``,
``gate_up_proj``) are one layer, a FusedMoE's experts one — with every tensor a 512-byte allocator block at least:

* GPTQ / AWQ / AutoRound on the kernel vLLM moves them to (:func:`int_kernel`): GPTQ-Marlin frees the loaded zero
  points (and g_idx without act-order) and keeps a workspace; Machete on sm 90 keeps both; AWQ-Marlin keeps its
  zero points; the plain methods keep theirs (:func:`linear_bytes`); MoE on Marlin or ``moe_wna16``.
* NVFP4 (ModelOpt, compressed-tensors) and compressed-tensors MXFP4: Marlin below sm 100 and for weight-only
  checkpoints, CUTLASS / FlashInfer's swizzled and padded layouts above (:func:`_fp4_linear`, :func:`_fp4_moe`).
* bitsandbytes 4-bit / 8-bit (:func:`_bnb`); ModelOpt FP8 as fp8 per tensor, per channel or in 128 × 128 blocks.

Modules named in ``modules_to_not_convert`` / ``ignore`` (Hugging Face names, ``model.`` dropped, ``*`` a
wildcard, ``re:`` a regular expression) stay in the model dtype (``utils/quant_utils.py``
``is_layer_skipped``).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import replace
from functools import lru_cache

from timeline.graph.tensors import DTYPE_BYTES, TensorDef
from timeline.spec.engine_versions import VLLM_FP4_019, parse_version, triton_kernels_vendored
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
    flashinfer = 100 <= sm < 110  # the sm 100 family (B200, GB200, B300)
    if flashinfer:
        return 256, 256
    if 90 <= sm < 110 and triton_kernels_vendored(version):  # Triton's (9, 0) <= capability < (11, 0)
        return 64, 1
    return 128, 256  # Marlin: below sm 90, without triton_kernels, and on sm 110 / 120


#: the first vLLM release whose Triton MXFP4 swizzle is read (module docstring)
VLLM_MXFP4_SWIZZLE_READ = (0, 19, 0)


def mxfp4_triton_moe(run: ServeRunSpec) -> bool:
    """The run's experts are MXFP4 on the Triton backend (sm 90 with ``triton_kernels``, :func:`mxfp4_padding`)."""
    q = run.quant
    return q is not None and q.experts_only and mxfp4_padding(int(run.hardware.sm), run.serving.engine_version) == (64, 1)


def mxfp4_swizzled(sm: int, version: str) -> bool:
    """The Hopper Triton backend rewrites the experts after loading (module docstring)."""
    v = parse_version(version) if version else None
    return sm < 100 and mxfp4_padding(sm, version) == (64, 1) and v is not None and v >= VLLM_MXFP4_SWIZZLE_READ


def mxfp4_swizzled_expert_bytes(out: int, inp: int, half_of_w13: bool) -> int:
    """One expert's share of a swizzled MXFP4 weight ``out × in`` — gate or up (``half_of_w13``: half of
    w13, whose 2·out rows are padded as one), or down (w2) — with the loaded scales that stay and the
    swizzled copy (module docstring)."""
    value = _round_up(inp // 2, 64) * _round_up(out, 64)  # 2·out of w13 is a multiple of 128: halves pad alike
    cols = _cdiv(inp, 32)
    rows = _round_up(2 * out, 256) // 2 if half_of_w13 else _round_up(out, 256)
    return value + out * cols + rows * _round_up(cols, 2)


def linear_bytes(q: CheckpointQuant, out: int, inp: int, act_bytes: int) -> int:
    """One quantized out × in weight with its scales, zeros and indices, as the checkpoint's plain method keeps
    it (fp8, W8A8 int8, compressed-tensors WNA16, GPTQ / AWQ without Marlin)."""
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
    # GPTQLinearMethod.process_weights_after_loading empties g_idx without act-order; AWQLinearMethod allocates
    # qzeros whether or not the checkpoint has zero points
    zeros = groups * out * bits // 8 if q.zero_point or q.method == "awq" or q.packing == "awq" else 0
    g_idx = inp * 4 if q.method == "gptq" and q.desc_act else 0
    return packed + groups * out * act_bytes + zeros + g_idx


#: vLLM's merged linear layers (``QKVParallelLinear``, ``MergedColumnParallelLinear``): the projections one
#: kernel, one workspace and one set of padded scales serve
_FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
          "up_proj": "gate_up_proj", "q_a_proj": "fused_qkv_a_proj", "kv_a_proj_with_mqa": "fused_qkv_a_proj"}
#: row-parallel projections (their input is split across tensor-parallel ranks)
_ROW = ("o_proj", "down_proj", "out_proj", "dense", "fc2")
#: the allocator's block: every tensor, a scalar too, takes a multiple of 512 bytes
_BLOCK = 512


#: the first vLLM release read whose GPTQ-Marlin layer frees the loaded zero points and sits behind the kernel
#: chooser (``kernels/mixed_precision/marlin.py`` ``MarlinLinearKernel``, Machete beside it): read at 0.7.3, 0.8.5,
#: 0.9.2, 0.10.1.1, 0.11.0 and 0.19.0; 0.5.5's ``GPTQMarlinLinearMethod`` keeps them (earlier releases are laid out
#: as the plain method)
VLLM_MARLIN_KERNELS = (0, 7, 3)
#: the first vLLM release read whose Marlin workspace is one int32 per SM (``marlin_make_workspace_new``, 0.9.2);
#: 0.8.5's ``marlin_make_workspace`` holds output / 64 · 16 int32
VLLM_MARLIN_WORKSPACE_PER_SM = (0, 9, 2)


def _marlin_ws(run: ServeRunSpec, out: int) -> int:
    """One Marlin linear layer's workspace (:data:`VLLM_MARLIN_WORKSPACE_PER_SM`)."""
    if _at_least(run, VLLM_MARLIN_WORKSPACE_PER_SM):
        return _blk(4 * int(run.hardware.sms))
    return _blk(out // 64 * 16 * 4)


def _blk(nbytes: int) -> int:
    return _round_up(nbytes, _BLOCK) if nbytes else 0


def _at_least(run: ServeRunSpec, first: tuple[int, int, int]) -> bool:
    v = parse_version(run.serving.engine_version) if run.serving.engine_version else None
    return v is None or v >= first  # no version: the newest rules read


def int_kernel(run: ServeRunSpec, q: CheckpointQuant) -> str:
    """The kernel an integer (GPTQ / AWQ / AutoRound) layer ends on: ``gptq`` / ``awq`` (the plain methods),
    ``gptq_marlin`` / ``awq_marlin``, or ``machete`` — ``choose_mp_linear_kernel`` tries Machete before Marlin
    on sm 90 (``kernels/mixed_precision/machete.py`` ``MacheteLinearKernel.can_implement``), for GPTQ at 0.11.0
    and 0.19.0, for AWQ from 0.19.0 (0.11.0's ``AWQMarlinLinearMethod`` calls Marlin itself). ``--quantization
    gptq`` / ``awq`` keeps the plain method (``override_quantization_method`` converts only when the user named
    none or the Marlin one); Marlin needs sm 80 (sm 75 from 0.19.0)."""
    plain = "gptq" if q.packing.startswith("gptq") else "awq"
    v = parse_version(run.serving.engine_version) if run.serving.engine_version else None
    if not q.packing.endswith("_marlin") or run.serving.quantization in ("gptq", "awq") or (
            v is not None and v < VLLM_MARLIN_KERNELS):
        return plain
    sm = int(run.hardware.sm)
    if sm < (75 if _at_least(run, VLLM_FP4_019) else 80):
        return plain
    if sm == 90 and (plain == "gptq" or _at_least(run, VLLM_FP4_019)):
        return "machete"
    return q.packing


def _int_linear(run: ServeRunSpec, q: CheckpointQuant, members: list[TensorDef], act: int, bits: int,
                group: int) -> int:
    """A merged integer linear layer (its projections ``members``, one input width) on its kernel
    (:func:`int_kernel`): GPTQ-Marlin drops the zero points and, without act-order, g_idx, and keeps a
    workspace of one int32 per SM (``marlin.py`` ``MarlinLinearKernel.process_weights_after_loading``,
    ``marlin_make_workspace_new``); Machete keeps both and no workspace, and turns AWQ zero points into
    model-dtype ``-scale·zero`` (``machete.py``); AWQ-Marlin keeps its packed zero points and a workspace."""
    kernel = int_kernel(run, q)
    inp, out = members[0].shape[1], sum(t.shape[0] for t in members)
    row = members[0].name.rsplit(".", 2)[-2] in _ROW
    if kernel == "machete" and not (group in (-1, 64, 128) and inp % 64 == 0 and out % 128 == 0
                                    and not (q.desc_act and row and run.parallel.tp > 1)):
        kernel = "gptq_marlin" if q.packing.startswith("gptq") else "awq_marlin"
    if kernel in ("gptq", "awq"):
        lq = replace(q, bits=bits, group_size=group, weight_dtype=f"int{8 if bits == 8 else 4}")
        return sum(linear_bytes(lq, t.shape[0], inp, act) for t in members)
    # scale rows: act-order replicates the full input's on a row-parallel layer (marlin_repeat_scales_on_all_ranks)
    rows = 1 if group <= 0 else _cdiv(inp * (run.parallel.tp if q.desc_act and row else 1), group)
    packed, scales = inp * out * bits // 8, rows * out * act
    ws = _marlin_ws(run, out)
    if kernel == "machete":
        if q.packing.startswith("awq"):
            return packed + scales + rows * out * act
        return packed + scales + rows * out * bits // 8 + inp * 4 + (inp * 4 if q.desc_act else 0)
    if kernel == "awq_marlin":
        return packed + scales + rows * out * bits // 8 + ws
    return packed + scales + (8 * inp if q.desc_act else 0) + ws


def _int_moe(run: ServeRunSpec, q: CheckpointQuant, experts: list[list[TensorDef]], act: int, bits: int,
             group: int) -> int:
    """One MoE layer's integer experts: GPTQ-Marlin MoE (``GPTQMarlinMoEMethod``: zero points kept in the model
    dtype, a workspace of 4 int32 per SM) or AWQ-Marlin MoE (packed int32 zero points) where
    ``check_moe_marlin_supports_layer`` passes (hidden % 128, intermediate % max(64, group), groups of -1 … 128);
    else ``moe_wna16`` (uint8 weights, scales, zero points only when asymmetric, no g_idx)."""
    e0 = experts[0]
    hidden = next(t.shape[1] for t in e0 if ".down_proj." not in t.name)
    inter = next(t.shape[1] for t in e0 if ".down_proj." in t.name)
    kernel = int_kernel(run, q)
    marlin = kernel != q.packing.split("_")[0] and hidden % 128 == 0 and inter % max(64, group) == 0 \
        and group in (-1, 32, 64, 128)
    total = 0
    for ts in experts:
        for t in ts:
            out, inp = t.shape
            rows = 1 if group <= 0 else _cdiv(inp, group)
            total += out * inp * bits // 8 + rows * out * act
            if marlin and q.packing.startswith("gptq"):
                total += rows * (out * bits // 32) * act + (8 * inp if q.desc_act else 0)
            elif marlin or (not q.sym if q.packing.startswith("gptq") else q.zero_point):
                total += rows * out * bits // 8
    return total + (_blk(16 * int(run.hardware.sms)) if marlin else 0)


def _fp4_linear(run: ServeRunSpec, q: CheckpointQuant, members: list[TensorDef]) -> int:
    """A merged fp4 linear layer. NVFP4 (``modelopt.py`` ``ModelOptNvFp4LinearMethod``, compressed-tensors
    ``CompressedTensorsW4A4Fp4`` / ``W4A16Fp4``): uint8 values (in/2 a row), an fp8 scale per 16. Below sm 100, and
    for weight-only checkpoints everywhere, Marlin repacks them at the same size and adds a workspace
    (``utils/marlin_utils_fp4.py`` ``prepare_fp4_layer_for_marlin``); on sm 100+ CUTLASS / FlashInfer swizzle the
    scales into 128 × 4 tiles (``swizzle_blockscale``) and, from 0.19.0, pad the values to 32 × 32
    (``pad_nvfp4_weight_for_cutlass``). Per-tensor fp32 scalars (global scales, alpha) take a block each: 4 at
    0.19.0 (ModelOpt, W4A4) and on 0.11.0's CUTLASS path (3 for compressed-tensors W4A4); 0.11.0's Marlin path
    keeps 2 (ModelOpt deletes alpha and the input scale) or, for compressed-tensors W4A4 served as W4A16, 1 and its
    per-shard input global scales; W4A16 keeps 1. MXFP4 W4A16
    (``CompressedTensorsW4A16Mxfp4``, 0.19.0): a uint8 e8m0 scale per 32, Marlin."""
    inp, out = members[0].shape[1], sum(t.shape[0] for t in members)
    new = _at_least(run, VLLM_FP4_019)
    ws = _blk(4 * int(run.hardware.sms))
    if q.weight_dtype == "mxfp4":
        return out * inp // 2 + out * _cdiv(inp, 32) + ws
    ct = q.method == "compressed-tensors"
    if q.weight_only or int(run.hardware.sm) < 100:  # Marlin
        if q.weight_only:
            kept = _BLOCK  # the weight global scale
        elif new:
            kept = 4 * _BLOCK
        elif ct:  # 0.11.0 serves W4A4 below sm 100 as W4A16, its per-shard input global scales kept
            kept = _BLOCK + _blk(4 * len(members))
        else:
            kept = 2 * _BLOCK
        return out * inp // 2 + out * (inp // 16) + ws + kept
    values = _round_up(out, 32) * _round_up(inp, 32) // 2 if new else out * inp // 2
    return values + _round_up(out, 128) * _round_up(inp // 16, 4) + (3 if ct and not new else 4) * _BLOCK


def _fp4_moe(run: ServeRunSpec, q: CheckpointQuant, experts: list[list[TensorDef]]) -> int:
    """One MoE layer's NVFP4 experts (``ModelOptNvFp4FusedMoE``, ``CompressedTensorsW4A4Nvfp4MoEMethod``), E local
    experts of hidden H and intermediate I: Marlin below sm 100 and for weight-only checkpoints (27/16 bytes
    a parameter, per-expert fp32 second scales, a workspace of 4 int32 per SM: ``prepare_nvfp4_moe_layer_for_marlin``);
    on sm 100+ at 0.19.0 FlashInfer TRT-LLM on sm 10x with H % 512 = 0 (I padded to 16:
    ``align_fp4_moe_weights_for_fi``), else CUTLASS with 128 × 4 swizzled scales
    (``prepare_nvfp4_moe_layer_for_fi_or_cutlass``). At 0.11.0 the compressed-tensors Marlin path keeps the loaded
    ``w13_weight_packed`` / ``w2_weight_packed`` beside the repacked copies (``compressed_tensors_moe.py``
    ``process_weights_after_loading``: 0.11.1 deletes them); MXFP4 W4A16 experts are Marlin with a byte scale per 32."""
    n = len(experts)
    e0 = experts[0]
    hidden = next(t.shape[1] for t in e0 if ".down_proj." not in t.name)
    inter = next(t.shape[1] for t in e0 if ".down_proj." in t.name)
    params = n * 3 * hidden * inter
    ws = _blk(16 * int(run.hardware.sms))
    vec = _blk(4 * n)
    new = _at_least(run, VLLM_FP4_019)
    sm = int(run.hardware.sm)
    if q.weight_dtype == "mxfp4":
        return params // 2 + params // 32 + ws
    if q.weight_only or sm < 100:
        leak = params // 2 if q.method == "compressed-tensors" and not _at_least(run, (0, 11, 1)) else 0
        return params // 2 + params // 16 + 2 * vec + ws + leak
    if new and 100 <= sm < 110 and hidden % 512 == 0:
        i_p = _round_up(inter, 16)
        return n * 3 * hidden * i_p * 9 // 16 + 4 * vec
    scales = n * (_round_up(2 * inter, 128) * _round_up(hidden // 16, 4) + _round_up(hidden, 128)
                  * _round_up(inter // 16, 4))
    return params // 2 + scales + 4 * vec


def nf4_bytes(numel: int) -> int:
    """One bitsandbytes 4-bit weight of ``numel`` values: two a byte, its fp32 absmax per 64 and its 16-float code
    table, each a 512-byte block at least (:func:`_bnb`)."""
    return numel // 2 + _blk(4 * _cdiv(numel, 64)) + _BLOCK


def _bnb(run: ServeRunSpec, q: CheckpointQuant, members: list[TensorDef], moe: bool) -> int:
    """bitsandbytes: 4-bit values two a byte, an fp32 absmax per 64 (the loader dequantizes double-quantized
    statistics to fp32: ``bitsandbytes_loader.py`` ``_dequantize_dq``) and a 16-float code table a shard
    (``QuantState``, moved to the GPU, a block each); MoE: one absmax tensor per w13 / w2
    (``BitsAndBytesMoEMethod._fuse_moe_quant_states``). 8-bit: one int8 per value (the SCB scales stay on the host
    until the first forward)."""
    numel = [t.numel for t in members]
    if q.weight_dtype == "int8":
        return sum(numel)
    if not moe:
        return sum(nf4_bytes(k) for k in numel)
    w13 = sum(k for t, k in zip(members, numel, strict=True) if ".down_proj." not in t.name)
    w2 = sum(numel) - w13
    return (w13 + w2) // 2 + _blk(4 * _cdiv(w13, 64)) + _blk(4 * _cdiv(w2, 64)) + 2 * _BLOCK


def _override(q: CheckpointQuant, module: str) -> tuple[int, int, bool] | None:
    """AutoRound's ``extra_config`` entry for ``module`` (a Hugging Face name or, from 0.19.0, a regular
    expression: ``INCConfig.get_layer_config``): (bits, group size, sym), or None."""
    for o in q.overrides:
        key = o.pattern.removeprefix("model.")
        if key == module or (any(c in key for c in "*[]()|\\^$+?") and re.fullmatch(key, module)):
            return o.bits, o.group_size, o.sym
    return None


@lru_cache(maxsize=16)
def _modelopt_index(q: CheckpointQuant) -> dict[str, CheckpointQuant]:
    return {key.removeprefix("model."): sub for keys, sub in q.schemes for key in keys}


def scheme_for(q: CheckpointQuant, module: str) -> CheckpointQuant | None:
    """The scheme a quantized module (a tool name, ``layers.N.…``) is stored in, None for the model dtype. Without
    per-layer schemes, ``q`` itself. compressed-tensors (``utils.py`` ``find_matched_target``): a target naming
    the layer (``model.`` + name, or a ``re:`` pattern matched from its start) before a module class
    (``Linear``, which a FusedMoE's experts take too); ModelOpt MIXED_PRECISION (``_resolve_quant_algo``): the
    layer's own key, or a key its module lies under (a FusedMoE named whole)."""
    if not q.schemes:
        return q
    hf = "model." + module
    if q.method == "modelopt":
        index = _modelopt_index(q)
        parts = module.split(".")
        for n in range(len(parts), 0, -1):  # the module, then each module it lies under
            sub = index.get(".".join(parts[:n]))
            if sub is not None:
                return sub
        return None
    for keys, sub in q.schemes:
        for key in keys:
            if key in (hf, module) or (key.startswith("re:") and (re.match(key[3:], hf) or re.match(key[3:], module))):
                return sub
    for keys, sub in q.schemes:
        if any(key == "Linear" or key.endswith("Linear") for key in keys):
            return sub
    return None


def _vllm_layer(name: str) -> str:
    """The vLLM layer a parameter belongs to: merged projections share one, a FusedMoE's experts one
    (``….experts``)."""
    module = name.rsplit(".", 1)[0]
    if ".experts." in module:
        return module[:module.index(".experts.")] + ".experts"
    head, _, last = module.rpartition(".")
    return f"{head}.{_FUSED.get(last, last)}"


def _expert_dims(run: ServeRunSpec, t: TensorDef) -> tuple[int, ...]:
    """MXFP4's padded shape of an expert weight or bias (gate/up: intermediate × hidden, down: the reverse). The
    width is one rank's (:func:`timeline.serve.graph_view.moe_rank_width`): a whole expert under expert parallelism
    (vLLM ``FusedMoE``: ``moe_parallel_config.tp_size`` 1 when ``use_ep``), else split over the MoE layer's GPUs —
    ``intermediate_size_per_partition`` before ``Mxfp4MoEMethod.create_weights`` pads it."""
    from timeline.serve.graph_view import moe_rank_width

    pad_i, pad_h = mxfp4_padding(int(run.hardware.sm), run.serving.engine_version)
    inter = moe_rank_width(run)
    i_p, h_p = _round_up(inter, pad_i), _round_up(run.model.hidden_size, pad_h)
    down = ".down_proj." in t.name
    if len(t.shape) == 1:
        return (h_p,) if down else (i_p,)
    return (h_p, i_p) if down else (i_p, h_p)


def checkpoint_bytes(run: ServeRunSpec, params: list[TensorDef]) -> tuple[int, int]:
    """(quantized bytes, model-dtype bytes) of one device's parameters under ``run.quant``: each quantized
    weight grouped into the vLLM layer that loads it (merged projections, a FusedMoE's experts), laid out by
    the method's kernel on ``run.hardware.sm`` at ``serving.engine_version``."""
    from timeline.serve.weights import is_quantized

    q = run.quant
    assert q is not None
    act = DTYPE_BYTES[run.serving.dtype]
    quant = dense = 0
    layers: dict[tuple[str, int], tuple[CheckpointQuant, list[TensorDef]]] = {}
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
        module = t.name.rsplit(".", 1)[0]
        layer_bits = _override(q, module) if q.overrides else None
        scheme = scheme_for(q, module) if is_quantized(t) and not skipped(t.name, q.not_converted) else None
        if scheme is not None and (layer_bits is None or layer_bits[0] < 16):
            layers.setdefault((_vllm_layer(t.name), id(scheme)), (scheme, []))[1].append(t)
        else:
            dense += t.numel * (act if t.dtype in ("bf16", "fp16") else DTYPE_BYTES[t.dtype])
    for (key, _), (sq, members) in layers.items():
        moe = key.endswith(".experts")
        layer_bits = _override(sq, members[0].name.rsplit(".", 1)[0]) if sq.overrides else None
        bits, group, sym = layer_bits or (sq.bits, sq.group_size, sq.sym)
        lq = sq if layer_bits is None else replace(sq, sym=sym, zero_point=not sym or sq.packing.startswith("awq"))
        if sq.method == "bitsandbytes":
            quant += _bnb(run, sq, members, moe)
        elif sq.weight_dtype in ("nvfp4", "mxfp4"):
            quant += _fp4_moe(run, sq, _by_expert(members)) if moe else _fp4_linear(run, sq, members)
        elif sq.packing:
            quant += _int_moe(run, lq, _by_expert(members), act, bits, group) if moe \
                else _int_linear(run, lq, members, act, bits, group)
        else:
            quant += sum(linear_bytes(sq, t.shape[0], t.shape[1], act) for t in members)
    return quant, dense


def _by_expert(members: list[TensorDef]) -> list[list[TensorDef]]:
    """A FusedMoE layer's weights, one list per expert (``….experts.<e>.…``), in order."""
    experts: dict[str, list[TensorDef]] = {}
    for t in members:
        experts.setdefault(t.name.split(".experts.", 1)[1].split(".", 1)[0], []).append(t)
    return list(experts.values())
