"""``megatron`` profile, the flex token dispatcher (``moe_token_dispatcher = "flex"``): DeepEP's and
HybridEP's PyTorch-allocated tensors at their exact shapes and lifetimes, on the shipped DeepSeek-V3
layout (t = 2048 SP tokens per rank, h = 7168, E = 256, top-8, ep = 8: W = 8 ranks, 32 local experts)."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
from sources import template_of
from test_activations_megatron_moe import MEGATRON, SHIPPED, P, ops
from test_activations_megatron_moe import saved_bytes as saved

from timeline.graph.families.moe_flex import received_tokens
from timeline.io.runfile import load_run

FLEX = 'framework.moe_token_dispatcher="flex"'
HYBRID = 'framework.moe_flex_backend="hybridep"'
T, H, E, K, W = 2048, 7168, 256, 8, 8
LOCAL = E // W
ROWS = T * K  # balanced: every rank's local experts receive t·k (token, expert) pairs
#: distinct tokens a rank receives: ⌈W·t·(1 − C(224, 8)/C(256, 8))⌉ (hypergeometric miss of all 32 experts)
RECV = 10844


def test_received_tokens_is_the_expected_distinct_count():
    # by enumeration: every k-subset of 6 experts equally likely, the destination holds experts {0, 1}
    subsets = list(itertools.combinations(range(6), 2))
    hit = Fraction(sum(1 for s in subsets if {0, 1} & set(s)), len(subsets))  # 9/15
    assert received_tokens(10, 6, 2, 2) == math.ceil(10 * hit) == 6
    assert received_tokens(4, 4, 1, 1) == 1  # 4 · 1/4 exactly: no rounding up
    assert received_tokens(10, 4, 1, 1) == 3  # 2.5 → 3 (ceil)
    assert received_tokens(10, 8, 4, 5) == 10  # 5 of 8 experts always hit one of 4: every token
    assert received_tokens(10, 6, 2, 2, Fraction(3, 2)) == 9  # 6 · 1.5 = 9
    assert received_tokens(10, 6, 2, 2, Fraction(2)) == 10  # capped at the tokens sent
    miss = Fraction(math.comb(E - LOCAL, K), math.comb(E, K))
    assert received_tokens(W * T, E, LOCAL, K) == math.ceil(W * T * (1 - miss)) == RECV


def test_deepep_dispatch_keeps_its_handle_until_backward():
    got = saved(FLEX)
    d = f"{P}.dispatch"
    assert got[f"{d}.token_indices"] == ((T, K), "int64", 8 * T * K)  # torch.topk's indices
    assert got[f"{d}.token_probs_fp32"] == ((T, K), "fp32", 4 * T * K)  # token_probs.float(), the manager's
    assert got[f"{d}.is_token_in_rank"] == ((T, W), "bool", T * W)
    assert got[f"{d}.rank_prefix_matrix"] == ((W, W), "int32", 4 * W * W)
    assert got[f"{d}.channel_prefix_matrix"] == ((W, 10), "int32", 4 * W * 10)  # 20 SMs → 10 channels
    assert got[f"{d}.recv_channel_prefix_matrix"] == ((W, 10), "int32", 4 * W * 10)
    assert got[f"{d}.recv_src_idx"] == ((RECV,), "int32", 4 * RECV)
    assert got[f"{d}.send_head"] == ((T, W), "int32", 4 * T * W)
    # _indices_to_multihot: the bool mask and both index vectors; permute: sorted indices, transposed probs/map
    assert got[f"{d}.multihot_mask"] == ((RECV, K), "bool", RECV * K)
    assert got[f"{d}.multihot_rows"] == got[f"{d}.multihot_cols"] == ((ROWS,), "int64", 8 * ROWS)
    assert got[f"{d}.sorted_idx"] == ((ROWS,), "int64", 8 * ROWS)
    assert got[f"{d}.probs_t"] == ((LOCAL, RECV), "fp32", 4 * LOCAL * RECV)
    assert got[f"{d}.routing_map_t"] == ((LOCAL, RECV), "bool", LOCAL * RECV)
    assert got[f"{d}.received"] == ((ROWS, H), "bf16", 2 * ROWS * H)  # the grouped GEMM's input
    # recv_x itself is not kept (index_select keeps only its index); no all-to-all copies, no chunk sort
    assert not {f"{d}.recv_x", f"{d}.all_to_all.out", f"{d}.permuted", f"{d}.recv_topk_idx"} & set(got)


def test_deepep_ops_shapes_and_frees():
    o = ops(FLEX)
    assert f"{P}.dispatch.all_to_all" not in o and f"{P}.dispatch.sort_chunks" not in o
    dep = o[f"{P}.dispatch.deepep"].outputs
    assert (dep["y"].shape, dep["idx"].shape, dep["probs"].shape) == ((RECV, H), (RECV, K), (RECV, K))
    assert (dep["idx"].dtype, dep["probs"].dtype) == ("int64", "fp32")
    assert o[f"{P}.dispatch.multihot"].outputs["map"].shape == (RECV, LOCAL)  # int64 zeros, then .bool()
    assert o[f"{P}.combine.unpermute"].outputs["y"].shape == (RECV, H)
    assert o[f"{P}.combine.deepep"].outputs["y"].shape == (T, H)
    tpl = template_of(load_run(SHIPPED, [*MEGATRON, FLEX]), 1)
    freed = {s: op.name for op in tpl.forward for s in op.frees}
    # the manager drops dispatched_indices and the multihot probs in combine(); the int64 map dies at .bool()
    assert freed[f"{P}.dispatch.recv_topk_idx"] == freed[f"{P}.dispatch.multihot_probs"] == f"{P}.combine.deepep"
    assert freed[f"{P}.dispatch.multihot_map_int64"] == f"{P}.dispatch.multihot_bool"
    assert freed[f"{P}.dispatch.num_tokens_per_expert"] == f"{P}.dispatch.deepep"
    # the combine's backward (a cached dispatch) allocates recv rows and, once more, three handle tensors
    bwd = {t.name: t for op in tpl.backward_i if op.name.startswith(f"{P}.combine.deepep") for t in op.allocs}
    assert bwd[f"{P}.combine.deepep.backward_scratch.send_head"].size_bytes == 4 * T * W
    assert bwd[f"{P}.combine.deepep.backward_scratch.recv_src_idx"].size_bytes == 4 * RECV
    assert bwd[f"grad:{P}.combine.unpermuted"].shape == (RECV, H)


def test_deepep_across_nodes_and_expert_tp():
    # etp = 2: W = 16 > 8 NVLink peers → internode handle; routing replicated over expert-TP (expanded copy)
    o, got = ops(FLEX, "parallel.etp=2"), saved(FLEX, "parallel.etp=2")
    w, kk, rows = 16, 2 * K, 2 * ROWS
    recv = received_tokens(w * T, E, LOCAL, K)
    assert o[f"{P}.dispatch.expand"].outputs["y"].shape == (T, 2 * E)
    assert o[f"{P}.dispatch.deepep"].outputs["y"].shape == (recv, H)
    d = f"{P}.dispatch"
    assert got[f"{d}.recv_src_meta"] == ((recv, 8), "uint8", 8 * recv)
    assert got[f"{d}.send_rdma_head"] == ((T, 2), "int32", 8 * T)
    n_rdma = received_tokens(2 * T, E, LOCAL * 8 // 2, K)  # a node's 8 ranks hold 4 EP ranks' experts
    assert got[f"{d}.send_nvl_head"] == ((n_rdma, 8), "int32", 32 * n_rdma)
    assert got[f"{d}.token_indices"] == ((T, kk), "int64", 8 * T * kk)
    assert got[f"{d}.received"][0] == (rows, H)
    assert f"{d}.send_head" not in got and f"{d}.rank_prefix_matrix" not in got


def test_skewed_routing_scales_the_received_tokens():
    o = ops(FLEX, 'training.routing="skew"', "training.routing_skew=1.5")
    rows = math.ceil(ROWS * 1.5)
    miss = Fraction(math.comb(E - LOCAL, K), math.comb(E, K))
    want = math.ceil(W * T * (1 - miss) * Fraction(rows, ROWS))
    assert o[f"{P}.dispatch.deepep"].outputs["y"].shape == (want, H)
    assert o[f"{P}.dispatch.permute"].outputs["y"].shape == (rows, H)


def test_hybridep_keeps_its_handle_and_returns_permuted_rows():
    got, o = saved(FLEX, HYBRID), ops(FLEX, HYBRID)
    d = f"{P}.dispatch"
    assert got[f"{d}.local_expert_routing_map"] == ((T * W, LOCAL), "bool", T * W * LOCAL)
    assert got[f"{d}.row_id_map"] == ((T * W, LOCAL), "int32", 4 * T * W * LOCAL)
    assert got[f"{d}.sparse_to_dense_map"] == ((T, W), "int32", 4 * T * W)  # one node of 8 ranks
    assert got[f"{d}.rdma_to_attn_map"] == ((T, 1), "bool", T)  # ⌈t/16⌉·16 = t
    assert got[f"{d}.tokens_per_expert"] == ((LOCAL,), "int32", 4 * LOCAL)
    assert got[f"{d}.overflow_flag"] == ((1,), "int32", 4)
    assert got[f"{P}.router.probs_fp32"] == ((T, E), "fp32", 4 * T * E)  # the manager's fp32 dense probs
    assert got[f"{d}.received"] == ((ROWS, H), "bf16", 2 * ROWS * H)
    assert f"{d}.attn_to_rdma_map" not in got  # [t, 0]: no allocation inside one node
    assert not {k for k in got if "sorted_idx" in k or "multihot" in k or "recv_" in k}
    assert o[f"{P}.dispatch.hybridep"].outputs["probs"].shape == (ROWS,)
    assert o[f"{P}.combine.hybridep"].outputs["y"].shape == (T, H)
    assert o[f"{P}.dispatch.preprocess"].outputs["workspace1"].shape == (T * W // 256, LOCAL)


def test_hybridep_across_nvlink_domains_gathers_the_routing_map():
    got, o = saved(FLEX, HYBRID, "framework.nvlink_domain=4"), ops(FLEX, HYBRID, "framework.nvlink_domain=4")
    d = f"{P}.dispatch"
    assert o[f"{d}.allgather_routing_map"].outputs["y"].shape == (T * W, E)  # torch::empty, NCCL all-gather
    assert f"{d}.global_routing_map" not in got
    assert got[f"{d}.sparse_to_dense_map"] == ((2 * T, 4), "int32", 4 * 2 * T * 4)
    assert got[f"{d}.attn_to_rdma_map"] == ((T, 1), "bool", T)


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
def test_flex_keys_leave_the_other_dispatchers_alone(dispatcher: str):
    base = [f'framework.moe_token_dispatcher="{dispatcher}"']
    assert saved(*base) == saved(*base, HYBRID, "framework.nvlink_domain=72")


def test_hybridep_pads_to_its_own_capacity():
    # _HybridEPManager.setup_metadata: capacity = ⌈cf·t·k / (etp·E)⌉ per (virtual) expert, × W × E_local rows
    pad = ["training.capacity_factor=1.1", "training.pad_to_capacity=true"]
    o = ops(FLEX, HYBRID, *pad)
    assert o[f"{P}.dispatch.hybridep"].outputs["y"].shape == (math.ceil(1.1 * T * K / E) * W * LOCAL, H)
    assert o[f"{P}.dispatch.preprocess"].outputs["padded_tokens_per_expert"].dtype == "int64"
    assert "num_dispatched_tokens" in o[f"{P}.dispatch.preprocess"].outputs  # on the device (non_blocking)
    o2 = ops(FLEX, HYBRID, *pad, "parallel.etp=2")
    assert o2[f"{P}.dispatch.hybridep"].outputs["y"].shape == (math.ceil(1.1 * T * K / (2 * E)) * 16 * LOCAL, H)
    # the alltoall layout pads each of the E experts per source rank, then gathers over expert-TP
    assert ops(*pad, "parallel.etp=2")[f"{P}.experts.linear_fc1"].inputs["x"].shape[0] == \
        2 * E * math.ceil(1.1 * T * K / E)
