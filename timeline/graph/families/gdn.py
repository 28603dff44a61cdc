"""The gated delta-net mixer of a ``linear_attention`` layer (Qwen3-Next, Qwen3.5), as vLLM builds and runs it.

Source: vLLM 0.19.0 ``vllm/model_executor/layers/mamba/gdn_linear_attn.py`` ``GatedDeltaNetAttention``
(``__init__``, ``forward``, ``fix_query_key_value_ordering``, ``_forward_core``), built by
``models/qwen3_next.py`` ``Qwen3NextDecoderLayer`` (``gqa_interleaved_layout=True``) and ``models/qwen3_5.py``
``Qwen3_5DecoderLayer`` (``False``). With ``K = linear_num_key_heads · linear_key_head_dim`` and ``V =
linear_num_value_heads · linear_value_head_dim``, one tensor-parallel rank holds (:func:`params`):

* ``in_proj_qkvz`` ``[(2K + 2V)/tp, hidden]`` and ``in_proj_ba`` ``[2·v_heads/tp, hidden]`` (``MergedColumnParallel
  Linear``, no bias), quantized as the checkpoint says;
* ``conv1d.weight`` ``[(2K + V)/tp, 1, conv_kernel]`` (a ``ColumnParallelLinear`` built without ``quant_config``,
  no bias);
* ``dt_bias`` ``[v_heads/tp]`` in the model dtype and ``A_log`` ``[v_heads/tp]`` in fp32;
* ``norm.weight`` ``[linear_value_head_dim]`` (``RMSNormGated`` over one head, whole on every rank);
* ``out_proj`` ``[hidden, V/tp]`` (``RowParallelLinear``).

Forward ops on the layer's ``t`` tokens (:func:`forward`): the projections' outputs; Qwen3.5 splits ``q, k, v | z``
as views and copies ``b`` and ``a`` (``.contiguous()``), Qwen3-Next unpacks its interleaved layout with
reshapes that copy ``v``, ``z``, ``b``, ``a``, ``rearrange`` copies of ``q`` and ``k`` and their ``torch.cat``;
``core_attn_out = torch.zeros(t, v_heads/tp, value_dim)``; the ``gdn_attention_core`` custom op, which in vLLM's
profile run (no attention metadata) only warms the chunked kernels up on at most 64 tokens and returns; the gated
``RMSNormGated`` (a new ``[t, V/tp]``); ``out_proj``. Nothing is saved: an engine runs no backward, and training
with these layers is refused (:mod:`timeline.spec.arch_rules`).
"""

from __future__ import annotations

from timeline.graph.context import BuildCtx
from timeline.graph.families import attention
from timeline.graph.families.common import column_linear, row_linear
from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef, param
from timeline.spec.model import ModelSpec


def widths(m: ModelSpec) -> tuple[int, int]:
    """(K, V): the key and value widths of the unsharded mixer."""
    return m.linear_num_key_heads * m.linear_key_head_dim, m.linear_num_value_heads * m.linear_value_head_dim


def params(ctx: BuildCtx, prefix: str) -> list[TensorDef]:
    """The mixer's parameter shard (``prefix`` = ``layers.N.linear_attn``); the layer's norms are its own."""
    m, dt, h, tp = ctx.model, ctx.dtype, ctx.model.hidden_size, ctx.tp
    k, v = widths(m)
    nv = m.linear_num_value_heads
    def shard(name: str, shape: tuple[int, ...], dtype: str = dt, dim: int = 0) -> TensorDef:
        return param(f"{prefix}.{name}", shape, module=prefix, dtype=dtype, split=tp, dim=dim)

    return [
        shard("in_proj_qkvz.weight", (2 * k + 2 * v, h)),
        shard("in_proj_ba.weight", (2 * nv, h)),
        shard("conv1d.weight", (2 * k + v, 1, m.linear_conv_kernel_dim)),
        shard("dt_bias", (nv,)),
        shard("A_log", (nv,), "fp32"),
        param(f"{prefix}.norm.weight", (m.linear_value_head_dim,), module=prefix, dtype=dt),
        shard("out_proj.weight", (h, v), dim=1),
    ]


def forward(b: Builder, prefix: str, x: TensorDef, layer: int) -> TensorDef:
    """The layer's input norm and gated delta-net on its residual stream ``x``; returns ``out_proj``'s output."""
    m, p = b.model, f"{prefix}.linear_attn"
    ln = attention.input_norm(b, prefix, x, layer)
    qkvz_cols = b.params[f"{p}.in_proj_qkvz.weight"].shape[0]
    nv = b.params[f"{p}.dt_bias"].shape[0]  # local value heads, read off the shard
    v = nv * m.linear_value_head_dim
    k = (qkvz_cols - 2 * v) // 2
    qkvz = column_linear(b, f"{p}.in_proj_qkvz", ln, qkvz_cols, layer)
    ba = column_linear(b, f"{p}.in_proj_ba", ln, 2 * nv, layer)
    t = qkvz.shape[0]
    copies: dict[str, TensorDef] = {"b": b.tensor(f"{p}.b", (t, nv)), "a": b.tensor(f"{p}.a", (t, nv))}
    if m.model_type == "qwen3_next":  # fix_query_key_value_ordering: reshapes of non-contiguous splits copy
        copies |= {"value": b.tensor(f"{p}.value", (t, v)), "z": b.tensor(f"{p}.z", (t, v))}
    b.op(f"{p}.split", "gdn_unpack", layer, {"qkvz": qkvz, "ba": ba}, copies)
    if m.model_type == "qwen3_next":
        q, kk = b.tensor(f"{p}.query", (t, k)), b.tensor(f"{p}.key", (t, k))
        b.op(f"{p}.rearrange", "gdn_unpack", layer, {"qkvz": qkvz}, {"query": q, "key": kk})
        mixed = b.tensor(f"{p}.mixed_qkv", (t, 2 * k + v))
        b.op(f"{p}.cat", "gdn_unpack", layer, {"query": q, "key": kk, "value": copies["value"]}, {"y": mixed})
        z = copies["z"]
    else:  # Qwen3.5: mixed_qkv and z are views of the projection's output
        mixed, z = qkvz, qkvz
    core = b.tensor(f"{p}.core_attn_out", (t, v))
    b.op(f"{p}.core_attn_out", "gdn_zeros", layer, {}, {"y": core})
    b.op(f"{p}.gdn_attention_core", "gdn_core", layer, {"mixed_qkv": mixed, "b": copies["b"], "a": copies["a"],
                                                        "out": core}, {},
         flops=2.0 * t * (k // max(1, m.linear_key_head_dim)) * m.linear_key_head_dim * m.linear_value_head_dim * 4)
    normed = b.tensor(f"{p}.norm.out", (t, v))
    b.op(f"{p}.norm", "gdn_gated_norm", layer, {"x": core, "z": z}, {"y": normed}, flops=5.0 * t * v)
    return row_linear(b, f"{p}.out_proj", normed, m.hidden_size, layer)
