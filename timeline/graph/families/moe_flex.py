"""Megatron-Core's flex token dispatcher: DeepEP's or HybridEP's fused dispatch and combine.

``MoEFlexTokenDispatcher`` (MC transformer/moe/token_dispatcher.py at Megatron-LM f098fe84) runs one
communication group over expert-TP × EP (``W = etp·ep`` ranks, ``tp_ep_group``) and replicates the routing
over expert-TP (``_initialize_metadata``: ``[tokens, ep, 1, E_local].expand(…, etp, …)`` — a view for
``etp = 1``, a ``.contiguous()`` copy of the probs and the bool map for ``etp > 1``). The rules of what each
op keeps are :mod:`timeline.profiles.megatron_flex`'s; the communication buffers themselves are outside
PyTorch's allocator and are not tensors here.

DeepEP (``[framework] moe_flex_backend = "deepep"``): ``setup_metadata`` takes ``torch.topk(probs, etp·k)``
(fp32 copy of the weights where the probs are not fp32); ``get_dispatch_layout`` and the dispatch receive
``num_recv`` distinct tokens — DeepEP sends a token once per destination rank, however many of its experts
live there — then ``_indices_to_multihot`` and ``permute`` expand them to the ``rows`` (token, local expert)
pairs the grouped GEMM reads; ``unpermute`` sums them back to ``num_recv`` rows and the combine returns the
rank's own ``tokens`` rows.

``num_recv`` (:func:`received_tokens`): each of the ``W`` ranks sends its ``t`` tokens; a token reaches a
given rank when at least one of its ``k`` distinct experts is among that rank's ``E_local = E/ep``. Under
``routing = "balanced"`` every token's ``k`` experts are taken as a uniformly random ``k``-subset of the ``E``
experts (each expert then gets ``t·k/E`` of each rank's tokens on average, the balanced load
:func:`~timeline.graph.families.router.expert_rows` assumes), so the hypergeometric probability of missing
all ``E_local`` experts is ``C(E − E_local, k) / C(E, k)`` and ``num_recv = ⌈W·t·(1 − C(E − E_local, k)/C(E,
k))⌉`` — rounded up, the number of rows a busy rank must hold. ``routing = "skew"`` and expert capacity scale
it as they scale the rows (``× expert_rows / (t·k)``, before the ceiling), capped at the ``W·t`` tokens that
exist and at the ``rows`` pairs (each received token carries at least one). Across nodes (more than
NUM_MAX_NVL_PEERS = 8 ranks) the RDMA rank of a node receives, by the same rule, the distinct tokens of the
``W/8`` ranks that share its local index bound for any of the node's experts.

HybridEP (``"hybridep"``): ``dispatch_with_permute`` returns the ``rows`` permuted rows and their fp32 probs
directly; its handle keeps the per-token routing metadata (over all ``t·W`` group tokens) until backward.
The NVLink domain (``[framework] nvlink_domain``; HybridEP's ``detect_accessible_ranks`` or
``NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN``) sets its ``ranks per node = min(W, domain)`` and ``nodes``;
with more than one node the routing map is all-gathered into a ``torch::empty`` ``[t·W, etp·E]`` bool tensor
(inside one domain into HybridEP's own buffer).
"""

from __future__ import annotations

import math
from fractions import Fraction

from timeline.graph.families.router import MOE, expert_rows
from timeline.graph.families.router_losses import permute_extras
from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef

#: deepseek-ai/DeepEP@92fe2de csrc/kernels/configs.cuh: NUM_MAX_NVL_PEERS — ranks one NVLink domain joins
#: before DeepEP's normal kernels go internode (Buffer: ``num_rdma_ranks = max(1, num_ranks / 8)``)
NVL_PEERS = 8
#: Megatron-LM f098fe84 transformer_config.py: moe_deepep_num_sms = 20 (Buffer.set_num_sms); DeepEP's
#: intranode/internode dispatch: ``num_channels = config.num_sms / 2``
DEEPEP_CHANNELS = 20 // 2
#: deepseek-ai/DeepEP@92fe2de csrc/kernels/internode.cu: sizeof(SourceMeta) = two ints
SOURCE_META_BYTES = 8
#: DeepEP@1b8f467 hybrid-ep csrc/hybrid_ep/extension/permute.cu: permute_preprocessing block_size
HYBRIDEP_BLOCK = 256


def received_tokens(tokens: int, experts: int, on_rank: int, k: int, scale: Fraction = Fraction(1)) -> int:
    """Distinct tokens one destination receives of ``tokens`` sent, when each picks a uniformly random
    ``k``-subset of ``experts`` and the destination holds ``on_rank`` of them, scaled by ``scale``
    (skew, capacity), rounded up and capped at ``tokens``."""
    miss = Fraction(math.comb(experts - on_rank, k), math.comb(experts, k))
    return min(tokens, math.ceil(tokens * (1 - miss) * scale))


