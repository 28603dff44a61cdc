"""The ``hf`` profile: Hugging Face transformers 5.x under plain PyTorch autograd — parameter rules,
saved-tensor rules, op structure, lifecycle and limits.

One device per replica, ``attn_implementation="sdpa"`` as a CUDA GPU runs it (cuDNN attention on
compute capability 9.0/10.0/10.3 from PyTorch 2.11, else the flash kernel for equal head dims ≤ 256 in
16 bits, both with GQA's k/v at kv-head width; else the memory-efficient kernel: each with its backward's
workspaces, :mod:`timeline.graph.families.sdpa`), ``grouped_mm`` experts, dropout only where the model has it (GPT-2), no KV cache. What
autograd keeps follows from the modelling code: RMSNorm in Python saves an fp32 copy of its input, the fp32 rstd and the 16-bit
normalised tensor; RoPE saves the shared cos/sin; DeepSeek attention saves the ``cat`` query,
the ``new_empty`` key, kv_b_proj's output (V is a view of it) and a ``.contiguous()`` copy of the
attention output; the router saves an fp32 copy of its input; experts save the permuted tokens,
gate/up, silu, product and down outputs, three int64 index vectors and the fp32 weights; the loss
saves the fp32 log-softmax and its backward adds NllLossBackward0's fp32 grad_input. The MLP's activation keeps what its
expression in transformers' ``activations.py`` keeps, for every ``ACT2CLS`` name (``spec/hf_activations.py``:
GPT-2's default ``gelu_new`` keeps x, tanh, 0.5·x and 1 + tanh). GPT-OSS (no SDPA: eager attention with learned sinks) saves q, k and v at
every query head's width, the int64 row-max indices and the (b, h, s, s + 1) softmax, o_proj's input
copy, an fp32 normalised tensor per norm, its router's top-k indices and 16-bit softmax of the k
logits, and the clamped SwiGLU's gate_up, clamped gate, sigmoid, glu and (up + 1). Measured facts: ``../shared/reference/groundtruth.md`` §4–5 (GT);
``tools/groundtruth.py`` measures them again and ``tests/graph/test_activations_hf.py`` compares.
Paths are in huggingface/transformers ``src/transformers`` and pytorch ``tools/autograd/derivatives.yaml``.

The modelling code runs as written, so the code facts of :class:`~timeline.spec.model.ModelSpec`
(GPT-2's fused ``c_attn`` and residual dropout, Mixtral/Qwen-MoE's softmax router, Qwen-MoE's top-k
weights cast to the logits' dtype, GPT-OSS's half-width RoPE and fp32 normalised tensor) shape the ops
(``Structure.model_code``). Lifecycle: weights from model construction, ``.grad`` tensors at the first
backward that reaches them, optimizer states at the first ``step()``; ZeRO 2/3 through FSDP or
DeepSpeed with DeepSpeed's buckets, PyTorch's cuBLAS workspaces (:func:`workspaces`). One device per
model replica.
"""

from __future__ import annotations

from collections.abc import Sequence

from timeline.profiles.base import (
    AT_OP,
    Lifecycle,
    Limits,
    ParamRules,
    ParamTensor,
    Profile,
    SaveRule,
    SaveRules,
    Structure,
)
from timeline.profiles.megatron_workspaces import torch_workspace_bytes
from timeline.spec.framework import FrameworkSpec
from timeline.spec.hf_activations import HF_ACTIVATIONS
from timeline.spec.model import ModelSpec
from timeline.spec.run import ParallelSpec, TrainingSpec

LLAMA = "models/llama/modeling_llama.py"
DSV3 = "models/deepseek_v3/modeling_deepseek_v3.py"
MOE = "integrations/moe.py grouped_mm_experts_forward"
GT = "groundtruth.md §4"
MIXTRAL = "models/mixtral/modeling_mixtral.py"
QWEN2_MOE = "models/qwen2_moe/modeling_qwen2_moe.py"
QWEN3 = "models/qwen3/modeling_qwen3.py"
GPT2 = "models/gpt2/modeling_gpt2.py"
GPT_OSS = "models/gpt_oss/modeling_gpt_oss.py"

