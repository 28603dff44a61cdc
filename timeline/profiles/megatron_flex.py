"""Saved-tensor rules of Megatron-Core's flex token dispatcher (``--moe-token-dispatcher-type flex``).

``MoEFlexTokenDispatcher`` (megatron/core/transformer/moe/token_dispatcher.py) moves tokens over the
expert-TP × EP group with DeepEP's fused kernels (``_DeepepManager``, megatron/core/transformer/moe/
fused_a2a.py ``FusedDispatch`` / ``FusedCombine``) or HybridEP's (``_HybridEPManager``, ``HybridEPDispatch`` /
``HybridEPCombine``). Both keep their communication buffers outside PyTorch's allocator (DeepEP's NVLink
buffer via ``shared_memory_allocator.malloc``, its RDMA buffer via ``nvshmem`` and its workspace via
``cudaMalloc``: csrc/deep_ep.cpp ``Buffer::Buffer``; HybridEP's NVLink buffers and the intra-domain
routing-map all-gather output likewise): what the rules below name are the ``torch::empty`` tensors of
their C++ entry points and Megatron's own tensors around them. Read at Megatron-LM f098fe84 (2026-04-16);
core_v0.14.0 (2025) has the same DeepEP path (``--moe-enable-deepep``, no ``pad_offsets``) and no HybridEP,
which came with 3df2009 (2025-11-18). The graph side is :mod:`timeline.graph.families.moe_flex`.
"""

from __future__ import annotations

from timeline.profiles.base import SaveRule, SaveRules

MCF = "NVIDIA/Megatron-LM@f098fe84:megatron/core/transformer/moe"
DEEPEP = "deepseek-ai/DeepEP@92fe2de:csrc/deep_ep.cpp"
HYBRIDEP = "deepseek-ai/DeepEP@1b8f467 (hybrid-ep):csrc/hybrid_ep"

#: the handle DeepEP's intranode dispatch returns and ``FusedDispatch.forward`` keeps in ``ctx`` until its
#: backward (``FusedCombine`` keeps the same handle)
DEEPEP_HANDLE = ("rank_prefix_matrix", "channel_prefix_matrix", "recv_channel_prefix_matrix", "recv_src_idx",
                 "send_head")
#: the internode (more than NUM_MAX_NVL_PEERS = 8 ranks) handle, less ``is_token_in_rank``
DEEPEP_HANDLE_RDMA = ("rdma_channel_prefix_matrix", "gbl_channel_prefix_matrix", "recv_rdma_channel_prefix_matrix",
                      "recv_rdma_rank_prefix_sum", "recv_gbl_channel_prefix_matrix", "recv_gbl_rank_prefix_sum",
                      "recv_src_meta", "send_rdma_head", "send_nvl_head")
#: the non-fused ``dispatch_with_permute`` handle HybridEPDispatch keeps in ``ctx`` (device tensors)
HYBRIDEP_HANDLE = ("sparse_to_dense_map", "rdma_to_attn_map", "attn_to_rdma_map", "num_dispatched_tokens",
                   "local_expert_routing_map", "row_id_map", "tokens_per_expert", "overflow_flag")

