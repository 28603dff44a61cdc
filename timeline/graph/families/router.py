"""The MoE router of each framework: scores, top-k and the dispatcher's first permutation.

One function per framework, :data:`ROUTERS` keyed by the profile's name, so the MoE block
(:func:`timeline.graph.families.moe.forward`) picks one once and never asks which framework runs:

- :func:`megatron_router` — Megatron-Core's ``TopKRouter`` (top-k or sinkhorn) and the alltoall or allgather
  dispatcher's permutation;
- :func:`paper_router` — arXiv 2502.07846's convention: bf16 scores and int16 indices;
- :func:`hf_router` — Hugging Face: fp32 scores and int64 indices, or GPT-OSS's top-k of the logits.

Each returns (routing weights, top-k indices, permuted weights, permuted tokens) and builds the same
ops, in the same order, as it always did; what each op keeps is the table's business.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from timeline.graph.families import router_losses
from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef

MOE = frozenset({"moe"})
#: the token dispatchers that keep the router's bool ``[tokens, E]`` routing map past the layer's forward:
#: ``MoEAlltoAllTokenDispatcher.dispatch_preprocess`` (``self.routing_map``) and the flex dispatcher's managers
#: (``setup_metadata``); the allgather dispatcher drops its gathered map in ``dispatch_postprocess``
DISPATCHERS_KEEPING_MAP = ("alltoall", "flex")

#: (routing weights, top-k indices, permuted weights, permuted tokens)
Routed = tuple[TensorDef, TensorDef, TensorDef, TensorDef]
Router = Callable[[Builder, str, TensorDef, TensorDef, int, int], Routed]


def expert_rows(b: Builder) -> int:
    """Token rows one EP rank's experts receive (before the expert-TP all-gather)."""
    m, d, tr = b.model, b.dims, b.training
    k = m.num_experts_per_tok
    if b.table.moe_tokens == "paper":
        return d.t_full * k // d.ep
    tokens = d.t_sp
    rows = tokens * k
    if tr.routing == "skew":
        rows = math.ceil(rows * tr.routing_skew)
    if tr.capacity_factor > 0:
        cap_rows = m.n_routed_experts * math.ceil(tr.capacity_factor * tokens * k / m.n_routed_experts)
        rows = cap_rows if tr.pad_to_capacity else min(rows, cap_rows)
    return padded_rows(b, rows)


def padded_rows(b: Builder, rows: int) -> int:
    """``rows`` routed (token, expert) pairs with each expert's count padded to the FP8 alignment
    (``[training] moe_router_padding``), spread evenly: the alltoall dispatcher pads the routing map of each
    source rank per expert (``token_dispatcher.py: MoEAlltoAllTokenDispatcher.dispatch_preprocess`` →
    ``moe_utils.py: pad_routing_map``), so every one of the E experts gets ``ceil(rows / E / a)·a`` from each
    rank; the flex dispatcher pads what each of this rank's experts received (``_DeepepManager.
    _pad_routing_map``, HybridEP's ``pad_multiple``): ``ceil(rows / E_local / a)·a`` each (4e85d74ae9)."""
    a = b.training.moe_pad_multiple
    if not a or not b.table.megatron_moe:
        return rows
    experts = b.model.n_routed_experts
    if b.table.moe_dispatcher == "flex":
        experts //= b.dims.ep
    return experts * math.ceil(rows / experts / a) * a


def paper_router(b: Builder, p: str, src: TensorDef, logits: TensorDef, layer: int, experts: int) -> Routed:
    """The paper's router: every expert scored (sigmoid or softmax) in bf16, then top-k with int16 indices."""
    probs, idx = _score_then_topk(b, p, logits, layer, "bf16", "int16")
    return probs, idx, *_permute(b, p, src, probs, idx, layer, experts)


