"""Property tests over random valid plans: shards sum back to the whole model."""

from __future__ import annotations

from dataclasses import replace

from helpers_run import tiny_run
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sources import ctx_of, source_of, state_bytes_of, tensors_of

from timeline.graph.static import is_expert_state, zero_shard
from timeline.profiles import LIMITS
from timeline.spec.presets import PRESETS
from timeline.spec.validate import validate_run

# a small DeepSeek-style MoE with MLA and a small dense model keep each example fast
SMALL_MOE = replace(PRESETS["deepseek-v3"], name="tiny-moe", hidden_size=64, num_hidden_layers=4,
                    num_attention_heads=8, num_key_value_heads=8, intermediate_size=128, vocab_size=512,
                    q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                    n_routed_experts=16, moe_intermediate_size=32, first_k_dense_replace=1, mtp_layers=0)
SMALL_DENSE = replace(PRESETS["llama3-8b"], name="tiny-llama", hidden_size=64, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, intermediate_size=128, vocab_size=512)

# GPT-OSS-style: sinks, o_proj/router/expert biases, alternating sliding and full layers
SMALL_GPTOSS = replace(SMALL_DENSE, name="tiny-gpt-oss", model_type="gpt_oss", head_dim=16, n_routed_experts=8,
                       num_experts_per_tok=2, moe_intermediate_size=128, attention_bias=True, attention_sinks=True,
                       attention_out_bias=True, router_logit_bias=True, expert_linear_bias=True, swiglu_limit=7.0,
                       sliding_window=16, layer_types=("sliding_attention", "full_attention") * 2)


@st.composite
def plans(draw):
    model = draw(st.sampled_from([SMALL_MOE, SMALL_DENSE, SMALL_GPTOSS]))
    profile = draw(st.sampled_from(["paper", "megatron"]))
    pp = draw(st.sampled_from([1, 2, 4]))
    tp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2, 3, 4]))
    cp = draw(st.sampled_from([1, 2]))
    ep = draw(st.sampled_from([1, 2, 4, 8])) if model.is_moe else 1
    etp = draw(st.sampled_from([1, tp]))
    zero = draw(st.sampled_from([0, 1] if profile == "megatron" else [0, 1, 2, 3]))
    return tiny_run(name="p", model=model, profile=profile, pp=pp, tp=tp, dp=dp, cp=cp, ep=ep, etp=etp,
                    sp=tp > 1, zero=zero, seq_len=64)


@settings(max_examples=60, deadline=None)
@given(plans())
def test_weight_shards_sum_to_model_times_replication(run):
    """Rebuild the unique parameters from the per-device shards: TP/ETP shards (``split``) and
    EP ranks (disjoint expert sets) multiply back; nothing else may be missing or extra."""
    assume(not validate_run(run, LIMITS))
    par = run.parallel
    ctx = ctx_of(run)
    rebuilt = 0
    for r in range(par.pp):
        _, tensors = tensors_of(run, r)
        rebuilt += sum(t.numel * t.split * (par.ep if t.expert else 1) for t in tensors if t.trainable)
    h = run.model.hidden_size
    pad = (ctx.padded_vocab - run.model.vocab_size) * h  # Megatron's vocabulary padding rows
    tables = 1 if run.model.tie_word_embeddings else 2
    tied_copy = ctx.padded_vocab * h if (run.model.tie_word_embeddings and par.pp > 1) else 0
    assert rebuilt == source_of(run).total_params() + tables * pad + tied_copy


@settings(max_examples=60, deadline=None)
@given(plans())
def test_zero_shards_sum_back(run):
    """Over a shard group (dense: dp·cp ranks, expert: EDP ranks) the ZeRO shards of weights,
    gradients and optimizer states sum back to the unsharded states."""
    assume(not validate_run(run, LIMITS))
    par, tr = run.parallel, run.training
    rule = ctx_of(run).profile.expert_state_group
    unsharded = replace(run, training=replace(tr, zero=0))
    _, tensors = tensors_of(run, 0)
    trainable = [t for t in tensors if t.trainable]
    for part, group, key in ((
            [t for t in trainable if not is_expert_state(t, rule)], par.dp * par.cp, "dense_rank"),
            ([t for t in trainable if is_expert_state(t, rule)], par.edp, "expert_rank")):
        full = state_bytes_of(unsharded, part)
        shards = [state_bytes_of(run, part, **{key: i}) for i in range(group)]
        for k, level in enumerate((3, 2, 1)):  # weights shard at ZeRO-3, grads at 2, optimizer at 1
            total = sum(s[k] for s in shards)
            assert total == (full[k] if tr.zero >= level else full[k] * group)


def test_zero_shard_partition_exact():
    for n in (0, 1, 7, 429_719_552, 10**9 + 7):
        for g in (1, 3, 8, 32):
            assert sum(zero_shard(n, g, i) for i in range(g)) == n
            assert zero_shard(n, g, 0) - zero_shard(n, g, g - 1) in (0, 1)
