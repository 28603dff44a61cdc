"""Multi-head latent attention (DeepSeek-V2/V3).

Matrices as arXiv 2502.07846 Table 2 names them: W^DQ (q down), W^UQ and W^QR (q up: the
no-RoPE and RoPE parts), W^DKV and W^KR (kv down, fused in Megatron's
``linear_kv_down_proj``), W^UK and W^UV (kv up), W^O. The down projections are replicated
over TP; the up projections and W^O are split by heads. Whether W^QR is split is the
profile's ``mla_q_rope_tp_split`` rule. The two latent norms are tagged ``norm`` (the paper
counts them under LN). :func:`local_heads` reads the local head count back off the built
parameters, for the op builders.

Forward ops (:func:`forward`), names as arXiv 2502.07846 Table 2.

Down projections W^DQ and W^DKV (+W^KR, fused) are replicated over TP; the latent norms, the
up projections W^UQ/W^QR and W^UK/W^UV, RoPE, core attention and W^O follow. Under the
``paper`` table the input is all-gathered first, so c_Q/c_KV hold the full sequence; Megatron
keeps them sequence-parallel and all-gathers before the up projections (``mla_latent_sp``).
The latent norms, up projections and RoPE form the ``mla_up_proj`` recompute module. Under a table
with ``mla_kv_views`` (HF ``DeepseekV3Attention``) V is a view of the kv up-projection's output
(RoPE builds only the query and key) and a cuDNN or flash attention output is copied before W^O.
Under ``mla_kv_combined`` (Megatron ``MLASelfAttention``) the kv down projection is one tensor
whose kv part the latent norm keeps (so the whole tensor stays), and k_pe is copied and gathered
before the ``mla_up_proj`` checkpoint, which keeps the gathered copy as its input.
"""

from __future__ import annotations

from collections.abc import Mapping

from timeline.graph.context import BuildCtx
from timeline.graph.families import norm, sdpa
from timeline.graph.families.attention import core_attention, rope_inputs
from timeline.graph.families.common import all_gather, linear, row_linear, sp_gather
from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef, param


def params(ctx: BuildCtx, prefix: str, module: str = "attention") -> list[TensorDef]:
    m, tp, dt, h = ctx.model, ctx.tp, ctx.dtype, ctx.model.hidden_size
    nh, d_h, d_hr, d_v = m.num_attention_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
    qr_split = tp if ctx.profile.mla_q_rope_tp_split else 1
    out: list[TensorDef] = []
    if m.q_lora_rank:
        out.append(param(f"{prefix}.q_a_proj.weight", (m.q_lora_rank, h), module=module, dtype=dt))
        out += norm.params(ctx, f"{prefix}.q_a_layernorm", m.q_lora_rank, kind="rmsnorm")
        q_in = m.q_lora_rank
    else:
        q_in = h
    out.append(param(f"{prefix}.q_b_proj.nope.weight", (nh * d_h, q_in), module=module, dtype=dt, split=tp))
    out.append(param(f"{prefix}.q_b_proj.rope.weight", (nh * d_hr, q_in), module=module, dtype=dt,
                     split=qr_split))
    out.append(param(f"{prefix}.kv_a_proj.weight", (m.kv_lora_rank, h), module=module, dtype=dt))
    out.append(param(f"{prefix}.kv_a_proj.rope.weight", (d_hr, h), module=module, dtype=dt))
    out += norm.params(ctx, f"{prefix}.kv_a_layernorm", m.kv_lora_rank, kind="rmsnorm")
    out.append(param(f"{prefix}.kv_b_proj.k.weight", (nh * d_h, m.kv_lora_rank), module=module, dtype=dt,
                     split=tp))
    out.append(param(f"{prefix}.kv_b_proj.v.weight", (nh * d_v, m.kv_lora_rank), module=module, dtype=dt,
                     split=tp))
    out.append(param(f"{prefix}.o_proj.weight", (h, nh * d_v), module=module, dtype=dt, split=tp, dim=1))
    return out


def local_heads(params: Mapping[str, TensorDef], prefix: str, v_head_dim: int) -> int:
    """Local heads of the MLA built under ``prefix``, off its (head-split) W^UV."""
    return params[f"{prefix}.kv_b_proj.v.weight"].shape[0] // v_head_dim


UP = frozenset({"mla_up_proj"})