def hf_router(b: Builder, p: str, src: TensorDef, logits: TensorDef, layer: int, experts: int) -> Routed:
    """A Hugging Face router: the top-k of the logits then a softmax over them for a model with
    ``router_score = "topk_softmax"`` (GPT-OSS ``GptOssTopKRouter``), else every expert scored in fp32 first."""
    if b.table.model_code and b.model.router_score == "topk_softmax":
        probs, idx = _topk_then_softmax(b, p, logits, layer, "int64")
    else:
        probs, idx = _score_then_topk(b, p, logits, layer, "fp32", "int64")
    return probs, idx, *_permute(b, p, src, probs, idx, layer, experts)


def _topk_then_softmax(b: Builder, p: str, logits: TensorDef, layer: int,
                       idx_dtype: str) -> tuple[TensorDef, TensorDef]:
    """``torch.topk`` of the logits and a softmax over the k values in the logits' dtype."""
    m = b.model
    t, n, k = logits.shape[0], m.n_routed_experts, m.num_experts_per_tok
    idx = b.tensor(f"{p}.router.topk_idx", (t, k), idx_dtype)
    top = b.tensor(f"{p}.router.topk_logits", (t, k), logits.dtype)
    b.op(f"{p}.router.topk", "topk_logits", layer, {"x": logits}, {"y": top, "idx": idx}, flops=float(t * n),
         tags=MOE)
    probs = b.tensor(f"{p}.router.scores", (t, k), logits.dtype)  # the routing weights themselves
    b.op(f"{p}.router.score", "router_softmax", layer, {"x": top}, {"y": probs}, flops=4.0 * t * k, tags=MOE)
    return probs, idx


def _score_then_topk(b: Builder, p: str, logits: TensorDef, layer: int, score_dtype: str,
                     idx_dtype: str) -> tuple[TensorDef, TensorDef]:
    """Every expert scored first (sigmoid, or fp32 softmax for a model whose ``router_score`` is ``softmax``),
    then the top-k of the scores: (routing weights ``(t, k)``, indices ``(t, k)``)."""
    m, d = b.model, b.dims
    t, n, k = logits.shape[0], m.n_routed_experts, m.num_experts_per_tok
    idx = b.tensor(f"{p}.router.topk_idx", (t, k), idx_dtype)
    scores = b.tensor(f"{p}.router.scores", (t, n), score_dtype)
    softmax = b.table.model_code and m.router_score == "softmax"
    b.op(f"{p}.router.score", "router_softmax" if softmax else "router_score", layer, {"x": logits},
         {"y": scores}, extras={"scores": b.tensor(f"{p}.router.scores_saved", (t, n), "fp32")},
         flops=4.0 * t * n, tags=MOE)
    cast = b.table.model_code and m.router_weights_cast  # weights cast back to the logits dtype
    plain = cast and not m.norm_topk_prob  # renormalised top-k keeps its fp32 sum and raw weights
    probs = b.tensor(f"{p}.router.probs", (t, k), d.dtype if cast else "fp32")
    norm_extras = {"denominator": b.tensor(f"{p}.router.topk_denominator", (t,), "fp32"),
                   "raw_weights": b.tensor(f"{p}.router.topk_raw_weights", (t, k), "fp32")}
    b.op(f"{p}.router.topk", "topk_unnormalised" if plain else "topk", layer, {"x": scores},
         {"probs": probs, "idx": idx}, extras=norm_extras, flops=float(t * n), tags=MOE)
    return probs, idx