RULES: dict[str, SaveRule] = {
    "flex_topk": SaveRule(saves=("out:idx",),
                          source=f"{MCF}/token_dispatcher.py: _DeepepManager.setup_metadata — torch.topk(probs, "
                                 "tp·topk) of the [tokens, tp·E] probs saves its int64 indices (TopkBackward0)"),
    "deepep_layout": SaveRule(source=f"{DEEPEP}: Buffer::get_dispatch_layout — torch::empty num_tokens_per_rank "
                                     "[ranks] int32, num_tokens_per_rdma_rank [rdma ranks] int32 (internode), "
                                     "num_tokens_per_expert [experts] int32, is_token_in_rank [tokens, ranks] bool; "
                                     "the op keeps nothing (the dispatch keeps is_token_in_rank in its handle)"),
    "deepep_dispatch": SaveRule(
        saves=("in:probs", "in:in_rank", *(f"extra:{k}" for k in DEEPEP_HANDLE + DEEPEP_HANDLE_RDMA)),
        source=f"{MCF}/fused_a2a.py: FusedDispatch.forward keeps the handle in ctx (ctx.handle) until its backward; "
               f"{DEEPEP}: Buffer::intranode_dispatch allocates recv_x [recv, h], recv_src_idx [recv] int32, "
               "recv_topk_idx [recv, tp·topk] int64, recv_topk_weights [recv, tp·topk] fp32, rank_prefix_matrix "
               "[ranks, ranks], channel_prefix_matrix and recv_channel_prefix_matrix [ranks, channels], send_head "
               "[tokens, ranks] int32 (handle = prefix matrices, recv_src_idx, is_token_in_rank, send_head); "
               "Buffer::internode_dispatch's handle: is_token_in_rank, rdma/gbl channel prefix matrices, rank "
               "prefix sums, recv_src_meta [recv, 8] uint8, send_rdma_head [tokens, rdma ranks], send_nvl_head "
               "[rdma recv, 8] int32; the fp32 top-k weights stay referenced by _DeepepManager.token_probs "
               "(until the layer's next forward: modelled until this backward)"),
    "deepep_multihot": SaveRule(
        saves=("extra:mask", "extra:row_indices", "extra:col_indices"),
        source=f"{MCF}/token_dispatcher.py: _DeepepManager._indices_to_multihot — torch.zeros [recv, E_local] "
               "int64 map and fp32 probs; probs[mask] (IndexBackward0 keeps the bool mask [recv, tp·topk]); "
               "multihot_probs[row_indices, valid_indices] = … (IndexPutBackward0 keeps both int64 [pairs] "
               "index vectors); .bool() makes the map returned"),
    "deepep_combine": SaveRule(
        backward_scratch=("extra:recv_src_idx", "extra:recv_channel_prefix_matrix", "extra:send_head"),
        source=f"{MCF}/fused_a2a.py: FusedCombine.forward — Buffer::intranode_combine returns torch::empty "
               "recv_x [tokens, h]; keeps only the handle; its backward is a cached Buffer::intranode_dispatch, "
               f"which allocates recv_x [recv, h] and once more recv_src_idx, recv_channel_prefix_matrix and "
               f"send_head ({DEEPEP}); _DeepepManager.combine drops dispatched_indices / dispatched_probs"),
    "hybridep_preprocess": SaveRule(
        source=f"{HYBRIDEP}/executor/executor.cu: Executor::metadata_preprocess_core — torch::empty "
               "sparse_to_dense_map [tokens·nodes, ranks per node] int32, rdma_to_attn_map [ceil16(tokens), nodes] "
               "bool, attn_to_rdma_map [tokens, nodes − 1] bool, num_dispatched_tokens_tensor [1] int32 (pinned "
               "host unless non_blocking), local_expert_routing_map [tokens·ranks, E_local] bool, overflow_flag "
               "[1] int32; extension/permute.cu: permute_preprocessing — row_id_map [tokens·ranks + pad, E_local] "
               "int32, tokens_per_expert [E_local] int32, a new overflow_flag, workspaces [ceil(tokens·ranks/256), "
               "E_local] and [ceil(that/256), E_local] int32 freed on return; padded_tokens_per_expert [E_local] "
               "int64 (on the device only when non_blocking: Megatron's drop-and-pad mode, which ignores it); "
               "the op keeps nothing"),
    "hybridep_dispatch": SaveRule(
        saves=("in:probs", *(f"in:{k}" for k in HYBRIDEP_HANDLE)),
        source=f"{MCF}/fused_a2a.py: HybridEPDispatch.forward keeps the handle (ctx.handle) until its backward; "
               f"{HYBRIDEP}/hybrid_ep.cu: HybridEPBuffer::dispatch_with_permute allocates local_expert_output_token "
               "[permuted, h] and local_expert_output_prob [permuted] fp32; the fp32 [tokens, tp·E] probs stay "
               "referenced by _HybridEPManager.token_probs (until the layer's next forward: modelled until this "
               "backward)"),
    "hybridep_combine": SaveRule(
        source=f"{MCF}/fused_a2a.py: HybridEPCombine.forward — {HYBRIDEP}/hybrid_ep.cu combine_with_unpermute "
               "returns torch::empty combined_tokens [tokens, h]; keeps the handle only; its backward "
               "(dispatch_with_permute on the cached handle) allocates [permuted, h]"),
}


def extend(rules: SaveRules) -> SaveRules:
    """``rules`` (the megatron rules) with the flex dispatcher's rules added; no rule is replaced."""
    return rules.extended(RULES)
