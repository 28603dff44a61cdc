"""The Megatron-LM arguments that move no allocation of the training step timeline simulates, by why.

Two kinds. :data:`NEUTRAL` groups arguments by the reason they move nothing: host-side logging,
data and checkpoint plumbing, learning-rate arithmetic, launch and NCCL tuning, numerics that keep
every tensor's shape and dtype, inference- and RL-engine settings the training step never reads,
and code paths ``pretrain_gpt.py`` does not build. :data:`UNDER` lists parameters of a feature
that is refused (:mod:`timeline.io.megatron_table`): alone they change nothing, and with their
feature the job is refused for that feature. Each reason names the code that reads the argument
(Megatron-LM ``megatron/`` paths, 0.12–main). This module holds no mapped or refused argument.
"""

from __future__ import annotations

#: memory-neutral arguments, by exact option string, grouped by why they move no allocation
NEUTRAL: dict[str, tuple[str, ...]] = {
    "fine-grained activation offloading's CUDA-graph switch: it defers the offload groups' copies to after a TE "
    "CUDA graph's replay (pipeline_parallel/fine_grained_activation_offload.py: push_offload_groups), so without "
    "CUDA graphs it changes nothing; with them the job is refused for its graphs": (
        "--delay-offload-until-cuda-graph",
    ),
    "Megatron-FSDP's initialisation and checkpoint checks: meta-device parameters are materialised group by group "
    "into the FSDP buffers (megatron_fsdp/param_and_grad_buffer.py: _init_each_parameter_group_buffers), below the "
    "training peak; strict DTensor loading only validates keys": (
        "--init-model-with-meta-device", "--no-strict-fsdp-dtensor-load", "--disable-strict-fsdp-dtensor-load",
    ),
    "FP8 scaling arithmetic: how delayed scaling turns the amax history into a scale (TE common/recipe "
    "DelayedScaling: amax_compute_algo, margin, interval), not what is allocated": (
        "--fp8-amax-compute-algo", "--fp8-interval", "--fp8-margin",
    ),
    "logging, timers and reporting: host-side (training/training.py: training_log, the tensorboard, wandb, "
    "one-logger and OpenTelemetry writers, core/config_logger.py); no device tensor": (
        "--log-interval", "--log-num-zeros-in-grad", "--log-throughput", "--log-progress",
        "--log-timers-to-tensorboard", "--log-memory-to-tensorboard", "--log-validation-ppl-to-tensorboard",
        "--tensorboard-dir", "--tensorboard-log-interval", "--timing-log-level", "--timing-log-option",
        "--wandb-project", "--wandb-entity", "--wandb-exp-name", "--wandb-save-dir", "--logging-level",
        "--straggler-minmax-count", "--log-energy", "--log-world-size-to-tensorboard", "--config-logger-dir",
        "--no-log-loss-scale-to-tensorboard",
        "--disable-log-loss-scale-to-tensorboard", "--log-device-memory-used", "--log-memory-interval",
        "--moe-per-layer-logging", "--no-barrier-with-level-1-timing", "--tensorboard-queue-size",
        "--otel-enabled", "--otel-service-name", "--otel-span-groups", "--no-one-logger", "--one-logger-async",
        "--one-logger-project", "--one-logger-run-name", "--app-tag-run-name", "--app-tag-run-version",
        "--disable-straggler-on-startup", "--log-straggler", "--straggler-ctrlr-port",
        "--run-workload-inspector-server",
    ),
    "profiling: profilers and the allocator's history recorder observe the run from the host "
    "(training/training.py: torch.profiler, nvtx ranges, torch.cuda.memory._record_memory_history)": (
        "--profile", "--profile-ranks", "--profile-step-start", "--profile-step-end", "--use-pytorch-profiler",
        "--pytorch-profiler-collect-callstack", "--pytorch-profiler-collect-chakra",
        "--pytorch-profiler-collect-shapes", "--record-shapes", "--nvtx-ranges", "--record-memory-history",
        "--memory-snapshot-path",
    ),
    "data: which samples are read and how (core/datasets, training/datasets, pretrain_gpt.py: "
    "train_valid_test_datasets_provider); every batch keeps its [micro-batch, seq-length] shape": (
        "--data-path", "--data-cache-path", "--split", "--num-workers", "--mock-data", "--dataloader-type",
        "--no-mmap-bin-files", "--fim-data", "--fim-rate", "--fim-spm-rate", "--fim-eod-token",
        "--fim-fragment-rate",
        "--fim-middle-token", "--fim-no-prefix", "--fim-pad-token", "--fim-prefix-token", "--fim-split-sample",
        "--fim-suffix-token", "--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss",
        "--allow-ambiguous-pad-tokens", "--data-args-path", "--per-split-data-args-path", "--train-data-path",
        "--valid-data-path", "--test-data-path", "--dataloader-defer-npy-index-mmap",
        "--dataloader-fast-cache-load",
        "--mid-level-dataset-surplus", "--num-dataset-builder-threads", "--object-storage-cache-path",
        "--s3-cache-path", "--per-dataset-sequences-path", "--phase-transition-iterations", "--mask-prob",
        "--short-seq-prob", "--sample-rate", "--no-data-sharding", "--full-validation",
        "--multiple-validation-sets", "--validation-set-names",
    ),
    "tokenizer: builds the host-side tokenizer (core/tokenizers/utils/build_tokenizer.py); the model's "
    "vocabulary is --vocab-size / the tokenizer file, mapped": (
        "--merge-file", "--tiktoken-pattern", "--tiktoken-num-special-tokens", "--tiktoken-special-tokens",
        "--no-use-tokenizer-model-from-checkpoint-args", "--disable-use-tokenizer-model-from-checkpoint-args",
        "--chat-template", "--null-tokenizer-eod-id", "--null-tokenizer-pad-id",
        "--tokenizer-hf-no-include-special-tokens",
        "--tokenizer-hf-no-use-fast", "--tokenizer-hf-include-special-tokens", "--tokenizer-hf-use-fast",
        "--tokenizer-metadata", "--tokenizer-sentencepiece-legacy", "--tokenizer-special-tokens",
        "--no-tokenizer-sentencepiece-ignore-extra-whitespaces",
        "--disable-tokenizer-sentencepiece-ignore-extra-whitespaces", "--trust-remote-code", "--use-gigatoken",
        "--legacy-tokenizer", "--sft-tokenizer-prompt-format",
    ),
    "checkpointing: save/load paths, formats and workers (training/checkpointing.py, core/dist_checkpointing): "
    "saving runs between iterations, not in the step simulated, and none of these moves a device byte of a "
    "resumed run's load (timeline/sim/megatron_load.py; --dist-ckpt-optim-fully-reshardable reads to the host)": (
        "--save", "--load", "--save-interval", "--persistent-save-interval", "--save-retain-interval",
        "--async-save", "--async-strategy", "--use-persistent-ckpt-worker", "--ckpt-assume-constant-structure",
        "--ckpt-fully-parallel-save", "--no-ckpt-fully-parallel-save",
        "--disable-ckpt-fully-parallel-save", "--dist-ckpt-strictness", "--dist-ckpt-optim-fully-reshardable",
        "--dist-ckpt-save-pre-mcore-014", "--auto-detect-ckpt-format", "--use-checkpoint-args",
        "--use-checkpoint-opt_param-scheduler", "--use-checkpoint-opt-param-scheduler", "--no-load-rng",
        "--verify-integrity", "--exit-on-missing-checkpoint", "--async-ckpt-cpu-priority",
        "--async-ckpt-io-priority",
        "--async-ckpt-use-cpu-shm", "--ckpt-convert-format", "--ckpt-convert-save",
        "--ckpt-convert-update-legacy-dist-opt-format", "--ckpt-drop-redundant-extra-state",
        "--ckpt-fully-parallel-load-per-rank-objects", "--ckpt-fully-parallel-save-process-group",
        "--ckpt-pg-tensors-cache-create", "--ckpt-pg-tensors-cache-path", "--ckpt-step",
        "--disable-ckpt-load-validate-sharding-integrity", "--no-ckpt-load-validate-sharding-integrity",
        "--disable-save-tokenizer-assets", "--no-save-tokenizer-assets", "--disable-stream-ckpt-dequant",
        "--no-stream-ckpt-dequant", "--dist-ckpt-workers", "--distrib-optim-fully-reshardable-mem-efficient",
        "--non-persistent-ckpt-type", "--non-persistent-global-ckpt-dir", "--non-persistent-local-ckpt-algo",
        "--non-persistent-local-ckpt-dir", "--non-persistent-save-interval", "--no-save-optim", "--no-save-rng",
        "--override-ckpt-iteration", "--use-mp-args-from-checkpoint-args", "--replication", "--replication-factor",
        "--replication-jump", "--load-model-opt-format", "--dist-ckpt-format", "--use-dist-ckpt", "--enable-msc",
        "--disable-msc",
    ),
    "μP's attention softmax scale and initialisation (MC/transformer/transformer_config.py: TransformerConfig."
    "__post_init__ computes softmax_scale and recomputes mup_width_mult from the hidden sizes): scalars": (
        "--mup-attn-scale-power", "--mup-base-head-dim", "--mup-width-mult",
    ),
    "optimizer and initialisation hyper-parameters: the learning-rate schedule, Adam's scalars, the fp16 loss "
    "scaler's schedule, init methods (core/optimizer_param_scheduler.py, core/optimizer); the same tensors": (
        "--lr", "--min-lr", "--lr-decay-style", "--lr-decay-iters", "--lr-decay-samples", "--lr-warmup-fraction",
        "--lr-warmup-iters", "--lr-warmup-samples", "--lr-warmup-init", "--lr-wsd-decay-style", "--decoupled-lr",
        "--decoupled-min-lr", "--override-opt-param-scheduler", "--override-opt_param-scheduler",
        "--clip-grad", "--adam-beta1", "--adam-beta2", "--adam-eps", "--init-method-std",
        "--seed", "--lr-wsd-decay-iters", "--lr-wsd-decay-samples", "--start-weight-decay", "--end-weight-decay",
        "--weight-decay-incr-style", "--no-weight-decay-cond-type", "--apply-wd-to-qk-layernorm",
        "--embedding-init-method-std", "--init-method-xavier-uniform", "--hysteresis", "--loss-scale-window",
        "--min-loss-scale", "--data-parallel-random-init", "--no-initialization",
    ),
    "Muon's scalars (momentum, update scale, Newton-Schulz coefficients; emerging_optimizers "
    "OrthogonalizedOptimizer.step): the same momentum buffer per parameter (Nesterov's `grad.lerp(momentum)` "
    "copy, taken or not, is a step transient like the Newton-Schulz tensors)": (
        "--muon-momentum", "--muon-nesterov", "--muon-use-nesterov", "--muon-no-use-nesterov", "--muon-scale-mode",
        "--muon-coefficient-type", "--muon-extra-scale-factor",
    ),
    "Muon's Newton-Schulz step, not simulated: its per-parameter working tensors (fp32 momentum copies, the "
    "bf16 iterate and Gram matrices of muon_utils.newton_schulz; under --muon-tp-mode duplicated/distributed the "
    "TP-gathered matrix) live within the optimizer step, after the backward freed the activations; not neutral "
    "in truth": (
        "--muon-no-split-qkv", "--muon-tp-mode", "--muon-use-syrk", "--muon-fp32-matmul-prec", "--muon-num-ns-steps",
    ),
    "run length, evaluation and exit: which iterations run (training/training.py: train, evaluate); the "
    "measured training iterations are the same": (
        "--train-iters", "--train-samples", "--exit-interval", "--exit-duration-in-mins", "--eval-interval",
        "--eval-iters", "--test-mode", "--exit-signal", "--exit-signal-handler",
        "--exit-signal-handler-for-dataloader",
        "--exit-signal-handler-for-training", "--skip-train", "--start-eval-at-iter", "--eval-global-batch-size",
        "--eval-micro-batch-size", "--iterations-to-skip", "--train-sync-interval", "--gpu-sniff-test-interval",
        "--adlr-autoresume", "--adlr-autoresume-interval", "--save-params-interval",
        "--save-tokens-per-expert-interval",
        "--dump-param-to-param-group-map", "--result-rejected-tracker-filename",
    ),
    "process groups, NCCL and launch: communicators (Gloo's on the host), their settings and the SMs their "
    "kernels use live outside PyTorch's allocator (core/parallel_state.py, training/initialize.py)": (
        "--distributed-backend", "--distributed-timeout-minutes", "--use-mcore-models", "--use-tp-pp-dp-mapping",
        "--enable-experimental", "--overlap-p2p-communication-warmup-flush", "--overlap-param-gather",
        "--manual-gc",
        "--manual-gc-interval", "--no-manual-gc-eval", "--disable-manual-gc-eval",
        "--check-weight-hash-across-dp-replicas-interval", "--no-check-for-nan-in-loss-and-grad",
        "--check-for-large-grads", "--check-for-spiky-loss", "--calculate-per-token-loss",
        "--moe-flex-dispatcher-num-sms", "--te-rng-tracker", "--inference-rng-tracker",
        "--distributed-timeout-seconds-after-init",
        "--flight-recorder-dump-path", "--flight-recorder-include-stack-trace",
        "--flight-recorder-trace-buffer-size",
        "--disable-flight-recorder-dump-on-timeout", "--no-flight-recorder-dump-on-timeout",
        "--disable-flight-recorder-extra-dump-on-exec", "--no-flight-recorder-extra-dump-on-exec",
        "--disable-flight-recorder-include-only-active", "--no-flight-recorder-include-only-active",
        "--high-priority-stream-groups", "--lazy-mpu-init", "--local-rank", "--nccl-communicator-config-path",
        "--sharp-enabled-group", "--use-sharp", "--create-all-gather-group",
        "--pipeline-model-parallel-comm-backend",
        "--use-ring-exchange-p2p", "--no-align-param-gather", "--no-align-grad-reduce",
        "--disable-align-grad-reduce", "--ddp-average-in-collective", "--no-gradient-reduce-div-fusion",
        "--enable-ft-package", "--calc-ft-timeouts", "--ft-num-warmup-iters", "--moe-deepep-num-sms",
        "--moe-hybridep-num-sms", "--moe-hybridep-num-sms-preprocessing", "--moe-hybridep-num-blocks-permute",
        "--moe-hybridep-num-blocks-unpermute", "--disable-gloo-process-groups", "--fake-process-group",
    ),
    "in-process restart and fault tolerance: a watchdog around the step (training/inprocess_restart.py, "
    "core/fault_injector.py, core/rerun_state_machine.py), not inside it": (
        "--inprocess-restart", "--inprocess-active-world-size", "--inprocess-barrier-timeout",
        "--inprocess-completion-timeout", "--inprocess-empty-cuda-cache", "--inprocess-granularity",
        "--inprocess-hard-timeout", "--inprocess-heartbeat-interval", "--inprocess-heartbeat-timeout",
        "--inprocess-last-call-wait", "--inprocess-max-iterations", "--inprocess-monitor-process-interval",
        "--inprocess-monitor-thread-interval", "--inprocess-progress-watchdog-interval", "--inprocess-soft-timeout",
        "--inprocess-termination-grace-time", "--fault-injector-delay-start-iteration",
        "--fault-injector-fault-delay",
        "--fault-injector-fault-probabilities", "--fault-injector-fault-types", "--fault-injector-mtti-seconds",
        "--fault-injector-num-ranks", "--fault-injector-offset-seconds", "--fault-injector-ranks",
        "--fault-injector-seed", "--error-injection-rate", "--error-injection-type",
    ),
    "numerics: values, scales, epsilons and kernels with the same saved tensors; every tensor keeps its shape "
    "and dtype": (
        "--norm-epsilon", "--apply-layernorm-1p", "--no-persist-layer-norm", "--rotary-base",
        "--rotary-interleaved", "--rotary-scaling-factor", "--mscale", "--mscale-all-dim",
        "--no-bias-gelu-fusion",
        "--no-bias-dropout-fusion", "--moe-router-topk-scaling-factor", "--moe-router-bias-update-rate",
        "--moe-router-num-groups", "--moe-router-group-topk", "--mtp-loss-scaling-factor", "--use-flash-attn",
        "--yarn-beta-fast", "--yarn-beta-slow",
        "--no-yarn-correction-range-round-to-int", "--yarn-correction-range-round-to-int", "--max-tokens-to-oom",
        "--use-transformer-engine-op-fuser",
        "--disable-bf16-reduced-precision-matmul", "--use-cpu-initialization", "--rope-scaling-factor",
        "--use-rope-scaling", "--rotary-seq-len-interpolation-factor", "--no-rope-freq",
        "--moe-token-drop-policy",
    ),
    "MTP's stage is the layout's: core/transformer/transformer_config.py: TransformerConfig.__post_init__ sets "
    "mtp_standalone from --pipeline-model-parallel-layout (mapped: parallel.mtp_stage) whatever is given; without "
    "a layout it only makes core/pipeline_parallel/p2p_communication.py: _communicate send each tensor's shape "
    "(three int64s) first (core_v0.16.0 … d98e8a64dd)": (
        "--mtp-standalone",
    ),
    "inference engine settings: read by megatron/core/inference and megatron/inference, which "
    "pretrain_gpt.py's training step never builds (an inference job is refused by its MODE or script)": (
        # main only, between releases (tools/megatron_parser_history.py): the dynamic engine's coordinator and logs
        "--inference-dynamic-batching-active-buffer-size-gb", "--inference-dynamic-batching-mamba-triton-conv1d",
        "--inference-flask-server-logging", "--inference-mp-coordinator-port", "--inference-wandb-logging-step-interval",
        "--initialize-socket-comms",
        "--inference-batch-times-seqlen-threshold", "--inference-coordinator-port",
        "--inference-cuda-graph-all-prefills",
        "--inference-cuda-graph-max-tokens", "--inference-disable-ep-consensus",
        "--no-inference-disable-ep-consensus",
        "--inference-dynamic-batching", "--inference-dynamic-batching-async-sched-mode",
        "--inference-dynamic-batching-block-size", "--inference-dynamic-batching-buffer-guaranteed-fraction",
        "--inference-dynamic-batching-buffer-overflow-factor", "--inference-dynamic-batching-buffer-size-gb",
        "--inference-dynamic-batching-chunk-size", "--inference-dynamic-batching-cuda-graph-max-tokens",
        "--inference-dynamic-batching-cuda-graph-mixed-prefill-count",
        "--inference-dynamic-batching-cuda-graph-sizing-distribution", "--inference-dynamic-batching-logprobs-mode",
        "--inference-dynamic-batching-mamba-memory-ratio", "--inference-dynamic-batching-max-requests",
        "--inference-dynamic-batching-max-requests-override", "--inference-dynamic-batching-max-tokens",
        "--inference-dynamic-batching-max-tokens-override", "--inference-dynamic-batching-num-cuda-graphs",
        "--inference-dynamic-batching-paused-buffer-size-gb", "--inference-dynamic-batching-prefix-caching",
        "--no-inference-dynamic-batching-prefix-caching",
        "--inference-dynamic-batching-prefix-caching-coordinator-policy",
        "--inference-dynamic-batching-prefix-caching-eviction-policy",
        "--inference-dynamic-batching-prefix-caching-mamba-gb",
        "--inference-dynamic-batching-prefix-caching-routing-alpha",
        "--inference-dynamic-batching-sampling-backend",
        "--inference-dynamic-batching-track-generated-token-events",
        "--inference-dynamic-batching-track-paused-request-events",
        "--inference-dynamic-batching-unified-memory-level",
        "--inference-logging-step-interval", "--inference-max-batch-size", "--inference-max-requests",
        "--inference-shards", "--inference-text-gen-server-logging", "--no-inference-text-gen-server-logging",
        "--inference-use-synchronous-zmq-collectives", "--no-inference-use-synchronous-zmq-collectives",
        "--inference-wandb-logging", "--no-inference-wandb-logging", "--mamba-inference-conv-states-dtype",
        "--mamba-inference-ssm-states-dtype", "--num-speculative-tokens", "--use-legacy-static-engine",
        "--use-same-sampling-seed-across-dp-ranks", "--decode-only-cuda-graphs", "--enable-chunked-prefill",
        "--disable-chunked-prefill", "--inference-cuda-graph-scope", "--inference-disable-triton-nvls-kernels",
        "--inference-fuse-tp-communication", "--inference-grouped-gemm-backend",
        "--inference-moe-disable-fused-quant-kernels", "--inference-moe-token-dispatcher-type", "--flash-decode",
        "--mlp-chunks-for-prefill", "--nccl-all-reduce-for-prefill", "--cache-mla-latents",
        "--output-bert-embeddings", "--bert-embedder-type",
    ),
    "ModelOpt export settings: read by megatron/post_training (model_builder.py, checkpointing.py) when "
    "exporting; no tensor of the trained model changes": (
        "--export-kd-finalize",  # main only, 3b141a2471 … 8ddc7908fe (2025-04/06)
        "--export-model-type", "--export-legacy-megatron", "--export-te-mcore-model",
        "--export-force-local-attention",
        "--export-default-te-spec", "--export-kv-cache-quant", "--export-real-quant-cfg", "--export-offline-model",
        "--export-qk-l2-norm", "--export-moe-apply-probs-on-input", "--export-num-eagle-layers",
        "--export-num-medusa-heads", "--export-num-mtp", "--export-draft-vocab-size", "--export-eagle-algorithm",
        "--export-freeze-mtp", "--finetune-data-files", "--finetune-data-split", "--finetune-hf-dataset",
        "--enable-gpt-oss",
    ),
    "read by no code the training step runs: the legacy (pre-Megatron-Core) model, retrieval (ICT/REALM), "
    "vision and DINO scripts, or nothing at all in that version": (
        "--apply-residual-connection-post-layernorm",
        "--no-async-tensor-model-parallel-allreduce", "--disable-async-tensor-model-parallel-allreduce",
        "--no-scatter-gather-tensors-in-pipeline", "--bert-load", "--biencoder-projection-dim",
        "--biencoder-shared-query-context-model", "--block-data-path", "--embedding-path", "--evidence-data-path",
        "--ict-head-size", "--ict-load", "--indexer-batch-size", "--indexer-log-interval", "--query-in-block-prob",
        "--retriever-report-topk-accuracies", "--retriever-score-scaling", "--titles-data-path",
        "--use-one-sent-docs",
        "--retriever-seq-length", "--classes-fraction", "--data-per-class-fraction", "--dino-bottleneck-size",
        "--dino-freeze-last-layer", "--dino-head-hidden-size", "--dino-local-crops-number", "--dino-local-img-size",
        "--dino-norm-last-layer", "--dino-teacher-temp", "--dino-warmup-teacher-temp",
        "--dino-warmup-teacher-temp-epochs", "--head-lr-mult", "--iter-per-epoch", "--mask-factor", "--mask-type",
        "--num-channels", "--num-classes", "--swin-backbone-type", "--vision-backbone-type", "--openai-gelu",
        "--onnx-safe", "--yaml-cfg",
    ),
    "parameter layout: TE GroupedLinear's single grouped weight / bias holds all local experts in one tensor; "
    "the same bytes in the same DDP buffer": (
        "--moe-single-grouped-weight", "--moe-single-grouped-bias",
    ),
}

