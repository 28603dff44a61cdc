"""The ``[framework]``, ``[allocator]`` and ``[hardware]`` sections of a converted Megatron-LM job:
implementation switches from Megatron's arguments and the environment variables that change
PyTorch-allocator memory (``PYTORCH_CUDA_ALLOC_CONF``, ``CUBLAS_WORKSPACE_CONFIG``, Transformer
Engine's ``NVTE_*_ATTN`` backend switches, ``NVTE_ALLOW_NONDETERMINISTIC_ALGO``,
``TORCH_NCCL_AVOID_RECORD_STREAMS``). NCCL's own variables size buffers outside PyTorch's allocator
and are memory-neutral here.

Transformer Engine's ``auto`` attention choice (``TE attention/dot_product_attention/utils.py:
get_attention_backend``, v2.6): FlashAttention and cuDNN FusedAttention both qualify for 16-bit
inputs with head dims ≤ 256; on sm ≥ 90 TE drops FlashAttention "to give FusedAttention preference
on Hopper+", and when deterministic backward is required (``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0``)
FlashAttention 2's non-deterministic backward is dropped too; fp32 inputs fall back to unfused. In
deterministic training on Blackwell the fused backend depends on the TE version
(:func:`blackwell_deterministic_fused`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from timeline.errors import UserError
from timeline.profiles.megatron_workspaces import version_tuple
from timeline.spec.cuda_graph_rules import capture_before_first_step, megatron_release
from timeline.spec.framework import CUDA_GRAPH_SCOPES

if TYPE_CHECKING:
    from timeline.io.megatron_map import ArgReader, Conversion


def _on(env: dict[str, str], name: str) -> bool | None:
    v = env.get(name)
    return None if v is None else v.strip() not in ("0", "", "false", "False")


def blackwell_deterministic_fused(te_version: str, attention_dropout: float) -> bool:
    """Whether TE runs its F16 FusedAttention in deterministic training on sm ≥ 100.

    TE ``attention/dot_product_attention/utils.py: get_attention_backend`` ("Disabling FusedAttention
    for determinism reasons on Blackwell", from a5c79876a, 2025-08): in v2.7–v2.8 when cuDNN ≤ 9.14.0
    (taken as the cuDNN of those releases' containers), in v2.9–v2.11 always; from v2.12
    (27fc168e2) the filter lives in ``common/fused_attn/fused_attn.cpp: nvte_get_fused_attn_backend``,
    which allows deterministic training backward on Blackwell with cuDNN ≥ 9.18.1 (taken as present)
    only without dropout and bias (Megatron's GPT attention has no core-attention bias)."""
    te = version_tuple(te_version)
    if te < (2, 7):
        return True
    if te < (2, 12):
        return False
    return attention_dropout == 0.0


def _head_dim(a: ArgReader) -> int:
    """The attention head dimension the arguments give (``--kv-channels``, else hidden / heads; 0: not given)."""
    heads = a.int("--num-attention-heads")
    hidden = a.int("--hidden-size")
    return a.int("--kv-channels") or (hidden // heads if hidden and heads else 0)


def _fused_head_dims(a: ArgReader, sm: int) -> bool:
    """TE ``common/fused_attn/fused_attn.cpp: nvte_get_fused_attn_backend`` (v2.4 … v2.18): cuDNN's F16
    arbitrary-sequence-length backend takes head dims divisible by 8, up to 128 (256 on sm ≥ 90 with cuDNN 9);
    MLA's unequal q/k and v head dims are checked by their own sizes, not read here."""
    head_dim = _head_dim(a)
    if a.flag("--multi-latent-attention") or not head_dim:
        return True
    return head_dim % 8 == 0 and head_dim <= (256 if sm >= 90 else 128)


def _flash2_head_dims(a: ArgReader, sm: int) -> bool:
    """TE ``get_attention_backend``'s "Filter: Head dimension" for FlashAttention 2 (v2.14): not for MLA
    (q/k and v head dims differ), and only for head dims ≤ 256 divisible by 8 (> 192 only on sm 80, 90,
    100 and 120)."""
    if a.flag("--multi-latent-attention"):
        return False
    head_dim = _head_dim(a)
    if not head_dim:
        return True
    return head_dim <= 256 and head_dim % 8 == 0 and (head_dim <= 192 or sm in (80, 90, 100, 120))


def aux_loss_coeff(value: object) -> float:
    """``--moe-aux-loss-coeff`` as one number: the largest of its values (one per aux-loss type; the loss
    is computed when its coefficient is > 0)."""
    items = value if isinstance(value, list | tuple) else str(value).split()
    try:
        coeffs = [float(v) for v in items]
    except ValueError:
        raise UserError(f"--moe-aux-loss-coeff: expected numbers, got {value!r}") from None
    if not coeffs or min(coeffs) < 0:
        raise UserError(f"--moe-aux-loss-coeff: expected numbers >= 0, got {value!r}")
    return max(coeffs)


def attention_backend(a: ArgReader, env: dict[str, str], *, sm: int, dtype: str, deterministic: bool,
                      te_version: str = "2.6") -> str:
    """The attention implementation the job runs, after Megatron's argument and TE's switches."""
    if a.str("--transformer-impl", "transformer_engine") == "local":
        return "local"
    choice = a.str("--attention-backend", "auto")
    if choice not in ("auto", "flash", "fused", "unfused", "local"):
        raise UserError(f"--attention-backend {choice}: use auto, flash, fused, unfused or local")
    # the argument acts through Core's LanguageModule._set_attention_backend (the NVTE_*_ATTN switches it sets,
    # megatron/core/models/common/language_module/language_module.py@46fdcd5b7e … d98e8a64dd); the legacy
    # GPTModel / BertModel are megatron/legacy/model/module.py: MegatronModule, which never calls it, so TE's
    # TransformerLayer there chooses as under auto
    if a.flag("--use-legacy-models"):
        choice = "auto"
    if choice != "auto":
        return choice
    # TE 2.6 attention/dot_product_attention/utils.py: get_attention_backend — in deterministic training
    # the F16 fused sub-backend runs only on sm ≥ 90 ("Disabling FusedAttention for determinism
    # reasons"); where flash and fused both remain, fused is preferred on Hopper and later
    flash = _on(env, "NVTE_FLASH_ATTN") is not False and dtype != "fp32" and _flash2_head_dims(a, sm)
    # TE before 1.3 (NVIDIA/TransformerEngine@v1.2.1 pytorch/attention.py: DotProductAttention.__init__):
    # "Disabling usage of FlashAttention since version 2 does not support deterministic execution" whenever
    # NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 and flash-attn 2 is installed; v1.3 disables it only for
    # flash-attn < 2.4.1 (its deterministic backward came with 2.4.1)
    if deterministic and version_tuple(te_version) < (1, 3):
        flash = False
    fused = _on(env, "NVTE_FUSED_ATTN") is not False and dtype != "fp32" and not (deterministic and sm < 90) \
        and _fused_head_dims(a, sm)
    if fused and deterministic and sm >= 100:
        fused = blackwell_deterministic_fused(te_version, a.float("--attention-dropout", 0.1))
    if flash and fused and sm >= 90:
        flash = False
    if flash:
        return "flash"
    if fused:
        return "fused"
    if _on(env, "NVTE_UNFUSED_ATTN") is False:
        raise UserError("NVTE_FLASH_ATTN, NVTE_FUSED_ATTN and NVTE_UNFUSED_ATTN leave no attention backend")
    return "unfused"


def allocator_conf(text: str, c: Conversion) -> None:
    """``PYTORCH_CUDA_ALLOC_CONF`` options the allocator model has; others are refused by name."""
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, _, value = item.partition(":")
        key, value = key.strip(), value.strip()
        if key == "expandable_segments":
            c.put("allocator.expandable_segments", value.lower() == "true")
        elif key == "max_split_size_mb":
            c.put("allocator.max_split_size_mb", int(value))
        elif key == "max_non_split_rounding_mb":
            c.put("allocator.max_non_split_rounding_mb", int(value))
        elif key == "roundup_power2_divisions" and value.isdigit():
            c.put("allocator.roundup_power2_divisions", int(value))
        elif key == "garbage_collection_threshold":
            continue  # frees cached blocks when reserved nears capacity: no allocated byte changes
        else:
            raise UserError(f"PYTORCH_CUDA_ALLOC_CONF: option {item!r} is not modelled")
    c.env_mapped["PYTORCH_CUDA_ALLOC_CONF"] = "allocator.*"


def framework(a: ArgReader, c: Conversion, env: dict[str, str], *, gpu: str, sm: int, te_version: str | None,
              pytorch_version: str | None = None, megatron_core: str | None = None,
              keeps_batch: bool | None = None, probs_in_experts: bool | None = None,
              releases_nodes: bool | None = None, router_te_gemm_fixed: bool = False) -> None:
    """``[framework]``, ``[allocator]`` and ``[hardware]`` from the arguments and the environment.

    ``keeps_batch``: whether the Megatron-LM commit has 5e4fc931ba's ``get_batch`` (None: read from
    ``megatron_core``, from 0.19.0 on; main's 0.18.0 spans both sides of it). ``probs_in_experts``: whether it
    has 2659630721's routing-probability multiply inside the experts (None: from ``megatron_core``, from
    0.13 on; main's 0.12.0rc0 spans both sides of it). ``releases_nodes``: whether it has a56a0b001d's
    combined-1F1B layer release (None: from ``megatron_core``, 0.16.0 on; main's 0.16.0rc0 spans both sides).
    ``router_te_gemm_fixed``: whether it has d3528a2130's TE GEMM import for the MoE router though
    ``megatron_core`` is below 0.17 (main's and dev's 0.16.0rc0 span both sides of it)."""
    dtype = c.sections["training"]["dtype"]
    deterministic = a.flag("--deterministic-mode") or env.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "1") == "0"
    c.put("framework.megatron_core", megatron_core or "0.14.0")
    c.put("framework.transformer_engine", te_version or "2.6")
    c.put("framework.pytorch", pytorch_version or "2.13")
    impl = a.str("--transformer-impl", "transformer_engine")
    if impl not in ("transformer_engine", "local"):
        raise UserError(f"--transformer-impl {impl}: use transformer_engine or local")
    c.put("framework.transformer_impl", impl, "--transformer-impl")
    c.put("framework.attention_backend",
          attention_backend(a, env, sm=sm, dtype=dtype, deterministic=deterministic, te_version=te_version or "2.6"),
          "--attention-backend")
    c.put("framework.gradient_accumulation_fusion", not a.flag("--no-gradient-accumulation-fusion"),
          "--no-gradient-accumulation-fusion")
    fusion = "none"
    if a.flag("--cross-entropy-loss-fusion"):
        fusion = a.str("--cross-entropy-fusion-impl", "native")
        if fusion not in ("native", "te"):
            raise UserError(f"--cross-entropy-fusion-impl {fusion}: use native or te")
    else:
        a.value("--cross-entropy-fusion-impl")
    c.put("framework.cross_entropy_fusion", fusion, "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl")
    c.put("framework.masked_softmax_fusion", not a.flag("--no-masked-softmax-fusion"), "--no-masked-softmax-fusion")
    # arguments.py → core_transformer_config_from_args: bias_activation_fusion = args.bias_swiglu_fusion under
    # --swiglu (args.bias_gelu_fusion otherwise: unfused GELU keeps what the fused one keeps, its input)
    if a.flag("--no-bias-swiglu-fusion") and c.sections["model"].get("hidden_act") == "silu":
        c.put("framework.bias_swiglu_fusion", False, "--no-bias-swiglu-fusion")
    c.put("framework.fused_weighted_squared_relu", a.flag("--use-fused-weighted-squared-relu"),
          "--use-fused-weighted-squared-relu")
    if a.flag("--use-te-activation-func"):  # mlp.py / experts.py: a TE module where the layer spec builds one
        c.put("framework.te_activation_func", True, "--use-te-activation-func")
    # arguments.py: --no-create-attention-mask-in-dataloader (store_false create_attention_mask_in_dataloader)
    c.put("framework.dataloader_batch", "tokens" if a.flag("--no-create-attention-mask-in-dataloader") else "mask",
          "--no-create-attention-mask-in-dataloader")
    # Megatron-LM 5e4fc931ba (2026-05-21, main at 0.18.0; first release 0.19.0): pretrain_gpt.py get_batch writes
    # the .cuda() copies into the dict RerunDataIterator saved (core/rerun_state_machine.py), kept until the next
    # train_step unless --rerun-mode disabled (training/config/resilience_config.py default validate_results)
    if keeps_batch is None:
        keeps_batch = version_tuple(megatron_core or "0.14.0") >= (0, 19)
    c.put("framework.rerun_keeps_batch",
          keeps_batch and a.str("--rerun-mode", "validate_results") != "disabled", "--rerun-mode")
    _combined_1f1b(a, c, megatron_core, releases_nodes)
    # arguments.py: --apply-query-key-layer-scaling sets attention_softmax_in_fp32
    c.put("framework.attention_softmax_in_fp32",
          a.flag("--attention-softmax-in-fp32") or a.flag("--apply-query-key-layer-scaling"),
          "--attention-softmax-in-fp32", "--apply-query-key-layer-scaling")
    # --padded-vocab-size is the model's vocabulary as it stands (training/argument_utils.py: should_pad_vocab
    # False; before 0.17 core/tokenizers/utils/build_tokenizer.py: _set_padded_vocab_size keeps a given one)
    c.put("framework.make_vocab_size_divisible_by",
          1 if a.has("--padded-vocab-size") else a.int("--make-vocab-size-divisible-by", 128),
          "--make-vocab-size-divisible-by")
    c.put("framework.deterministic", deterministic, "--deterministic-mode")
    if deterministic and not a.flag("--deterministic-mode"):  # NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 alone
        c.put("framework.deterministic_mode", False)
    level = a.int("--empty-unused-memory-level", 0)
    if level not in (0, 1, 2):
        raise UserError(f"--empty-unused-memory-level {level}: Megatron's choices are 0, 1 and 2")
    if level:
        c.put("framework.empty_unused_memory_level", level, "--empty-unused-memory-level")
    if a.flag("--tp-comm-overlap"):
        c.put("framework.tp_comm_overlap", True, "--tp-comm-overlap")
    cuda_graphs(a, c, megatron_core)
    # training.py: get_model builds DistributedDataParallelConfig from these (the grad buffer's buckets)
    overlap = a.flag("--overlap-grad-reduce")
    c.put("framework.overlap_grad_reduce", overlap, "--overlap-grad-reduce")
    # training.py: get_model (≤ 0.17: bucket_size = parameters // --ddp-num-buckets; later the DDP config's
    # num_buckets), None without --overlap-grad-reduce (distributed_data_parallel.py: one bucket)
    if a.value("--ddp-num-buckets") is not None and overlap:
        raise UserError("--ddp-num-buckets with --overlap-grad-reduce: the bucket size it gives (the rank's "
                        "parameters ÷ N) is not modelled; give the equivalent --ddp-bucket-size")
    # embeddings/language_model_embedding.py: LanguageModelEmbedding.forward clones the sequence-parallel
    # scatter's output unless this flag; without SP it changes nothing
    no_clone = (a.flag("--no-clone-scatter-output-in-embedding")
                or a.flag("--disable-clone-scatter-output-in-embedding"))
    if no_clone and c.sections["parallel"]["sp"]:
        raise UserError("--no-clone-scatter-output-in-embedding with sequence parallelism: the embedding's full "
                        "output kept alive by the scattered view is not modelled")
    bucket = a.int("--ddp-bucket-size", 0)
    if bucket < 0:
        raise UserError(f"--ddp-bucket-size {bucket}: give a positive number of elements")
    c.put("framework.ddp_bucket_size", bucket, "--ddp-bucket-size")
    c.put("framework.ddp_pad_for_busbw", a.flag("--ddp-pad-buckets-for-high-nccl-busbw"),
          "--ddp-pad-buckets-for-high-nccl-busbw")
    if "n_routed_experts" in c.sections["model"]:
        disp = a.str("--moe-token-dispatcher-type", "allgather")
        if disp not in ("allgather", "alltoall", "flex"):
            raise UserError(f"--moe-token-dispatcher-type {disp}: use allgather, alltoall or flex")
        c.put("framework.moe_token_dispatcher", disp, "--moe-token-dispatcher-type")
        _flex_backend(c, a, disp, env, gpu)
        lb = a.str("--moe-router-load-balancing-type", "aux_loss")
        if lb not in ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"):
            raise UserError(f"--moe-router-load-balancing-type {lb}: not a Megatron router")
        # MC transformer/moe/router.py: TopKRouter.is_aux_loss_enabled — an aux-loss type with coefficient 0
        # (arguments.py: --moe-aux-loss-coeff, nargs='+', default 0.0) computes no loss: the top-k router as "none"
        if lb.endswith("aux_loss") and aux_loss_coeff(a.value("--moe-aux-loss-coeff", 0.0)) == 0:
            lb = "none"
        c.put("framework.moe_router_load_balancing", lb, "--moe-router-load-balancing-type", "--moe-aux-loss-coeff")
        rd = a.str("--moe-router-dtype", "") or ""
        if rd not in ("", "fp32", "fp64"):
            raise UserError(f"--moe-router-dtype {rd}: use fp32 or fp64")
        c.put("framework.moe_router_dtype", rd, "--moe-router-dtype")
        c.put("framework.moe_permute_fusion", a.flag("--moe-permute-fusion"), "--moe-permute-fusion")
        # moe/moe_utils.py: topk_routing_with_score_function(fused=config.moe_router_fusion) calls TE's
        # fused_topk_with_score_function, raising "Please install TE >= 2.6.0" without it (core_v0.17.0)
        fused_router = a.flag("--moe-router-fusion")
        if fused_router and te_version is not None and version_tuple(te_version)[:2] < (2, 6):
            raise UserError(f"--moe-router-fusion with Transformer Engine {te_version}: Megatron-LM raises (TE's "
                            "fused_topk_with_score_function needs TE >= 2.6); drop it or give --te-version 2.6")
        c.put("framework.moe_router_fusion", fused_router, "--moe-router-fusion")
        jitter = a.value("--moe-input-jitter-eps")
        if jitter not in (None, False, "None", "none"):
            if float(jitter) <= 0:
                raise UserError(f"--moe-input-jitter-eps {jitter}: torch's Uniform(1 - eps, 1 + eps) raises (its low must "
                                "be below its high); give a positive eps, or drop it")
            c.put("framework.moe_input_jitter", True, "--moe-input-jitter-eps")
        if a.flag("--moe-apply-probs-on-input"):  # experts.py asserts top-1 routing
            if a.int("--moe-router-topk", 2) != 1:
                raise UserError("--moe-apply-probs-on-input with --moe-router-topk other than 1: Megatron-LM's "
                                "experts assert top-1 routing (experts.py); give --moe-router-topk 1")
            c.put("framework.moe_apply_probs_on_input", True, "--moe-apply-probs-on-input")
        if a.flag("--moe-router-force-load-balancing"):  # random logits: the balanced routing the run takes anyway
            c.put("framework.moe_router_force_load_balancing", True, "--moe-router-force-load-balancing")
        c.put("framework.moe_grouped_gemm", a.flag("--moe-grouped-gemm"), "--moe-grouped-gemm")
        c.put("framework.moe_legacy_grouped_gemm", a.flag("--moe-use-legacy-grouped-gemm"),
              "--moe-use-legacy-grouped-gemm")
        # Megatron-LM 2659630721 (2025-04-09, "Memory efficient token permutation"; not in core_r0.12.x, first in
        # core_v0.13.0rc0): experts.py multiplies the routing probs into the activation; before it the
        # dispatchers' combine multiplied the experts' output (moe_utils.py: unpermute, token_dispatcher.py:
        # MoEAllGatherTokenDispatcher.token_unpermutation at 2659630721^)
        if probs_in_experts is None:
            probs_in_experts = version_tuple(megatron_core or "0.14.0") >= (0, 13)
        if not probs_in_experts and disp == "flex":
            raise UserError("--moe-token-dispatcher-type flex before Megatron-Core 0.13: the DeepEP combine that "
                            "multiplied the routing probs then (before Megatron-LM 2659630721) is not modelled; "
                            "give --megatron-core 0.13 or later")
        c.put("framework.moe_probs_in_experts", probs_in_experts)
        if router_te_gemm_fixed:  # written only where the version does not say it (the default is false)
            c.put("framework.router_te_gemm_fixed", True)
        score = a.str("--moe-router-score-function", "softmax")
        if score not in ("softmax", "sigmoid"):
            raise UserError(f"--moe-router-score-function {score}: use softmax or sigmoid")
        a.flag("--moe-router-pre-softmax")  # softmax before top-k: the same tensors' shapes
        # router.py: TopKRouter.apply_z_loss runs whenever the coefficient is given (0 included)
        c.put("framework.moe_z_loss", a.value("--moe-z-loss-coeff") is not None, "--moe-z-loss-coeff")
    else:  # a dense model runs no router: its loss coefficients move nothing
        a.value("--moe-aux-loss-coeff")
        a.has("--moe-z-loss-coeff")
    if "CUBLAS_WORKSPACE_CONFIG" in env:
        c.put("framework.cublas_workspace_config", env["CUBLAS_WORKSPACE_CONFIG"])
        c.env_mapped["CUBLAS_WORKSPACE_CONFIG"] = "framework.cublas_workspace_config"
    if env.get("TORCH_NCCL_AVOID_RECORD_STREAMS") is not None:
        c.put("framework.avoid_record_streams", env["TORCH_NCCL_AVOID_RECORD_STREAMS"] == "1")
        c.env_mapped["TORCH_NCCL_AVOID_RECORD_STREAMS"] = "framework.avoid_record_streams"
    for name in ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN"):
        if name in env:
            c.env_mapped[name] = "framework.attention_backend"
    if "NVTE_ALLOW_NONDETERMINISTIC_ALGO" in env:
        c.env_mapped["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] = "framework.deterministic"
    if env.get("PYTORCH_CUDA_ALLOC_CONF"):
        allocator_conf(env["PYTORCH_CUDA_ALLOC_CONF"], c)
        graphs = c.sections.get("framework", {}).get("cuda_graph_impl", "none") != "none"
        if graphs and c.sections.get("allocator", {}).get("expandable_segments") and \
                env.get("NCCL_GRAPH_REGISTER", "") != "0":
            # cuda_graphs.py: TECudaGraphHelper.__init__ (2b343d739f … d98e8a64dd) asserts it
            raise UserError("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True with CUDA graphs: Megatron-LM asserts "
                            "NCCL_GRAPH_REGISTER=0 (illegal memory access otherwise); set it in the job's environment")
    c.put("hardware.gpu", gpu)



#: GPUs one NVLink domain joins per --gpu (HGX boards 8; a GB200 NVL72 rack 72)
NVLINK_DOMAIN = {"gb200": 72}


def _flex_backend(c: Conversion, a: ArgReader, disp: str, env: dict[str, str], gpu: str) -> None:
    """``--moe-flex-dispatcher-backend`` (and the deprecated ``--moe-enable-deepep``) → ``[framework]
    moe_flex_backend``, and the NVLink domain HybridEP partitions its group by → ``nvlink_domain``.

    MC transformer/transformer_config.py (Megatron-LM f098fe84): ``moe_flex_dispatcher_backend`` defaults
    to ``"deepep"``; ``moe_enable_deepep`` requires the flex dispatcher, refuses ``hybridep`` and sets
    ``deepep``. DeepEP@1b8f467 (hybrid-ep) deep_ep/hybrid_ep_buffer.py: HybridEPBuffer.__init__ takes
    ``NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN`` when set, else the ranks it detects over NVLink. Written
    for the flex dispatcher only."""
    backend = a.str("--moe-flex-dispatcher-backend", "deepep")
    if backend not in ("deepep", "hybridep"):
        raise UserError(f"--moe-flex-dispatcher-backend {backend}: use deepep or hybridep")
    if a.flag("--moe-enable-deepep"):
        if disp != "flex":
            raise UserError("--moe-enable-deepep: DeepEP runs only with --moe-token-dispatcher-type flex")
        if backend == "hybridep":
            raise UserError("--moe-enable-deepep with --moe-flex-dispatcher-backend hybridep: give one backend")
    if disp != "flex":
        return
    c.put("framework.moe_flex_backend", backend, "--moe-flex-dispatcher-backend", "--moe-enable-deepep")
    domain = env.get("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", "")
    if domain:
        if not domain.isdigit() or int(domain) < 1:
            raise UserError(f"NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN={domain}: give a positive integer")
        c.env_mapped["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] = "framework.nvlink_domain"
    c.put("framework.nvlink_domain", int(domain) if domain else NVLINK_DOMAIN.get(gpu, 8))


def _combined_1f1b(a: ArgReader, c: Conversion, megatron_core: str | None, releases_nodes: bool | None) -> None:
    """Combined 1F1B's memory rules (``schedule.combined_1f1b`` is set with the schedule): before Megatron-LM
    a56a0b001d (2026-01-06; first release core_v0.16.0) each backward layer node kept its inputs' gradients
    and its outputs until the pair ended (:func:`timeline.sim.combined.kept_node_io`); from it on,
    ``--ep-overlap-early-attn-memory-release`` moves the backward's attention before the forward's experts
    (``model_chunk_schedule_plan.py: TransformerLayerSchedulePlan.run``)."""
    delay = a.flag("--delay-wgrad-compute")
    if not c.sections.get("schedule", {}).get("combined_1f1b"):
        a.flag("--ep-overlap-early-attn-memory-release")
        if delay and not (a.flag("--use-megatron-fsdp") or a.flag("--use-custom-fsdp")):  # FSDP refuses it itself
            raise UserError("--delay-wgrad-compute without --overlap-moe-expert-parallel-comm: Megatron-LM refuses it "
                            "(transformer_config.py: __post_init__); add the overlap or drop it")
        return
    c.put("framework.delay_wgrad_compute", delay, "--delay-wgrad-compute")
    if releases_nodes is None:
        releases_nodes = version_tuple(megatron_core or "0.14.0") >= (0, 16, 0)
    c.put("framework.combined_1f1b_keeps_node_io", not releases_nodes, "--overlap-moe-expert-parallel-comm")
    early = a.flag("--ep-overlap-early-attn-memory-release")
    if early and not releases_nodes:
        raise UserError("--ep-overlap-early-attn-memory-release: Megatron-LM has it from a56a0b001d (core 0.16.0) "
                        "on; give --megatron-core 0.16.0 or later")
    c.put("framework.ep_overlap_early_attn_memory_release", early, "--ep-overlap-early-attn-memory-release")


#: Megatron-LM's CUDA-graph arguments (``megatron/training/arguments.py``@11debfa7b4 / d98e8a64dd):
#: --external-cuda-graph is --cuda-graph-impl transformer_engine and --enable-cuda-graph local; the per-layer
#: graph's modules are --cuda-graph-scope (core_v0.12 … 0.17, default "full": the whole layer) and, from
#: e41b37002c (core_v0.18.0), --cuda-graph-modules (default empty: the whole layer; --cuda-graph-scope its
#: deprecated alias); --cuda-graph-warmup-steps defaults to 3
CUDA_GRAPH_ARGS = ("--cuda-graph-impl", "--external-cuda-graph", "--enable-cuda-graph", "--cuda-graph-scope",
                   "--cuda-graph-modules", "--cuda-graph-warmup-steps")


def cuda_graphs(a: ArgReader, c: Conversion, megatron_core: str | None) -> None:
    """``[framework] cuda_graph_impl`` / ``cuda_graph_scope`` / ``cuda_graph_warmup_steps`` from Megatron's
    CUDA-graph arguments. With warm-up steps the run simulates two iterations past the capture (the eager ones,
    the one that captures, a replayed one), so the peak over them is the job's."""
    scope = cuda_graph_scope(a, megatron_core)
    if scope is None:
        return
    used = [n for n in CUDA_GRAPH_ARGS if n in a.raw]
    c.put("framework.cuda_graph_impl", "transformer_engine", *used)
    c.put("framework.cuda_graph_scope", scope, *used)
    steps = a.int("--cuda-graph-warmup-steps", 3)
    if steps and not capture_before_first_step(megatron_core):
        c.put("framework.cuda_graph_warmup_steps", steps, "--cuda-graph-warmup-steps")
        c.put("training.iterations", max(int(c.sections.get("training", {}).get("iterations", 2)), steps + 2),
              "--cuda-graph-warmup-steps")


def cuda_graph_scope(a: ArgReader, megatron_core: str | None = None) -> str | None:
    """The scope of the TE per-layer graphs the arguments ask for (full, or the modules: ``[framework]
    cuda_graph_scope``), None without CUDA graphs; what is not modelled is refused in one line."""
    impl = str(a.value("--cuda-graph-impl", "none")).strip("'\" ")
    if a.flag("--external-cuda-graph"):
        impl = "transformer_engine"
    if a.flag("--enable-cuda-graph") or impl == "local":
        name = "--enable-cuda-graph" if a.flag("--enable-cuda-graph") else "--cuda-graph-impl local"
        raise UserError(f"{name}: Megatron's own CudaGraphManager (a graph per layer and micro-batch captured "
                        "lazily in the first iterations, cuda_graphs.py) is not modelled; use --cuda-graph-impl "
                        "transformer_engine or drop it")
    if impl == "full_iteration":
        raise UserError("--cuda-graph-impl full_iteration: one graph of the whole forward-backward "
                        "(full_cuda_graph.py: FullCudaGraphWrapper) is not modelled; use transformer_engine or none")
    for name in ("--cuda-graph-scope", "--cuda-graph-modules", "--cuda-graph-warmup-steps"):
        a.has(name)  # read: they act only with an impl
    if impl in ("none", "None"):
        return None
    if impl != "transformer_engine":
        raise UserError(f"--cuda-graph-impl {impl}: use none, transformer_engine (modelled) or local")
    flag = "--cuda-graph-modules" if a.has("--cuda-graph-modules") else "--cuda-graph-scope"
    raw = a.value(flag)
    # argparse's list (a launch script's words arrive as a tuple), or a YAML string "[attn mlp]"
    words = [w for w in re.split(r"[\s,\[\]'\"]+", " ".join(map(str, raw)) if isinstance(raw, list | tuple)
                                 else str(raw or "")) if w]
    if words in ([], ["full"]):
        return "full"
    text = " ".join(words)
    if "full_iteration" in words:
        raise UserError(f"{flag} {text}: Megatron-LM captures a whole iteration only under --cuda-graph-impl local "
                        "(transformer_config.py: __post_init__); use full or the modules")
    other = [w for w in words if w not in CUDA_GRAPH_SCOPES]
    if other:
        raise UserError(f"{flag} {text}: {', '.join(other)} graphs are not modelled (Mamba layers' graphs among "
                        f"them); the modules modelled are {', '.join(CUDA_GRAPH_SCOPES)}")
    if set(words) - {"attn"} and megatron_release(megatron_core) < (0, 16, 0, 0):
        raise UserError(f"{flag} {text}: per-module graphs came with Megatron-Core 0.16.0 (before it the scope is "
                        "full, attn or full_iteration: arguments.py); give --megatron-core 0.16.0 or later, or attn")
    if "moe_router" in words and a.flag("--moe-shared-expert-overlap"):
        raise UserError(f"{flag} {text} with --moe-shared-expert-overlap: the shared experts then run outside the "
                        "router's graph on their own stream (transformer_layer.py: _get_submodules_under_cudagraphs), "
                        "which is not modelled; drop the overlap")
    return " ".join(w for w in CUDA_GRAPH_SCOPES if w in words)  # Megatron's order, each once
