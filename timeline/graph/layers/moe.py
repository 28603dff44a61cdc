"""Mixture-of-experts block: router, routed experts, shared experts.

Routed experts: ``n_routed_experts / ep`` per rank, each FFN split over ``etp`` (Megatron
grouped GEMM ``experts``). The router weight is replicated; DeepSeek-V3's score-correction
bias is an fp32 buffer where the profile holds it. Shared experts are one MLP of width
``n_shared × moe_intermediate`` (or Qwen's ``shared_expert_intermediate_size``), TP-split
or replicated per the profile. Everything is tagged ``moe``.
"""

from __future__ import annotations

from dataclasses import replace

from timeline.graph.context import BuildCtx
from timeline.graph.layers.mlp import mlp_params
from timeline.graph.tensors import TensorDef, param


def moe_params(ctx: BuildCtx, prefix: str, module: str = "moe") -> list[TensorDef]:
    m, h = ctx.model, ctx.model.hidden_size
    out = [param(f"{prefix}.gate.weight", (m.n_routed_experts, h), module=module, dtype=ctx.dtype)]
    if m.router_bias and ctx.profile.router_bias:
        out.append(param(f"{prefix}.gate.e_score_correction_bias", (m.n_routed_experts,), module=module,
                         dtype="fp32", trainable=False))
    local = m.n_routed_experts // ctx.ep
    for e in range(local):
        out += mlp_params(ctx, f"{prefix}.experts.{e}", m.moe_intermediate_size, split=ctx.etp,
                          module=module, expert=True)
    if m.shared_ffn:
        split = ctx.tp if ctx.profile.shared_experts_tp_split else 1
        out += mlp_params(ctx, f"{prefix}.shared_experts", m.shared_ffn, split=split, module=module)
        if m.shared_expert_gate:
            out.append(param(f"{prefix}.shared_expert_gate.weight", (1, h), module=module, dtype=ctx.dtype))
    return [replace(t, in_moe=True) for t in out]