RULES: dict[str, SaveRule] = {
    "embedding": SaveRule(saves=("extra:position_ids",),
                          source=f"{LLAMA} embed_tokens: EmbeddingBackward0 keeps only the token ids (not "
                                 f"modelled); {GPT2} GPT2Model: wpe(position_ids) keeps the int64 position ids"),
    "upcast": SaveRule(source=f"{LLAMA} LlamaRMSNorm: hidden_states.to(torch.float32) — the copy is saved by "
                              "the norm's pow/mul, not by the cast"),
    "rmsnorm": SaveRule(saves=("in:x", "extra:rsigma", "extra:normed", "extra:weight_offset"),
                        source=f"{LLAMA} LlamaRMSNorm: pow/mul save the fp32 input, rsqrt its fp32 result, "
                               f"weight * hidden_states.to(input_dtype) the normalised tensor ({GT}: 6sbh + 4sb); "
                               "models/gemma/modeling_gemma.py GemmaRMSNorm: output * (1.0 + self.weight.float()) "
                               "keeps the fp32 normalised tensor and the fp32 (1 + weight)"),
    "latent_norm": SaveRule(saves=("in:x", "extra:rsigma", "extra:normed"),
                            source=f"{DSV3} q_a_layernorm/kv_a_layernorm are DeepseekV3RMSNorm ({GT}: 6·q_lora, "
                                   "6·kv_lora)"),
    "layernorm": SaveRule(saves=("in:x", "extra:mu", "extra:rsigma"),
                          source="torch.nn.LayerNorm: NativeLayerNormBackward0 saves input, mean, rstd"),
    "linear": SaveRule(saves=("in:_save",), wgrad=("in:_save",),
                       source="torch.nn.Linear: MmBackward0 saves self (the input) for the weight gradient"),
    "grouped_linear": SaveRule(saves=("in:_save",), wgrad=("in:_save",),
                               source=f"{MOE}: GroupedMmBackward0 saves self (permuted tokens; product for down)"),
    "rope_cache": SaveRule(source=f"{LLAMA} LlamaRotaryEmbedding.forward: cos/sin once per forward, shared by "
                                  "all layers"),
    "rope": SaveRule(saves=("in:_cos", "in:_sin"),
                     source=f"{LLAMA} apply_rotary_pos_emb: q * cos + rotate_half(q) * sin — MulBackward0 saves "
                            f"cos and sin only ({GT}: +131,072 B on layer 0 of the small Llama)"),
    "flash_attn": SaveRule(saves=("in:q", "in:k", "in:v", "out:y", "extra:lse", "extra:rng_state",
                                  "extra:rng_unused", "extra:philox_seed", "extra:philox_offset"),
                           backward_scratch=("scratch:workspace", "scratch:softmax_d", "scratch:dq_accum",
                                             "scratch:dk_expanded", "scratch:dv_expanded"),
                           source="integrations/sdpa_attention.py (enable_gqa when use_gqa_in_sdpa); "
                                  "ScaledDotProduct{Cudnn,Flash,Efficient}AttentionBackward0 save q, k, v, output, "
                                  "logsumexp, philox rng state; the kernel's backward workspaces as "
                                  "graph/families/sdpa.py sizes them (cuDNN's dQ accumulator, flash's dq_accum)"),
    # GPT-OSS eager attention with sinks (graph/families/sinks.py); torch.matmul on 4-D tensors is bmm on views
    "attn_scores": SaveRule(saves=("in:q", "in:k"),
                            source=f"{GPT_OSS} eager_attention_forward: torch.matmul(query, key_states.transpose(2, "
                                   "3)) — BmmBackward0 saves the RoPE'd query and the repeat_kv'd key"),
    "mask": SaveRule(source="masking_utils.py create_causal_mask / create_sliding_window_causal_mask (eager): "
                            "built once per forward, kept by nothing but a checkpoint's inputs"),
    "scale": SaveRule(source=f"{GPT_OSS} eager_attention_forward: * scaling (a Python scalar) keeps nothing"),
    "logits_max": SaveRule(saves=("extra:indices",),
                           source=f"{GPT_OSS} eager_attention_forward: combined_logits.max(dim=-1, keepdim=True) — "
                                  "MaxBackward0 saves the int64 indices"),
    "softmax": SaveRule(saves=("out:y",),
                        source=f"{GPT_OSS} eager_attention_forward: F.softmax(combined_logits, dtype=combined_logits"
                               ".dtype) — SoftmaxBackward0 saves its (b, h, s, s + 1) result"),
    "attn_dropout": SaveRule(saves=("extra:mask",),
                             source=f"{GPT_OSS} eager_attention_forward: nn.functional.dropout(scores, p="
                                    "attention_dropout) — NativeDropoutBackward0 keeps a bool mask (CUDA's fused "
                                    "kernel); the product with V keeps the dropout output"),
    "attn_v": SaveRule(saves=("in:p", "in:v"),
                       source=f"{GPT_OSS} eager_attention_forward: torch.matmul(attn_weights, value_states) — "
                              "BmmBackward0 saves probs[..., :-1] (a view of the softmax result) and the value "
                              "copied to every head"),
    "copy": SaveRule(source=f"{DSV3} DeepseekV3Attention: transpose(1, 2).contiguous() copies the attention "
                            f"output (o_proj saves the copy; {GT})"),
    "swiglu": SaveRule(saves=("in:x", "in:up", "extra:silu"),
                       source=f"{LLAMA} LlamaMLP: act_fn(gate_proj(x)) * up_proj(x) — SiluBackward0 saves gate, "
                              f"MulBackward0 silu and up; down_proj saves the product ({GT}: 2sbh + 8sbI); "
                              f"{MOE}: one gate_up output, kept whole through the chunk views"),
    "clamped_swiglu": SaveRule(saves=("in:x", "extra:gate_clamped", "extra:sigmoid", "extra:glu", "extra:up_offset"),
                               source=f"{GPT_OSS} GptOssExperts._apply_gate: gate/up are strided views of the "
                                      "gate_up output, whose whole storage ClampBackward1 keeps; MulBackward0 keeps "
                                      "the clamped gate and sigmoid(gate·alpha) (SigmoidBackward0 its result), then "
                                      "(up + 1) and glu; the product is down_proj's input"),
    "gelu": SaveRule(saves=("in:x",), source="torch GeluBackward0 saves its input"),
    "dropout": SaveRule(saves=("extra:mask",), source="native_dropout keeps a bool mask"),
    "add": SaveRule(source="a residual add keeps nothing"),
    "tanh": SaveRule(saves=("out:y",), source="models/gemma2/modeling_gemma2.py eager_attention_forward and "
                                               "Gemma2ForCausalLM.forward: torch.tanh of the capped logits — "
                                               "TanhBackward0 keeps its result"),
    "cast": SaveRule(source="models/gemma2/modeling_gemma2.py eager_attention_forward: softmax(..., "
                            "dtype=float32).to(query.dtype) — ToCopyBackward0 keeps nothing (the matmul with V "
                            "keeps the 16-bit copy)"),
    "router_score": SaveRule(saves=("out:y",), source=f"{DSV3} DeepseekV3TopkRouter: router_logits.sigmoid() — "
                                                      "SigmoidBackward0 saves its fp32 result"),
    "router_softmax": SaveRule(saves=("out:y",),
                               source=f"{MIXTRAL} MixtralTopKRouter / {QWEN2_MOE} Qwen2MoeTopKRouter: "
                                      "softmax(router_logits, fp32) of F.linear on the 16-bit input (no fp32 copy) "
                                      "— SoftmaxBackward0 saves its fp32 result"),
    "topk_unnormalised": SaveRule(saves=("out:idx",),
                                  source=f"{QWEN2_MOE} Qwen2MoeTopKRouter: with norm_topk_prob False (the config "
                                         "default) topk keeps only its int64 indices and the weights are cast to "
                                         "the logits dtype (16-bit routing weights in the experts)"),
    "shared_gate": SaveRule(saves=("in:x", "extra:sigmoid"),
                            source=f"{QWEN2_MOE} Qwen2MoeSparseMoeBlock: F.sigmoid(shared_expert_gate(x)) * "
                                   "shared_expert_output — MulBackward0 keeps the shared expert's output and the "
                                   "sigmoid (also SigmoidBackward0's result)"),
    "topk_logits": SaveRule(saves=("out:idx",),
                            source=f"{GPT_OSS} GptOssTopKRouter: torch.topk(router_logits) — TopkBackward0 saves "
                                   "the int64 indices; softmax(router_top_value, dtype=router_top_value.dtype) "
                                   "keeps its 16-bit (t, k) result (rule router_softmax)"),
    "topk": SaveRule(saves=("out:idx", "extra:denominator", "extra:raw_weights"),
                     source=f"{DSV3} DeepseekV3TopkRouter: scores.gather(1, topk_indices) saves the int64 indices; "
                            "topk_weights /= denominator saves both (fp32)"),
    "permute": SaveRule(saves=("extra:src_idx", "extra:sorted_idx", "extra:offsets", "extra:expert_ids"),
                        source=f"{MOE}: hidden_states[perm // num_top_k] and sample_weights[perm] save int64 "
                               "indices; grouped_mm saves the int32 offsets; with expert biases "
                               "(GPT-OSS) gate_up_proj_bias[expert_ids_g] saves the sorted int64 expert ids"),
    "unpermute": SaveRule(saves=("in:x", "in:probs", "extra:inv_idx"),
                          source=f"{MOE}: proj_out * sample_weights_g saves the down output and fp32 weights; "
                                 f"weighted_out[inv_perm] the int64 inverse permutation ({GT})"),
    "ce_loss": SaveRule(saves=("extra:exp_logits", "extra:masked_target", "extra:total_weight"),
                        # NllLossBackward0 returns a fresh zero-filled grad_input shaped like its input (the fp32
                        # log-probabilities: pytorch/pytorch@v2.11.0 aten/src/ATen/native/cuda/Loss.cu
                        # nll_loss_backward_out_cuda, LossNLL.cpp nll_loss_backward_out_cpu on the CPU), which
                        # LogSoftmaxBackward0 reads into a second one (_log_softmax_backward_data) and which
                        # is freed when that returns: 3 × b·s·V·4 live at the loss's backward (groundtruth.md §4,
                        # traces/groundtruth-h200 snapshots)
                        backward_scratch=("extra:exp_logits",),
                        source="loss/loss_utils.py ForCausalLMLoss: logits.float(); LogSoftmaxBackward0 saves the "
                               "fp32 result, NllLossBackward0 the shifted labels and total_weight"),
    "concat": SaveRule(source="a concatenation keeps nothing"),
    "comm": SaveRule(source="no collectives on one device"),
}


