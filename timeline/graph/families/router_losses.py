"""Megatron-Core's router losses and Transformer Engine's fused-permutation index map, as ops of the MoE block.

- :func:`z_loss` — ``TopKRouter.apply_z_loss`` (MC transformer/moe/router.py), run on the logits before
  routing whenever ``--moe-z-loss-coeff`` is given: ``moe_utils.z_loss_func`` is
  ``torch.logsumexp(logits, -1)`` (keeps its input and its ``[tokens]`` result), ``torch.square`` of it (keeps
  the same result) and a mean; ``MoEAuxLossAutoScaler.apply(logits, z_loss)`` returns the logits and keeps
  the 0-d loss.
- :func:`aux_loss` — ``TopKRouter.routing`` with an aux-loss type (``aux_loss``, ``seq_aux_loss``,
  ``global_aux_loss``) and a coefficient > 0: ``moe_utils.compute_routing_scores_for_aux_loss`` scores every
  expert in fp32 (softmax: ``torch.softmax(logits, -1, dtype=torch.float32)`` keeps its result; sigmoid:
  ``torch.sigmoid(logits.float())`` keeps its result and ``scores / (scores.sum(-1, keepdim=True) + 1e-20)``
  keeps it and the ``[tokens, 1]`` sum), ``switch_load_balancing_loss_func`` sums them per expert
  (``probs.sum(dim=0)`` keeps nothing; the product with the ``[E]`` token counts keeps the counts) and
  ``MoEAuxLossAutoScaler.apply(probs, aux_loss · tokens)`` keeps the 0-d loss. The routing map it builds
  (``torch.topk``, ``scatter``) needs no gradient and is transient.
- :func:`row_id_map` — TE pytorch/triton/permutation.py ``make_row_id_map``: ``torch.empty((num_tokens,
  num_experts * 2 + 1), dtype=torch.int32)``, the map TE's ``_moe_permute_mask_map`` saves for its backward
  and ``moe_unpermute`` reads (v2.6 through v2.14 alike).

What each op keeps is the profile's business (``z_loss`` and ``aux_loss`` rules); the ops exist only where
the table switches them on.
"""

from __future__ import annotations

from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef

MOE = frozenset({"moe"})


def z_loss(b: Builder, p: str, logits: TensorDef, layer: int) -> None:
    """The z-loss on ``logits`` ``[tokens, E]``: an op keeping the logits, the logsumexp and the loss."""
    t, n = logits.shape
    b.op(f"{p}.router.z_loss", "z_loss", layer, {"x": logits}, {},
         extras={"logsum": b.tensor(f"{p}.router.z_loss.logsum", (t,), logits.dtype),
                 "loss": b.tensor(f"{p}.router.z_loss.loss", (1,), logits.dtype)},
         flops=4.0 * t * n, tags=MOE)


def aux_loss(b: Builder, p: str, logits: TensorDef, layer: int) -> None:
    """The load-balancing loss's scores of every expert (fp32), their sum for a sigmoid router, and the loss."""
    t, n = logits.shape
    extras = {"scores": b.tensor(f"{p}.router.aux_loss.scores", (t, n), "fp32"),
              "loss": b.tensor(f"{p}.router.aux_loss.loss", (1,), "fp32"),
              "tokens_per_expert": b.tensor(f"{p}.router.aux_loss.tokens_per_expert", (n,), "int64")}
    if b.model.router_bias:  # sigmoid scoring (the model's expert bias marks it, as in the router)
        extras["denominator"] = b.tensor(f"{p}.router.aux_loss.denominator", (t, 1), "fp32")
    b.op(f"{p}.router.aux_loss", "aux_loss", layer, {"x": logits}, {}, extras=extras, flops=6.0 * t * n, tags=MOE)


def row_id_map(b: Builder, prefix: str, tokens: int, experts: int) -> TensorDef:
    """TE's ``[tokens, 2·experts + 1]`` int32 row-id map of a fused permutation."""
    return b.tensor(f"{prefix}.row_id_map", (tokens, 2 * experts + 1), "int32")


def permute_extras(b: Builder, prefix: str, rows: int, tokens: int, experts: int, probs_dtype: str) -> dict[str, TensorDef]:
    """What a permutation of ``tokens`` tokens into ``rows`` (token, expert) rows keeps for its
    backward: TE's ``moe_permute_with_probs`` only its row-id map; Megatron's unfused ``permute`` the
    int64 ``sorted_indices`` (``index_select``) and the transposed probs and routing map
    (``masked_select``)."""
    if b.table.moe_permute_fusion:
        return {"row_id_map": row_id_map(b, prefix, tokens, experts)}
    return {"sorted_idx": b.tensor(f"{prefix}.sorted_idx", (rows,), "int64"),
            "probs_t": b.tensor(f"{prefix}.probs_t", (experts, tokens), probs_dtype),
            "routing_map_t": b.tensor(f"{prefix}.routing_map_t", (experts, tokens), "bool")}