def _permute(b: Builder, p: str, src: TensorDef, probs: TensorDef, idx: TensorDef, layer: int,
             experts: int) -> tuple[TensorDef, TensorDef]:
    """The dispatch's permutation outside Megatron: (permuted weights, permuted tokens), with the index
    vectors and the per-expert offsets of a grouped GEMM as extras."""
    t, k, h = src.shape[0], b.model.num_experts_per_tok, src.shape[1]
    permuted = b.tensor(f"{p}.dispatch.permuted", (t * k, h))
    pprobs = b.tensor(f"{p}.dispatch.permuted_probs", (t * k,), probs.dtype)
    b.op(f"{p}.dispatch.permute", "permute", layer, {"x": src, "probs": probs, "_idx": idx},
         {"y": permuted, "probs": pprobs},
         extras={"sorted_idx": b.tensor(f"{p}.dispatch.sorted_idx", (t * k,), "int64"),
                 "src_idx": b.tensor(f"{p}.dispatch.src_idx", (t * k,), "int64"),
                 **({"expert_ids": b.tensor(f"{p}.dispatch.expert_ids", (t * k,), "int64")}
                    if b.model.expert_linear_bias else {}),
                 "offsets": b.tensor(f"{p}.dispatch.offsets", (experts,), "int32")}, tags=MOE)
    return pprobs, permuted


def megatron_router(b: Builder, p: str, src: TensorDef, logits: TensorDef, layer: int,
                    experts: int) -> Routed:
    """Megatron-Core's TopKRouter and the alltoall dispatcher's first permutation
    (megatron/core/transformer/moe/moe_utils.py, unfused as the config defaults have it).

    Scores and probabilities are in the logits' dtype (``moe_router_dtype`` unset). Sigmoid scoring
    (DeepSeek-V3, with its expert bias): ``sigmoid(logits.float())`` keeps its fp32 result,
    ``gather`` keeps the scores cast back and the int64 indices, the top-k normalisation keeps the
    gathered scores and their sum. Softmax scoring: ``topk`` on the logits keeps the indices and
    ``softmax(dtype=fp32)`` of the k values keeps its fp32 result. The probabilities are scattered
    into a dense ``[tokens, E]`` map; ``permute`` keeps the transposed probs and routing map
    (``masked_select``) and the int64 ``sorted_indices`` (``index_select``), which ``unpermute``'s
    ``scatter_add_`` reuses. The table's ``moe_router = "sinkhorn"`` scores by :func:`_sinkhorn`
    instead, its ``moe_dispatcher = "allgather"`` permutes by :func:`_allgather_permute`. Returns
    (probs, indices, permuted probs, permuted tokens)."""
    m = b.model
    t, n, k, h = src.shape[0], m.n_routed_experts, m.num_experts_per_tok, src.shape[1]
    dt = logits.dtype
    if b.table.moe_z_loss:
        router_losses.z_loss(b, p, logits, layer)
    sinkhorn = b.table.moe_router == "sinkhorn"
    probs, idx = _sinkhorn(b, p, logits, layer) if sinkhorn else _topk(b, p, logits, layer)
    if b.table.moe_aux_loss and not sinkhorn:
        router_losses.aux_loss(b, p, logits, layer)
    if b.table.moe_dispatcher == "allgather":
        return probs, idx, *_allgather_permute(b, p, src, probs, layer, experts)
    if b.table.moe_dispatcher == "flex":  # the flex dispatcher permutes after its dispatch (moe_flex)
        return probs, idx, probs, src
    out = padded_rows(b, t * k)  # the padded routing map's pairs (num_out_tokens)
    permuted = b.tensor(f"{p}.dispatch.permuted", (out, h))
    rule = "fused_permute" if b.table.moe_permute_fusion else "permute"
    extras = router_losses.permute_extras(b, f"{p}.dispatch", out, t, n, dt)
    if b.table.moe_probs_at_combine:  # before 2659630721 permute() moved the tokens alone; the combine reads probs
        extras = {k_: v for k_, v in extras.items() if k_ in ("sorted_idx", "row_id_map")}
        b.op(f"{p}.dispatch.permute", rule, layer, {"x": src, "_idx": idx}, {"y": permuted}, extras=extras, tags=MOE)
        return probs, idx, probs, permuted
    pprobs = b.tensor(f"{p}.dispatch.permuted_probs", (out,), dt)
    b.op(f"{p}.dispatch.permute", rule, layer, {"x": src, "probs": probs, "_idx": idx},
         {"y": permuted, "probs": pprobs}, extras=extras, tags=MOE)
    return probs, idx, pprobs, permuted


