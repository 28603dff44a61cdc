"""Multi-head and grouped-query attention (GPT, Llama, Mistral, Qwen).

Q/K/V are column-parallel over TP (heads split), the output projection row-parallel (its
bias, where present, is replicated — Megatron ``RowParallelLinear``). Qwen3's per-head q/k
norms are tagged ``norm``. GPT-OSS's learned sinks are one logit per query head, split with the
heads (HF ``GptOssAttention.sinks``; Megatron-Core's ``softmax_offset`` per local head). :func:`attention_heads` reads the local head counts back off the
built parameters, for the op builders.
"""

from __future__ import annotations

from collections.abc import Mapping

from timeline.graph.context import BuildCtx
from timeline.graph.layers.norm import norm_params
from timeline.graph.tensors import TensorDef, param


def attention_params(ctx: BuildCtx, prefix: str, module: str = "attention") -> list[TensorDef]:
    m, tp, dt = ctx.model, ctx.tp, ctx.dtype
    hd = m.attn_head_dim
    q_out, kv_out = m.num_attention_heads * hd, m.kv_heads * hd
    out = [
        param(f"{prefix}.q_proj.weight", (q_out, m.hidden_size), module=module, dtype=dt, split=tp),
        param(f"{prefix}.k_proj.weight", (kv_out, m.hidden_size), module=module, dtype=dt, split=tp),
        param(f"{prefix}.v_proj.weight", (kv_out, m.hidden_size), module=module, dtype=dt, split=tp),
        param(f"{prefix}.o_proj.weight", (m.hidden_size, q_out), module=module, dtype=dt, split=tp, dim=1),
    ]
    if m.attention_bias or m.linear_bias:
        out += [param(f"{prefix}.{n}_proj.bias", (w,), module=module, dtype=dt, split=tp)
                for n, w in (("q", q_out), ("k", kv_out), ("v", kv_out))]
    if m.linear_bias or m.attention_out_bias:
        out.append(param(f"{prefix}.o_proj.bias", (m.hidden_size,), module=module, dtype=dt))
    if m.attention_sinks:
        out.append(param(f"{prefix}.sinks", (m.num_attention_heads,), module=module, dtype=dt, split=tp))
    if m.qk_norm:
        out += norm_params(ctx, f"{prefix}.q_norm", hd, module="norm", kind="rmsnorm")
        out += norm_params(ctx, f"{prefix}.k_norm", hd, module="norm", kind="rmsnorm")
    return out


def attention_heads(params: Mapping[str, TensorDef], prefix: str, head_dim: int) -> tuple[int, int]:
    """Local (query, key/value) heads of the attention built under ``prefix``, off its q/k projections."""
    return (params[f"{prefix}.q_proj.weight"].shape[0] // head_dim,
            params[f"{prefix}.k_proj.weight"].shape[0] // head_dim)
