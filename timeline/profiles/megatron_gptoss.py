"""Saved-tensor rules the ``megatron`` profile adds for GPT-OSS, as Megatron-Core expresses the model.

Megatron-Core runs GPT-OSS from ``core_v0.15.0`` on, the first release with its four knobs
(``megatron/core/transformer/transformer_config.py``): ``softmax_type = "learnable"``
(``--softmax-type learnable``: one learned sink logit per head, TE's ``softmax_offset``),
``window_size`` with ``window_attn_skip_freq`` (``--window-size``, ``--window-attn-skip-freq 2``:
sliding layers alternate with full ones, as ``layer_types`` has them), ``activation_func =
quick_gelu`` on a gated unit (``--quick-geglu``: gate · sigmoid(1.702 · gate), GPT-OSS's
``swiglu_alpha``), ``glu_linear_offset`` (``--glu-linear-offset 1.0``: (up + 1)) and
``activation_func_clamp_value`` (``--activation-func-clamp-value 7.0``), with ``add_bias_linear``
for the q/k/v, proj, router and expert biases. Whether attention with sinks is fused depends on
Transformer Engine: Megatron-Core 0.15's ``TEDotProductAttention`` asserts TE ≥ 2.8.0 for any
``softmax_type`` but vanilla; TE 2.8's ``get_attention_backend`` disables FlashAttention for it and
keeps FusedAttention only where cuDNN's F16 arbitrary-seqlen backend takes sinks (cuDNN ≥ 9.13.1,
``common/fused_attn/fused_attn.cpp: nvte_get_fused_attn_backend``), else it falls back to
UnfusedDotProductAttention, which materialises s² scores (not modelled here: this table assumes
the fused path). Under context parallelism TE 2.8 keeps FusedAttention for a learnable softmax only
with ``cp_comm_type = "a2a"``, not the KV ring this profile models, so run validation refuses cp > 1
(``Limits.sinks_cp_note``). The rules extend :data:`timeline.profiles.megatron.RULES` under new names only,
so the base table (Megatron-Core 0.14, TE 2.6) stays as it is for every other model.
"""

from __future__ import annotations

from timeline.profiles.base import SaveRule, SaveRules

MC15 = "NVIDIA/Megatron-LM@core_v0.15.0:megatron/core"
TE28 = "NVIDIA/TransformerEngine@v2.8:transformer_engine"
GEGLU = f"{MC15}/fusions/fused_bias_geglu.py"

RULES: dict[str, SaveRule] = {
    "flash_attn_sinks": SaveRule(
        saves=("in:q", "in:k", "in:v", "out:y", "extra:lse", "extra:rng_state", "extra:softmax_offset"),
        source=f"{MC15}/extensions/transformer_engine.py: TEDotProductAttention passes softmax_type (TE ≥ 2.8.0 "
               f"asserted); {TE28}/pytorch/attention/dot_product_attention/dot_product_attention.py: "
               "softmax_offset.reshape(1, -1, 1, 1).to(torch.float32); backends.py: FusedAttnFunc.forward saves q, "
               "k, v, out and aux_ctx_tensors = softmaxStats [b, h, s_q, 1] fp32, rng_state [2] and SoftmaxOffset "
               f"[1, h, 1, 1] fp32 (pytorch/csrc/extensions/attention.cpp: fused_attn_fwd); FusedAttention needs "
               f"cuDNN ≥ 9.13.1 for sinks ({TE28}/common/fused_attn/fused_attn.cpp), else TE runs "
               "UnfusedDotProductAttention; a sliding window (window_size) changes the FLOPs, not what is saved"),
    "clamped_weighted_swiglu": SaveRule(
        saves=("in:x", "extra:clamped", "in:probs", "extra:linear_offset"),
        source=f"{GEGLU}: weighted_bias_quick_geglu_impl — x_glu.clamp(max=v) and x_linear.clamp(-v, v) on chunk "
               "views keep linear_fc1's output whole (ClampBackward1), torch.cat makes the clamped input that "
               "WeightedQuickGeGLUFunction.forward saves with the permuted probs and the linear_offset scalar "
               f"tensor; {MC15}/transformer/moe/experts.py: TEGroupedMLP.forward (bias_activation_fusion = "
               "--bias-gelu-fusion, on by default, under --quick-geglu); _apply_bias adds fc2's bias × probs "
               "(keeps the probs, already saved)"),
    "clamped_swiglu": SaveRule(
        saves=("in:x", "extra:gate_clamped", "extra:glu", "extra:up_offset"),
        source=f"{MC15}/transformer/mlp.py: MLP.forward — without routing probs the quick-geglu fusion raises, so "
               "a dense GLU runs unfused: glu() clamps chunk views of linear_fc1's output (kept whole), "
               "quick_gelu keeps its clamped input, the product keeps quick_gelu(x_glu) and x_linear + offset"),
}


def extend(rules: SaveRules) -> SaveRules:
    """``rules`` (the megatron rules) with the GPT-OSS rules added; no rule of it is replaced."""
    return rules.extended(RULES)
