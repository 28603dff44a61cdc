"""Which Megatron-LM arguments move no memory, and which the simulator refuses and why.

Every argument ``timeline from-megatron`` meets is in exactly one of three places: mapped to a
run-file key (:mod:`timeline.io.megatron_map`), listed here as memory-neutral (logging, data,
checkpointing, the learning-rate schedule, NCCL and process-group tuning, numerics that keep every
tensor's shape and dtype; and, named as such, two compute-communication overlaps simulated as the
schedule without them), or refused here with the reason. An argument in none of them is refused
as unknown, so a new Megatron flag is never silently taken for harmless. Names are Megatron-LM's
``megatron/training/arguments.py`` (2025–2026 main).
"""

from __future__ import annotations

#: memory-neutral arguments, by exact name, grouped by why they move no allocation
NEUTRAL: dict[str, tuple[str, ...]] = {
    "logging": (
        "--log-interval", "--log-params-norm", "--log-num-zeros-in-grad", "--log-throughput", "--log-progress",
        "--log-timers-to-tensorboard", "--log-memory-to-tensorboard", "--log-validation-ppl-to-tensorboard",
        "--tensorboard-dir", "--tensorboard-log-interval", "--timing-log-level", "--timing-log-option",
        "--wandb-project", "--wandb-entity", "--wandb-exp-name", "--wandb-save-dir", "--logging-level",
        "--no-record-throughput", "--straggler-minmax-count", "--log-energy", "--log-world-size-to-tensorboard",
    ),
    "data": (
        "--data-path", "--data-cache-path", "--split", "--vocab-file", "--merge-file", "--tokenizer-type",
        "--tokenizer-model", "--tiktoken-pattern", "--num-workers", "--mock-data", "--dataloader-type",
        "--no-mmap-bin-files", "--fim-data", "--fim-rate",
        "--fim-spm-rate", "--no-use-tokenizer-model-from-checkpoint-args", "--dataset-provider",
        "--vocab-extra-ids", "--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss",
    ),
    "checkpointing": (
        "--save", "--load", "--save-interval", "--save-retain-interval", "--ckpt-format", "--async-save",
        "--async-strategy", "--use-persistent-ckpt-worker", "--ckpt-assume-constant-structure",
        "--ckpt-fully-parallel-load", "--ckpt-fully-parallel-save", "--no-ckpt-fully-parallel-save",
        "--dist-ckpt-strictness", "--dist-ckpt-optim-fully-reshardable", "--dist-ckpt-save-pre-mcore-014",
        "--auto-detect-ckpt-format", "--use-checkpoint-args", "--use-checkpoint-opt_param-scheduler",
        "--no-load-rng", "--verify-integrity", "--exit-on-missing-checkpoint",
    ),
    "learning-rate schedule and optimizer hyper-parameters": (
        "--lr", "--min-lr", "--lr-decay-style", "--lr-decay-iters", "--lr-decay-samples", "--lr-warmup-fraction",
        "--lr-warmup-iters", "--lr-warmup-samples", "--lr-warmup-init", "--lr-wsd-decay-style", "--decoupled-lr",
        "--decoupled-min-lr", "--override-opt-param-scheduler", "--override-opt_param-scheduler",
        "--weight-decay", "--clip-grad", "--adam-beta1", "--adam-beta2", "--adam-eps", "--init-method-std",
        "--seed", "--lr-mult-router",
    ),
    "run length and evaluation (the measured training iterations are unchanged)": (
        "--train-iters", "--train-samples", "--exit-interval", "--exit-duration-in-mins", "--eval-interval",
        "--eval-iters", "--test-mode",
    ),
    "process groups, NCCL and launch": (
        "--distributed-backend", "--distributed-timeout-minutes", "--use-mcore-models", "--use-tp-pp-dp-mapping",
        "--enable-experimental", "--overlap-p2p-communication-warmup-flush",
        "--overlap-param-gather", "--manual-gc", "--manual-gc-interval", "--rerun-mode",
        "--check-weight-hash-across-dp-replicas-interval", "--no-check-for-nan-in-loss-and-grad",
        "--check-for-large-grads", "--calculate-per-token-loss",
        "--moe-flex-dispatcher-num-sms", "--te-rng-tracker",
    ),
    "numerics that keep every tensor's shape and dtype": (
        "--norm-epsilon", "--apply-layernorm-1p", "--no-persist-layer-norm", "--rotary-base", "--rotary-percent", "--rotary-interleaved",
        "--rotary-scaling-factor", "--no-rope-fusion", "--mscale", "--mscale-all-dim", "--use-rotary-position-embeddings",
        "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion", "--no-bias-dropout-fusion", 
        "--moe-router-topk-scaling-factor", "--moe-router-bias-update-rate",
        "--moe-router-num-groups", "--moe-router-group-topk", "--mtp-loss-scaling-factor",
        "--use-flash-attn", "--yarn-beta-fast", "--yarn-beta-slow", "--yarn-original-max-position-embeddings",
        "--no-yarn-correction-range-round-to-int", "--max-tokens-to-oom", "--moe-shared-expert-overlap",
        "--use-transformer-engine-op-fuser",
        "--use-fused-weighted-squared-relu", "--moe-router-fusion",
        "--glu-linear-offset", "--activation-func-clamp-value", "--mtp-use-repeated-layer",
    ),
    # not neutral in truth: simulated as the job without the overlap, which the run file's comment says
    "compute-communication overlap, simulated as the schedule without it (not modelled yet: combined 1F1B's "
    "layer-interleaved forward and backward on a second stream, pipeline_parallel/combined_1f1b.py; TE's "
    "userbuffers, allocated outside PyTorch's allocator, which hold the gathered GEMM inputs)": (
        "--overlap-moe-expert-parallel-comm", "--tp-comm-overlap",
    ),
}