#: parameters of a refused feature (the key): without it they change nothing, with it the job is
#: refused for the feature itself
UNDER: dict[str, tuple[str, ...]] = {
    "--use-megatron-fsdp (FP8 under it)": ("--keep-fp8-transpose-cache",
                                          "--keep-fp8-transpose-cache-when-using-custom-fsdp"),
    "--fp4-format": ("--fp4-recipe", "--fp4-quantizer-factory"),
    "--cpu-offloading-num-layers > 0": ("--cpu-offloading-retain-pinned-cpu-buffers",),
    "--use-nccl-ub (with --use-megatron-fsdp)": ("--fsdp-manual-registration", "--fsdp-db-use-persist-buf-on-alloc-fail"),
    "--outer-dp-sharding-strategy other than no_shard": ("--enable-full-sharding-in-hsdp",),
    "--use-torch-fsdp2": ("--torch-fsdp2-no-reshard-after-forward",),
    "--use-nccl-ub": ("--disable-symmetric-registration",),
    "--experimental-attention-variant dsa": ("--dsa-indexer-head-dim", "--dsa-indexer-k-norm-epsilon",
                                         "--dsa-indexer-k-norm-fp32", "--dsa-indexer-loss-coeff",
                                         "--dsa-indexer-n-heads", "--dsa-indexer-rope-interleaved",
                                         "--dsa-indexer-skip-topk-offset", "--dsa-indexer-topk",
                                         "--dsa-indexer-topk-freq", "--dsa-indexer-use-sparse-loss",
                                         "--dsa-kernel-backend", "--disable-dsa-indexer-rotate-activation",
                                         "--no-dsa-indexer-rotate-activation", "--disable-dsa-indexer-scoring-relu",
                                         "--no-dsa-indexer-scoring-relu"),
    "--linear-attention-type (gated delta product)": ("--gdp-cutedsl-kernel", "--gdp-num-chunk-states-to-recompute",
                                                      "--gdp-num-householder"),
    "--enable-mhc-connections": ("--mhc-init-gating-factor", "--mhc-num-residual-streams", "--mhc-recompute-layer-num",
                                 "--mhc-sinkhorn-iterations"),
    "--moe-paged-stash": ("--moe-paged-stash-buffer-size-factor-cpu", "--moe-paged-stash-buffer-size-factor-cuda",
                          "--moe-paged-stash-page-size"),
    "--hybrid-context-parallel": ("--max-seqlen-per-dp-cp-rank", "--max-seqlen-per-cp-rank"),
    "--batch-invariant-mode": ("--batch-invariant-backend",),
    "--use-kitchen-attention": ("--kitchen-attention-backend",),
    "--qk-clip": ("--qk-clip-alpha", "--qk-clip-threshold"),
    "--moe-use-upcycling": ("--moe-upcycling-granularity",),
    "--export-kd-teacher-load": ("--export-kd-cfg", "--export-kd-teacher-ckpt-format", "--export-kd-teacher-model-config",
                                 "--teacher-model-config"),
    "--logits-load-dir": ("--logits-load-decode-threads", "--logits-load-ignore-errors", "--logits-load-kd-loss-alpha",
                          "--logits-load-msc-prefetch-depth", "--logits-load-prefetch-factor"),
    "--logits-save-dir": ("--logits-save-dtype", "--logits-save-top-k", "--logits-save-top-p", "--logits-save-top-p-min-k"),
    "--moe-routing-trace-path": ("--moe-routing-trace-capture-hidden-states", "--moe-routing-trace-capture-logits",
                                 "--moe-routing-trace-dump-weights", "--moe-routing-trace-max-training-iters"),
    "--perform-rl-step": (
        "--grpo-clamp-eps-lower", "--grpo-clamp-eps-upper", "--grpo-default-temperature", "--grpo-default-top-p",
        "--grpo-entropy-term-weight", "--grpo-filter-groups-with-same-reward", "--grpo-group-size",
        "--grpo-iterations",
        "--grpo-kl-beta", "--grpo-prompts-per-step", "--langrl-env-config", "--langrl-external-server",
        "--no-langrl-external-server", "--langrl-inference-server-conversation-template",
        "--langrl-inference-server-type", "--refit-method", "--rl-calculate-intra-group-similarity",
        "--no-rl-calculate-intra-group-similarity", "--rl-consumption-granularity", "--rl-default-temperature",
        "--rl-default-top-k", "--rl-default-top-p", "--rl-durable-rollout-bank", "--rl-generation-batch-size",
        "--rl-generation-lag", "--rl-importance-sampling-truncation-coef",
        "--rl-inference-expert-model-parallel-size",
        "--rl-inference-expert-tensor-model-parallel-size", "--rl-inference-logprobs-is-correction",
        "--no-rl-inference-logprobs-is-correction", "--rl-inference-model-unified-memory-level",
        "--rl-inference-parsers", "--rl-inference-pipeline-model-parallel-size",
        "--rl-inference-tensor-model-parallel-size", "--rl-kv-cache-management-mode", "--rl-max-inflight-requests",
        "--rl-num-parallel-generation-batches", "--rl-num-parallel-generations",
        "--rl-offload-inference-model-weights-when-idle", "--no-rl-offload-inference-model-weights-when-idle",
        "--rl-offload-kv-cache-during-training", "--no-rl-offload-kv-cache-during-training",
        "--rl-offload-optimizer-during-inference", "--rl-parallel-generation-tasks", "--rl-partial-rollouts",
        "--no-rl-partial-rollouts", "--rl-persist-cuda-graphs", "--no-rl-persist-cuda-graphs", "--rl-profile",
        "--rl-profile-dir", "--rl-prompts-per-eval", "--rl-remove-kv-cache-during-training",
        "--no-rl-remove-kv-cache-during-training", "--rl-reset-cuda-graphs", "--no-rl-reset-cuda-graphs",
        "--rl-rollout-bank-dir", "--rl-rollout-bank-max-bytes", "--rl-sequence-packing-algo",
        "--rl-sequence-packing-bin-size", "--rl-sequence-packing-max-sequences-per-bin", "--rl-skip-bos-token",
        "--no-rl-skip-bos-token", "--rl-submission-granularity", "--rl-training-cuda-graphs",
        "--no-rl-training-cuda-graphs", "--rl-use-sequence-packing", "--no-rl-use-sequence-packing",
        "--rl-verify-model-weights-swap", "--no-rl-verify-model-weights-swap", "--moe-enable-routing-replay",
    ),
    "--moe-router-load-balancing-type quantile_balancing": ("--moe-router-quantile-balancing-ema",),
    "--position-embedding-type mrope": ("--mrope-section",),
    "--moe-flex-dispatcher-backend ncclep": ("--moe-ncclep-static-shape", "--moe-ncclep-zero-copy"),
    "--tensor-parallel-num-weight-shards": ("--gtp-remat-opt-in-modules", "--gtp-remat-nccl-ub",
                                            "--gtp-expert-remat-nccl-ub",
                                            "--gtp-remat-reduce-scatter-with-fp32-accumulation"),
    "--optimizer lion": ("--lion-beta1", "--lion-beta2"),
}

