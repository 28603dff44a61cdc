"""Megatron-Core's MoE combine before Megatron-LM 2659630721: the routing probabilities scale the experts'
output there, not the experts' activation (``Structure.moe_probs_at_combine``, ``[framework]
moe_probs_in_experts = false``).

2659630721 ("perf(MoE): Memory efficient token permutation", 2025-04-09, first released in core_v0.13.0rc0;
core_r0.12.x never had it) moved the multiply into the experts (``experts.py``: ``activation_func(x) *
permuted_probs``, which keeps the activation's ``[rows, ffn]`` output; ``WeightedSwiGLUFunction`` keeps the
probs). Before it (``NVIDIA/Megatron-LM@2659630721^``):

- the alltoall dispatcher's ``token_unpermutation`` calls ``moe_utils.py: unpermute(..., probs=self.probs,
  routing_map=...)``: ``probs.T.contiguous().masked_select(routing_map.T.contiguous())`` keeps the
  transposed probs and bool map ``[E, t]``; ``permuted_tokens * permuted_probs.unsqueeze(-1)`` keeps the
  ``[t·k, h]`` rows the all-to-all brought back and the permuted probs, and makes a product in the promoted
  dtype (fp32 under ``--moe-router-dtype fp32``); ``torch.zeros(restore_shape)`` of that dtype takes the
  ``scatter_add_``, and ``.to(input_dtype)`` casts the result back. With ``--moe-permute-fusion`` TE's
  ``moe_unpermute`` with ``merging_probs`` does all of it in one kernel
  (``NVIDIA/TransformerEngine@release_v2.2:transformer_engine/pytorch/permutation.py:
  _moe_unpermute_mask_map.forward`` saves ``inp``, ``row_id_map`` and ``merging_probs``);
- the allgather dispatcher's ``token_unpermutation`` makes the permuted local probs the same way
  (``self.local_probs.T.contiguous().masked_select(self.local_map.T.contiguous())``) and multiplies the
  experts' ``[rows, h]`` output by them before ``unpermute``, which then runs in the promoted dtype, as does
  the reduce-scatter (``.to(self.local_probs.dtype)``); ``output_total.to(hidden_states.dtype)`` casts back;
- ``permute`` moved the tokens alone (``index_select`` keeps ``sorted_indices``), and no probs travelled with
  them through the all-to-all or the chunk sort (router.py builds the dispatch accordingly).

Experts with biases (allowed before 2659630721, with the allgather dispatcher only) return their bias rows
too, which the combine weights, unpermutes and reduce-scatters like the output (:func:`weighted_bias`,
:func:`add_bias`). This module builds those combine ops; the saved-tensor rules are the profile's
(``combine_probs_select``, ``combine_probs_mul``, ``fused_unpermute_probs``).
"""

from __future__ import annotations

from timeline.graph.families.router import MOE
from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef

#: torch's type promotion among the dtypes a product of tokens and probs meets
_RANK = {"bf16": 1, "fp16": 1, "fp32": 2, "fp64": 3}


def at_combine(b: Builder) -> bool:
    """Whether the table's Megatron-Core multiplies the routing probs in the combine (before 2659630721)."""
    return b.table.megatron_moe and b.table.moe_probs_at_combine


def promoted(a: str, b: str) -> str:
    """The dtype of ``a_tensor * b_tensor`` (``bf16 · fp32 → fp32``)."""
    return a if _RANK.get(a, 0) >= _RANK.get(b, 0) else b


def weighted_rows(b: Builder, p: str, x: TensorDef, probs: TensorDef, layer: int, experts: int,
                  tokens: int) -> tuple[TensorDef, TensorDef]:
    """``x * permuted_probs.unsqueeze(-1)`` on the experts' ``[rows, h]`` output ``x``, the permuted probs
    selected out of ``probs`` (``[tokens, ≥ experts]``, the columns of the ``experts`` this combine serves):
    (the weighted rows, the permuted probs)."""
    rows, h = x.shape
    pprobs = b.tensor(f"{p}.combine.permuted_probs", (rows,), probs.dtype)
    b.op(f"{p}.combine.select_probs", "combine_probs_select", layer, {"probs": probs}, {"y": pprobs},
         extras={"probs_t": b.tensor(f"{p}.combine.probs_t", (experts, tokens), probs.dtype),
                 "routing_map_t": b.tensor(f"{p}.combine.routing_map_t", (experts, tokens), "bool")}, tags=MOE)
    out = b.tensor(f"{p}.combine.weighted", (rows, h), promoted(x.dtype, probs.dtype))
    b.op(f"{p}.combine.weight", "combine_probs_mul", layer, {"x": x, "probs": pprobs}, {"y": out},
         flops=float(rows * h), tags=MOE)
    return out, pprobs