def _shape(b: Builder, experts: int) -> tuple[int, int, int, int]:
    """(W, t, rows, num_recv) of this rank: group size, own tokens, received (token, expert) pairs and
    distinct received tokens (DeepEP)."""
    m, d = b.model, b.dims
    w, t, k = d.etp * d.ep, d.t_sp, m.num_experts_per_tok
    rows = expert_rows(b) * d.etp
    scale = Fraction(expert_rows(b), t * k)
    return w, t, rows, min(rows, received_tokens(w * t, m.n_routed_experts, experts, k, scale))


#: (permuted probs, permuted tokens, what the combine reads or holds: its slots by name)
Dispatched = tuple[TensorDef, TensorDef, dict[str, TensorDef]]


def dispatch(b: Builder, p: str, src: TensorDef, probs: TensorDef, layer: int, experts: int) -> Dispatched:
    """The flex dispatch of ``src`` (``[t, h]``) routed by the dense ``probs`` (``[t, E]``) to this rank's
    ``experts`` local experts: (permuted fp32 probs ``[rows]``, permuted tokens ``[rows, h]``, the tensors
    the combine reads or the manager holds until it)."""
    d, m = b.dims, b.model
    if d.etp * d.ep < 2:
        raise ValueError("the flex dispatcher needs expert-TP × EP > 1 (MoEFlexTokenDispatcher asserts it)")
    dense = probs
    if d.etp > 1:  # _initialize_metadata: expand over expert-TP, .contiguous() (the bool map's copy dies at once)
        dense = b.tensor(f"{p}.dispatch.expanded_probs", (probs.shape[0], d.etp * m.n_routed_experts), probs.dtype)
        emap = b.tensor(f"{p}.dispatch.expanded_map", dense.shape, "bool")
        b.op(f"{p}.dispatch.expand", "copy", layer, {"x": probs}, {"y": dense, "map": emap}, tags=MOE)
    if b.table.moe_flex_backend == "hybridep":
        return _hybridep_dispatch(b, p, src, dense, layer, experts)
    return _deepep_dispatch(b, p, src, dense, layer, experts)


def _fp32(b: Builder, p: str, x: TensorDef, layer: int) -> TensorDef:
    """``token_probs.float()`` where the probs are not fp32 already (both managers' ``dispatch``)."""
    if x.dtype == "fp32":
        return x
    y = b.tensor(f"{x.name}_fp32", x.shape, "fp32")
    b.op(f"{p}.dispatch.probs_fp32", "copy", layer, {"x": x}, {"y": y}, tags=MOE)
    return y


