"""Mixture-of-experts block: router, routed experts, shared experts.

Routed experts: ``n_routed_experts / ep`` per rank, each FFN split over ``etp`` (Megatron
grouped GEMM ``experts``). The router weight is replicated; DeepSeek-V3's score-correction
bias is an fp32 buffer where the profile holds it; GPT-OSS's router linear has a trainable bias
(``router_logit_bias``) and its experts biases (:func:`~timeline.graph.layers.mlp.mlp_params`). Shared experts are one MLP of width
``n_shared × moe_intermediate`` (or Qwen's ``shared_expert_intermediate_size``), TP-split
or replicated per the profile. Everything is tagged ``moe``. :func:`moe_local` reads the local
expert count and widths back off the built parameters, for the op builders.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from timeline.graph.context import BuildCtx
from timeline.graph.layers.mlp import mlp_down, mlp_ffn, mlp_params
from timeline.graph.tensors import TensorDef, param


def moe_params(ctx: BuildCtx, prefix: str, module: str = "moe") -> list[TensorDef]:
    m, h = ctx.model, ctx.model.hidden_size
    out = [param(f"{prefix}.gate.weight", (m.n_routed_experts, h), module=module, dtype=ctx.dtype, in_moe=True)]
    if m.router_logit_bias:
        out.append(param(f"{prefix}.gate.bias", (m.n_routed_experts,), module=module, dtype=ctx.dtype,
                         in_moe=True))
    if m.router_bias and ctx.profile.router_bias:
        out.append(param(f"{prefix}.gate.e_score_correction_bias", (m.n_routed_experts,), module=module,
                         dtype="fp32", trainable=False, in_moe=True))
    local = m.n_routed_experts // ctx.ep
    for e in range(local):
        out += mlp_params(ctx, f"{prefix}.experts.{e}", m.moe_intermediate_size, split=ctx.etp,
                          module=module, expert=True, in_moe=True)
    if m.shared_ffn:
        split = ctx.tp if ctx.profile.shared_experts_tp_split else 1
        out += mlp_params(ctx, f"{prefix}.shared_experts", m.shared_ffn, split=split, module=module, in_moe=True)
        if m.shared_expert_gate:
            out.append(param(f"{prefix}.shared_expert_gate.weight", (1, h), module=module, dtype=ctx.dtype,
                             in_moe=True))
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class MoELocal:
    """What one device holds of an MoE block."""

    experts: int  # routed experts on this EP rank
    expert_ffn: int  # each routed expert's FFN width after expert-TP
    shared_ffn: int  # the shared experts' FFN width (after TP, where the profile splits them); 0 if none


def moe_local(params: Mapping[str, TensorDef], prefix: str) -> MoELocal:
    """The local expert count and widths of the MoE block built under ``prefix``."""
    n = 0
    while mlp_down(params, f"{prefix}.experts.{n}") is not None:
        n += 1
    shared = mlp_down(params, f"{prefix}.shared_experts")
    return MoELocal(experts=n, expert_ffn=mlp_ffn(params, f"{prefix}.experts.0"),
                    shared_ffn=0 if shared is None else shared.shape[1])
