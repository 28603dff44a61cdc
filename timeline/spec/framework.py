"""``[framework]``: the implementation choices and versions the ``megatron`` profile's rules assume.

A Megatron-LM job allocates more than its model's saved tensors, and how much depends on settings
that live in Megatron's arguments and Transformer Engine's environment, not in the model: which
attention kernel runs, whether cross entropy is fused, whether weight gradients accumulate into
``main_grad`` in place, which MoE dispatcher moves tokens, which cuBLAS workspaces exist. This
section names them with Megatron's own argument names (``--attention-backend`` →
``attention_backend``) and the versions whose source the rules were read from, so a rule that
changed between versions can say which one it follows.

The defaults keep a hand-written run file as it was before this section existed (TE's cuDNN
fused attention, unfused cross entropy, the alltoall dispatcher, no router aux loss); ``timeline
from-megatron`` writes every key explicitly with Megatron's command-line defaults instead. Only
the ``megatron`` profile reads this section (validation rejects non-default values elsewhere).
This module checks its own fields; it decides no bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from timeline.spec.fields import spec_field

ATTENTION_BACKENDS = ("auto", "flash", "fused", "unfused", "local")
DISPATCHERS = ("allgather", "alltoall", "flex")
CP_COMM_TYPES = ("p2p", "a2a", "a2a+p2p")
#: Megatron-FSDP's --data-parallel-sharding-strategy values (MC/distributed/fsdp/src/megatron_fsdp/
#: param_and_grad_buffer.py: ParamAndGradBuffer._init_each_parameter_group_buffers)
FSDP_STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")
CUDA_GRAPH_IMPLS = ("none", "transformer_engine")
#: Megatron's CudaGraphScope modules of TE's per-layer graphs (``transformer/enums.py``); "full" alone is the whole layer
CUDA_GRAPH_SCOPES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess")
LOAD_BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")
#: the Adam Megatron-Core's optimizer module imports first that is installed (``[framework] optimizer_impl``)
OPTIMIZER_IMPLS = ("te_fused", "apex_fused", "torch_foreach")


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameworkSpec:
    megatron_core: str = spec_field("0.14.0", doc="Megatron-Core version (or commit) the rules follow")
    transformer_engine: str = spec_field("2.6", doc="Transformer Engine version X.Y[.Z]")
    pytorch: str = spec_field("2.13", doc="PyTorch version X.Y[.Z] (its default cuBLAS workspace size per "
                              "GPU generation; from 2.2 to 2.5 the native fused loss's first call autotunes on "
                              "copies of the softmax)")
    transformer_impl: str = spec_field("transformer_engine", choices=("transformer_engine", "local"),
                                       doc="--transformer-impl")
    optimizer_impl: str = spec_field("te_fused", choices=OPTIMIZER_IMPLS, doc=(
        "the Adam Megatron-Core imports (core/optimizer/__init__.py: Transformer Engine's FusedAdam, else Apex's, "
        "else torch.optim.AdamW with the warning 'Transformer Engine and Apex are not installed. Falling back to "
        "Torch optimizers.'): te_fused, apex_fused (no intermediates), torch_foreach (its foreach step's copy of the "
        "second moments per parameter group, timeline.profiles.torch_adam; and, under fp16, Megatron's local "
        "multi_tensor_scale copy of each main parameter)"))
    use_legacy_models: bool = spec_field(False, doc=(
        "--use-legacy-models: Megatron-LM's legacy GPT model (megatron/legacy/model, Megatron-Core before 0.18) as "
        "its differences from the Core model of the same transformer_impl: its own layer (local: torch-op RMSNorm "
        "and SwiGLU) or TE's TransformerLayer (transformer_engine: Core's TE layers, the legacy final norm)"))
    legacy_flash_attn: bool = spec_field(False, doc=(
        "--use-flash-attn with the legacy model's local layer (use_legacy_models, transformer_impl local): "
        "megatron/legacy/model/transformer.py FlashSelfAttention, flash-attn 2's varlen kernel on bshd copies of q, k "
        "and v, its output copied back to sbhd; its core attention is never checkpointed"))
    attention_backend: str = spec_field("fused", choices=ATTENTION_BACKENDS,
                                        doc="--attention-backend, after NVTE_*_ATTN switches (auto: fused)")
    dataloader_batch: str = spec_field("none", choices=("none", "tokens", "mask"),
                                       doc="the micro-batch on the device through its forward: tokens, labels, "
                                           "loss mask, position ids; mask: and the [b, 1, s, s] bool attention "
                                           "mask (Megatron-LM unless --no-create-attention-mask-in-dataloader)")
    rerun_keeps_batch: bool = spec_field(False, doc="the rerun state machine's data iterator holds each "
                                         "micro-batch's device tensors until the next train_step (Megatron-LM "
                                         "from 5e4fc931ba, 2026-05-21, under --rerun-mode other than disabled)")
    gradient_accumulation_fusion: bool = spec_field(True, doc="weight gradients accumulate into main_grad")
    cross_entropy_fusion: str = spec_field("none", choices=("none", "native", "te"),
                                           doc="--cross-entropy-loss-fusion with --cross-entropy-fusion-impl "
                                               "(native: torch.compile'd steps from PyTorch 2.2)")
    masked_softmax_fusion: bool = spec_field(True, doc="false: --no-masked-softmax-fusion (local attention's "
                                             "torch softmax path)")
    fused_weighted_squared_relu: bool = spec_field(False, doc="--use-fused-weighted-squared-relu (Megatron's MoE "
                                                   "experts: one Function for relu(x)² · probs)")
    bias_swiglu_fusion: bool = spec_field(True, doc="false: --no-bias-swiglu-fusion (Megatron-Core's MLP and experts "
                                          "run SwiGLU as torch ops: chunk, silu, product)")
    attention_softmax_in_fp32: bool = spec_field(False, doc="--attention-softmax-in-fp32 (or "
                                                 "--apply-query-key-layer-scaling)")
    make_vocab_size_divisible_by: int = spec_field(128, positive=True, doc="vocabulary padded to this × tp")
    deterministic: bool = spec_field(False, doc="--deterministic-mode / NVTE_ALLOW_NONDETERMINISTIC_ALGO=0")
    deterministic_mode: bool | None = spec_field(None, doc=(
        "--deterministic-mode itself: torch.use_deterministic_algorithms(True) (the MoE unpermute's index_add_, "
        "Inductor's one-config pointwise kernels) and Megatron-Core's config.deterministic_mode (the gated delta net "
        "as torch ops); unset: as deterministic. from-megatron writes false where only "
        "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 asks for determinism, which reaches TE alone"))
    moe_token_dispatcher: str = spec_field("alltoall", choices=DISPATCHERS, doc="--moe-token-dispatcher-type")
    moe_flex_backend: str = spec_field("deepep", choices=("deepep", "hybridep"),
                                       doc="--moe-flex-dispatcher-backend (--moe-enable-deepep: deepep)")
    nvlink_domain: int = spec_field(8, positive=True, maximum=100000,
                                    doc="GPUs one NVLink domain joins (HGX boards 8, GB200 NVL72 72; HybridEP's "
                                        "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN)")
    moe_router_load_balancing: str = spec_field("none", choices=LOAD_BALANCING,
                                                doc="--moe-router-load-balancing-type; an aux-loss type means "
                                                    "its loss is computed (--moe-aux-loss-coeff > 0)")
    moe_router_dtype: str = spec_field("", choices=("", "fp32", "fp64"), doc="--moe-router-dtype ('' = logits')")
    moe_permute_fusion: bool = spec_field(False, doc="--moe-permute-fusion")
    moe_router_fusion: bool = spec_field(False, doc="--moe-router-fusion (TE's fused top-k with score function, "
                                         "TE >= 2.6)")
    moe_router_force_load_balancing: bool = spec_field(False, doc="--moe-router-force-load-balancing: the router's "
                                                       "logits replaced by a random copy (moe_utils.py: RandomSTE) "
                                                       "for a load-balanced benchmark")
    moe_input_jitter: bool = spec_field(False, doc=(
        "--moe-input-jitter-eps given: the router multiplies its input by Uniform(1 - eps, 1 + eps) noise "
        "(router.py: apply_input_jitter), keeping the noise and the jittered copy for backward"))
    qk_l2_norm: bool = spec_field(False, doc=(
        "--qk-l2-norm (Llama 4): q and k per head through torch_norm.py's L2Norm (no weight; compiled by jit_fuser: "
        "its input and one fp32 rsqrt per row and head kept) instead of a TE norm; with model.qk_norm"))
    te_activation_func: bool = spec_field(False, doc=(
        "--use-te-activation-func (transformer_impl = transformer_engine): MLPs and experts run TE's activation "
        "modules, which keep their input alone; the experts then multiply by the probs as a torch op in the "
        "promoted dtype (experts.py: bias_act_func), keeping the activation's output and the probs"))
    moe_apply_probs_on_input: bool = spec_field(False, doc=(
        "--moe-apply-probs-on-input (top-1 routing, Llama 4): the experts multiply their permuted input by the "
        "probs before fc1 (experts.py), keeping the input, the probs and the weighted copy; the activation gets "
        "ones"))
    rope_fusion: bool = spec_field(True, doc=(
        "Megatron's apply_rope_fusion (false: --no-rope-fusion); an MLA layer's YaRN RoPE then keeps its cos/sin in "
        "the activations' dtype over the training sequence (multi_latent_attention.py: get_cached_cos_sin)"))
    mla_rope_type: str = spec_field("yarn", choices=("yarn", "rope"), doc=(
        "Megatron --rope-type for MLA layers: each builds a YarnRotaryEmbedding (yarn, MLATransformerConfig's "
        "default) or a RotaryEmbedding (rope) of its own"))
    yarn_positions: bool = spec_field(False, doc=(
        "Megatron --position-embedding-type yarn (no MLA): GPTModel's rotary embedding is a YarnRotaryEmbedding "
        "(its construction's cos/sin buffers beside the training table)"))
    yarn_original_max_positions: int = spec_field(4096, positive=True, maximum=2**30, doc=(
        "the context a YaRN rotary embedding caches its cos/sin for at construction (MLATransformerConfig."
        "original_max_position_embeddings; --yarn-original-max-position-embeddings for a GPT-level yarn)"))
    moe_z_loss: bool = spec_field(False, doc="--moe-z-loss-coeff given: the router's z-loss is computed")
    moe_grouped_gemm: bool = spec_field(True, doc="--moe-grouped-gemm (false: SequentialMLP)")
    moe_legacy_grouped_gemm: bool = spec_field(False, doc="--moe-use-legacy-grouped-gemm: Megatron's GroupedMLP "
                                               "(grouped_gemm's gmm, Megatron-Core before 0.17), also taken "
                                               "under --moe-grouped-gemm without TE's GroupedLinear (TE < 1.9, "
                                               "or the local layer spec)")
    moe_probs_in_experts: bool = spec_field(True, doc="the routing probabilities scale the experts' activation "
                                            "(Megatron-LM from 2659630721, 2025-04-09, first released in "
                                            "Megatron-Core 0.13); false: the token dispatcher's combine scales "
                                            "the experts' output")
    router_te_gemm_fixed: bool = spec_field(False, doc="the MoE router's GEMM runs through TE's general_gemm "
                                            "with TE >= 2.10 although megatron_core is below 0.17 (Megatron-LM "
                                            "from d3528a2130, 2026-03-06, whose package_info still said "
                                            "0.16.0rc0 on the dev branch); 0.17 and later have it anyway")
    cublas_workspace_config: str = spec_field("", doc="CUBLAS_WORKSPACE_CONFIG (':SIZE_KiB:COUNT…'; '' = default)")
    avoid_record_streams: bool = spec_field(False, doc=(
        "TORCH_NCCL_AVOID_RECORD_STREAMS=1 (recorded only: no rule reads it yet; record streams delay when a "
        "collective's freed blocks can be reused, which moves reserved, not allocated, memory)"))
    overlap_grad_reduce: bool = spec_field(False, doc="--overlap-grad-reduce (the grad buffer splits into buckets)")
    ddp_bucket_size: int = spec_field(0, nonneg=True, doc="--ddp-bucket-size in elements (0: Megatron's default, "
                                      "max(40M, 1M·dp·cp), with overlap_grad_reduce)")
    ddp_pad_for_busbw: bool = spec_field(False, doc="--ddp-pad-buckets-for-high-nccl-busbw (buckets end at a "
                                         "multiple of lcm(dp, 128, 65536) elements)")
    combined_1f1b_keeps_node_io: bool = spec_field(False, doc=(
        "combined 1F1B (schedule.combined_1f1b): each backward layer node keeps its inputs' gradients and its "
        "outputs until the pair ends (Megatron-Core before a56a0b001d, 2026-01-06; released in 0.16.0)"))
    ep_overlap_early_attn_memory_release: bool = spec_field(False, doc=(
        "--ep-overlap-early-attn-memory-release: in a combined-1F1B pair the backward's attention runs before "
        "the forward's experts (Megatron-LM from a56a0b001d)"))
    cp_comm_type: tuple[str, ...] = spec_field(("p2p",), choices=CP_COMM_TYPES, doc=(
        "--cp-comm-type: how attention exchanges context-parallel chunks, one for all layers or one per layer: "
        "p2p (a K/V ring), a2a (heads scattered, sequence gathered), a2a+p2p (a2a over cp_a2a_size ranks, then the "
        "ring over the rest)"))
    cp_a2a_size: int = spec_field(1, positive=True, maximum=2**20, doc=(
        "--hierarchical-context-parallel-sizes' first entry: the a2a group of an a2a+p2p layer"))
    checkpoint_format: str = spec_field("torch_dist", choices=("torch_dist", "torch"), doc=(
        "--ckpt-format of the checkpoint a resumed run (training.resumed) loads: torch_dist loads in place into "
        "states made first, torch reads it to the host"))
    defer_embedding_wgrad: bool = spec_field(False, doc=(
        "--defer-embedding-wgrad-compute: the output layer's weight-gradient GEMMs wait for the pipeline flush, "
        "each deferred micro-batch's input and logits gradient kept until then"))
    wgrad_deferral_limit: int = spec_field(0, nonneg=True, maximum=2**31 - 1, doc=(
        "--wgrad-deferral-limit: how many of an iteration's output-layer calls defer (0: all)"))
    overlap_param_gather_with_optimizer_step: bool = spec_field(False, doc=(
        "--overlap-param-gather-with-optimizer-step (every chunk's buffer one bucket; the first model chunk's dense "
        "parameters in an optimizer of their own, stepped first)"))
    tp_comm_overlap: bool = spec_field(False, doc=(
        "--tp-comm-overlap: TE's userbuffers (outside PyTorch's allocator) and the cuBLAS workspace of their "
        "GEMMs (three workspaces; TE ≥ 2.10 keeps the plain one beside them); the overlap itself is not simulated"))
    fsdp_sharding: str = spec_field("", choices=("",) + FSDP_STRATEGIES, doc=(
        "--use-megatron-fsdp (--use-custom-fsdp) with --data-parallel-sharding-strategy: Megatron-FSDP's "
        "parameter groups per FSDP unit, sharded over dp·cp (experts over the expert-DP group); '' = Megatron's DDP "
        "buffers"))
    megatron_fsdp_package: bool = spec_field(True, doc=(
        "Megatron-FSDP as the megatron_fsdp package (Megatron-LM from af28b5a559, 2025-08-21; Megatron-Core 0.14.0): "
        "all-gathers prefetch up to 500M elements beyond the requested FSDP unit, the gradient reduce-scatter queue "
        "holds up to 1B, and each step's start_param_sync gathers the first parameter group with that prefetch; "
        "false: the custom_fsdp module before it (prefetch and queue two units' worth, the step gathers the first "
        "group alone)"))
    log_params_norm: bool = spec_field(False, doc=(
        "--log-params-norm: calc_params_l2_norm after each step; under the megatron_fsdp package it first releases "
        "every gathered parameter group (stop_communication), before Megatron logs its memory"))
    empty_unused_memory_level: int = spec_field(0, choices=(0, 1, 2), doc=(
        "--empty-unused-memory-level (megatron/training/training.py: train_step): 1 empties PyTorch's allocator cache "
        "(torch.cuda.empty_cache) after the forward-backward, before the optimizer step; 2 also after the step"))
    delay_wgrad_compute: bool = spec_field(False, doc=(
        "--delay-wgrad-compute (with --overlap-moe-expert-parallel-comm, schedule.combined_1f1b): each schedule-plan "
        "node's TE weight gradients wait for its backward_dw — the mlp node's after the paired forward's dispatch, the "
        "attention's (and the shared experts') after the attention backward, the chunk's first layer's at the end"))
    cuda_graph_impl: str = spec_field("none", choices=CUDA_GRAPH_IMPLS, doc=(
        "--cuda-graph-impl (--external-cuda-graph: transformer_engine): TE's make_graphed_callables captures each "
        "decoder layer's graphed part per micro-batch into one private memory pool, before iteration 1 or after "
        "cuda_graph_warmup_steps eager ones"))
    cuda_graph_scope: str = spec_field("full", doc=(
        "--cuda-graph-scope / --cuda-graph-modules under the transformer_engine impl: full (the whole decoder "
        "layer, Megatron's default) or the graphed modules, space-separated: attn (input norm, self-attention, its "
        "residual add), mlp (a dense layer's MLP), moe_router (an MoE layer's pre-MLP norm, router and shared "
        "experts), moe_preprocess (with moe_router: the dispatcher's permutation too)"))
    cuda_graph_warmup_steps: int = spec_field(0, nonneg=True, maximum=2**20, doc=(
        "--cuda-graph-warmup-steps from Megatron-Core 0.15.0rc6 (training.py: train captures the graphs when "
        "iteration − start_iteration reaches it): the first iterations run eagerly, the capture comes before "
        "that iteration's step (0: before the first step, as older releases always do)"))
    layer_wise_layout: str = spec_field("padded", choices=("padded", "compact"), doc=(
        "Muon's layer-wise optimizer in the distributed optimizer's buffers (training.muon_layer_wise, zero = 1): "
        "padded (Megatron-Core 0.18.0 on: Muon's matrices packed whole into padded shards), compact (Megatron-LM's "
        "dev branch from 3b9c248a1b: unpadded, all-reduced, dealt ping-pong)"))
    workspaces: bool = spec_field(True, doc="TE's and PyTorch's persistent cuBLAS workspaces (false: leave "
                                  "them out, e.g. to compare saved tensors alone)")

    @property
    def deterministic_algorithms(self) -> bool:
        """Whether ``--deterministic-mode`` ran: ``torch.use_deterministic_algorithms(True)`` (``megatron/training/
        arguments.py`` → ``determinism.py``) and Megatron-Core's ``config.deterministic_mode`` — ``deterministic_mode``
        where given, else ``deterministic``. ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` alone reaches TE only."""
        return self.deterministic if self.deterministic_mode is None else self.deterministic_mode