def _activation_rules() -> dict[str, SaveRule]:
    """``act_NAME`` (an MLP's ``act(fc1(x))``) and ``gated_NAME`` (``act(gate) * up``) for every activation
    whose expression keeps more or less than its input (:mod:`timeline.spec.hf_activations`)."""
    rules = {}
    for name, act in HF_ACTIVATIONS.items():
        if act.plain:
            continue
        keeps = (("in:x",) if act.keeps_input else ()) + tuple(f"extra:{e}" for e in act.intermediates + act.masks + act.scalars)
        rules[f"act_{name}"] = SaveRule(saves=keeps, source=act.source)
        gated = ("in:x", "in:up") if act.identity else ("in:up", "extra:silu")
        rules[f"gated_{name}"] = SaveRule(saves=keeps + gated,
                                          source=f"{act.source}; MulBackward0 of act(gate) * up keeps both")
    return rules


RULES.update(_activation_rules())

PARAMS = ParamRules(mla_q_rope_tp_split=True, final_norm=True, router_bias=True, shared_experts_tp_split=True,
                    expert_state_group="routed", vocab_pad=1, mtp_embedding=False, mtp_eh_proj_tp_split=False,
                    mtp_modules=False)

STRUCTURE = Structure(attention="sdpa", dropout=False, fused_norm_linear=False, moe_tokens="routed",
                      mla_latent_sp=False, full_recompute_moe_split=False, swiglu_extra=True,
                      # the model family's modelling code: models/gpt2/modeling_gpt2.py GPT2Attention
                      # (c_attn(x).split) and GPT2Block (nn.Dropout after c_proj and the MLP, resid_pdrop;
                      # attn_pdrop goes into SDPA's dropout_p), models/mixtral, qwen2_moe, qwen3_moe TopKRouter
                      # (softmax(fp32) of 16-bit logits; Qwen's `if self.norm_topk_prob:` then
                      # .to(router_logits.dtype)), models/gpt_oss/modeling_gpt_oss.py GptOssTopKRouter (topk, then
                      # softmax of the k logits), GptOssRotaryEmbedding (cos/sin head_dim / 2 wide), GptOssRMSNorm
                      # ((weight * hidden_states).to(input_dtype): fp32 normalised tensor)
                      model_code=True,
                      upcast_fp32=True, rope_cache=True, mla_kv_views=True, moe_weight_after_down=True,
                      split_gate_up=True,
                      # models/qwen3/modeling_qwen3.py Qwen3Attention: q_norm/k_norm (Qwen3RMSNorm over
                      # head_dim) on q and k before RoPE
                      qk_norm=True,
                      # models/gpt2/modeling_gpt2.py GPT2Model.forward: position_embeds = self.wpe(position_ids)
                      position_ids=True,
                      # models/qwen2_moe/modeling_qwen2_moe.py Qwen2MoeSparseMoeBlock.shared_expert_gate
                      shared_expert_gate=True,
                      # models/gpt_oss/modeling_gpt_oss.py: GptOssPreTrainedModel._supports_sdpa = False (eager
                      # attention with sinks)
                      sink_attention="eager")