def _topk(b: Builder, p: str, logits: TensorDef, layer: int) -> tuple[TensorDef, TensorDef]:
    """Megatron-Core's ``topk_routing_with_score_function`` (unfused): (dense probs ``[t, E]``, indices)."""
    m = b.model
    t, n, k = logits.shape[0], m.n_routed_experts, m.num_experts_per_tok
    dt = logits.dtype
    if b.table.moe_router_fused:  # --moe-router-fusion: TE's fused top-k (rule "fused_topk")
        probs = b.tensor(f"{p}.router.probs", (t, n), dt)
        routing_map = b.tensor(f"{p}.router.routing_map", (t, n), "bool")
        b.op(f"{p}.router.topk", "fused_topk", layer, {"x": logits}, {"probs": probs, "idx": routing_map},
             extras={"intermediate": b.tensor(f"{p}.router.fused_intermediate", (t, n), dt)},
             flops=5.0 * t * n, tags=MOE)
        return probs, routing_map
    sigmoid = m.router_bias
    # Megatron-Core >= 0.18: the sigmoid path stays in fp32 until probs.type_as(logits)
    sdt = "fp32" if sigmoid and b.table.moe_router_fp32_topk else dt
    scores = b.tensor(f"{p}.router.scores", (t, n), sdt)
    saved = (t, n) if sigmoid else (t, k)
    b.op(f"{p}.router.score", "router_score", layer, {"x": logits}, {"y": scores},
         # sigmoid in fp32 with fp32 scores: its result is ``scores`` itself, which the gather keeps
         extras={"scores": b.tensor(f"{p}.router.scores_saved", saved, "fp32")} if not sigmoid or sdt != "fp32" else {},
         flops=4.0 * t * n, tags=MOE)
    probs = b.tensor(f"{p}.router.probs", (t, n), dt)
    idx = b.tensor(f"{p}.router.topk_idx", (t, k), "int64")
    extras = {}
    if sigmoid and k > 1:
        extras = {"denominator": b.tensor(f"{p}.router.topk_denominator", (t,), sdt),
                  "raw_weights": b.tensor(f"{p}.router.topk_raw_weights", (t, k), sdt)}
    outs = {"probs": probs, "idx": idx}
    if b.table.moe_dispatcher in DISPATCHERS_KEEPING_MAP and b.table.moe_mask_routing:
        # zeros_like(logits).int().scatter(1, top_indices, 1).bool(): read by nothing the sim models, but the
        # dispatcher keeps it (timeline.sim.expand.dispatcher_kept)
        outs["map"] = b.tensor(f"{p}.router.routing_map", (t, n), "bool")
    b.op(f"{p}.router.topk", "topk" if sigmoid else "topk_softmax", layer, {"x": scores},
         outs, extras=extras, flops=float(t * n), tags=MOE)
    return probs, idx


def _sinkhorn(b: Builder, p: str, logits: TensorDef, layer: int) -> tuple[TensorDef, TensorDef]:
    """Megatron-Core's ``TopKRouter.sinkhorn_load_balancing`` in training (MC transformer/moe/router.py):
    the fp32 ``sinkhorn`` and its top-k run under ``no_grad``; the activation of every expert's logit
    (sigmoid for top-1, else fp32 softmax cast back) times the bool top-k map gives the dense probs.
    Returns (probs ``[t, E]``, the bool routing map ``[t, E]``)."""
    m = b.model
    t, n, k = logits.shape[0], m.n_routed_experts, m.num_experts_per_tok
    dt = logits.dtype
    act = b.tensor(f"{p}.router.scores", (t, n), dt)
    if k == 1:
        b.op(f"{p}.router.score", "sinkhorn_sigmoid", layer, {"x": logits}, {"y": act}, flops=4.0 * t * n, tags=MOE)
    else:
        b.op(f"{p}.router.score", "router_score", layer, {"x": logits}, {"y": act},
             extras={"scores": b.tensor(f"{p}.router.scores_saved", (t, n), "fp32")}, flops=4.0 * t * n, tags=MOE)
    probs = b.tensor(f"{p}.router.probs", (t, n), dt)
    routing_map = b.tensor(f"{p}.router.routing_map", (t, n), "bool")
    b.op(f"{p}.router.topk", "sinkhorn_mask", layer, {"x": act}, {"probs": probs, "idx": routing_map},
         flops=float(t * n), tags=MOE)
    return probs, routing_map


