"""Saved-tensor rules of the ``megatron`` profile: Megatron-Core with Transformer Engine.

Flash/cuDNN fused attention (q, k, v, output and the fp32 softmax statistics, no s² tensors),
norms fused into the following linear where the layer spec fuses them (TE LayerNormLinear
keeps the norm input, its output shard and fp32 rsigma), separate TENorm before MLA and MoE,
fused SwiGLU keeping the fc1 output, grouped-GEMM experts keeping their permuted input, the
alltoall token dispatcher's permutation indices, no dropout, MLA's compressed q/kv kept
sequence-parallel. Paths are in NVIDIA/Megatron-LM and NVIDIA/TransformerEngine.
"""

from __future__ import annotations

from timeline.graph.saved import SavedTable, SaveRule

TE_LNL = "transformer_engine/pytorch/module/layernorm_linear.py: _LayerNormLinear saves inputmat, ln_out, mu, rsigma"
TE_LIN = "transformer_engine/pytorch/module/linear.py: _Linear saves inputmat (the local SP shard; re-gathered for wgrad)"

RULES: dict[str, SaveRule] = {
    "embedding": SaveRule(source="megatron/core/tensor_parallel/layers.py: VocabParallelEmbedding saves only the "
                                 "token ids (not modelled)"),
    "layernorm": SaveRule(saves=("in:x", "extra:mu", "extra:rsigma"),
                          source=f"{TE_LNL}; transformer_engine/pytorch/module/layernorm.py"),
    "rmsnorm": SaveRule(saves=("in:x", "extra:rsigma"),
                        source=f"{TE_LNL}; transformer_engine/pytorch/module/rmsnorm.py: RMSNorm saves inp, rsigma"),
    "latent_norm": SaveRule(saves=("in:x", "extra:rsigma"),
                            source="megatron/core/transformer/multi_latent_attention.py: q/kv layernorm fused into "
                                   f"linear_q_up_proj / linear_kv_up_proj (TELayerNormColumnParallelLinear); {TE_LNL}"),
    "linear": SaveRule(saves=("in:_save",), wgrad=("in:_save",), source=TE_LIN),
    "grouped_linear": SaveRule(saves=("in:_save",), wgrad=("in:_save",),
                               source="transformer_engine/pytorch/module/grouped_linear.py: _GroupedLinear saves "
                                      "inputmats; megatron/core/transformer/moe/experts.py: TEGroupedMLP"),
    "flash_attn": SaveRule(saves=("in:q", "in:k", "in:v", "out:y", "extra:lse"),
                           source="transformer_engine/pytorch/attention/dot_product_attention/backends.py: FusedAttnFunc "
                                  "saves q, k, v, out and aux_ctx_tensors (fp32 softmax stats b·h·s, rng state)"),
    "dropout": SaveRule(source="Megatron-Core bias-dropout-add with hidden_dropout = 0 keeps nothing"),
    "gelu": SaveRule(saves=("in:x",), source="megatron/core/fusions/fused_bias_gelu.py: saves input (and bias)"),
    "swiglu": SaveRule(saves=("in:x",), source="megatron/core/fusions/fused_bias_swiglu.py: SwiGLUFunction saves "
                                               "the fc1 output"),
    "weighted_swiglu": SaveRule(saves=("in:x", "in:probs"),
                                source="megatron/core/fusions/fused_bias_swiglu.py: WeightedSwiGLUFunction saves "
                                       "input and permuted probs (megatron/core/transformer/moe/experts.py)"),
    "rope": SaveRule(source="megatron/core/models/common/embeddings/rope_utils.py: fused RoPE saves only freqs"),
    "add": SaveRule(source="residual add keeps nothing"),
    "router_score": SaveRule(saves=("extra:scores",),
                             source="megatron/core/transformer/moe/moe_utils.py: topk_routing_with_score_function — "
                                    "autograd keeps the fp32 sigmoid/softmax scores [tokens, E]"),
    "topk": SaveRule(saves=("out:idx",), source="megatron/core/transformer/moe/moe_utils.py: gather/scatter of the "
                                                "top-k scores keeps the int64 indices [tokens, k]"),
    "permute": SaveRule(saves=("extra:sorted_idx",),
                        source="megatron/core/transformer/moe/moe_utils.py: permute() index_select keeps "
                               "sorted_indices [tokens·k] (int64); token_dispatcher.py MoEAlltoAllTokenDispatcher"),
    "unpermute": SaveRule(source="megatron/core/transformer/moe/moe_utils.py: unpermute() scatter_add reuses "
                                 "sorted_indices (saved by permute)"),
    "ce_loss": SaveRule(saves=("extra:exp_logits", "extra:target_mask", "extra:masked_target"),
                        source="megatron/core/tensor_parallel/cross_entropy.py: _VocabParallelCrossEntropy saves "
                               "fp32 exp_logits, target_mask, masked_target_1d"),
    "concat": SaveRule(source="a concatenation keeps nothing"),
    "comm": SaveRule(source="collectives keep nothing (buffers come from the caller's stream)"),
}

TABLE = SavedTable(name="megatron", rules=RULES, attention="flash", dropout=False, fused_norm_linear=True,
                   moe_tokens="routed", mla_latent_sp=True, full_recompute_moe_split=False, swiglu_extra=False)
