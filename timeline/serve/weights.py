"""Weight bytes on one device under ``weight_dtype``, with the scales and zeros each format stores.

Which parameters are quantized follows vLLM's linear methods: every ``LinearBase`` /``FusedMoE``
weight inside a decoder layer (attention projections, dense and expert MLPs); embeddings, the LM
head, norms, biases and DeepSeek's router (``ReplicatedLinear(..., quant_config=None)`` in
``vllm/model_executor/models/deepseek_v2.py`` ``DeepseekV2MoE``) stay in the model dtype.

Formats (out × in is one device's weight shard, g = ``quant_group_size``):

* ``fp8``: 1 byte per element + fp32 block scales ``ceil(out/g) × ceil(in/g)`` (vLLM
  ``fp8.py`` ``Fp8LinearMethod.create_weights``, ``weight_scale_inv`` with ``weight_block_size``
  [g, g], DeepSeek-V3's published 128 × 128); ``quant_group_size = 0``: one fp32 scale per output
  channel (``compressed_tensors_w8a8_fp8.py`` ``CompressedTensorsW8A8Fp8.create_weights``,
  ``ChannelQuantScaleParameter`` of shape (out, 1), as RedHatAI's FP8-dynamic checkpoints).
* ``int8`` / ``int4``: GPTQ (vLLM ``gptq.py`` ``GPTQLinearMethod.create_weights``): ``qweight``
  bits/8 per element, fp16 ``scales`` and packed ``qzeros`` per (in/g) × out, int32 ``g_idx``
  per input row.
* ``mxfp4``: OCP MX, two 4-bit values per byte and one e8m0 scale byte per 32 elements (vLLM
  ``mxfp4.py`` ``Mxfp4MoEMethod.create_weights``: ``w13_weight_scale`` of in/32 uint8 per row);
  the group is fixed at 32 by the format.
* ``nvfp4``: two fp4 values a byte and an fp8 scale per 16 (a ModelOpt / compressed-tensors NVFP4 checkpoint's
  ``weight`` / ``weight_scale``); the group is fixed at 16.
* ``nf4``: bitsandbytes 4-bit, what ``--quantization bitsandbytes`` makes of an unquantized checkpoint at load
  (``model_loader/bitsandbytes_loader.py`` ``_unquantized_generator``: ``quantize_4bit(..., quant_type="nf4")``,
  blocks of 64, the double-quantized statistics back in fp32 by ``_dequantize_dq``): two values a byte, an fp32
  absmax per 64 values, a 16-float code table per weight, each a 512-byte allocator block at least.
* ``bf16`` / ``fp16``: 2 bytes per element, nothing else.

A run whose ``hf_config`` carries a ``quantization_config`` lays each weight out as the checkpoint
stores it (:func:`checkpoint_bytes`, ``run.quant``): which modules are quantized, the scale layout,
zeros, act-order indices and MXFP4's padding.

MLA with vLLM also keeps ``W_UK_T`` and ``W_UV``, dequantized copies of ``kv_b_proj`` in the model
dtype (``vllm/v1/attention/backends/mla/common.py`` ``MLACommonImpl.process_weights_after_loading``).
"""

from __future__ import annotations

from dataclasses import dataclass

from timeline.graph.tensors import DTYPE_BYTES, TensorDef
from timeline.serve.quant_layout import checkpoint_bytes, nf4_bytes
from timeline.spec.serving import ServeRunSpec

MX_GROUP = 32
NV_GROUP = 16  # NVFP4: values per fp8 scale


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def is_quantized(t: TensorDef) -> bool:
    """A decoder-layer linear (or expert) weight: what vLLM's quant methods replace."""
    if not t.name.startswith("layers.") or not t.name.endswith("weight") or len(t.shape) != 2:
        return False
    # DeepSeek-V3.2's Indexer builds weights_proj with quant_config=None (vLLM 0.19.0 models/deepseek_v2.py)
    return not t.name.endswith((".mlp.gate.weight", ".mlp.router.weight", ".indexer.weights_proj.weight"))


def quantized_bytes(shape: tuple[int, ...], weight_dtype: str, group: int) -> int:
    """Bytes of one quantized out × in weight with its scales/zeros/indices."""
    out, inp = shape
    n = out * inp
    if weight_dtype == "fp8":
        if group == 0:  # per-output-channel fp32 scales (compressed-tensors CHANNEL strategy)
            return n + out * 4
        return n + _cdiv(out, group) * _cdiv(inp, group) * 4
    if weight_dtype in ("int8", "int4"):
        bits = 8 if weight_dtype == "int8" else 4
        groups = _cdiv(inp, group)
        return n * bits // 8 + groups * out * 2 + groups * out * bits // 8 + inp * 4
    if weight_dtype == "mxfp4":
        return n // 2 + out * _cdiv(inp, MX_GROUP)
    if weight_dtype == "nvfp4":  # two values a byte, an fp8 scale per 16 (as a checkpoint stores it)
        return n // 2 + out * (inp // NV_GROUP)
    if weight_dtype == "nf4":  # bitsandbytes 4-bit: an fp32 absmax per 64 values, a 16-float code table
        return nf4_bytes(n)
    return n * DTYPE_BYTES[weight_dtype]


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightBytes:
    total_bytes: int
    quantized_bytes: int  # of which quantized linear weights with their scales
    dense_bytes: int  # embeddings, head, norms, router, biases in the model dtype
    mla_absorbed_bytes: int  # vLLM's W_UK_T / W_UV copies (MLA)


def weight_bytes(run: ServeRunSpec, params: list[TensorDef]) -> WeightBytes:
    sv = run.serving
    q = d = 0
    if run.quant is not None:
        q, d = checkpoint_bytes(run, params)
        params = []
    for t in params:
        if sv.weight_dtype not in ("bf16", "fp16") and is_quantized(t):
            q += quantized_bytes(t.shape, sv.weight_dtype, sv.quant_group_size)
        elif t.dtype in ("bf16", "fp16") and sv.weight_dtype in ("bf16", "fp16"):
            d_bytes = t.numel * DTYPE_BYTES[sv.dtype]
            if is_quantized(t):
                q += d_bytes
            else:
                d += d_bytes
        else:
            d += t.numel * DTYPE_BYTES[sv.dtype if t.dtype in ("bf16", "fp16") else t.dtype]
    absorbed = 0
    m = run.model
    if m.is_mla and sv.engine == "vllm":
        heads = m.num_attention_heads // run.parallel.tp
        absorbed = m.num_hidden_layers * heads * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank \
            * DTYPE_BYTES[sv.dtype]
    return WeightBytes(total_bytes=q + d + absorbed, quantized_bytes=q, dense_bytes=d, mla_absorbed_bytes=absorbed)