def forward(b: Builder, prefix: str, x: TensorDef, layer: int) -> TensorDef:
    m, d = b.model, b.dims
    p = f"{prefix}.self_attn"
    h, d_h, d_hr, d_v = m.hidden_size, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
    nh = local_heads(b.params, p, d_v)
    ln = norm.forward(b, f"{prefix}.input_layernorm", x, layer, tags=frozenset({"layernorm"}))
    latent_sp = b.table.mla_latent_sp
    src = ln if latent_sp else sp_gather(b, f"{p}.linear_q_down_proj", ln, layer)
    if m.q_lora_rank:
        cq_raw = linear(b, f"{p}.linear_q_down_proj", src, m.q_lora_rank, layer, save=ln)
    rows = src.shape[0]
    f = 2.0 * rows * h * (m.kv_lora_rank + d_hr)
    group = d.tp if (latent_sp and d.sp) else 1
    combined = b.table.mla_kv_combined
    if combined:  # kv_combined [rows, kv_lora_rank + d_hr]; kv_compressed and k_pos_emb are split views
        kv_raw = b.tensor(f"{p}.linear_kv_down_proj.out", (rows, m.kv_lora_rank + d_hr))
        b.op(f"{p}.linear_kv_down_proj", "linear", layer, {"x": src, "_save": ln}, {"y": kv_raw}, flops=f, wflops=f)
        k_pe = b.tensor(f"{p}.linear_kv_down_proj.k_pe", (rows, d_hr))
        b.op(f"{p}.linear_kv_down_proj.k_pe_contiguous", "copy", layer, {"x": kv_raw}, {"y": k_pe})
        k_pe_full = all_gather(b, f"{p}.k_pe", k_pe, layer, group)  # outside the mla_up_proj checkpoint
    else:
        kv_raw = b.tensor(f"{p}.linear_kv_down_proj.out", (rows, m.kv_lora_rank))
        k_pe = b.tensor(f"{p}.linear_kv_down_proj.k_pe", (rows, d_hr))
        b.op(f"{p}.linear_kv_down_proj", "linear", layer, {"x": src, "_save": ln}, {"y": kv_raw, "k_pe": k_pe},
             flops=f, wflops=f)
    if m.q_lora_rank:
        cq = norm.forward(b, f"{p}.q_layernorm", cq_raw, layer, kind="rmsnorm", rule="latent_norm", tags=UP)
        cq_full = all_gather(b, f"{p}.linear_q_up_proj", cq, layer, group, tags=UP)
        q_raw = linear(b, f"{p}.linear_q_up_proj", cq_full, nh * (d_h + d_hr), layer, save=cq, tags=UP)
    else:
        q_raw = linear(b, f"{p}.linear_q_proj", sp_gather(b, f"{p}.linear_q_proj", ln, layer) if latent_sp else src,
                       nh * (d_h + d_hr), layer, save=ln, tags=UP)
    ckv = norm.forward(b, f"{p}.kv_layernorm", kv_raw, layer, kind="rmsnorm", rule="latent_norm", cols=m.kv_lora_rank,
               tags=UP)
    ckv_full = all_gather(b, f"{p}.linear_kv_up_proj", ckv, layer, group, tags=UP)
    kv = linear(b, f"{p}.linear_kv_up_proj", ckv_full, nh * (d_h + d_v), layer, save=ckv, tags=UP)
    if not combined:
        k_pe_full = all_gather(b, f"{p}.k_pe", k_pe, layer, group, tags=UP)
    full_rows = kv.shape[0]
    q = b.tensor(f"{p}.q", (full_rows, nh * (d_h + d_hr)))
    k = b.tensor(f"{p}.k", (full_rows, nh * (d_h + d_hr)))
    views = b.table.mla_kv_views
    v = kv if views else b.tensor(f"{p}.v", (full_rows, nh * d_v))
    outs = {"q": q, "k": k} if views else {"q": q, "k": k, "v": v}
    b.op(f"{p}.rope", "rope", layer, {"q": q_raw, "kv": kv, "k_pe": k_pe_full, **rope_inputs(b)}, outs,
         flops=3.0 * full_rows * nh * d_hr * 2, tags=UP)
    ctx = core_attention(b, p, q, k, v, layer, nh, d_h + d_hr, d_v)
    if views and sdpa.output_like_query(b, d_h + d_hr, d_v):  # a cuDNN or flash output inherits the cat
        # query's layout, so transpose(1, 2).contiguous() copies it (the efficient kernel's is (b, s, a, d))
        copy = b.tensor(f"{p}.core_attn.out_contiguous", ctx.shape)
        b.op(f"{p}.core_attn.contiguous", "copy", layer, {"x": ctx}, {"y": copy})
        ctx = copy
    return row_linear(b, f"{p}.linear_proj", ctx, h, layer)