NEUTRAL_REASON: dict[str, str] = {name: why for why, names in NEUTRAL.items() for name in names}

#: arguments whose memory the simulator does not model yet: refused with the reason
REFUSED: dict[str, str] = {
    "--perform-rl-step": "an RL loop (inference engine and training in one process) is not modelled",
    "--inference-max-seq-length": "an inference job (no training step); timeline simulates training",
    "--num-tokens-to-generate": "an inference job (no training step); timeline simulates training",
    "--prompts": "an inference job (no training step); timeline simulates training",
    "--fp8-format": "FP8 training (an FP8 recipe's casts, scales and transpose caches are not modelled yet)",
    "--fp8-recipe": "FP8 training (an FP8 recipe's casts, scales and transpose caches are not modelled yet)",
    "--fp8-param-gather": "FP8 parameters are not modelled yet",
    "--fp4-format": "FP4 training is not modelled yet",
    "--enable-cuda-graph": "CUDA graphs keep their own memory pools (not modelled yet)",
    "--cuda-graph-impl": "CUDA graphs keep their own memory pools (not modelled yet)",
    "--cuda-graph-scope": "CUDA graphs keep their own memory pools (not modelled yet)",
    "--use-megatron-fsdp": "Megatron-FSDP (ZeRO-3 style sharding) is not modelled",
    "--data-parallel-sharding-strategy": "FSDP-style sharding of optimizer states, gradients and parameters "
                                         "is not modelled",
    "--fine-grained-activation-offloading": "activation offloading to CPU is not modelled",
    "--cpu-offloading": "activation offloading to CPU is not modelled",
    "--offload-modules": "activation offloading to CPU is not modelled",
    "--export-kd-teacher-load": "distillation keeps a teacher model in memory (not modelled)",
    "--finetune": "the job loads a checkpoint's weights before the measured iterations (not modelled)",
    "--no-load-optim": "the job loads a checkpoint before the measured iterations (not modelled)",
    "--delay-wgrad-compute": "delayed weight-gradient computation is not modelled yet",
    "--precision-aware-optimizer": "the precision-aware optimizer's state dtypes are not modelled yet",
    "--use-precision-aware-optimizer": "the precision-aware optimizer's state dtypes are not modelled yet",
    "--main-grads-dtype": "the precision-aware optimizer's state dtypes are not modelled yet",
    "--main-params-dtype": "the precision-aware optimizer's state dtypes are not modelled yet",
    "--exp-avg-dtype": "the precision-aware optimizer's state dtypes are not modelled yet",
    "--exp-avg-sq-dtype": "the precision-aware optimizer's state dtypes are not modelled yet",
    "--first-last-layers-bf16": "FP8 training with bf16 first/last layers is not modelled yet",
    "--window-size": "sliding-window attention is not modelled yet",
    "--softmax-type": "attention softmax variants (learnable sinks) are not modelled yet",
    "--quick-geglu": "the GeGLU activation is not modelled yet",
    "--moe-pad-experts-for-cuda-graph-inference": "CUDA-graph inference padding is not modelled",
    "--defer-embedding-wgrad-compute": "deferred embedding weight gradients are not modelled yet",
    "--empty-unused-memory-level": "emptying the allocator cache between steps is not modelled yet",
    "--recompute-activations": "use --recompute-granularity selective (the same policy) instead",
    "--distribute-saved-activations": "saved activations distributed over TP ranks are not modelled yet",
    "--num-experts-per-tok": "not a Megatron-LM argument; use --moe-router-topk",
}