def weighted_bias(b: Builder, p: str, pprobs: TensorDef, layer: int, experts: int) -> TensorDef | None:
    """The experts' output bias times the permuted probs (``MoEAllGatherTokenDispatcher.token_unpermutation
    @2659630721^``: ``weighted_bias = bias * permuted_probs.unsqueeze(-1)``), where the experts have biases
    and more than one of them is local: ``SequentialMLP.forward@2659630721^`` returns
    ``torch.cat([output_bias.expand_as(output) …])``, a ``[rows, h]`` tensor the multiply keeps (one local
    expert returns its ``[h]`` bias parameter itself: the product keeps nothing new). None without biases."""
    if not b.model.linear_bias or experts < 2:
        return None
    rows, h = pprobs.shape[0], b.model.routed_width
    cat = b.tensor(f"{p}.experts.bias_rows", (rows, h))
    b.op(f"{p}.experts.bias_cat", "concat", layer, {}, {"y": cat}, tags=MOE)
    out = b.tensor(f"{p}.combine.weighted_bias", (rows, h), promoted(cat.dtype, pprobs.dtype))
    b.op(f"{p}.combine.weight_bias", "combine_probs_mul", layer, {"x": cat, "probs": pprobs}, {"y": out},
         flops=float(rows * h), tags=MOE)
    return out


def add_bias(b: Builder, p: str, routed: TensorDef, bias: TensorDef, idx: TensorDef, layer: int, unpermute: str,
             group: int) -> TensorDef:
    """The weighted bias rows unpermuted to all ``t·group`` gathered rows, reduce-scattered over the
    ``group`` (expert-TP × EP) ranks in their dtype and divided by ``tp`` (``/ self.tp_size``), cast back and
    added to the routed output by the layer's bias-dropout-add; returns the sum."""
    t, h = routed.shape
    full = b.tensor(f"{p}.combine.bias_unpermuted", (t * group, h), bias.dtype)
    b.op(f"{p}.combine.bias_unpermute", unpermute, layer, {"x": bias, "_idx": idx}, {"y": full},
         flops=float(bias.shape[0] * h), tags=MOE)
    if group > 1:
        reduced = b.tensor(f"{p}.combine.bias_reduced", (t, h), bias.dtype, comm=True)
        b.op(f"{p}.combine.bias_reduce_scatter", "comm", layer, {"x": full}, {"y": reduced}, kind="collective",
             stream="ep", tags=MOE)
        full = b.tensor(f"{p}.combine.bias_out", (t, h), bias.dtype)
        b.op(f"{p}.combine.bias_div", "copy", layer, {"x": reduced}, {"y": full}, tags=MOE)
    if full.dtype != routed.dtype:  # output_bias_total.to(bias.dtype)
        cast = b.tensor(f"{p}.combine.bias_cast", (t, h), routed.dtype)
        b.op(f"{p}.combine.bias_cast", "copy", layer, {"x": full}, {"y": cast}, tags=MOE)
        full = cast
    out = b.tensor(f"{p}.combine.with_bias", (t, h))
    b.op(f"{p}.combine.bias_add", "add", layer, {"x": routed, "bias": full}, {"y": out}, flops=float(t * h),
         tags=MOE)
    return out


def alltoall_unpermute(b: Builder, p: str, back: TensorDef, probs: TensorDef, idx: TensorDef, layer: int,
                       unpermute: str) -> TensorDef:
    """The alltoall combine's ``unpermute`` with probs: ``back`` the ``[t·k, h]`` rows the all-to-all returned,
    ``probs`` the router's dense ``[t, E]`` probs; returns the ``[t, h]`` routed output in ``back``'s dtype."""
    t, h = probs.shape[0], back.shape[1]
    routed = b.tensor(f"{p}.combine.out", (t, h), back.dtype)
    if b.table.moe_permute_fusion:
        b.op(f"{p}.combine.unpermute", "fused_unpermute_probs", layer, {"x": back, "probs": probs, "_idx": idx},
             {"y": routed}, flops=float(back.shape[0] * h), tags=MOE)
        return routed
    weighted, _ = weighted_rows(b, p, back, probs, layer, probs.shape[1], t)
    wide = weighted.dtype != back.dtype
    summed = b.tensor(f"{p}.combine.unpermuted_{weighted.dtype}", (t, h), weighted.dtype) if wide else routed
    b.op(f"{p}.combine.unpermute", unpermute, layer, {"x": weighted, "_idx": idx}, {"y": summed},
         flops=float(back.shape[0] * h), tags=MOE)
    if wide:  # output_tokens.to(dtype=input_dtype)
        b.op(f"{p}.combine.cast_back", "copy", layer, {"x": summed}, {"y": routed}, tags=MOE)
    return routed