TORCH_BLAS = "pytorch/pytorch@v2.11.0:aten/src/ATen/cuda/CublasHandlePool.cpp"


def workspaces(fw: FrameworkSpec, m: ModelSpec, tr: TrainingSpec, par: ParallelSpec, sm: int, *,
               holds_head: bool, has_moe: bool, tensors: Sequence[ParamTensor] = ()) -> list[tuple[str, int, str, str]]:
    """PyTorch's cuBLAS workspaces, allocated through the caching allocator and never freed:
    ``getCurrentCUDABlasHandle`` → ``setWorkspaceForHandle`` keeps one per (handle, stream) and handles
    are per thread, so the forward (the main thread) gets one at its first GEMM and the autograd
    engine's device thread another at the first GEMM of the first backward, the output layer's
    (every ``nn.Linear`` is a torch GEMM); each of ``getChosenWorkspaceSize`` bytes
    (``parseChosenWorkspaceSize``: ``CUBLAS_WORKSPACE_CONFIG``, else 32 MiB on compute capability 9.0 and
    8.125 MiB elsewhere at 2.11; :func:`torch_workspace_bytes` keeps the versions). cuBLASLt shares them
    (``getCUDABlasLtWorkspace`` allocates its own only for addmm epilogues, not modelled). The H200
    snapshots hold exactly two 33,554,432-byte blocks beside the model (``traces/groundtruth-h200``).
    ``[framework] workspaces = false`` leaves them out (a CPU measurement has none)."""
    if not fw.workspaces:
        return []
    size = torch_workspace_bytes(fw.cublas_workspace_config, sm, fw.pytorch)
    return [("workspace.torch_cublas_forward", size, f"{TORCH_BLAS}: getCurrentCUDABlasHandle", "start"),
            ("workspace.torch_cublas_backward", size, f"{TORCH_BLAS}: getCurrentCUDABlasHandle",
             AT_OP + r"(^|\.)output_layer$")]


LIFECYCLE = Lifecycle("first_backward", "first_step", "first_step",
                      "PyTorch autograd .grad on first backward; torch.optim lazy state; DeepSpeed ZeRO buckets",
                      reduce_bucket_elems=500_000_000, prefetch_bucket_elems=50_000_000, workspaces=workspaces)

PROFILE = Profile(name="hf", params=PARAMS, saved=SaveRules(name="hf", rules=RULES), structure=STRUCTURE,
                  lifecycle=LIFECYCLE,
                  limits=Limits(max_zero=3, single_device=True, zero_note="FSDP or DeepSpeed for ZeRO 2/3",
                                squared_relu=True,  # ReLUSquaredActivation (spec/hf_activations.py)
                                framework_keys=("pytorch", "cublas_workspace_config", "workspaces")))