#: arguments that name a model family the simulator lacks (refused as that family)
FAMILY_ARGS: dict[str, str] = {
    "--encoder-num-layers": "T5 encoder-decoder", "--encoder-seq-length": "T5 encoder-decoder",
    "--decoder-seq-length": "T5 encoder-decoder", "--bert-no-binary-head": "BERT encoder",
    "--hybrid-layer-pattern": "Mamba/hybrid", "--hybrid-override-pattern": "Mamba/hybrid",
    "--is-hybrid-model": "Mamba/hybrid", "--mamba-num-heads": "Mamba/hybrid", "--mamba-state-dim": "Mamba/hybrid",
    "--flextron": "Flextron elastic", "--img-h": "multimodal (vision)", "--img-w": "multimodal (vision)",
    "--patch-dim": "multimodal (vision)",
}

#: model families a functional test's folder or a ``pretrain_<family>.py`` names; gpt and the MoE
#: folders are modelled, the rest are not
MODELLED_FAMILIES = ("gpt", "moe", "mixtral", "deepseek", "llama", "qwen")
FAMILY_NAMES = {"bert": "BERT encoder", "t5": "T5 encoder-decoder", "hybrid": "Mamba/hybrid",
                "mamba": "Mamba/hybrid", "nemotron": "Mamba/hybrid (Nemotron-H)", "mimo": "multimodal (MIMO)",
                "multimodal-llava": "multimodal (LLaVA)", "vlm": "multimodal (VLM)", "retro": "RETRO",
                "ict": "ICT retriever"}

#: ``--model-provider`` / ``--spec`` values outside GPTModel
PROVIDER_FAMILIES = {"hybrid": "Mamba/hybrid", "mamba": "Mamba/hybrid", "llava_vlm": "multimodal (LLaVA)",
                     "mimo": "multimodal (MIMO)"}

#: environment variables that change PyTorch-allocator memory; every other variable (NCCL's, whose
#: buffers are outside PyTorch's allocator, CUDA_DEVICE_MAX_CONNECTIONS, paths) is memory-neutral
ENV_MAPPED = ("PYTORCH_CUDA_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG", "NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN",
              "NVTE_UNFUSED_ATTN", "NVTE_ALLOW_NONDETERMINISTIC_ALGO", "TORCH_NCCL_AVOID_RECORD_STREAMS")
