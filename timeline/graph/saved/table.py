"""The saved-tensor table types: a :class:`SaveRule` per op rule, gathered in a :class:`SavedTable`
with the few structural choices a framework makes. The tables themselves are in the sibling
modules, one per profile; parameter facts (which modules exist, how TP splits them) are not here
but in :mod:`timeline.graph.profiles`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class SaveRule:
    saves: tuple[str, ...] = ()  # "in:SLOT" | "out:SLOT" | "extra:SLOT"
    wgrad: tuple[str, ...] = ()  # of ``saves``, those only the weight gradient reads
    keep_under_recompute: tuple[str, ...] = ()  # kept even inside a recomputed region
    source: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedTable:
    name: str
    rules: dict[str, SaveRule]
    attention: str  # "eager" (scores, softmax, dropout materialised) | "flash" | "sdpa" (torch SDPA on CUDA:
    # flash for equal head dims ≤ 256 in 16 bits, GQA at kv-head width; else memory-efficient, k/v expanded)
    dropout: bool  # dropout after attention/MLP outputs (and inside eager attention)
    fused_norm_linear: bool  # norms before a linear fuse into it (TE LayerNormLinear): not "layernorm"-recomputable
    moe_tokens: str  # "paper": b·s·top_k/ep rows, router (and shared experts) on full b·s | "routed":
    # (b·s/(tp·cp))·top_k; whether shared experts are TP-split is the parameter rule ``shared_experts_tp_split``
    mla_latent_sp: bool  # MLA's compressed q/kv stay sequence-parallel (Megatron) or are gathered (paper)
    full_recompute_moe_split: bool  # full recompute checkpoints the MoE sub-block apart (keeps its input)
    swiglu_extra: bool  # an unfused SwiGLU also keeps silu(gate)
    # -- structure of Python-level modelling code (Hugging Face); False/True keep paper and megatron as they were
    upcast_fp32: bool = False  # RMSNorm input, router input and logits are copied to fp32 by a separate op
    rope_cache: bool = False  # RoPE cos/sin built once per model (op tagged "shared") and saved by each layer
    mla_kv_views: bool = False  # MLA's V is a view of kv_b_proj's output; attention output copied for o_proj
    moe_weight_after_down: bool = False  # routing weights scale the down-projection output (not inside SwiGLU)
    split_gate_up: bool = False  # a dense SwiGLU MLP has separate gate and up projections (two outputs)
    qk_norm: bool = False  # a model with ``qk_norm`` runs a per-head RMSNorm on q and k (Qwen3) as its own ops
    dropout_from_model: tuple[str, ...] = ()  # model types with dropout ops wherever the model's
    # ``hidden_dropout`` > 0 (nn.Dropout in training), whatever ``dropout`` says; attention dropout stays in SDPA
    fused_qkv: tuple[str, ...] = ()  # model types with one QKV projection whose output q, k and v are views of
    softmax_router: tuple[str, ...] = ()  # model types whose router is softmax(fp32) of 16-bit logits, then top-k
    # (the router reads the norm output itself, no fp32 copy)
    unnormalised_topk: tuple[str, ...] = ()  # model types whose top-k weights are not renormalised but cast back
    # to the logits dtype (Qwen-MoE ``norm_topk_prob`` = False, the config default)
    position_ids: bool = False  # a learned position embedding's lookup keeps its int64 position ids (1, s)
    shared_expert_gate: bool = False  # a model's ``shared_expert_gate`` scales the shared expert by a sigmoid
    # -- GPT-OSS (empty/"" keeps every other family and profile as it was)
    sink_attention: str = ""  # "eager": learned sinks run eager attention op by op (logits, mask, cat with the
    # sinks, max, softmax over s + 1 columns, ·V); "": the sinks live inside the table's attention kernel
    rope_half: tuple[str, ...] = ()  # model types whose RoPE cos/sin are head_dim / 2 wide
    normed_fp32: tuple[str, ...] = ()  # model types whose RMSNorm keeps its normalised tensor in fp32
    topk_softmax_router: tuple[str, ...] = ()  # model types whose router takes the top-k of the logits, then a
    # softmax over those k in the logits' dtype (GPT-OSS; Megatron's softmax router does the same)
    # -- structure of Megatron-Core (megatron table); False keeps paper and hf as they were
    mla_kv_combined: bool = False  # MLA's kv down projection is one [rows, kv_lora_rank + rope] tensor whose
    # kv part the latent norm keeps whole; k_pe is gathered (a contiguous copy) before the up-projection checkpoint
    model_dropout: bool = False  # dropout ops wherever the model's hidden_dropout / attention_dropout > 0
    # (Megatron's bias-dropout-add and attention dropout; p = 0 is the identity, torch ``_dropout``)
    wgrad_transient: str = "none"  # weight-gradient GEMMs ("linear" ops) return a fresh [out, in] tensor that
    # is added into the grads buffer and freed: "all" of them, "head" (the output layer only) or "none"
    ce_inplace: bool = False  # the loss writes its gradient into the 16-bit logits and keeps only them (TE's
    # parallel_cross_entropy): no fp32 softmax numerators
    softmax_fp32: bool = False  # eager attention's softmax runs on an fp32 copy and keeps its fp32 output;
    # a cast back to the 16-bit dtype feeds dropout and attention over V (Megatron's unfused FusedScaleMaskSoftmax)
    megatron_moe: bool = False  # router and alltoall dispatcher as Megatron-Core (moe_utils.py): scores and
    # probs in the logits dtype, a dense [tokens, E] probs map, masked_select keeping the transposed probs and
    # routing map, tokens re-sorted by local expert (sort_chunks_by_idxs) after the all-to-all

    def rule(self, key: str) -> SaveRule:
        try:
            return self.rules[key]
        except KeyError:
            raise KeyError(f"profile {self.name!r} has no saved-tensor rule for op kind {key!r}") from None