#: every compute-communication overlap timeline simulates as the schedule without it, with its
#: sub-options; not neutral in truth, and the run file's header says so
WITHOUT_OVERLAP = (
    "compute-communication overlap, simulated as the schedule without it: not modelled yet (TE's userbuffers, "
    "cudaMalloc'd or cuMemCreate'd outside PyTorch's allocator by register_user_buffer_collective, hold the "
    "gathered GEMM inputs and partial outputs that PyTorch allocates without the overlap; the cuBLAS workspace "
    "of their GEMMs is framework.tp_comm_overlap, from --tp-comm-overlap); a higher-priority stream for combined "
    "1F1B's all-to-alls",
    ("--tp-comm-overlap-cfg",
     "--high-priority-a2a-comm-stream", "--tp-comm-bootstrap-backend", "--tp-comm-overlap-rs-dgrad",
     "--disable-tp-comm-bulk-dgrad", "--no-tp-comm-bulk-dgrad", "--disable-tp-comm-bulk-wgrad",
     "--no-tp-comm-bulk-wgrad", "--disable-tp-comm-overlap-ag", "--no-tp-comm-overlap-ag",
     "--disable-tp-comm-overlap-rs", "--no-tp-comm-overlap-rs", "--disable-tp-comm-split-ag",
     "--no-tp-comm-split-ag", "--disable-tp-comm-split-rs", "--no-tp-comm-split-rs"),
)
NEUTRAL[WITHOUT_OVERLAP[0]] = WITHOUT_OVERLAP[1]
NEUTRAL["the hybrid CPU-offload optimizer's host side (MC/optimizer/cpu_offloading/hybrid_optimizer.py): pinned or "
        "pageable host copies; the copies on their own CUDA streams (the same device tensors, one at a time); a torch "
        "optimizer in place of TE's FusedAdam, which MC/optimizer/__init__.py overrides for Adam, the only optimizer the "
        "precision-aware path it needs takes"] = (
    "--overlap-cpu-optimizer-d2h-h2d", "--use-torch-optimizer-for-cpu-offload", "--no-pin-cpu-grads",
    "--no-pin-cpu-params")
#: the Megatron-Core models store it and never read it (gpt_model.py / hybrid_model.py / mamba_model.py: __init__'s
#: ``self.fp16_lm_cross_entropy``, unread by ``compute_language_model_loss``, core_v0.12.0 … d98e8a64dd); only the
#: legacy models' loss reads it (megatron_legacy.py refuses it there), and validate_args asserts --fp16
NEUTRAL["stored, never read, by the Megatron-Core model (its loss is the same either way)"] = (
    "--fp16-lm-cross-entropy",)
NEUTRAL["MoE overload logging (dev d48bd6be0a: moe_layer.py: MoELayer records per-expert token counts, moe_logging.py): "
        "one small integer count per expert and layer, kept for the log, against activations of the routed tokens"] = (
    "--log-moe-overload-factor",)
