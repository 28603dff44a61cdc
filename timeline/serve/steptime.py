"""Step durations from the roofline (:class:`timeline.sim.cost.CostModel`).

A step over ``T`` new tokens and ``C`` cached context tokens on one device costs
``max(flops / achieved peak, bytes / HBM bandwidth)``, with
``flops = 2 · T · P_active + 4 · C_attn · heads_local · head_dim`` and ``bytes = weights read + KV
read + KV written``: prefill is compute-bound, decode bandwidth-bound. ``P_active`` is the device's
dense parameters plus, for MoE, the experts a token activates on this device (``top_k`` of
``n_routed`` spread over ``ep`` ranks, or split by tp without EP); the weights read are the dense
weights and the experts at least one token reaches (balanced routing). Tensor-parallel
all-reduces are two per layer of ``T · hidden`` activations on NVLink (alpha-beta). A DP rank of a
MoE model (:mod:`timeline.serve.dp`) runs its padded tokens through attention and the dense layers and
the tokens gathered from every rank through its experts, with each MoE layer's all-gather and
reduce-scatter of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from timeline.graph.tensors import DTYPE_BYTES, TensorDef
from timeline.serve.dp import attention_tp
from timeline.sim.cost import CostModel
from timeline.spec.serving import ServeRunSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCost:
    cost: CostModel
    dense_params: int
    expert_params_local: int  # routed-expert parameters one device holds
    local_experts: int
    top_k: int
    n_routed: int
    dense_weight_bytes: int
    expert_weight_bytes: int
    attn_flops_per_ctx_token: float
    kv_bytes_per_token: int
    allreduce_bytes_per_token: int
    layers: int
    tp: int
    moe_layers: int = 0

    def step_us(self, num_tokens: int, kv_tokens: int, attn_pairs: float, moe_tokens: int = 0) -> float:
        """``kv_tokens``: cache tokens read and written; ``attn_pairs``: (query, key) pairs;
        ``moe_tokens`` > 0: the MoE layers run on the tokens gathered from every DP rank."""
        if moe_tokens:
            return self._dp_step_us(num_tokens, kv_tokens, attn_pairs, moe_tokens)
        frac = 0.0
        if self.n_routed:
            frac = min(1.0, num_tokens * self.top_k / self.n_routed)
        active = self.dense_params + self.expert_params_local * (self.top_k / self.n_routed if self.n_routed else 0)
        flops = 2.0 * num_tokens * active + self.attn_flops_per_ctx_token * attn_pairs
        moved = self.dense_weight_bytes + self.expert_weight_bytes * frac + self.kv_bytes_per_token * kv_tokens
        t = self.cost.compute_us(flops, moved)
        if self.tp > 1:
            t += 2 * self.layers * self.cost.comm_us(self.allreduce_bytes_per_token * num_tokens, "tp")
        return t


    def _dp_step_us(self, num_tokens: int, kv_tokens: int, attn_pairs: float, moe_tokens: int) -> float:
        """A DP rank's step: its own (padded) tokens through attention and the dense layers, the
        gathered ``moe_tokens`` through its experts (the weights a token reaches, the flops of its
        ``top_k``), and each MoE layer's dispatch all-gather and combine reduce-scatter of the
        gathered rows over NVLink."""
        frac = min(1.0, moe_tokens * self.top_k / self.n_routed) if self.n_routed else 0.0
        experts = self.expert_params_local * (self.top_k / self.n_routed) if self.n_routed else 0.0
        flops = 2.0 * num_tokens * self.dense_params + 2.0 * moe_tokens * experts \
            + self.attn_flops_per_ctx_token * attn_pairs
        moved = self.dense_weight_bytes + self.expert_weight_bytes * frac + self.kv_bytes_per_token * kv_tokens
        t = self.cost.compute_us(flops, moved)
        if self.tp > 1:
            t += 2 * self.layers * self.cost.comm_us(self.allreduce_bytes_per_token * num_tokens, "tp")
        return t + 2 * self.moe_layers * self.cost.comm_us(self.allreduce_bytes_per_token * moe_tokens, "ep")


def step_cost(run: ServeRunSpec, params: Sequence[TensorDef], weights_total: int, kv_bytes_per_token: int) -> StepCost:
    m, par = run.model, run.parallel
    expert = [t for t in params if t.expert]
    expert_n = sum(t.numel for t in expert)
    dense_n = sum(t.numel for t in params if not t.expert and t.name.startswith("layers."))
    local_experts = m.n_routed_experts // par.ep if m.is_moe else 0
    expert_bytes = int(weights_total * (expert_n / max(1, expert_n + dense_n)))
    heads = m.num_attention_heads // attention_tp(run)  # one DP rank's attention heads per device
    head = (m.qk_nope_head_dim + m.qk_rope_head_dim) if m.is_mla else m.attn_head_dim
    cost = CostModel(flops_per_us=run.hardware.bf16_tflops * 1e6 * run.hardware.efficiency,
                     hbm_bytes_per_us=run.hardware.hbm_gbps * 1e3,
                     nvlink_bytes_per_us=run.hardware.nvlink_gbps * 1e3 * run.hardware.comm_efficiency,
                     network_bytes_per_us=run.hardware.network_gbps * 1e3 * run.hardware.comm_efficiency,
                     latency_us=run.hardware.latency_us, ep_on_nvlink=True)
    return StepCost(cost=cost, dense_params=dense_n, expert_params_local=expert_n,
                    local_experts=local_experts, top_k=m.num_experts_per_tok, n_routed=m.n_routed_experts,
                    dense_weight_bytes=weights_total - expert_bytes, expert_weight_bytes=expert_bytes,
                    attn_flops_per_ctx_token=4.0 * heads * head * m.num_hidden_layers,
                    kv_bytes_per_token=kv_bytes_per_token,
                    allreduce_bytes_per_token=m.hidden_size * DTYPE_BYTES[run.serving.dtype],
                    layers=m.num_hidden_layers, tp=attention_tp(run),
                    moe_layers=sum(m.is_moe_layer(i) for i in range(m.num_hidden_layers)) if m.is_moe else 0)
