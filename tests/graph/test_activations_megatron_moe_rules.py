"""``megatron`` profile, MoE tensors as ``[framework]`` configures them, at their exact bytes: the
router's aux-loss scores, ``--moe-router-dtype``, TE's fused permutation (``--moe-permute-fusion``), the
deterministic unpermute's ``index_add_`` and the router z-loss rule (Megatron-Core transformer/moe/router.py,
moe_utils.py; TE pytorch/permutation.py). The shipped DeepSeek-V3 run: sigmoid router with expert bias,
E = 256, k = 8, ep = 8, SP over tp = 2."""

from __future__ import annotations

import pytest
from test_activations_megatron_moe import ALLGATHER, EP, LOCAL, E, H, K, P, T, ops, saved_bytes

AUX = 'framework.moe_router_load_balancing="aux_loss"'
FP32, FP64 = 'framework.moe_router_dtype="fp32"', 'framework.moe_router_dtype="fp64"'
FUSED = "framework.moe_permute_fusion=true"
DETERMINISTIC = ("framework.deterministic=true", 'framework.megatron_core="0.15.0"')
ROWS = T * K  # balanced routing: t·k rows reach the local experts


@pytest.mark.parametrize("kind", ["aux_loss", "seq_aux_loss", "global_aux_loss"])
def test_aux_loss_keeps_fp32_scores_of_every_expert(kind: str) -> None:
    got = saved_bytes(f'framework.moe_router_load_balancing="{kind}"')
    # compute_routing_scores_for_aux_loss, sigmoid: sigmoid(logits.float()) [t, E] and its [t, 1] sum
    assert got[f"{P}.router.aux_loss.scores"] == ((T, E), "fp32", 4 * T * E)
    assert got[f"{P}.router.aux_loss.denominator"] == ((T, 1), "fp32", 4 * T)
    assert got[f"{P}.router.aux_loss.tokens_per_expert"] == ((E,), "int64", 8 * E)
    assert got[f"{P}.router.aux_loss.loss"] == ((1,), "fp32", 4)  # MoEAuxLossAutoScaler's 0-d loss


def test_aux_loss_of_a_softmax_router_keeps_no_sum() -> None:
    got = saved_bytes(AUX, "model.router_bias=false")
    assert got[f"{P}.router.aux_loss.scores"] == ((T, E), "fp32", 4 * T * E)
    assert f"{P}.router.aux_loss.denominator" not in got


def test_no_aux_loss_without_an_aux_loss_type() -> None:
    for overrides in ((), ('framework.moe_router_load_balancing="sinkhorn"',)):
        assert not any(".aux_loss." in n for n in saved_bytes(*overrides))


def test_router_dtype_fp32_carries_to_every_router_tensor() -> None:
    base, got = saved_bytes(), saved_bytes(FP32)
    assert ops(FP32)[f"{P}.router"].outputs["y"].dtype == "fp32"  # router_gating_linear's logits
    # sigmoid of fp32 logits: its result is the scores the gather keeps (no separate fp32 copy)
    assert got[f"{P}.router.scores"] == ((T, E), "fp32", 4 * T * E) and f"{P}.router.scores_saved" not in got
    assert got[f"{P}.router.topk_raw_weights"] == ((T, K), "fp32", 4 * T * K)
    assert got[f"{P}.dispatch.probs_t"] == ((E, T), "fp32", 4 * E * T)
    assert got[f"{P}.dispatch.received_probs"] == ((ROWS,), "fp32", 4 * ROWS)  # the weighted SwiGLU's probs
    assert f"{P}.router.logits" not in got and f"{P}.router.logits" not in base  # kept only by a z-loss
    assert saved_bytes(FP64)[f"{P}.dispatch.probs_t"] == ((E, T), "fp64", 8 * E * T)


def test_router_dtype_widens_the_allgather_reduce_scatter() -> None:
    o = ops(ALLGATHER, FP32)
    # token_combine: hidden_states.to(local_probs.dtype) before the reduce-scatter, then back
    wide = o[f"{P}.combine.cast"].outputs["y"]
    assert (wide.shape, wide.dtype) == ((T * EP, H), "fp32")
    assert o[f"{P}.combine.reduce_scatter"].outputs["y"].dtype == "fp32"
    assert o[f"{P}.combine.cast_back"].outputs["y"].dtype == "bf16"
    assert f"{P}.combine.cast" not in ops(ALLGATHER)


