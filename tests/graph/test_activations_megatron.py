"""``megatron`` profile: each selective module removes exactly its saved tensors; routed-expert
activations scale with tp, cp, ep, etp and top_k as DESIGN §4 states."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from helpers_run import TINY_MODEL, tiny_run
from sources import forward_ops_of, template_of

from timeline.io.runfile import load_run
from timeline.spec.recompute import parse_recompute

# the shipped run (not via conftest: other test folders have a conftest module too)
SHIPPED = Path(__file__).resolve().parents[2] / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"

MEGATRON = ['model.profile="megatron"']


def saved(run, chunk: int, layer: int) -> set[str]:
    return {st.tensor.name for st in template_of(run, chunk).saved if st.layer == layer}


def with_rc(run, text):
    return replace(run, recompute=parse_recompute(text))


P = "layers.4"
EXPECTED = {  # module -> (chunk, layer, removed, added checkpoint inputs)
    "core_attn": (1, 4, {f"{P}.self_attn.core_attn.softmax_lse", f"{P}.self_attn.core_attn.rng_state"}, set()),
    "mla_up_proj": (1, 4, {f"{P}.self_attn.q_layernorm.out", f"{P}.self_attn.q_layernorm.rsigma",
                           f"{P}.self_attn.kv_layernorm.out", f"{P}.self_attn.kv_layernorm.rsigma",
                           f"{P}.self_attn.q", f"{P}.self_attn.k", f"{P}.self_attn.v"},
                    {f"{P}.self_attn.k_pe.gathered"}),  # gathered before the CheckpointWithoutOutput
    "layernorm": (1, 4, {f"{P}.input_layernorm.out", f"{P}.input_layernorm.rsigma",
                         f"{P}.pre_mlp_layernorm.out", f"{P}.pre_mlp_layernorm.rsigma"}, set()),
    "moe": (1, 4, {f"{P}.mlp.router.scores_saved", f"{P}.mlp.router.scores", f"{P}.mlp.router.topk_idx",
                   f"{P}.mlp.router.topk_raw_weights", f"{P}.mlp.router.topk_denominator",
                   f"{P}.mlp.dispatch.probs_t", f"{P}.mlp.dispatch.routing_map_t", f"{P}.mlp.dispatch.sorted_idx",
                   f"{P}.mlp.dispatch.received", f"{P}.mlp.dispatch.received_probs",
                   f"{P}.mlp.experts.linear_fc1.out", f"{P}.mlp.experts.act.out",
                   f"{P}.mlp.shared_experts.linear_fc1.out", f"{P}.mlp.shared_experts.act.out"}, set()),
    "moe_act": (1, 4, {f"{P}.mlp.experts.act.out"}, set()),
    "shared_experts": (1, 4, {f"{P}.mlp.shared_experts.linear_fc1.out", f"{P}.mlp.shared_experts.act.out"},
                       set()),
    "mlp": (0, 1, {"layers.1.post_attention_layernorm.out", "layers.1.post_attention_layernorm.rsigma",
                   "layers.1.mlp.linear_fc1.out", "layers.1.mlp.act.out"}, set()),
}


@pytest.mark.parametrize("module", list(EXPECTED))
def test_selective_module_removes_exactly_its_tensors(module):
    chunk, layer, removed, added = EXPECTED[module]
    run = load_run(SHIPPED, MEGATRON)
    base = saved(run, chunk, layer)
    got = saved(with_rc(run, f"selective:{module}"), chunk, layer)
    assert base - got == removed
    assert got - base == added
    t = template_of(with_rc(run, f"selective:{module}"), chunk)
    rc = [o for o in t.backward_i if o.recompute and o.layer == layer]
    assert rc and {a.name.removesuffix("@recompute") for o in rc for a in o.allocs
                   if a.category == "recompute"} == removed


def test_flash_attention_has_no_s2_tensors():
    run = load_run(SHIPPED, MEGATRON)
    for st in template_of(run, 1).saved:
        assert 4096 * 4096 not in (st.tensor.shape[-1] * st.tensor.shape[-2] if len(st.tensor.shape) > 1 else 0,)
    lse = [st for st in template_of(run, 1).saved if st.tensor.name.endswith("softmax_lse")][0]
    assert lse.tensor.dtype == "fp32" and lse.tensor.size_bytes == 4 * 1 * (128 // 2) * 4096


@pytest.mark.parametrize("cp", [1, 2])
def test_te_flash_attention_keeps_its_bshd_output_apart(cp):
    """TE FlashAttention (flash-attn) on Megatron's sbhd tensors: q, k and v become bshd copies and its
    bshd output is kept beside the sbhd copy the output projection keeps — one [s/cp, b, h/tp] bf16 per
    layer more than cuDNN fused attention; under cp the ring keeps q, its last K/V buffer and out, so the
    bshd k/v copies are not kept (cuDNN's k and v are views kept with q)."""
    tp, b, s = 2, 2, 128
    runs = {be: tiny_run(pp=1, layers=2, tp=tp, cp=cp, micro_batch_size=b, seq_len=s, attention_backend=be)
            for be in ("fused", "flash")}
    held = {be: sum(st.tensor.size_bytes for st in template_of(r, 0).saved if st.layer == 1)
            for be, r in runs.items()}
    h, kv = TINY_MODEL.hidden_size // tp, TINY_MODEL.num_key_value_heads * TINY_MODEL.attn_head_dim // tp
    rows = s // cp * b
    assert held["flash"] - held["fused"] == rows * h * 2 - (0 if cp == 1 else 2 * rows * kv * 2)
    names = {st.tensor.name for st in template_of(runs["flash"], 0).saved if st.layer == 1}
    assert {"layers.1.self_attn.core_attn.out_bshd", "layers.1.self_attn.core_attn.out"} <= names


@pytest.mark.parametrize("tp", [1, 2])
def test_te_flash_attention_copies_nothing_at_micro_batch_one(tp):
    """At one sequence per micro-batch TE FlashAttention's sbhd ↔ bshd ``.transpose(0, 1).contiguous()`` is
    no copy of a contiguous tensor (RoPE's q and k, get_qkv_layout's copy of v, the output): flash keeps
    exactly what cuDNN fused attention keeps (Megatron-LM's 7B tp1/pp4 memory test measured the same peak
    under both backends); at two sequences each of q, k, v and the output is copied."""
    s = 128
    runs = {(be, mbs): tiny_run(pp=1, layers=2, tp=tp, micro_batch_size=mbs, seq_len=s, attention_backend=be)
            for be in ("fused", "flash") for mbs in (1, 2)}
    held = {key: sum(st.tensor.size_bytes for st in template_of(r, 0).saved if st.layer == 1)
            for key, r in runs.items()}
    assert held["flash", 1] == held["fused", 1]
    assert held["flash", 2] - held["fused", 2] == 2 * s * TINY_MODEL.hidden_size // tp * 2
    copies = {mbs: [o.name for o in template_of(runs["flash", mbs], 0).forward
                    if o.layer == 1 and o.name.endswith(("to_bshd", "to_sbhd"))] for mbs in (1, 2)}
    assert copies == {1: [], 2: ["layers.1.self_attn.core_attn.to_bshd", "layers.1.self_attn.core_attn.to_sbhd"]}


@pytest.mark.parametrize("cp", [1, 2])
def test_the_batch_lives_through_the_first_and_last_stages_forward(cp):
    """get_batch_on_this_tp_rank: tokens, labels, position ids (int64), loss mask (fp32) and the bool
    [b, 1, s, s] attention mask on the first and last stages, none in between; under cp each is the
    rank's index_select (the mask on its query dimension); the forward step's last op frees them."""
    b, s = 2, 128
    run = tiny_run(pp=3, layers=3, cp=cp, micro_batch_size=b, seq_len=s, dataloader_batch="mask")
    local = s // cp
    for chunk in range(3):
        ops = template_of(run, chunk).forward
        held = [a for o in ops if o.name.startswith("batch.") for a in o.allocs]
        if chunk == 1:
            assert not held
            continue
        kept = [a for a in held if a.name.endswith(".cp_local")] if cp > 1 else held
        assert sum(a.size_bytes for a in kept) == b * local * (8 + 8 + 4 + 8) + b * local * s
        assert ops[-1].name == "batch.release" and set(ops[-1].frees) == {a.storage for a in kept}
    no_mask = tiny_run(pp=3, layers=3, micro_batch_size=b, seq_len=s, dataloader_batch="tokens")
    assert sum(a.size_bytes for o in template_of(no_mask, 0).forward if o.name.startswith("batch.")
               for a in o.allocs) == b * s * 28


def test_the_embedding_backward_returns_dense_weight_gradients():
    """VocabParallelEmbedding's backward makes a dense [V/tp, h] gradient (and the learned position
    embedding a [max_pos, h] one) in the weights' dtype; the weight-gradient step frees it once added
    into the grads buffer."""
    tp = 2
    run = tiny_run(pp=2, layers=2, tp=tp, model=replace(TINY_MODEL, position_embedding="learned",
                                                         max_position_embeddings=256))
    t = template_of(run, 0)
    (w,) = [o for o in (*t.backward_i, *t.backward_w) if o.name == "embedding.wgrad"]
    vocab = -(-TINY_MODEL.vocab_size // (128 * tp)) * 128  # padded to 128·tp, split over tp
    assert {(a.name, a.shape, a.size_bytes) for a in w.allocs} == {
        ("embedding.word_embeddings.wgrad", (vocab, 256), vocab * 256 * 2),
        ("embedding.position_embeddings.wgrad", (256, 256), 256 * 256 * 2)}
    assert set(w.frees) >= {a.storage for a in w.allocs}
    assert not [a for o in t.forward for a in o.allocs if a.name.endswith(".wgrad")]


def expert_rows(*overrides) -> tuple[int, int]:
    """(rows the all-to-all delivers to this EP rank, rows the expert fc1 sees after the ETP gather)."""
    run = load_run(SHIPPED, [*MEGATRON, *overrides])
    ops = {o.name: o for o in forward_ops_of(run, 1)}
    a2a = ops[f"{P}.mlp.dispatch.all_to_all"].outputs["probs"]
    return a2a.shape[0], ops[f"{P}.mlp.experts.linear_fc1"].outputs["y"].shape[0]


B, S, K = 1, 4096, 8


@pytest.mark.parametrize(("overrides", "rows", "etp"), [
    ([], B * S // 2 * K, 1),
    (["parallel.tp=4"], B * S // 4 * K, 1),
    (["parallel.cp=2"], B * S // (2 * 2) * K, 1),
    (["parallel.ep=4"], B * S // 2 * K, 1),
    (["parallel.ep=16"], B * S // 2 * K, 1),
    (["parallel.etp=2"], B * S // 2 * K, 2),
    (["model.num_experts_per_tok=4"], B * S // 2 * 4, 1),
    (["training.micro_batch_size=2"], 2 * S // 2 * K, 1),
])
def test_routed_rows_scale(overrides, rows, etp):
    got_rows, fc1_rows = expert_rows(*overrides)
    assert got_rows == rows
    assert fc1_rows == rows * etp


def test_routing_skew_and_capacity():
    tokens = B * S // 2
    assert expert_rows('training.routing="skew"', "training.routing_skew=1.5")[0] == int(tokens * K * 1.5)
    cap = 256 * -(-int(0.5 * tokens * K) // 256)
    assert expert_rows("training.capacity_factor=0.5")[0] == min(tokens * K, cap)
    assert expert_rows("training.capacity_factor=2.0")[0] == tokens * K  # dropless below the cap
    assert expert_rows("training.capacity_factor=2.0", "training.pad_to_capacity=true")[0] == \
        256 * -(-2 * tokens * K // 256)


def test_megatron_mla_latents_are_sequence_parallel():
    by = {st.tensor.name: st.tensor for st in template_of(load_run(SHIPPED, MEGATRON), 1).saved}
    assert by[f"{P}.self_attn.q_layernorm.out"].shape == (S // 2, 1536)
    paper = {st.tensor.name: st.tensor for st in template_of(load_run(SHIPPED, []), 1).saved}
    assert paper[f"{P}.self_attn.q_layernorm.out"].shape == (S, 1536)


def saved_by_name(*overrides, chunk: int = 1, layer: int = 4) -> dict[str, tuple[tuple[int, ...], str, int]]:
    run = load_run(SHIPPED, [*MEGATRON, *overrides])
    return {st.tensor.name: (st.tensor.shape, st.tensor.dtype, st.tensor.size_bytes)
            for st in template_of(run, chunk).saved if st.layer == layer}


T = B * S // 2  # tokens per TP rank (SP)
E = 256
# DeepSeek-V3 under TP2 (SP): hidden, MLA ranks, heads per TP rank and their dims, expert FFN width
H, Q_LORA, KV_LORA, ROPE, NOPE, V_DIM = 7168, 1536, 512, 64, 128, 128
HEADS = 128 // 2
FFN = 2048  # moe_intermediate_size: each routed expert and the one shared expert (TP-split)
R = T * K  # token rows the all-to-all delivers to this EP rank
BF16, FP32, I64, BOOL = 2, 4, 8, 1
#: one MoE layer's saved bytes, term by term as the tests above and below assert them
LAYER_BYTES = (
    4 * T * H * BF16  # layer input, input_layernorm.out, attention residual, pre_mlp_layernorm.out
    + 4 * T * FP32  # rsigma of the input, q, kv and pre-MLP norms
    + 2 * T * Q_LORA * BF16  # q down projection, q_layernorm.out
    + T * (KV_LORA + ROPE) * BF16 + T * KV_LORA * BF16  # kv_combined (kept whole), kv_layernorm.out
    + 2 * S * HEADS * (NOPE + ROPE) * BF16  # q, k (gathered sequence)
    + 2 * S * HEADS * V_DIM * BF16  # v, core_attn.out
    + 2 * I64 + HEADS * S * FP32  # rng_state, softmax_lse
    + T * E * (FP32 + BF16) + T * BF16 + T * K * (I64 + BF16)  # router: scores ×2, denominator, top-k
    + E * T * (BF16 + BOOL) + R * I64 + R * H * BF16 + R * BF16  # dispatch: probs_t, map, idx, rows, probs
    + R * 2 * FFN * BF16 + R * FFN * BF16  # routed experts: fc1 (gate | up), act
    + S * 2 * (FFN // 2) * BF16 + S * (FFN // 2) * BF16  # shared expert (TP-split): fc1, act
)
STAGE1_BYTES = 4 * LAYER_BYTES  # pipeline stage 1 holds layers 4–7, all MoE


def test_router_and_permute_saved_tensors():
    """topk_routing_with_score_function (sigmoid, expert bias) and permute() in
    megatron/core/transformer/moe/moe_utils.py at core_v0.14.0: logits in bf16 (moe_router_dtype unset)."""
    by = saved_by_name()
    assert by[f"{P}.mlp.router.scores_saved"] == ((T, E), "fp32", T * E * 4)  # SigmoidBackward result
    assert by[f"{P}.mlp.router.scores"] == ((T, E), "bf16", T * E * 2)  # gather's self (type_as(logits))
    assert by[f"{P}.mlp.router.topk_idx"] == ((T, K), "int64", T * K * 8)
    assert by[f"{P}.mlp.router.topk_raw_weights"] == ((T, K), "bf16", T * K * 2)  # DivBackward self
    assert by[f"{P}.mlp.router.topk_denominator"] == ((T,), "bf16", T * 2)  # DivBackward other
    assert by[f"{P}.mlp.dispatch.probs_t"] == ((E, T), "bf16", E * T * 2)  # masked_select self
    assert by[f"{P}.mlp.dispatch.routing_map_t"] == ((E, T), "bool", E * T)  # masked_select mask
    assert by[f"{P}.mlp.dispatch.sorted_idx"] == ((T * K,), "int64", T * K * 8)  # index_select index
    # the experts read the copy sort_chunks_by_idxs makes (32 local experts); probs stay bf16
    assert by[f"{P}.mlp.dispatch.received"] == ((T * K, 7168), "bf16", T * K * 7168 * 2)
    assert by[f"{P}.mlp.dispatch.received_probs"] == ((T * K,), "bf16", T * K * 2)
    assert f"{P}.mlp.dispatch.all_to_all.out" not in by


def test_router_fp32_logits_share_the_sigmoid_result():
    """With fp32 logits, type_as is a no-op: the gather keeps the sigmoid's own fp32 result."""
    by = saved_by_name("training.dtype=\"fp32\"")
    assert by[f"{P}.mlp.router.scores"] == ((T, E), "fp32", T * E * 4)
    assert f"{P}.mlp.router.scores_saved" not in by


def test_attention_saves_rng_state_and_mla_latents():
    by = saved_by_name()
    assert by[f"{P}.self_attn.core_attn.rng_state"] == ((2,), "int64", 16)
    # kv_compressed is a split view of kv_combined [s/tp, 512 + 64]: the latent norm keeps it whole
    assert by[f"{P}.self_attn.linear_kv_down_proj.out"] == ((T, 576), "bf16", T * 576 * 2)
    assert by[f"{P}.self_attn.kv_layernorm.out"] == ((T, 512), "bf16", T * 512 * 2)
    assert f"{P}.self_attn.k_pe.gathered" not in by  # fused MLA RoPE keeps only cos/sin


def test_stage_activation_bytes():
    """DeepSeek-V3 PP16 TP2 EP8, pipeline stage 1 (layers 4–7), one micro-batch."""
    run = load_run(SHIPPED, MEGATRON)
    assert sum(st.tensor.size_bytes for st in template_of(run, 1).saved) == STAGE1_BYTES


def test_softmax_router_keeps_the_top_k_softmax():
    """Without the expert bias (softmax scoring): topk on the logits keeps the indices and
    softmax(dtype=fp32) of the k values its result; no [tokens, E] sigmoid, no normalisation."""
    by = saved_by_name("model.router_bias=false")
    assert by[f"{P}.mlp.router.scores_saved"] == ((T, K), "fp32", T * K * 4)
    assert by[f"{P}.mlp.router.topk_idx"] == ((T, K), "int64", T * K * 8)
    assert not {f"{P}.mlp.router.scores", f"{P}.mlp.router.topk_raw_weights"} & set(by)


def _layer0(run):
    t = template_of(run, 0)
    return {st.tensor.name: st.tensor.size_bytes for st in t.saved if st.layer == 0}, t.forward


@pytest.mark.parametrize("tp", [1, 4])
def test_megatron_qkv_is_one_output_whose_views_keep_it_whole(tp):
    """MC SelfAttention.get_query_key_value_tensors: linear_qkv writes one mixed_qkv [s·b, (np + 2·ng)·hn]
    and q, k, v are its split views. Megatron's local DotProductAttention (baddbmm, bmm) keeps the views,
    hence the whole output, as one allocation; under TE, get_qkv_layout copies the view v contiguous
    once RoPE has made q and k new tensors (the copy is kept), and the output itself is freed when
    SelfAttention.forward returns, after linear_proj."""
    b, s = 2, 128
    hd = TINY_MODEL.attn_head_dim
    nq, nkv = TINY_MODEL.num_attention_heads // tp, TINY_MODEL.num_key_value_heads // tp
    rows = b * s
    qkv_bytes = rows * (nq + 2 * nkv) * hd * 2
    p = "layers.0.self_attn"
    local, _ = _layer0(tiny_run(pp=1, layers=1, tp=tp, micro_batch_size=b, seq_len=s, transformer_impl="local"))
    assert local[f"{p}.qkv"] == qkv_bytes
    assert not {f"{p}.q", f"{p}.k", f"{p}.v", f"{p}.core_attn.qkv_layout.v"} & set(local)
    te, fwd = _layer0(tiny_run(pp=1, layers=1, tp=tp, micro_batch_size=b, seq_len=s, attention_backend="fused"))
    assert f"{p}.qkv" not in te and te[f"{p}.core_attn.qkv_layout.v"] == rows * nkv * hd * 2
    made = next(o for o in fwd if o.name == f"{p}.linear_qkv")
    assert [(a.name, a.size_bytes) for a in made.allocs] == [(f"{p}.qkv", qkv_bytes)]
    freed = next(o for o in fwd if f"{p}.qkv" in o.frees)
    assert freed.name == f"{p}.linear_proj"


def test_megatron_qk_layernorm_keeps_contiguous_copies_of_the_views():
    """--qk-layernorm: TE LayerNorm.op_forward normalises `input_.contiguous()` and keeps that copy — one
    [s·b, np·hn] for q and one [s·b, ng·hn] for k beside the norms' outputs; v is then copied by
    get_qkv_layout; without RoPE nothing else is made of q and k."""
    tp, b, s = 4, 2, 128
    model = replace(TINY_MODEL, qk_norm=True, position_embedding="learned", norm="layernorm")
    saved_, _ = _layer0(tiny_run(pp=1, model=model, layers=1, tp=tp, micro_batch_size=b, seq_len=s,
                                 attention_backend="fused"))
    hd, rows = model.attn_head_dim, b * s
    nq, nkv = model.num_attention_heads // tp, model.num_key_value_heads // tp
    p = "layers.0.self_attn"
    assert saved_[f"{p}.q_norm.input.q"] == saved_[f"{p}.q_norm.out"] == rows * nq * hd * 2
    assert saved_[f"{p}.k_norm.input.k"] == saved_[f"{p}.k_norm.out"] == rows * nkv * hd * 2
    assert saved_[f"{p}.core_attn.qkv_layout.v"] == rows * nkv * hd * 2
    assert f"{p}.qkv" not in saved_
