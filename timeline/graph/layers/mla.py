"""Multi-head latent attention (DeepSeek-V2/V3).

Matrices as arXiv 2502.07846 Table 2 names them: W^DQ (q down), W^UQ and W^QR (q up: the
no-RoPE and RoPE parts), W^DKV and W^KR (kv down, fused in Megatron's
``linear_kv_down_proj``), W^UK and W^UV (kv up), W^O. The down projections are replicated
over TP; the up projections and W^O are split by heads. Whether W^QR is split is the
profile's ``mla_q_rope_tp_split`` rule. The two latent norms are tagged ``norm`` (the paper
counts them under LN). :func:`mla_heads` reads the local head count back off the built
parameters, for the op builders.
"""

from __future__ import annotations

from collections.abc import Mapping

from timeline.graph.context import BuildCtx
from timeline.graph.layers.norm import norm_params
from timeline.graph.tensors import TensorDef, param


def mla_params(ctx: BuildCtx, prefix: str, module: str = "attention") -> list[TensorDef]:
    m, tp, dt, h = ctx.model, ctx.tp, ctx.dtype, ctx.model.hidden_size
    nh, d_h, d_hr, d_v = m.num_attention_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
    qr_split = tp if ctx.profile.mla_q_rope_tp_split else 1
    out: list[TensorDef] = []
    if m.q_lora_rank:
        out.append(param(f"{prefix}.q_a_proj.weight", (m.q_lora_rank, h), module=module, dtype=dt))
        out += norm_params(ctx, f"{prefix}.q_a_layernorm", m.q_lora_rank, kind="rmsnorm")
        q_in = m.q_lora_rank
    else:
        q_in = h
    out.append(param(f"{prefix}.q_b_proj.nope.weight", (nh * d_h, q_in), module=module, dtype=dt, split=tp))
    out.append(param(f"{prefix}.q_b_proj.rope.weight", (nh * d_hr, q_in), module=module, dtype=dt,
                     split=qr_split))
    out.append(param(f"{prefix}.kv_a_proj.weight", (m.kv_lora_rank, h), module=module, dtype=dt))
    out.append(param(f"{prefix}.kv_a_proj.rope.weight", (d_hr, h), module=module, dtype=dt))
    out += norm_params(ctx, f"{prefix}.kv_a_layernorm", m.kv_lora_rank, kind="rmsnorm")
    out.append(param(f"{prefix}.kv_b_proj.k.weight", (nh * d_h, m.kv_lora_rank), module=module, dtype=dt,
                     split=tp))
    out.append(param(f"{prefix}.kv_b_proj.v.weight", (nh * d_v, m.kv_lora_rank), module=module, dtype=dt,
                     split=tp))
    out.append(param(f"{prefix}.o_proj.weight", (h, nh * d_v), module=module, dtype=dt, split=tp, dim=1))
    return out


def mla_heads(params: Mapping[str, TensorDef], prefix: str, v_head_dim: int) -> int:
    """Local heads of the MLA built under ``prefix``, off its (head-split) W^UV."""
    return params[f"{prefix}.kv_b_proj.v.weight"].shape[0] // v_head_dim