def test_fused_permute_keeps_row_id_maps_instead_of_sorted_indices() -> None:
    got = saved_bytes(FUSED)
    # TE make_row_id_map: int32 [tokens, 2·E + 1]; make_chunk_sort_map: int32 [rows] for each chunk sort
    assert got[f"{P}.dispatch.row_id_map"] == ((T, 2 * E + 1), "int32", 4 * T * (2 * E + 1))
    assert got[f"{P}.dispatch.sort_chunks.row_id_map"] == ((ROWS,), "int32", 4 * ROWS)
    assert got[f"{P}.combine.sort_chunks.row_id_map"] == ((ROWS,), "int32", 4 * ROWS)
    assert not {f"{P}.dispatch.sorted_idx", f"{P}.dispatch.probs_t", f"{P}.dispatch.routing_map_t"} & set(got)


def test_fused_permute_under_the_allgather_dispatcher() -> None:
    got = saved_bytes(ALLGATHER, FUSED)
    gathered = T * EP
    assert got[f"{P}.dispatch.row_id_map"] == ((gathered, 2 * LOCAL + 1), "int32", 4 * gathered * (2 * LOCAL + 1))
    assert f"{P}.dispatch.sorted_idx" not in got
    # the local probs are still permuted by masked_select (unfused in the dispatcher)
    assert got[f"{P}.dispatch.probs_t"] == ((LOCAL, gathered), "bf16", 2 * LOCAL * gathered)


def test_deterministic_unpermute_keeps_index_add_source() -> None:
    got = saved_bytes(*DETERMINISTIC)
    # alltoall: the combine all-to-all's output rows are index_add_'s source
    assert got[f"{P}.combine.received"] == ((ROWS, H), "bf16", 2 * ROWS * H)
    ag = saved_bytes(ALLGATHER, *DETERMINISTIC)
    assert ag[f"{P}.experts.linear_fc2.out"] == ((ROWS, H), "bf16", 2 * ROWS * H)  # the experts' output itself


@pytest.mark.parametrize("overrides", [(*DETERMINISTIC, FUSED), (), ("framework.deterministic=true",),
                                       ("framework.deterministic=true", 'framework.megatron_core="0.15.0rc8"'),
                                       (*DETERMINISTIC, "framework.deterministic_mode=false")],
                         ids=["fused", "nondeterministic", "core_0.14", "main_0.15.0rc8", "te_env_only"])
def test_no_index_add_source_fused_or_nondeterministic(overrides: tuple[str, ...]) -> None:
    """Nor before Megatron-LM 56818f9e50 (2025-10-16, first in core_r0.15.0): its unpermute always ran
    scatter_add_ (core_r0.12.0 … core_r0.14.0 moe_utils.py). Nor where only NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 asks
    for determinism (deterministic_mode false): torch's deterministic algorithms are --deterministic-mode's."""
    got = saved_bytes(*overrides)
    assert f"{P}.combine.received" not in got and f"{P}.experts.linear_fc2.out" not in got


def test_z_loss_keeps_logits_and_logsumexp() -> None:
    got = saved_bytes(FP32, "model.router_bias=false", "framework.moe_z_loss=true")
    # z_loss_func: logsumexp keeps the (fp32) logits and its [t] result; the 0-d loss in the logits dtype
    assert got[f"{P}.router.logits"] == ((T, E), "fp32", 4 * T * E)
    assert got[f"{P}.router.z_loss.logsum"] == ((T,), "fp32", 4 * T)
    assert got[f"{P}.router.z_loss.loss"] == ((1,), "fp32", 4)


def test_sigmoid_top_k_stays_fp32_from_megatron_core_0_18() -> None:
    old, new = saved_bytes(), saved_bytes('framework.megatron_core="0.18.0"')
    # core_v0.14.0: sigmoid(logits.float()) kept in fp32, then cast; the gather keeps the bf16 copy
    assert old[f"{P}.router.scores"] == ((T, E), "bf16", 2 * T * E)
    assert old[f"{P}.router.scores_saved"] == ((T, E), "fp32", 4 * T * E)
    assert old[f"{P}.router.topk_raw_weights"] == ((T, K), "bf16", 2 * T * K)
    # eb80b74 (core_v0.18.0): one fp32 [t, E] (the sigmoid's result the gather reads), fp32 top-k and sum
    assert new[f"{P}.router.scores"] == ((T, E), "fp32", 4 * T * E) and f"{P}.router.scores_saved" not in new
    assert new[f"{P}.router.topk_raw_weights"] == ((T, K), "fp32", 4 * T * K)
    assert new[f"{P}.router.topk_denominator"] == ((T,), "fp32", 4 * T)
    assert saved_bytes('framework.megatron_core="0.17.0"')[f"{P}.router.scores"][1] == "bf16"
