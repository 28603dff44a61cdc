"""The ``megatron`` profile: Megatron-Core with Transformer Engine — parameter rules, saved-tensor
rules, op structure (as ``[framework]`` configures it), lifecycle and limits.

Each rule cites the file, class or function it was read from, at Megatron-Core 0.14.0 (the
``megatron-core`` 0.14.0 wheel, tag ``core_v0.14.0`` of NVIDIA/Megatron-LM: ``MC``) and
Transformer Engine 2.6.0 (the ``transformer-engine-cu12`` 2.6.0 wheel, tag ``v2.6`` of
NVIDIA/TransformerEngine: ``TE``), with the defaults of ``TransformerConfig`` (unfused router and
permutation, ``moe_router_dtype`` unset, no auxiliary loss, no dropout) and the TE layer spec
(``MC models/gpt/gpt_layer_specs.py: get_gpt_layer_with_transformer_engine_spec``): dense
layers fuse the pre-MLP norm into ``linear_fc1`` (TELayerNormColumnParallelLinear) and, without
MLA, the input norm into ``linear_qkv``; MLA layers have a separate TENorm before attention, MoE
layers one before the MoE block; MLA's q/kv norms fuse into the up projections (``qk_layernorm``),
its down projections are TELinear ``parallel_mode="duplicated"`` on the sequence-parallel rows.

Lifecycle: weights, the fp32 ``main_grad`` buffer and the fp32 master weights exist from the DDP
wrap and the optimizer's construction (``distributed/param_and_grad_buffer.py``,
``optimizer/distrib_optimizer.py``); Adam's moments are created lazily by the first ``step()``
(``torch/optim/adam.py`` ``_init_group``). Gradient reduce-scatter and parameter all-gather work in
place in those buffers, so the step allocates nothing else; the persistent library workspaces are
in :mod:`timeline.profiles.megatron_workspaces`, the GPT-OSS rules in
:mod:`timeline.profiles.megatron_gptoss`, the MoE combine's rules before Megatron-LM 2659630721 in
:mod:`timeline.profiles.megatron_combine`, the legacy GPT model's (``--use-legacy-models``) in
:mod:`timeline.profiles.megatron_legacy`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from timeline.profiles import (
    megatron_bert,
    megatron_combine,
    megatron_flex,
    megatron_gdn,
    megatron_gptoss,
    megatron_legacy,
    megatron_llava,
    megatron_mamba,
)
from timeline.profiles.base import Lifecycle, Limits, ParamRules, Profile, SaveRule, SaveRules, Structure
from timeline.profiles.megatron_autotune import COMPILED_FROM, first_call
from timeline.profiles.megatron_workspaces import legacy_grouped_mlp, persistent_workspaces, version_tuple
from timeline.spec.cuda_graph_rules import scope_modules
from timeline.spec.framework import FrameworkSpec

MC = "NVIDIA/Megatron-LM@core_v0.14.0:megatron/core"
TE = "NVIDIA/TransformerEngine@v2.6:transformer_engine/pytorch"
TE_LNL = (f"{TE}/module/layernorm_linear.py: _LayerNormLinear.forward saves inputmat, ln_out (the local shard "
          "under SP, re-gathered for wgrad), mu, rsigma (fp32, per row)")
TE_NORM = f"{TE}/ops/basic/rmsnorm.py: RMSNorm.op_forward saves x and rstdevs (fp32) (module/rmsnorm.py: TENorm)"
MOE_UTILS = f"{MC}/transformer/moe/moe_utils.py"
TE_PERM = "NVIDIA/TransformerEngine@v2.6..v2.14:transformer_engine/pytorch/permutation.py"

#: the flash-attn 2 backward's allocations beside dq, dk, dv (graph/families/flash_bwd.py, which cites
#: Dao-AILab/flash-attention@v2.7.4.post1 csrc/flash_attn/flash_api.cpp: mha_bwd and TE
#: context_parallel.py: AttnFuncWithCPAndKVP2P.backward): the CP ring's buffers and last step's dq_/dkv_,
#: softmax_d, the fp32 dq accumulator, GQA's expanded dk/dv — the slots an op lacks are skipped
FLASH_BWD_SCRATCH = ("scratch:dkv_p2p0", "scratch:dkv_p2p1", "scratch:dq_step", "scratch:dkv_step",
                     "scratch:softmax_d", "scratch:dq_accum", "scratch:dk_expanded", "scratch:dv_expanded")

RULES: dict[str, SaveRule] = {
    "embedding": SaveRule(source=f"{MC}/tensor_parallel/layers.py: VocabParallelEmbedding.forward — F.embedding "
                                 "keeps the masked int64 token ids (not modelled: b·s·8 bytes)"),
    "layernorm": SaveRule(saves=("in:x", "extra:mu", "extra:rsigma"),
                          source=f"{TE_LNL}; {TE}/ops/basic/layer_norm.py: LayerNorm.op_forward saves x, means, rstdevs"),
    "rmsnorm": SaveRule(saves=("in:x", "extra:rsigma"), source=f"{TE_LNL}; {TE_NORM}"),
    "l2norm": SaveRule(saves=("in:x", "extra:rsigma"),
                       source=f"{MC}/transformer/torch_norm.py: L2Norm._norm under jit_fuser (torch.compile from "
                              "PyTorch 2.2): `x.float() * rsqrt(mean(x²) + eps)` cast back, its backward graph "
                              "keeping the input and the per-row rsqrt (the upcast and product recomputed)"),
    "latent_norm": SaveRule(saves=("in:x", "extra:rsigma"),
                            source=f"{MC}/transformer/multi_latent_attention.py: MLASelfAttention — q/kv layernorm "
                                   "fused into linear_q_up_proj / linear_kv_up_proj (TELayerNormColumnParallelLinear; "
                                   f"kv_compressed is a split view of kv_combined); {TE_LNL}"),
    "linear": SaveRule(saves=("in:_save",), wgrad=("in:_save",),
                       source=f"{TE}/module/linear.py: _Linear.forward saves inputmat (the local SP shard, "
                              f"re-gathered for wgrad); {MC}/tensor_parallel/layers.py: "
                              "LinearWithGradAccumulationAndAsyncCommunication saves input (output layer); "
                              f"{MOE_UTILS}: RouterGatingLinearFunction saves inp"),
    "grouped_linear": SaveRule(saves=("in:_save",), wgrad=("in:_save",),
                               source=f"{TE}/module/grouped_linear.py: _GroupedLinear.forward saves inputmats "
                                      "(torch.split views of the input); "
                                      f"{MC}/transformer/moe/experts.py: TEGroupedMLP.forward"),
    **{rule: SaveRule(saves=("extra:x_fp8", "extra:x_scale_inv"), wgrad=("extra:x_fp8", "extra:x_scale_inv"),
                      source=f"{TE}/module/linear.py: _Linear.forward (layernorm_linear.py: _LayerNormLinear, "
                             "grouped_linear.py: _GroupedLinear alike) under fp8 saves the quantized input — "
                             "column-wise only, or the local row-wise shard under the SP all-gather — and its "
                             "scale_inv (graph/families/fp8.py), TE v2.2 … v2.16")
       for rule in ("fp8_linear", "fp8_grouped_linear")},
    "flash_attn": SaveRule(saves=("in:q", "in:k", "in:v", "out:y", "extra:lse", "extra:rng_state", "extra:kv_p2p",
                                  "extra:rng_state_step*"),
                           # TE's FlashAttention backend only (the op builder gives no scratch to FusedAttention,
                           # whose cuDNN workspace sizes are not readable from open source)
                           backward_scratch=FLASH_BWD_SCRATCH,
                           source=f"{TE}/attention/dot_product_attention/backends.py: FusedAttnFunc.forward saves "
                                  "q, k, v, out and aux_ctx_tensors = softmaxStats [b, h, s_q, 1] fp32 and "
                                  f"rng_state [2] ({TE}/cpp_extensions/fused_attn.py: fused_attn_fwd); with cp > 1 "
                                  f"{TE}/attention/dot_product_attention/context_parallel.py: AttnFuncWithCPAndKVP2P."
                                  "forward saves q, kv = the last p2p_comm_buffers entry (torch.cat of k and v), out, "
                                  "softmax_lse (q's storage keeps the QKV projection's output alive) and *rng_states, "
                                  "one [2] int64 per ring step (cp_p2p_fwd_flash_attn: flash-attn 2.7's "
                                  "_flash_attn_forward returns rng_state at [3]; cp_p2p_fwd_fused_attn: "
                                  "aux_ctx_tensors), at TE 2.6 … 2.14 (rev 71bbefb)"),
    "dropout": SaveRule(saves=("extra:mask",),
                        source=f"{MC}/fusions/fused_bias_dropout.py: _bias_dropout_add_func — F.dropout(x + bias, p) "
                               "keeps its bool mask (1 B per element; native_dropout); with p = 0 torch's _dropout "
                               "returns its input and keeps nothing (no op is built); the embedding's dropout "
                               f"({MC}/models/common/embeddings/language_model_embedding.py) likewise"),
    # TE UnfusedDotProductAttention (--attention-backend unfused) and Megatron's local DotProductAttention
    # (--transformer-impl local) materialise the s² scores
    "attn_scores": SaveRule(saves=("in:q", "in:k"),
                            source=f"{TE}/attention/dot_product_attention/backends.py: UnfusedDotProductAttention."
                                   "forward — torch.baddbmm(q, kᵀ) keeps q and k; "
                                   f"{MC}/transformer/dot_product_attention.py: DotProductAttention.forward"),
    "softmax": SaveRule(saves=("out:y",),
                        source=f"{TE}/attention/dot_product_attention/softmax.py: FusedScaleMaskSoftmax "
                               "(ScaledUpperTriangMaskedSoftmax / ScaledMaskedSoftmax) keeps its bf16 output "
                               f"[b, a/tp, s_q, s_k]; {MC}/fusions/fused_softmax.py likewise"),
    "te_torch_softmax_masked": SaveRule(
        saves=("out:y",), backward_scratch=("in:x",),
        source=f"{TE}/attention/dot_product_attention/softmax.py: FusedScaleMaskSoftmax.forward_torch_softmax "
               "(v1.11 … v2.18) — torch.nn.Softmax on the fp32 copy keeps its fp32 output; the mask before it is "
               "utils.py: attention_mask_func, `masked_fill_` in place, whose backward (derivatives.yaml "
               "masked_fill_.Scalar: `grad.masked_fill(mask, 0)`) makes a second fp32 gradient of the scores' shape "
               "while the softmax's is alive"),
    "te_fused_softmax": SaveRule(
        saves=("out:y",), grad_in_place=("in:x", "out:y"),
        source=f"{TE}/attention/dot_product_attention/softmax.py: FusedScaleMaskSoftmax.forward_fused_softmax "
               "(ScaledMaskedSoftmax / ScaledSoftmax) keeps its bf16 output; their backward "
               "(csrc/extensions/softmax.cpp: scaled_masked_softmax_backward, \"Produce gradients in place.\", "
               "NVIDIA/TransformerEngine v1.11 … release_v2.18) writes the scores' gradient into the "
               "probabilities' gradient and returns it (TE main 0c8cf2c03, 2026-07-24, allocates it fresh)"),
    "attn_dropout": SaveRule(saves=("extra:mask",),
                             source=f"{TE}/attention/dot_product_attention/backends.py: UnfusedDotProductAttention."
                                    "forward — self.attention_dropout(attention_probs) (torch.nn.Dropout) keeps "
                                    "its 1-byte mask; absent with attention_dropout = 0"),
    "attn_v": SaveRule(saves=("in:p", "in:v"),
                       source=f"{TE}/attention/dot_product_attention/backends.py: UnfusedDotProductAttention.forward "
                              "— torch.bmm(attention_probs, v) keeps the (dropped) probabilities and v"),
    "gelu": SaveRule(saves=("in:x",), source=f"{MC}/fusions/fused_bias_gelu.py: GeLUFunction saves input (and bias)"),
    "weighted_act": SaveRule(saves=("in:x", "extra:act", "in:probs"),
                             source=f"{MC}/transformer/moe/experts.py: TEGroupedMLP.forward bias_act_func (unfused, "
                                    "non-gated) and SequentialMLP → MLP.forward(per_token_scale) — "
                                    "activation_func(x) keeps x; `* permuted_probs.unsqueeze(-1)` keeps the "
                                    "activation's output and the probs"),
    "weighted_squared_relu": SaveRule(
        saves=("in:x", "in:probs"),
        source="NVIDIA/Megatron-LM@core_v0.17.0:megatron/core/fusions/fused_weighted_squared_relu.py: "
               "WeightedSquaredReLUFunction.forward `ctx.save_for_backward(input, weights)` (5df6dbe8ee on), which "
               "moe/experts.py: TEGroupedMLP.bias_act_func runs for squared ReLU with --use-fused-weighted-squared-relu "
               "(and no bias_activation_fusion); the unfused path keeps relu's output and the product too"),
    "weighted_act_compiled": SaveRule(
        saves=("in:x", "in:probs"),
        source=f"{MC}/transformer/moe/experts.py: GroupedMLP.forward (Megatron-LM 2659630721 … core_r0.16) — "
               "activation_func_with_probs (activation_func(x) * probs, cast back) is jit_fuser = torch.compile "
               "(core/jit.py, torch >= 2.2), whose AOTAutograd partition keeps x and probs and recomputes the "
               "activation in the backward (read off the traced graphs of torch 2.2.0, 2.5.1 and 2.13.0)"),
    "squared_relu": SaveRule(saves=("extra:relu",),
                             source=f"{MC}/transformer/mlp.py: MLP.forward with activation_func = squared_relu "
                                    f"({MC}/activations.py: torch.pow(F.relu(x), 2)) — relu keeps its result, "
                                    "which pow keeps as its input; fc1's output is not kept"),
    "swiglu_ops": SaveRule(saves=("in:x", "extra:silu"),
                           source=f"{MC}/transformer/mlp.py: MLP.forward without bias_activation_fusion "
                                  "(--no-bias-swiglu-fusion) — glu: torch.chunk(x, 2, -1) views; F.silu(x[0]) keeps "
                                  "its view of the fc1 output (the whole output), F.silu(x[0]) * x[1] keeps silu's "
                                  "output and the up view; the legacy model's ParallelMLP swiglu "
                                  "(megatron/legacy/model/transformer.py) the same"),
    "weighted_swiglu_ops": SaveRule(saves=("in:x", "extra:silu", "extra:glu", "in:probs"),
                                    source="NVIDIA/Megatron-LM@core_v0.17.0:megatron/core/transformer/moe/experts.py: "
                                           "TEGroupedMLP.bias_act_func without bias_activation_fusion — glu keeps the "
                                           "fc1 output (views) and silu's output, `* permuted_probs` keeps the "
                                           "product and the probs"),
    "swiglu": SaveRule(saves=("in:x",), source=f"{MC}/fusions/fused_bias_swiglu.py: SwiGLUFunction.forward saves "
                                               "the fc1 output (MLP.forward, bias_activation_fusion)"),
    "weighted_swiglu": SaveRule(saves=("in:x", "in:probs"),
                                source=f"{MC}/fusions/fused_bias_swiglu.py: WeightedSwiGLUFunction.forward saves "
                                       "input and weights (permuted_probs.unsqueeze(-1), the probs' dtype); "
                                       f"{MC}/transformer/moe/experts.py: TEGroupedMLP.forward"),
    "rope": SaveRule(source=f"{TE}/attention/rope.py: FusedRoPEFunc saves freqs; {MC}/fusions/"
                            "fused_mla_yarn_rope_apply.py: ApplyMLARotaryEmbQ/KV save cos, sin"),
    "add": SaveRule(source="residual add keeps nothing"),
    "distribute_saved": SaveRule(source=f"{MC}/tensor_parallel/random.py: CheckpointFunction.forward — "
                                        "split_tensor_into_1d_equal_chunks(new_buffer=True) copies this rank's "
                                        "1/tp of the checkpoint's input into a new buffer under no gradient; the "
                                        "checkpoint keeps that chunk (graph/analysis.py)"),
    "jitter_sample": SaveRule(source=f"{MC}/transformer/moe/router.py: apply_input_jitter — Uniform(1 - eps, "
                                     "1 + eps).rsample(input.shape) (torch/distributions/uniform.py: low + rand · "
                                     "(high - low)) under no gradient: its rand and product die at once"),
    "jitter_mul": SaveRule(saves=("in:noise",), source=f"{MC}/transformer/moe/router.py: `input * noise` — "
                                                       "MulBackward0 keeps the noise (the input's gradient needs it)"),
    "times_probs": SaveRule(saves=("in:x", "in:probs"), source=f"{MC}/transformer/moe/experts.py: "
                            "`permuted_probs * permuted_local_hidden_states` under moe_apply_probs_on_input (4ca43093f8 "
                            "on), bias_act_func's `activation_func(x) * permuted_probs` under use_te_activation_func "
                            "(core_v0.15.0 on): MulBackward0 keeps both (each takes a gradient), the product in the "
                            "promoted dtype"),
    "ones_like": SaveRule(source=f"{MC}/transformer/moe/experts.py: `torch.ones_like(permuted_probs)` (no gradient)"),
    "scale": SaveRule(source=f"{MC}/models/common/embeddings/language_model_embedding.py and language_module/"
                             "language_module.py: _scale_logits under use_mup — `x * mult` with a Python float "
                             "(torch derivatives.yaml mul.Scalar: MulBackward1 keeps nothing), a new tensor"),
    "shared_gate": SaveRule(saves=("in:x", "extra:sigmoid"),
                            source="NVIDIA/Megatron-LM@core_v0.17.0:megatron/core/transformer/moe/shared_experts.py: "
                                   "SharedExpertMLP.forward with --moe-shared-expert-gate (bddd0a8ed7): "
                                   "`logits = F.linear(hidden_states, self.gate_weight)` on the SP rows, "
                                   "`gate_score = sigmoid(logits)`, `output = output * gate_score` — MulBackward0 "
                                   "keeps the shared expert's output and the score (SigmoidBackward0's result too); "
                                   "the logits die with the sigmoid"),
    "output_gate": SaveRule(saves=("in:x", "in:gate"),
                            source=f"{MC}/transformer/attention.py: Attention._apply_output_gate, jit_fuser = "
                                   "torch.compile (core/jit.py, torch >= 2.2): x · sigmoid(gate.float()) cast back; "
                                   "its backward needs x and sigmoid(gate), and AOTAutograd's min-cut partition "
                                   "keeps the two bf16 inputs (the gate a view of mixed_qkv) and recomputes the "
                                   "fp32 sigmoid rather than keep it"),
    "batch": SaveRule(source="NVIDIA/Megatron-LM pretrain_gpt.py: get_batch → megatron/training/utils.py: "
                             "get_batch_on_this_tp_rank (the batch on the device for the forward step), "
                             f"{MC}/utils.py: get_batch_on_this_cp_rank; autograd keeps none of it"),
    "copy": SaveRule(source=f"{MC}/tensor_parallel/mappings.py: _gather_along_first_dim copies its input "
                            f"contiguous; {TE}/attention/dot_product_attention/backends.py: FlashAttention.forward's "
                            "sbhd ↔ bshd transposes (.contiguous()); a copy keeps nothing"),
    "random_logits": SaveRule(source=f"{MOE_UTILS}: RandomSTE.forward — logits.clone().normal_() under "
                                     "--moe-router-force-load-balancing (router.py: TopKRouter.forward, "
                                     "apply_random_logits; core_v0.13.0 … d98e8a64dd); its backward passes the "
                                     "gradient through and keeps nothing"),
    "router_score": SaveRule(saves=("extra:scores",),
                             source=f"{MOE_UTILS}: topk_routing_with_score_function — sigmoid: "
                                    "torch.sigmoid(logits.float()) saves its fp32 result [tokens, E]; softmax: "
                                    "torch.softmax(top-k logits, dtype=fp32) saves its result [tokens, k]"),
    "topk": SaveRule(saves=("in:x", "out:idx", "extra:denominator", "extra:raw_weights"),
                     source=f"{MOE_UTILS}: topk_routing_with_score_function (sigmoid) — torch.gather(scores, 1, "
                            "top_indices) saves scores (cast to the logits dtype; fp32 from Megatron-LM eb80b74, "
                            "core_v0.18.0, which casts only the final probs) and the int64 indices; "
                            "scores / (scores.sum(-1) + 1e-20) saves both; the group-limited top-k keeps nothing"),
    "fused_topk": SaveRule(saves=("out:idx", "extra:intermediate"),
                           source="NVIDIA/TransformerEngine@v2.12:transformer_engine/pytorch/router.py: "
                                  "FusedTopkScoreFunction.forward `ctx.save_for_backward(routing_map, "
                                  "intermediate_output)` — csrc/extensions/router.cpp makes probs and the intermediate "
                                  "[tokens, E] in the logits' dtype and the bool routing map; Megatron-Core's "
                                  "topk_routing_with_score_function(fused=True) returns TE's probs and map"),
    "topk_softmax": SaveRule(saves=("out:idx",),
                             source=f"{MOE_UTILS}: topk_routing_with_score_function (softmax) — torch.topk on "
                                    "the logits saves the int64 indices"),
    "permute": SaveRule(saves=("extra:sorted_idx", "extra:probs_t", "extra:routing_map_t"),
                        source=f"{MOE_UTILS}: permute() — tokens.index_select saves sorted_indices [tokens·k] "
                               "int64; probs.T.contiguous().masked_select(routing_map) saves the transposed probs "
                               f"and bool map [E, tokens]; {MC}/transformer/moe/token_dispatcher.py: "
                               "MoEAlltoAllTokenDispatcher.dispatch_preprocess"),
    "sinkhorn_sigmoid": SaveRule(saves=("out:y",),
                                 source=f"{MC}/transformer/moe/router.py: TopKRouter.sinkhorn_load_balancing — "
                                        "_sinkhorn_activation with topk = 1: torch.sigmoid(logits) saves its result "
                                        "[tokens, E] in the logits' dtype (the fp32 sinkhorn() and its topk run "
                                        "under no_grad and keep nothing); with topk > 1 torch.softmax(logits, "
                                        "dtype=fp32) saves its fp32 result (the router_score rule)"),
    "sinkhorn_mask": SaveRule(saves=("out:idx",),
                              source=f"{MC}/transformer/moe/router.py: TopKRouter.sinkhorn_load_balancing — "
                                     "scores = logits * map saves the bool map [tokens, E] (zeros_like(logits)"
                                     ".int().scatter(1, indices, 1).bool(); the activation is kept already)"),
    "allgather_permute": SaveRule(saves=("extra:sorted_idx", "extra:row_id_map", "extra:probs_t",
                                         "extra:routing_map_t"),
                                  source=f"{MC}/transformer/moe/token_dispatcher.py: MoEAllGatherTokenDispatcher."
                                         "dispatch_postprocess — permute(hidden_states, local_map): index_select "
                                         "keeps sorted_indices [rows] int64 (not the gathered tokens, which live in "
                                         "the GlobalMemoryBuffer: token_dispatch, use_global_buffer=True); "
                                         "local_probs.T.contiguous().masked_select(local_map.T.contiguous()) keeps "
                                         "the transposed local probs and bool map [E_local, tokens·etp·ep]; with "
                                         f"--moe-permute-fusion {TE_PERM}: moe_permute (no probs) keeps the int32 "
                                         "row_id_map [tokens·etp·ep, 2·E_local + 1] instead of sorted_indices"),
    "sort_chunks": SaveRule(saves=("extra:row_id_map",),
                            source=f"{MOE_UTILS}: sort_chunks_by_idxs — torch.split + torch.cat keep nothing "
                                   "(token_dispatcher.py: dispatch_postprocess / combine_preprocess); with "
                                   f"--moe-permute-fusion {TE_PERM}: _moe_chunk_sort saves the int32 [rows] map "
                                   "of triton/permutation.py make_chunk_sort_map"),
    "unpermute": SaveRule(source=f"{MOE_UTILS}: unpermute() — scatter_add_ saves sorted_indices (kept by permute)"),
    "unpermute_index_add": SaveRule(
        saves=("in:x",),
        source=f"{MOE_UTILS}: unpermute() — under torch.are_deterministic_algorithms_enabled() "
               "output_tokens.index_add_(0, sorted_indices, permuted_tokens), whose IndexAddBackward0 keeps "
               "source (pytorch tools/autograd/derivatives.yaml index_add: grad.index_select(dim, index)"
               ".expand_as(source)) — the experts' output rows"),
    "fused_permute": SaveRule(saves=("extra:row_id_map",),
                              source=f"{MOE_UTILS}: permute(fused=True) → {TE_PERM}: moe_permute_with_probs → "
                                     "_moe_permute_mask_map.forward saves row_id_map (triton/permutation.py "
                                     "make_row_id_map: int32 [tokens, 2·E + 1]); the permuted probs come out of "
                                     "the kernel (no transposed copies kept)"),
    "fused_unpermute": SaveRule(source=f"{MOE_UTILS}: unpermute(fused=True) → {TE_PERM}: moe_unpermute → "
                                       "_moe_unpermute_mask_map.forward without merging probs saves row_id_map "
                                       "(kept by the permute) and pad_offsets (None)"),
    "z_loss": SaveRule(saves=("in:x", "extra:logsum", "extra:loss"),
                       source=f"{MC}/transformer/moe/router.py: TopKRouter.apply_z_loss (moe_z_loss_coeff is not "
                              f"None) → {MOE_UTILS}: z_loss_func — torch.logsumexp(logits) keeps logits and its "
                              "[tokens] result, torch.square keeps the same result; MoEAuxLossAutoScaler keeps "
                              "the 0-d loss"),
    "aux_loss": SaveRule(saves=("extra:scores", "extra:denominator", "extra:tokens_per_expert", "extra:loss"),
                         source=f"{MC}/transformer/moe/router.py: TopKRouter.routing (is_aux_loss_enabled) → "
                                f"{MOE_UTILS}: compute_routing_scores_for_aux_loss — softmax(logits, "
                                "dtype=fp32) keeps its [tokens, E] result (sigmoid: sigmoid(logits.float()) and "
                                "the division by its [tokens, 1] sum keep both); switch_load_balancing_loss_func "
                                "— the product with the int64 [E] tokens_per_expert keeps them; "
                                "MoEAuxLossAutoScaler keeps the 0-d loss (aux_loss, seq_aux_loss and "
                                "global_aux_loss alike)"),
    "ce_loss": SaveRule(saves=("extra:exp_logits", "extra:target_mask", "extra:masked_target"),
                        source=f"{MC}/tensor_parallel/cross_entropy.py: _VocabParallelCrossEntropy.forward saves "
                               "exp_logits (fp32), target_mask, masked_target_1d (also "
                               f"{MC}/fusions/fused_cross_entropy.py)"),
    "ce_loss_compiled": SaveRule(saves=("extra:exp_logits", "extra:target_mask", "extra:masked_target"),
                                 backward_scratch=("extra:exp_logits",),
                                 source=f"{MC}/fusions/fused_cross_entropy.py: _VocabParallelCrossEntropy (the "
                                        "--cross-entropy-fusion-impl native path of language_module.py: "
                                        "compute_language_model_loss) saves exp_logits, target_mask, masked_target_1d "
                                        "as the unfused loss; its steps are jit_fuser = torch.compile (core/jit.py, "
                                        "torch >= 2.2). calculate_gradients mutates the saved softmax through a view "
                                        "(grad_2d[arange_1d, masked_target_1d] -= softmax_update): Inductor's "
                                        "functionalised kernel scatters into a fresh fp32 [N, V] copy, writes the "
                                        "result back into the softmax and returns a fresh bf16 gradient (read off "
                                        "torch 2.13's generated code: buf0 fp32 [N, V], buf2 bf16 [s, b, V])"),
    "ce_loss_inplace": SaveRule(saves=("in:x",),
                                source=f"{TE}/cross_entropy.py: CrossEntropyFunction.forward — "
                                       "triton cross_entropy_forward writes the gradient into the bf16 logits in "
                                       "place and saves them (--cross-entropy-fusion-impl te; "
                                       f"{MC}/models/common/language_module/language_module.py: "
                                       "compute_language_model_loss → te_parallel_cross_entropy)"),
    "concat": SaveRule(source="a concatenation keeps nothing"),
    "comm": SaveRule(source="collectives keep nothing (buffers come from the caller's stream)"),
}

#: the base rules (Megatron-Core 0.14, TE 2.6); the profile adds the GPT-OSS rules under names of their own
BASE = SaveRules(name="megatron", rules=RULES)

PARAMS = ParamRules(mla_q_rope_tp_split=True, final_norm=True, router_bias=True, shared_experts_tp_split=True,
                    expert_state_group="routed", vocab_pad=128, mtp_embedding=True, mtp_eh_proj_tp_split=True,
                    mtp_modules=True)

STRUCTURE = Structure(attention="flash", dropout=False, fused_norm_linear=True, moe_tokens="routed",
                      mla_latent_sp=True, full_recompute_moe_split=False, swiglu_extra=False,
                      mla_kv_combined=True, megatron_moe=True, model_dropout=True,
                      # --qk-layernorm: q_layernorm / k_layernorm (TENorm over head_dim) on q and k per head,
                      # MC transformer/attention.py: SelfAttention.get_query_key_value_tensors
                      qk_norm=True,
                      # MC transformer/attention.py: SelfAttention.get_query_key_value_tensors — mixed_qkv is
                      # one linear_qkv output [s, b, ng·(np/ng + 2)·hn]; query, key and value are its
                      # torch.split / TE SplitAlongDim views, and SelfAttention.forward holds `value` until
                      # it returns (after linear_proj)
                      qkv_views=True, qkv_gather_above_kv=True,
                      # MC tensor_parallel/layers.py: VocabParallelEmbedding.forward — F.embedding (or
                      # weight[masked_input] in deterministic mode) returns a dense weight gradient that
                      # MC distributed/distributed_data_parallel.py's grad hook adds into main_grad and drops
                      # (gradient-accumulation fusion covers linears only)
                      embedding_wgrad=True,
                      # MC transformer/moe/shared_experts.py: SharedExpertMLP — --moe-shared-expert-gate scales the
                      # shared experts' output by sigmoid(F.linear(x, gate_weight)) (the "shared_gate" rule)
                      shared_expert_gate=True)


def configure(table: Structure, spec: FrameworkSpec) -> Structure:
    """The structure as a run's ``[framework]`` configures Megatron-Core: TE's unfused attention and
    Megatron's local attention materialise the s² tensors (``attention = "eager"``); the local
    implementation (``--transformer-impl local``: ``get_gpt_layer_local_spec``) keeps norms apart
    from the linears after them (``FusedLayerNorm`` then ``ColumnParallelLinear``, which saves the
    norm's output)."""
    local = spec.transformer_impl == "local"
    eager = spec.attention_backend in ("unfused", "local") or local
    # TE attention/dot_product_attention/backends.py (v2.6, unchanged to v2.17): FlashAttention.forward
    # turns sbhd q, k, v into ``x.transpose(0, 1).contiguous()`` copies for flash-attn (which keeps them, its
    # bshd output, softmax_lse and rng_state: flash_attn_interface.py FlashAttnFunc.forward) and returns
    # ``output.view(b, s, -1).transpose(0, 1)...contiguous()``, a new sbhd tensor the output projection
    # keeps; FusedAttnFunc keeps Megatron's sbhd views and returns the output the projection keeps
    flash_copies = spec.attention_backend == "flash" and not eager
    fused = table.fused_norm_linear and not local
    # transformer/dot_product_attention.py → fusions/fused_softmax.py: FusedScaleMaskSoftmax.forward_torch_softmax
    # (masked_softmax_fusion off) upcasts the scores, keeps torch.softmax's fp32 output and casts it back
    fp32 = (local or spec.attention_backend == "local") and not spec.masked_softmax_fusion \
        and spec.attention_softmax_in_fp32
    # TE's unfused attention (UnfusedDotProductAttention.scale_mask_softmax): its fused kernels' backward works in
    # place up to release_v2.18 (rule "te_fused_softmax"); Megatron's own FusedScaleMaskSoftmax (local attention
    # or impl: Apex's kernels, not read here) keeps the plain rule
    te_softmax = spec.attention_backend == "unfused" and not local and version_tuple(spec.transformer_engine)[:2] <= (2, 18)
    ce = spec.cross_entropy_fusion == "te"
    compiled = spec.cross_entropy_fusion == "native"
    wgrad = wgrad_rule(spec)
    # MC transformer/moe/token_dispatcher.py: MoEAllGatherTokenDispatcher, MoEFlexTokenDispatcher (its DeepEP /
    # HybridEP buffers are outside PyTorch's allocator: profiles/megatron_flex.py); MC transformer/moe/router.py:
    # TopKRouter.routing → sinkhorn_load_balancing for --moe-router-load-balancing-type sinkhorn
    dispatcher = spec.moe_token_dispatcher if spec.moe_token_dispatcher in ("allgather", "flex") \
        else table.moe_dispatcher
    router = "sinkhorn" if spec.moe_router_load_balancing == "sinkhorn" else table.moe_router
    moe = moe_switches(spec)
    # TE FlashAttention passes deterministic (NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 or torch's deterministic
    # algorithms, dot_product_attention.py: DotProductAttention.__init__) to flash-attn 2's backward
    flash_bwd = ("fa2_deterministic" if spec.deterministic else "fa2") if flash_copies else ""
    # MC tensor_parallel/layers.py: LinearWithGradAccumulationAndAsyncCommunication (GPTModel's output layer is a
    # ColumnParallelLinear under every --transformer-impl) all-gathers its SP input, forward and for the wgrad,
    # into GlobalMemoryBuffer ("mpu"), which profiles/megatron_workspaces.py places when workspaces are on
    # MC transformer/mlp.py and moe/experts.py (core_v0.15.0 … d98e8a64dd): a TE activation module where the layer
    # spec has one (the transformer_engine specs), before any fused or unfused activation path
    te_act = spec.te_activation_func and spec.transformer_impl == "transformer_engine" and not spec.use_legacy_models
    out = replace(table, attention="eager" if eager else table.attention, flash_bwd=flash_bwd, fused_norm_linear=fused, softmax_fp32=fp32,
                   te_softmax=te_softmax, te_torch_softmax=spec.attention_backend == "unfused" and not local,
                   te_frozen_ln_out=version_tuple(spec.transformer_engine)[:2] < (1, 6),
                   ce_inplace=ce, ce_compiled=compiled, wgrad_transient=wgrad, moe_dispatcher=dispatcher, moe_router=router,
                   te_flash_copies=flash_copies, te_qkv_layout=not local, dataloader_batch=spec.dataloader_batch,
                   rerun_keeps_batch=spec.rerun_keeps_batch, head_gather_buffer=spec.workspaces,
                   cp_comm=spec.cp_comm_type, cp_a2a=spec.cp_a2a_size, delay_wgrad=spec.delay_wgrad_compute,
                   # MC transformer/mlp.py: MLP.forward and moe/experts.py: bias_act_func without
                   # bias_activation_fusion (--no-bias-swiglu-fusion): the glu as torch ops
                   # (TE's activation modules, --use-te-activation-func, come first: they keep their input alone)
                   swiglu_ops=(table.swiglu_ops or not spec.bias_swiglu_fusion) and not te_act,
                   te_activation_func=te_act, qk_l2_norm=spec.qk_l2_norm,
                   # MC ssm/gated_delta_net.py (20d66d5c7b … d98e8a64dd): config.deterministic_mode runs the conv
                   # and the chunked rule as torch ops (torch_chunk_gated_delta_rule), fla is not deterministic
                   gdn_torch=spec.deterministic_algorithms, **moe)
    # the legacy GPT model (megatron/legacy/model) runs as the local layer but for its torch-op RMSNorm and SwiGLU
    out = megatron_bert.configure(out, spec)
    return megatron_legacy.configure(out, local=local, flash=spec.legacy_flash_attn) if spec.use_legacy_models \
        else out


#: Megatron-LM eb80b74 (2026-04-14, "[MoE] Add a new score function to the router", first in core_v0.18.0):
#: moe_utils.py topk_routing_with_score_function keeps the sigmoid scores in fp32 through the gather and the
#: normalisation and casts only the probs (``probs.type_as(logits)``); core_v0.14.0 cast the sigmoid and the
#: gathered scores to the logits dtype first
ROUTER_FP32_TOPK = (0, 18)

#: Megatron-LM 56818f9e50 (2025-10-16, "Moe padding inference", on main during 0.15.0rc8, in core_r0.15.0):
#: moe_utils.py ``unpermute`` runs ``output_tokens.index_add_`` under
#: ``torch.are_deterministic_algorithms_enabled()``; before it (core_r0.12.0 … core_r0.14.0, and main's
#: cb12e3dea4 / 194b2be238 of 2025-04/05) the unfused unpermute always ran ``scatter_add_``, which keeps only
#: the index. A version string of main's 0.15.0rcN (2025-08-18 to 10-21) reads as before it
UNPERMUTE_INDEX_ADD = (0, 15, 0)
#: Megatron-LM ac0474d26e "MoE Refactoring - Switch to mask-based routing for MoE" (2024-10-29, first in
#: core_v0.10.0): the router's dense probs and bool routing map. A version string of main's 0.10.0rc0 (to
#: 2025-02-13) reads as before it
MASK_ROUTING = (0, 10, 0)


def moe_switches(spec: FrameworkSpec) -> dict[str, Any]:
    """The MoE ``Structure`` switches ``[framework]`` sets (router dtype, aux loss, permute fusion, the
    deterministic unpermute).

    MC transformer/moe/router.py: ``TopKRouter.gating`` → moe_utils.py ``router_gating_linear`` returns the
    logits in ``--moe-router-dtype``; ``TopKRouter.routing`` computes the aux-loss scores only when
    ``is_aux_loss_enabled()`` (an aux-loss type whose coefficient is > 0: the run file's aux-loss types say
    so, from-megatron writes ``"none"`` for a coefficient of 0). ``apply_z_loss`` (whenever
    ``moe_z_loss_coeff is not None``: ``[framework] moe_z_loss``). moe_utils.py ``permute`` / ``unpermute`` / ``sort_chunks_by_idxs``
    call TE's fused kernels under ``--moe-permute-fusion``; the unfused ``unpermute`` uses ``index_add_`` when
    ``torch.are_deterministic_algorithms_enabled()`` (megatron/training/arguments.py: ``--deterministic-mode``
    calls ``torch.use_deterministic_algorithms(True)``), whose autograd node keeps ``source`` (PyTorch
    tools/autograd/derivatives.yaml ``index_add``: ``grad.index_select(dim, index).expand_as(source)``;
    ``IndexAddBackward0._saved_source`` on 2.13; the formula dates from pytorch#72777, 2022) — from
    Megatron-Core 0.15.0 on (:data:`UNPERMUTE_INDEX_ADD`; ``scatter_add_`` before). Before Megatron-LM
    2659630721 (``[framework] moe_probs_in_experts = false``) the combine multiplies the routing probs into the
    experts' output (graph/families/moe_combine.py)."""
    aux = spec.moe_router_load_balancing in ("aux_loss", "seq_aux_loss", "global_aux_loss")
    index_add = (spec.deterministic_algorithms and not spec.moe_permute_fusion
                 and version_tuple(spec.megatron_core) >= UNPERMUTE_INDEX_ADD)
    return {"moe_router_dtype": spec.moe_router_dtype, "moe_random_logits": spec.moe_router_force_load_balancing,
            "moe_input_jitter": spec.moe_input_jitter, "moe_probs_on_input": spec.moe_apply_probs_on_input,
            "moe_pre_norm_recompute": not router_graph_drops_norm_recompute(spec),
            "moe_aux_loss": aux, "moe_z_loss": spec.moe_z_loss,
            "moe_router_fp32_topk": version_tuple(spec.megatron_core) >= ROUTER_FP32_TOPK,
            "moe_permute_fusion": spec.moe_permute_fusion, "moe_unpermute": "index_add" if index_add else "scatter_add",
            "moe_flex_backend": spec.moe_flex_backend, "moe_nvlink_domain": spec.nvlink_domain,
            "moe_probs_at_combine": not spec.moe_probs_in_experts,
            "moe_mask_routing": version_tuple(spec.megatron_core) >= MASK_ROUTING,
            "moe_act_compiled": legacy_grouped_mlp(spec) and version_tuple(spec.pytorch)[:2] >= COMPILED_FROM,
            "moe_squared_relu_fused": spec.fused_weighted_squared_relu, "moe_router_fused": spec.moe_router_fusion}


def router_graph_drops_norm_recompute(spec: FrameworkSpec) -> bool:
    """Whether Megatron turns off the "layernorm" recompute of MoE layers' pre-MLP norm: under a TE ``moe_router``
    CUDA graph, unless ``moe_preprocess`` with the alltoall dispatcher (or a latent MoE) keeps the norm's output
    inside the graph — else the norm's output is a static graph output it cannot release
    (``transformer_layer.py: can_recompute_pre_mlp_layernorm_for_cudagraph``, 4e85d74ae9; a warning, not an
    error). The recompute inside a graph that the other case keeps is refused (``spec/cuda_graph_rules.py``)."""
    mods = scope_modules(spec.cuda_graph_scope)
    return spec.cuda_graph_impl == "transformer_engine" and "moe_router" in mods and not (
        "moe_preprocess" in mods and spec.moe_token_dispatcher == "alltoall")


def wgrad_rule(spec: FrameworkSpec) -> str:
    """Which weight-gradient GEMMs return a fresh weight-sized tensor ("all" | "head" | "none").

    Without gradient-accumulation fusion every linear's wgrad is a new tensor the DDP hook adds into
    ``main_grad`` (``MC/tensor_parallel/layers.py: LinearWithGradAccumulationAndAsyncCommunication.
    backward``; ``TE/module/linear.py: _Linear.backward``). With it, TE before 2.3 and Megatron's own
    linears before Megatron-LM e7c55de (2025-08, taken as Megatron-Core 0.15) return a fresh
    ``torch.empty`` placeholder of the weight's shape; TE from 2.3 returns its cached dummy
    (a persistent workspace, ``megatron_workspaces.dummy_wgrad_shapes``)."""
    te, mc = version_tuple(spec.transformer_engine), version_tuple(spec.megatron_core)
    if not spec.gradient_accumulation_fusion:
        return "all"
    if spec.transformer_impl == "local":
        return "all" if mc < (0, 15) else "none"
    if te < (2, 3):
        return "all"
    return "head" if mc < (0, 15) else "none"


#: Megatron-LM adc69dba (to 6e091e1b, unchanged) megatron/core/pipeline_parallel/schedules.py: forward_step
#: hands each micro-batch's received tensor to ``set_input_tensor``, which GPTModel.set_input_tensor passes to
#: transformer_block.py: TransformerBlock.set_input_tensor as ``self.input_tensor = input_tensor``; nothing
#: clears it, so the chunk's module holds the last tensor it was given until its next forward_step. That
#: tensor is the leaf ``torch.empty(..., requires_grad=True)`` of p2p_communication.py: _communicate's
#: create_tensor_recv_prev, and backward_step collects ``x.grad`` from it, so its gradient lives as long.
#: The schedules' loop variable ``input_tensor_grad`` (forward_backward_pipelining_without_interleaving's
#: 1F1B and cooldown loops, _with_interleaving's forward_backward_helper_wrapper results) also holds the
#: sent gradient until the next backward_step returns, or the schedule function does.
CHUNK_KEEPS_INPUT = ("Megatron-LM adc69dba megatron/core/transformer/transformer_block.py: "
                     "TransformerBlock.set_input_tensor (self.input_tensor, set per micro-batch by "
                     "pipeline_parallel/schedules.py: forward_step, never cleared); its .grad from backward_step, "
                     "also held by the schedules' input_tensor_grad until the next backward_step returns")

LIFECYCLE = Lifecycle("start", "start", "first_step",
                      "Megatron-Core param_and_grad_buffer.py, distrib_optimizer.py; torch Adam lazy state",
                      workspaces=persistent_workspaces, dp_buffers=True, chunk_keeps_input=CHUNK_KEEPS_INPUT,
                      first_call=first_call)

LIMITS = Limits(max_zero=1, instead="paper", zero_note="its distributed optimizer is zero = 1", squared_relu=True,
                reads_framework=True,
                # NVIDIA/TransformerEngine@v2.8 attention/dot_product_attention/utils.py
                # get_attention_backend: "Filter: Softmax type"
                sinks_cp_note="Transformer Engine 2.8 runs a learnable softmax under context "
                              "parallelism only with cp_comm_type = a2a, not the KV ring "
                              "this profile models")

PROFILE = Profile(name="megatron", params=PARAMS, saved=megatron_llava.extend(megatron_gdn.extend(megatron_bert.extend(megatron_mamba.extend(
    megatron_legacy.extend(megatron_combine.extend(megatron_flex.extend(megatron_gptoss.extend(BASE)))))))),
                  structure=STRUCTURE,
                  lifecycle=LIFECYCLE, limits=LIMITS, configure=configure)