def _deepep_dispatch(b: Builder, p: str, src: TensorDef, dense: TensorDef, layer: int, experts: int) -> Dispatched:
    d, m, h = b.dims, b.model, b.model.routed_width  # the dispatcher's hidden_dim (token_dispatcher.py)
    w, t, rows, n = _shape(b, experts)
    kk, ee, c = d.etp * m.num_experts_per_tok, d.etp * m.n_routed_experts, DEEPEP_CHANNELS
    q = f"{p}.dispatch"
    top = b.tensor(f"{q}.token_probs", (t, kk), dense.dtype)
    idx = b.tensor(f"{q}.token_indices", (t, kk), "int64")
    b.op(f"{q}.topk", "flex_topk", layer, {"x": dense}, {"probs": top, "idx": idx}, flops=float(t * ee), tags=MOE)
    top = _fp32(b, p, top, layer)
    rdma = w // NVL_PEERS if w > NVL_PEERS else 0
    layout = {"per_rank": b.tensor(f"{q}.num_tokens_per_rank", (w,), "int32"),
              "per_expert": b.tensor(f"{q}.num_tokens_per_expert", (ee,), "int32"),
              "in_rank": b.tensor(f"{q}.is_token_in_rank", (t, w), "bool")}
    if rdma:
        layout["per_rdma"] = b.tensor(f"{q}.num_tokens_per_rdma_rank", (rdma,), "int32")
    b.op(f"{q}.layout", "deepep_layout", layer, {"idx": idx}, layout, tags=MOE)
    recv = b.tensor(f"{q}.recv_x", (n, h), comm=True)
    ridx = b.tensor(f"{q}.recv_topk_idx", (n, kk), "int64")
    rprobs = b.tensor(f"{q}.recv_topk_weights", (n, kk), "fp32")
    if rdma:  # the node's RDMA rank: distinct tokens of the ``rdma`` same-local-index ranks bound for the node
        node_experts = min(m.n_routed_experts, experts * NVL_PEERS // d.etp)
        scale = Fraction(expert_rows(b), t * m.num_experts_per_tok)
        n_rdma = received_tokens(rdma * t, m.n_routed_experts, node_experts, m.num_experts_per_tok, scale)
        handle = {"rdma_channel_prefix_matrix": (rdma, c), "gbl_channel_prefix_matrix": (w, c),
                  "recv_rdma_channel_prefix_matrix": (rdma, c), "recv_rdma_rank_prefix_sum": (rdma,),
                  "recv_gbl_channel_prefix_matrix": (w, c), "recv_gbl_rank_prefix_sum": (w,),
                  "send_rdma_head": (t, rdma), "send_nvl_head": (n_rdma, NVL_PEERS)}
        extras = {k: b.tensor(f"{q}.{k}", s, "int32") for k, s in handle.items()}
        extras["recv_src_meta"] = b.tensor(f"{q}.recv_src_meta", (n, SOURCE_META_BYTES), "uint8")
    else:
        handle = {"rank_prefix_matrix": (w, w), "channel_prefix_matrix": (w, c),
                  "recv_channel_prefix_matrix": (w, c), "recv_src_idx": (n,), "send_head": (t, w)}
        extras = {k: b.tensor(f"{q}.{k}", s, "int32") for k, s in handle.items()}
    b.op(f"{q}.deepep", "deepep_dispatch", layer, {"x": src, "probs": top, "idx": idx, **layout},
         {"y": recv, "idx": ridx, "probs": rprobs}, extras=extras, kind="collective", stream="ep", tags=MOE)
    # _indices_to_multihot: int64 zeros map → .bool(); fp32 multihot probs
    wide = b.tensor(f"{q}.multihot_map_int64", (n, experts), "int64")
    mprobs = b.tensor(f"{q}.multihot_probs", (n, experts), "fp32")
    b.op(f"{q}.multihot", "deepep_multihot", layer, {"idx": ridx, "probs": rprobs}, {"map": wide, "probs": mprobs},
         extras={"mask": b.tensor(f"{q}.multihot_mask", (n, kk), "bool"),
                 "row_indices": b.tensor(f"{q}.multihot_rows", (rows,), "int64"),
                 "col_indices": b.tensor(f"{q}.multihot_cols", (rows,), "int64")}, tags=MOE)
    rmap = b.tensor(f"{q}.dispatched_routing_map", (n, experts), "bool")
    b.op(f"{q}.multihot_bool", "copy", layer, {"x": wide}, {"y": rmap}, tags=MOE)
    permuted = b.tensor(f"{q}.received", (rows, h))
    pprobs = b.tensor(f"{q}.received_probs", (rows,), "fp32")
    pext = permute_extras(b, q, rows, n, experts, "fp32")
    b.op(f"{q}.permute", "fused_permute" if b.table.moe_permute_fusion else "permute", layer,
         {"x": recv, "probs": mprobs, "_idx": rmap}, {"y": permuted, "probs": pprobs}, extras=pext, tags=MOE)
    # _DeepepManager keeps dispatched_indices and the multihot probs until combine() drops them
    return _fp64(b, q, pprobs, layer), permuted, {"_idx": rmap, "_held_idx": ridx, "_held_probs": mprobs}


def _fp64(b: Builder, q: str, pprobs: TensorDef, layer: int) -> TensorDef:
    """``permuted_probs.to(torch.float64)`` under ``--moe-router-dtype fp64`` (get_permuted_hidden_states…)."""
    if b.table.moe_router_dtype != "fp64":
        return pprobs
    y = b.tensor(f"{pprobs.name}_fp64", pprobs.shape, "fp64")
    b.op(f"{q}.probs_fp64", "copy", layer, {"x": pprobs}, {"y": y}, tags=MOE)
    return y


def hybridep_nodes(b: Builder) -> tuple[int, int]:
    """HybridEP's (ranks per node, nodes) for the expert-TP × EP group (HybridEPBuffer.__init__)."""
    w = b.dims.etp * b.dims.ep
    per = min(w, b.table.moe_nvlink_domain)
    return per, max(1, w // per)


def _hybridep_dispatch(b: Builder, p: str, src: TensorDef, dense: TensorDef, layer: int, experts: int) -> Dispatched:
    h, tr = b.model.routed_width, b.training
    w, t, rows, _ = _shape(b, experts)
    if tr.pad_to_capacity:  # _HybridEPManager.setup_metadata: get_capacity(t·k, etp·E) · W · E_local rows
        ee = b.dims.etp * b.model.n_routed_experts
        rows = math.ceil(tr.capacity_factor * t * b.model.num_experts_per_tok / ee) * w * experts
    per, nodes = hybridep_nodes(b)
    q = f"{p}.dispatch"
    probs = _fp32(b, p, dense, layer)
    inputs: dict[str, TensorDef] = {"x": src, "probs": probs}
    if nodes > 1:  # Executor::allgather_routing_map: NCCL all_gather_into_tensor into a torch::empty map
        gmap = b.tensor(f"{q}.global_routing_map", (t * w, dense.shape[1]), "bool", comm=True)
        b.op(f"{q}.allgather_routing_map", "comm", layer, {"x": dense}, {"y": gmap}, kind="collective",
             stream="ep", tags=MOE)
        inputs["map"] = gmap
    pad = 0  # Megatron passes pad_multiple only under FP8/FP4 (not modelled)
    shapes: dict[str, tuple[tuple[int, ...], str]] = {
        "sparse_to_dense_map": ((t * nodes, per), "int32"),
        "rdma_to_attn_map": ((math.ceil(t / 16) * 16, nodes), "bool"),
        "attn_to_rdma_map": ((t, nodes - 1), "bool"),
        "local_expert_routing_map": ((t * w, experts), "bool"),
        "row_id_map": ((t * w + pad, experts), "int32"),
        "tokens_per_expert": ((experts,), "int32"),
        "overflow_flag": ((1,), "int32")}
    if tr.pad_to_capacity:  # non_blocking (num_permuted_tokens known): the count stays on the device
        shapes["num_dispatched_tokens"] = ((1,), "int32")
    handle = {k: b.tensor(f"{q}.{k}", s, dt) for k, (s, dt) in shapes.items() if math.prod(s) > 0}
    ws1 = math.ceil(t * w / HYBRIDEP_BLOCK)
    scratch = {"first_overflow_flag": b.tensor(f"{q}.first_overflow_flag", (1,), "int32"),
               "workspace1": b.tensor(f"{q}.permute_workspace1", (ws1, experts), "int32"),
               "workspace2": b.tensor(f"{q}.permute_workspace2", (math.ceil(ws1 / HYBRIDEP_BLOCK), experts), "int32")}
    if tr.pad_to_capacity:  # non_blocking: padded_tokens_per_expert on the device (Megatron keeps its own)
        scratch["padded_tokens_per_expert"] = b.tensor(f"{q}.padded_tokens_per_expert", (experts,), "int64")
    b.op(f"{q}.preprocess", "hybridep_preprocess", layer, {"_map": inputs.get("map", dense)}, {**handle, **scratch},
         tags=MOE)
    tokens = b.tensor(f"{q}.received", (rows, h), comm=True)
    pprobs = b.tensor(f"{q}.received_probs", (rows,), "fp32", comm=True)
    b.op(f"{q}.hybridep", "hybridep_dispatch", layer, {**inputs, **handle}, {"y": tokens, "probs": pprobs},
         kind="collective", stream="ep", tags=MOE)
    return pprobs, tokens, {}


def combine(b: Builder, p: str, out: TensorDef, held: dict[str, TensorDef], layer: int, experts: int,
            unpermute: str) -> TensorDef:
    """The flex combine of the experts' ``[rows, h]`` output back to this rank's ``[t, h]`` tokens; ``held``
    is what :func:`dispatch` returned, ``unpermute`` the MoE block's unpermute rule (DeepEP)."""
    h, q = b.model.routed_width, f"{p}.combine"
    w, t, _, n = _shape(b, experts)
    routed = b.tensor(f"{q}.out", (t, h), comm=True)
    if b.table.moe_flex_backend == "hybridep":
        b.op(f"{q}.hybridep", "hybridep_combine", layer, {"x": out}, {"y": routed}, kind="collective",
             stream="ep", tags=MOE)
        return routed
    unperm = b.tensor(f"{q}.unpermuted", (n, h))
    b.op(f"{q}.unpermute", unpermute, layer, {"x": out, "_idx": held["_idx"]}, {"y": unperm},
         flops=float(out.shape[0] * h), tags=MOE)
    c = DEEPEP_CHANNELS
    scratch = {"recv_src_idx": b.tensor(f"{q}.recv_src_idx", (n,), "int32"),
               "recv_channel_prefix_matrix": b.tensor(f"{q}.recv_channel_prefix_matrix", (w, c), "int32"),
               "send_head": b.tensor(f"{q}.send_head", (t, w), "int32")} if w <= NVL_PEERS else {}
    b.op(f"{q}.deepep", "deepep_combine", layer,
         {"x": unperm, "_held_idx": held["_held_idx"], "_held_probs": held["_held_probs"]}, {"y": routed},
         extras=scratch, kind="collective", stream="ep", tags=MOE)
    return routed
