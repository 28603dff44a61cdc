"""The types a profile is made of (DESIGN §5), one per kind of rule.

A profile names how one framework builds and trains a model. Its facts fall in five groups, each a
frozen table here, and each fact is stated in exactly one of them, with its source:

- :class:`ParamRules` — which parameter tensors exist, how TP splits them, how their states shard;
- :class:`SaveRules` — per op rule (``linear``, ``rmsnorm``, …), the :class:`SaveRule` saying
  what that op keeps for its backward;
- :class:`Structure` — the switches that shape the op graph itself (eager or flash attention,
  fused norms, the MoE token convention, …);
- :class:`Lifecycle` — when static state (gradients, master weights, moments, buffers,
  workspaces) comes into being;
- :class:`Limits` — what decides whether a run is possible at all (ZeRO levels, one device per
  replica), read by run validation.

A :class:`Profile` joins them; the registry is :data:`timeline.profiles.PROFILES`. Facts of a
model's architecture (its router's scoring function, a fused QKV projection, …) are not profile
choices: they live on :class:`~timeline.spec.model.ModelSpec`. This module decides nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Protocol

from timeline.spec.framework import FrameworkSpec

#: a workspace's ``created at`` of the form ``first_backward_op:REGEX``: at the start of the first op of
#: the device's first backward whose name matches REGEX (``re.search``), after that op's own
#: allocations (a workspace the op's first GEMM creates); at the first backward's start where none does
AT_OP = "first_backward_op:"


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamRules:
    """One framework's parameter-layout rules (which tensors exist, how TP splits them, how their
    states shard), consulted by the parameter builders and the static-memory pass."""

    #: MLA's W^QR (RoPE part of the query up-projection) split over TP, as in Megatron-Core's
    #: ``linear_q_up_proj`` (multi_latent_attention.py); the paper replicates it (2502.07846 Table 5)
    mla_q_rope_tp_split: bool
    #: the final RMSNorm/LayerNorm before the head is a parameter (paper: not counted, Table 3)
    final_norm: bool
    #: DeepSeek-V3's per-expert fp32 score-correction bias is held (paper omits it; Megatron keeps
    #: ``expert_bias`` as an fp32 buffer in ``moe/router.py``)
    router_bias: bool
    #: shared experts are TP-split (Megatron ``SharedExpertMLP`` extends ``MLP``); the paper
    #: replicates one shared expert on every EP rank (Table 6)
    shared_experts_tp_split: bool
    #: which MoE parameters shard over EDP: "moe" = the whole MoE block (router, shared and routed
    #: experts; paper Table 8) or "routed" = routed experts only (Megatron's expert DDP buffers)
    expert_state_group: str
    #: vocabulary padded to a multiple of this × tp (Megatron ``--make-vocab-size-divisible-by 128``)
    vocab_pad: int
    #: the MTP stage builds its own embedding when it is not the first stage (Megatron GPTModel
    #: builds ``self.embedding`` for ``pre_process or mtp_process``)
    mtp_embedding: bool
    #: the MTP module's eh_proj is column-parallel (Megatron ``multi_token_prediction.py``)
    mtp_eh_proj_tp_split: bool
    #: the model builds its MTP modules (transformers' DeepseekV3ForCausalLM builds none)
    mtp_modules: bool
    #: with tp above the KV heads each rank holds whole KV heads, replicated over ``tp / kv_heads`` ranks (the
    #: serving engines' ``QKVParallelLinear``: ``num_kv_head_replicas``), not a 1/tp slice of them
    kv_head_replicas: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SaveRule:
    saves: tuple[str, ...] = ()  # "in:SLOT" | "out:SLOT" | "extra:SLOT"; "extra:PREFIX*": every extra so named
    wgrad: tuple[str, ...] = ()  # of ``saves``, those only the weight gradient reads
    keep_under_recompute: tuple[str, ...] = ()  # kept even inside a recomputed region
    backward_scratch: tuple[str, ...] = ()  # slots whose shape and dtype the op's input-gradient backward
    # allocates once more as scratch, freed when that backward returns; "scratch:SLOT" names a backward-only
    # tensor the op builder shaped itself (FOp.scratch); a slot the op lacks is skipped
    grad_in_place: tuple[str, ...] = ()  # ("in:SLOT", "out:SLOT"): the backward writes the input's gradient
    # into the output gradient's storage (a kernel that computes in place): no allocation
    source: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class SaveRules:
    """Per op rule, what a forward op keeps for its backward (the saved-tensor table)."""

    name: str
    rules: dict[str, SaveRule]

    def rule(self, key: str) -> SaveRule:
        try:
            return self.rules[key]
        except KeyError:
            raise KeyError(f"profile {self.name!r} has no saved-tensor rule for op kind {key!r}") from None

    def extended(self, more: dict[str, SaveRule]) -> SaveRules:
        """These rules with ``more`` added under new names; a clash is an error (no rule is replaced)."""
        clash = set(more) & set(self.rules)
        if clash:
            raise ValueError(f"rules would replace {self.name} rules: {sorted(clash)}")
        return replace(self, rules={**self.rules, **more})


@dataclass(frozen=True, slots=True, kw_only=True)
class Structure:
    """The choices a framework makes for the structure of its ops, consulted by the op builders
    (never the profile's name). Defaults keep the paper and megatron profiles as they are."""

    attention: str  # "eager" (scores, softmax, dropout materialised) | "flash" | "sdpa" (torch SDPA on CUDA:
    # cuDNN or flash by GPU and PyTorch version, GQA at kv-head width; else memory-efficient, k/v expanded;
    # graph/families/sdpa.py)
    dropout: bool  # dropout after attention/MLP outputs (and inside eager attention)
    fused_norm_linear: bool  # norms before a linear fuse into it (TE LayerNormLinear): not "layernorm"-recomputable
    moe_tokens: str  # "paper": b·s·top_k/ep rows, router (and shared experts) on full b·s | "routed":
    # (b·s/(tp·cp))·top_k; whether shared experts are TP-split is the parameter rule ``shared_experts_tp_split``
    mla_latent_sp: bool  # MLA's compressed q/kv stay sequence-parallel (Megatron) or are gathered (paper)
    full_recompute_moe_split: bool  # full recompute checkpoints the MoE sub-block apart (keeps its input)
    swiglu_extra: bool  # an unfused SwiGLU also keeps silu(gate)
    # -- Megatron's legacy model (megatron/legacy/model: timeline/profiles/megatron_legacy.py)
    rmsnorm_ops: bool = False  # RMSNorm runs as torch ops on an fp32 copy of its input (rule "rmsnorm_ops"): the
    # copy, the fp32 rsigma and the 16-bit normalised tensor the weight multiplies are kept
    swiglu_ops: bool = False  # SwiGLU runs as torch ops (chunk, silu, mul; rule "swiglu_ops"): the fc1 output and
    # silu(gate) are kept
    switch_mlp: bool = False  # MoE layers are the legacy SwitchMLP (graph/families/switch_mlp.py)
    final_rmsnorm_ops: bool = False  # the final RMSNorm alone runs as those torch ops (the legacy model's layers
    # being TE's TransformerLayer, its final norm megatron/legacy/model/rms_norm.py)
    # -- structure of Python-level modelling code (Hugging Face)
    #: the model family's own modelling code runs, so what :class:`~timeline.spec.model.ModelSpec` says that
    #: code does (``fused_qkv``, ``residual_dropout``, ``router_score``, ``router_weights_cast``,
    #: ``rope_half_width``, ``norm_output_fp32``) shapes the ops
    model_code: bool = False
    upcast_fp32: bool = False  # RMSNorm input, router input and logits are copied to fp32 by a separate op
    rope_cache: bool = False  # RoPE cos/sin built once per model (op tagged "shared") and saved by each layer
    mla_kv_views: bool = False  # MLA's V is a view of kv_b_proj's output; attention output copied for o_proj
    moe_weight_after_down: bool = False  # routing weights scale the down-projection output (not inside SwiGLU)
    split_gate_up: bool = False  # a dense SwiGLU MLP has separate gate and up projections (two outputs)
    qk_norm: bool = False  # a model with ``qk_norm`` runs a per-head RMSNorm on q and k (Qwen3) as its own ops
    qk_l2_norm: bool = False  # ... as a weightless L2 norm (Megatron --qk-l2-norm: rule "l2norm", no parameters)
    position_ids: bool = False  # a learned position embedding's lookup keeps its int64 position ids (1, s)
    shared_expert_gate: bool = False  # a model's ``shared_expert_gate`` scales the shared expert by a sigmoid
    head_gather_buffer: bool = False  # the output layer's sequence-parallel all-gather (and its re-gather for the
    # weight gradient) writes into a persistent buffer the profile's workspaces hold (Megatron's GlobalMemoryBuffer)
    sink_attention: str = ""  # "eager": learned sinks run eager attention op by op (logits, mask, cat with the
    # sinks, max, softmax over s + 1 columns, ·V); "": the sinks live inside the attention kernel
    # -- structure of Megatron-Core
    mla_kv_combined: bool = False  # MLA's kv down projection is one [rows, kv_lora_rank + rope] tensor whose
    # kv part the latent norm keeps whole; k_pe is gathered (a contiguous copy) before the up-projection checkpoint
    model_dropout: bool = False  # dropout ops wherever the model's hidden_dropout / attention_dropout > 0
    # (Megatron's bias-dropout-add and attention dropout; p = 0 is the identity, torch ``_dropout``)
    delay_wgrad: bool = False  # --delay-wgrad-compute: each schedule-plan node's TE weight gradients run at its
    # backward_dw (graph/backward.py: delay_wgrads)
    wgrad_transient: str = "none"  # weight-gradient GEMMs ("linear" ops) return a fresh [out, in] tensor that
    # is added into the grads buffer and freed: "all" of them, "head" (the output layer only) or "none"
    ce_inplace: bool = False  # the loss writes its gradient into the 16-bit logits and keeps only them (TE's
    # parallel_cross_entropy): no fp32 softmax numerators
    ce_compiled: bool = False  # the vocab-parallel loss's steps run under torch.compile (Megatron's native fused
    # cross entropy): its backward copies the fp32 softmax numerators once more
    softmax_fp32: bool = False  # eager attention's softmax runs on an fp32 copy and keeps its fp32 output;
    # a cast back to the 16-bit dtype feeds dropout and attention over V (Megatron's unfused FusedScaleMaskSoftmax)
    te_softmax: bool = False  # eager attention's softmax is TE's FusedScaleMaskSoftmax: where its fused kernel
    # takes the shape (spec/te_softmax.py: te_softmax_kernel) the op is "te_fused_softmax"
    te_frozen_ln_out: bool = False  # TE's LayerNormLinear keeps its norm output for a frozen weight too (before
    # v1.6: 580eb52b3 "Do not store input activations when not computing weight gradients")
    te_torch_softmax: bool = False  # eager attention is TE's UnfusedDotProductAttention (any release): where the
    # fused kernel does not take the shape its FusedScaleMaskSoftmax (softmax_in_fp32 by default) runs torch's
    # softmax on an fp32 copy of the scores, keeps its fp32 output and casts it back
    megatron_moe: bool = False  # router and alltoall dispatcher as Megatron-Core (moe_utils.py): scores and
    # probs in the logits dtype, a dense [tokens, E] probs map, masked_select keeping the transposed probs and
    # routing map, tokens re-sorted by local expert (sort_chunks_by_idxs) after the all-to-all
    moe_dispatcher: str = "alltoall"  # "allgather": Megatron's MoEAllGatherTokenDispatcher — tokens and probs
    # all-gathered over expert-TP × EP, permuted for the local experts, unpermuted to all gathered rows and
    # reduce-scattered back; "alltoall": the all-to-all permutation above; "flex": MoEFlexTokenDispatcher
    # (graph/families/moe_flex.py) with the backend below
    moe_flex_backend: str = "deepep"  # the flex dispatcher's fused all-to-all: "deepep" | "hybridep"
    moe_nvlink_domain: int = 8  # GPUs one NVLink domain joins (HybridEP's ranks per node)
    flash_bwd: str = ""  # the flash-attn backward the TE FlashAttention backend calls: "fa2" (flash-attn 2's
    # mha_bwd workspaces: graph/families/flash_bwd.py), "fa2_deterministic" (its split dq accumulator), "": none
    flash_varlen: bool = False  # the flash-attn call is the varlen one (flash_attn_varlen_func: mha_varlen_bwd's
    # workspaces hold total_q + 128·b rows, graph/families/flash_bwd.py), as the legacy FlashSelfAttention calls it
    #: TE's context-parallel exchange per decoder layer (one entry: every layer): "p2p" (AttnFuncWithCPAndKVP2P's
    #: K/V ring), "a2a" (AttnFuncWithCPAndQKVOA2A), "a2a+p2p" (an a2a over ``cp_a2a`` ranks, then the ring)
    cp_comm: tuple[str, ...] = ("p2p",)
    cp_a2a: int = 1
    te_flash_copies: bool = False  # TE's FlashAttention backend (flash-attn) on Megatron's sbhd tensors: q, k
    # and v become contiguous bshd copies the kernel keeps, and its bshd output is kept while a contiguous sbhd
    # copy is returned to the output projection (TE's FusedAttention reads and writes sbhd in place); at micro-batch
    # size 1 the transposes of contiguous tensors are no copies (graph/families/attention.py: flash_copies)
    qkv_gather_above_kv: bool = False  # tp above the KV groups: every rank all-gathers the fused QKV columns and
    # keeps its group as views of the whole (Megatron-Core >= 0.16, graph/families/attention.py); off in the
    # serving engines' builds, which replicate KV heads instead
    qkv_views: bool = False  # one fused QKV projection output whose q, k and v are views (Megatron-Core's
    # linear_qkv): a consumer keeping a view keeps the whole output; norms and attention kernels that need
    # contiguous inputs copy the view (graph/families/attention.py)
    te_qkv_layout: bool = False  # TE's DotProductAttention (any backend) runs get_qkv_layout, which copies
    # views of the fused QKV output contiguous when q, k and v fit no packed layout
    te_full_mask: bool = False  # TE ≥ 2.0: the unfused attention widens a padding mask with get_full_mask's
    # int32 sliding-window bounds (graph/families/bert.py: padding_mask); before, with a logical_or alone
    bert_mask: str = "b11s"  # BERT's extended padding mask (graph/families/bert.py: load_batch): "b11s", a
    # [b, 1, 1, s] bool that TE's unfused attention widens per layer; "b1ss", the [b, 1, s, s] bool Megatron's
    # own DotProductAttention (the local layer spec) and TE < 1.10 read as given
    gdn_torch: bool = False  # --deterministic-mode: Megatron-Core's gated delta net runs nn.Conv1d and
    # torch_chunk_gated_delta_rule instead of the conv and chunk kernels (graph/families/gdn.py: torch_chunk)
    gdn: str = "megatron"  # a linear_attention layer's gated delta net: "megatron", Megatron-Core's GatedDeltaNet
    # as it trains (graph/families/gdn.py: train_forward); "vllm", the engine's mixer (serve/graph_view.py)
    dataloader_batch: str = "none"  # the micro-batch get_batch keeps on the device through the first and last
    # stages' forward (graph/families/batch.py): "tokens" (tokens, labels, loss mask, position ids), "mask"
    # (and the [b, 1, s, s] bool attention mask), "none" (not modelled)
    rerun_keeps_batch: bool = False  # the data iterator's saved micro-batch dicts hold the device copies
    # get_batch wrote into them until the next train_step (graph/families/batch.py; ``[framework]``)
    embedding_wgrad: bool = False  # the embedding lookup's backward returns a dense [rows, h] weight gradient
    # per embedding weight, added into the grads buffer and freed (Megatron's DDP grad hook)
    moe_router: str = "topk"  # "sinkhorn": Megatron's TopKRouter.sinkhorn_load_balancing (activation of every
    # expert's logit, masked by the sinkhorn top-k); "topk": topk_routing_with_score_function
    moe_router_dtype: str = ""  # "fp32" | "fp64": Megatron's router GEMM returns logits in that dtype and every
    # router tensor after it (scores, probs, the dispatcher's probs) follows; "": the activations' dtype
    moe_input_jitter: bool = False  # --moe-input-jitter-eps: the router's input times sampled noise (moe.py)
    moe_probs_on_input: bool = False  # --moe-apply-probs-on-input: the experts' input times the probs (moe.py)
    te_activation_func: bool = False  # --use-te-activation-func: TE's activation keeps its input alone; experts
    # weigh its output by the probs as a torch op (moe.py)
    moe_random_logits: bool = False  # --moe-router-force-load-balancing: the router's logits are replaced by a
    # random copy of them (graph/families/moe.py)
    moe_pre_norm_recompute: bool = True  # "layernorm" recompute reaches an MoE layer's pre-MLP norm; Megatron
    # turns it off where a moe_router CUDA graph returns the norm's output (profiles/megatron.py)
    moe_aux_loss: bool = False  # the router's load-balancing loss is computed (an aux-loss type with a
    # coefficient > 0): its scores over every expert are kept
    moe_z_loss: bool = False  # the router's z-loss is computed (--moe-z-loss-coeff given): logsumexp keeps the logits
    moe_router_fused: bool = False  # TE's fused top-k (--moe-router-fusion): one op keeping the bool routing map
    # and its [t, E] intermediate in the logits' dtype (rule "fused_topk")
    moe_permute_fusion: bool = False  # TE's fused permute/unpermute/chunk sort keep int32 row-id maps
    # instead of the unfused int64 sorted indices and the transposed probs and routing map
    moe_router_fp32_topk: bool = False  # a sigmoid router's top-k and normalisation stay in fp32 and only the
    # final probs are cast to the logits dtype (Megatron-Core from 0.18; before, the scores are cast first)
    moe_unpermute: str = "scatter_add"  # "index_add": the unfused unpermute under deterministic algorithms
    # (torch.Tensor.index_add_, whose autograd node keeps its source, the experts' output rows)
    moe_squared_relu_fused: bool = False  # Megatron's --use-fused-weighted-squared-relu: the experts' squared ReLU
    # times the probs is one autograd Function keeping its input and the probs (rule "weighted_squared_relu")
    moe_act_compiled: bool = False  # Megatron's legacy GroupedMLP: the experts' non-gated activation times the
    # probs is one jit_fuser (torch.compile) function, which keeps its input and the probs (rule
    # "weighted_act_compiled"), not the activation's output
    moe_mask_routing: bool = False  # Megatron-Core from ac0474d26e (2024-10-29; core_v0.10.0): the router returns
    # dense [tokens, E] probs and a bool routing map, which the alltoall dispatcher keeps (``self.probs``,
    # ``self.routing_map``); before it [tokens, k] probs and indices (timeline.sim.expand.dispatcher_kept). Set by
    # the megatron profile alone (profiles.megatron.moe_switches): no other framework's router builds the map
    moe_probs_at_combine: bool = False  # Megatron-Core before 2659630721: the routing probs scale the experts'
    # output in the dispatcher's combine (the multiply keeps that output and the permuted probs), not the
    # experts' activation; no probs travel with the tokens


class ParamTensor(Protocol):
    """What a workspace rule reads of a parameter tensor (``timeline.graph.tensors.TensorDef``)."""

    @property
    def name(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def trainable(self) -> bool: ...
    @property
    def expert(self) -> bool: ...


#: (framework, model, training, parallel, sm, holds_head=, has_moe=, tensors=) -> [(name, bytes, source, when)] of persistent workspaces
Workspaces = Callable[..., list[tuple[str, int, str, str]]]


@dataclass(frozen=True, slots=True, kw_only=True)
class FirstCall:
    """What a compiled step's first call allocates and frees once per process, beside the op's own tensors
    (Inductor benchmarking its kernels: :mod:`timeline.profiles.megatron_autotune`). At the start of the first
    forward op whose name matches ``op`` (after that op's own allocations): ``forward_copies`` tensors of the
    size of that op's tensor ``<op>.<like>``, and ``flush_bytes``; at the start of the same op in the first
    backward that runs it, ``backward_copies`` and ``flush_bytes``; each set freed at once."""

    op: str  # re.search pattern of the op's name
    like: str  # the op's tensor each copy has the size of (``<op name>.<like>``)
    forward_copies: int
    backward_copies: int
    flush_bytes: int
    source: str
    tag: str = ""  # in the transients' names (``autotune.<tag>.<phase>.flush``), where several rules place them
    backward_same_op: bool = True  # the backward's at the forward's op itself; False: at the first op ``op``
    # matches in the first backward (a kernel every layer calls: the last layer's backward calls it first)


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """When static state comes into being, per profile (DESIGN §5 lifecycle rules)."""

    grads_at: str  # "start" | "first_backward"
    master_at: str  # "start" | "first_step"
    moments_at: str  # "start" | "first_step"
    source: str
    reduce_bucket_elems: int = 0  # 0: reduce-scatter works in place (Megatron)
    prefetch_bucket_elems: int = 0
    #: the persistent library workspaces a device holds (None: none)
    workspaces: Workspaces | None = None
    #: weights and gradients live in Megatron's contiguous param/grad buffers, the distributed
    #: optimizer's states per owned shard, each parameter made on its own first
    #: (:mod:`timeline.graph.dp_buffers`); else flat ZeRO blocks
    dp_buffers: bool = False
    #: a model chunk keeps the hidden state it received from the previous pipeline stage (the
    #: ``recv_forward`` buffer, with the ``.grad`` its backward gave it) from that forward until the
    #: chunk's next forward replaces it — across the optimizer step for the last micro-batch — and the
    #: schedule holds that gradient until the rank's next backward returns; the source it was read
    #: from ("": both die with their last backward use)
    chunk_keeps_input: str = ""
    #: what a compiled step's first call adds, by the run's ``[framework]`` (None: nothing)
    first_call: Callable[[FrameworkSpec], tuple[FirstCall, ...]] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """What decides whether a run is possible under the profile (read by run validation)."""

    #: highest ZeRO level the framework offers
    max_zero: int
    #: why ZeRO stops at ``max_zero`` (said when a run asks for more)
    zero_note: str = ""
    #: one device per model replica: no pipeline, tensor, expert or context parallelism
    single_device: bool = False
    #: the profile to suggest for what this one cannot do
    instead: str = "megatron"
    #: why attention with learned sinks cannot run under context parallelism ("": it can)
    sinks_cp_note: str = ""
    #: models ``hidden_act = "relu2"`` (squared ReLU, Megatron ``--squared-relu``)
    squared_relu: bool = False
    #: reads a run's ``[framework]`` section (elsewhere a non-default value is an error)
    reads_framework: bool = False
    #: the ``[framework]`` keys a profile that does not read the section still reads (PyTorch's own)
    framework_keys: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLimits(Limits):
    """What run validation reads of a profile (``timeline.profiles.LIMITS``): its :class:`Limits` and the one
    parameter rule a run's shapes are checked against — derived from the profile's :class:`ParamRules`, never
    declared twice (validation may not import the parameter rules themselves)."""

    #: :attr:`ParamRules.shared_experts_tp_split`: tp must divide the shared experts' width
    shared_experts_tp_split: bool

    @classmethod
    def of(cls, limits: Limits, params: ParamRules) -> RunLimits:
        return cls(**{f.name: getattr(limits, f.name) for f in fields(Limits)},
                   shared_experts_tp_split=params.shared_experts_tp_split)


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """One framework's rules, each group in its own table."""

    name: str
    params: ParamRules
    saved: SaveRules
    structure: Structure
    lifecycle: Lifecycle
    limits: Limits
    #: the structure as a run's ``[framework]`` section configures it (None: the structure as it is)
    configure: Callable[[Structure, FrameworkSpec], Structure] | None = None

    def configured(self, spec: FrameworkSpec) -> Profile:
        """This profile with its structure configured by ``spec``."""
        if self.configure is None:
            return self
        return replace(self, structure=self.configure(self.structure, spec))