def _allgather_permute(b: Builder, p: str, src: TensorDef, probs: TensorDef, layer: int,
                       experts: int) -> tuple[TensorDef, TensorDef]:
    """``MoEAllGatherTokenDispatcher`` (MC transformer/moe/token_dispatcher.py): ``token_dispatch``
    all-gathers the routing map, the probs ``[t·g, E]`` and the tokens over expert-TP × EP (``g``
    ranks; the tokens into the GlobalMemoryBuffer, a persistent workspace, so no tensor here), and
    ``dispatch_postprocess`` permutes the rows of the ``experts`` local experts out of them:
    (permuted probs, permuted tokens ``[expert_rows·etp, h]``). Before Megatron-LM 2659630721
    (``moe_probs_at_combine``) the probs stay gathered for ``token_unpermutation``: (gathered probs
    ``[t·etp·ep, E]``, permuted tokens)."""
    d, m = b.dims, b.model
    t, n, h = src.shape[0], m.n_routed_experts, src.shape[1]
    g = d.etp * d.ep
    gathered = probs
    if g > 1:
        gathered = b.tensor(f"{p}.dispatch.gathered_probs", (t * g, n), probs.dtype, comm=True)
        b.op(f"{p}.dispatch.all_gather", "comm", layer, {"x": probs, "tokens": src}, {"y": gathered},
             kind="collective", stream="ep", tags=MOE)
    rows = expert_rows(b) * d.etp
    permuted = b.tensor(f"{p}.dispatch.permuted", (rows, h))
    if b.table.moe_probs_at_combine:  # token_permutation@2659630721^: permute(hidden_states, local_map) alone
        only = {"row_id_map": router_losses.row_id_map(b, f"{p}.dispatch", t * g, experts)} \
            if b.table.moe_permute_fusion else {"sorted_idx": b.tensor(f"{p}.dispatch.sorted_idx", (rows,), "int64")}
        b.op(f"{p}.dispatch.permute", "allgather_permute", layer, {"x": src}, {"y": permuted},
             extras=only, tags=MOE)
        return gathered, permuted
    pprobs = b.tensor(f"{p}.dispatch.permuted_probs", (rows,), probs.dtype)
    extras = {"probs_t": b.tensor(f"{p}.dispatch.probs_t", (experts, t * g), probs.dtype),
              "routing_map_t": b.tensor(f"{p}.dispatch.routing_map_t", (experts, t * g), "bool")}
    if b.table.moe_permute_fusion:  # TE moe_permute (no probs): the int32 row-id map of all gathered rows
        extras["row_id_map"] = router_losses.row_id_map(b, f"{p}.dispatch", t * g, experts)
    else:
        extras["sorted_idx"] = b.tensor(f"{p}.dispatch.sorted_idx", (rows,), "int64")
    b.op(f"{p}.dispatch.permute", "allgather_permute", layer, {"x": src, "probs": gathered},
         {"y": permuted, "probs": pprobs}, extras=extras, tags=MOE)
    return pprobs, permuted


ROUTERS: dict[str, Router] = {"megatron": megatron_router, "paper": paper_router, "hf": hf_router}


def router(framework: str) -> Router:
    """The router of ``framework`` (a profile's name)."""
    return ROUTERS[framework]
