"""Every argument of Megatron-LM's training parser, classified: mapped, memory-neutral or refused.

Each option string of ``pretrain_gpt.py``'s parser at every release from core_v0.12.0 to main
(``tests/data/megatron/parser_args.json``, built by ``tools/megatron_parser_args.py``) is in exactly
one place: :data:`MAPPED` (read by :mod:`timeline.io.megatron_map` / :mod:`timeline.io.megatron_framework`,
with the rule it drives; a few refuse only some values), :data:`NEUTRAL` / :data:`UNDER`
(:mod:`timeline.io.megatron_neutral`: why no allocation moves), or refused with what modelling it
would need (:data:`REFUSED`, :data:`FAMILY_ARGS` for arguments that name a model family the
simulator lacks). ``tests/io/test_megatron_parser_table.py`` fails on an argument of any version in
none of them and on an entry that is an argument of no version. Arguments of Megatron's other scripts
(inference, MIMO, elastic training) are :data:`OTHER_SCRIPTS`.
"""

from __future__ import annotations

from timeline.io.megatron_neutral import NEUTRAL, UNDER

#: arguments from-megatron reads, with the run-file key or rule each drives
MAPPED: dict[str, str] = {
    **dict.fromkeys(("--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size", "--kv-channels",
                     "--max-position-embeddings", "--seq-length"), "model sizes ([model], [training] seq_len)"),
    **dict.fromkeys(("--group-query-attention", "--num-query-groups"), "model.num_key_value_heads"),
    **dict.fromkeys(("--swiglu", "--squared-relu"), "model.hidden_act"),
    "--normalization": "model.norm (LayerNorm or RMSNorm; others refused)",
    **dict.fromkeys(("--hybrid-layer-pattern", "--hybrid-override-pattern", "--hybrid-attention-ratio",
                     "--hybrid-mlp-ratio", "--is-hybrid-model"), "model.hybrid_override_pattern (and the layout "
                                                                  "of a pattern with '|')"),
    "--experimental-attention-variant": "model.layer_types (gated_delta_net: Megatron-Core's GatedDeltaNet in the "
                                        "linear layers; dsa refused)",
    "--linear-attention-freq": "model.layer_types (which layers are gated delta nets)",
    "--mtp-hybrid-override-pattern": "model.mtp_layers (the deprecated form of a hybrid pattern's MTP depths: "
                                     "'*E' / '*-' modelled)",
    "--mtp-use-repeated-layer": "model.mtp_repeated_layer (one MTP module's parameters for every depth)",
    "--moe-shared-expert-gate": "model.shared_expert_gate (the shared experts' output scaled by a sigmoid gate; "
                                "no effect without shared experts)",
    "--linear-attention-type": "model.layer_types (the dev branch's deprecated name for "
                               "--experimental-attention-variant; gated_delta_net only)",
    **dict.fromkeys(("--linear-conv-kernel-dim", "--linear-key-head-dim", "--linear-value-head-dim",
                     "--linear-num-key-heads", "--linear-num-value-heads"), "model.linear_* (the gated delta net's "
                                                                           "sizes)"),
    **dict.fromkeys(("--mamba-num-heads", "--mamba-state-dim", "--mamba-head-dim", "--mamba-num-groups"),
                    "model.mamba_num_heads / ssm_state_size / mamba_head_dim / n_groups"),
    "--position-embedding-type": "model.position_embedding (learned_absolute, rope, yarn, none; others refused)",
    "--no-position-embedding": "Megatron rejects it unless --position-embedding-type rope, where it changes nothing",
    "--use-rotary-position-embeddings": "model.position_embedding = rope (validate_args: the legacy RoPE flag sets "
                                        "position_embedding_type)",
    **dict.fromkeys(("--disable-bias-linear", "--add-qkv-bias"), "model.linear_bias / attention_bias"),
    "--untie-embeddings-and-output-weights": "model.tie_word_embeddings",
    **dict.fromkeys(("--hidden-dropout", "--attention-dropout"), "model.*_dropout"),
    **dict.fromkeys(("--vocab-size", "--tokenizer-type", "--vocab-file", "--tokenizer-model", "--vocab-extra-ids"),
                    "model.vocab_size"),
    **dict.fromkeys(("--encoder-num-layers", "--encoder-seq-length", "--decoder-seq-length", "--decoder-num-layers",
                     "--relative-attention-num-buckets", "--relative-attention-max-distance",
                     "--pipeline-model-parallel-split-rank"),
                    "T5 (io/megatron_t5.py): model.encoder_layers, num_layers, training.seq_len / decoder_seq_len; "
                    "LLaVA (io/megatron_vlm.py): model.vision_layers, num_layers; refused outside those jobs"),
    **dict.fromkeys(("--encoder-tensor-model-parallel-size", "--encoder-pipeline-model-parallel-size"),
                    "parallel.encoder_pp, pp (LLaVA's ViT stage: io/megatron_map.py encoder_stages); an encoder TP "
                    "without an encoder stage has no effect; T5's encoder stages refused"),
    **dict.fromkeys(("--img-h", "--img-w", "--patch-dim"),
                    "model.image_height / image_width / patch_size (LLaVA: io/megatron_vlm.py); refused as a vision "
                    "model in any other job"),
    "--padded-vocab-size": "model.vocab_size as given, unpadded (framework.make_vocab_size_divisible_by = 1)",
    "--load-main-params-from-ckpt": "training.resumed = false (with --no-load-optim, which Megatron-LM asserts: "
                                    "reload_model_params copies the loaded state dict's main parameters in place)",
    "--distribute-saved-activations": "recompute.distribute_saved (tensor_parallel/random.py: CheckpointFunction "
                                      "keeps each full-recompute checkpoint's input as a 1/tp chunk)",
    **dict.fromkeys(("--rotary-percent", "--no-rope-fusion", "--rope-type", "--original-max-position-embeddings",
                     "--yarn-original-max-position-embeddings"),
                    "the rotary embeddings' cached tables (model.partial_rotary_factor, framework.rope_fusion, "
                    "mla_rope_type, yarn_original_max_positions: profiles/megatron_workspaces.py rotary_caches)"),
    "--qk-l2-norm": "model.qk_norm with framework.qk_l2_norm (torch_norm.py: L2Norm, weightless, per head)",
    "--use-te-activation-func": "framework.te_activation_func (mlp.py / experts.py: TE's activation module keeps "
                                "its input alone; the experts weigh its output by the probs as a torch op)",
    "--moe-apply-probs-on-input": "framework.moe_apply_probs_on_input (experts.py: the permuted input times the "
                                  "probs before fc1)",
    "--moe-input-jitter-eps": "framework.moe_input_jitter (router.py: apply_input_jitter's noise and jittered copy)",
    "--pretrained-checkpoint": "training.resumed = false with framework.checkpoint_format (checkpointing.py: "
                               "load_checkpoint falls back to it as a finetune — weights only — where --load holds "
                               "no checkpoint; --resumed: --load's)",
    **dict.fromkeys(("--no-pad-vocab-size", "--disable-pad-vocab-size"),
                    "model.vocab_size, with --padded-vocab-size (build_tokenizer.py: _set_padded_vocab_size fills only "
                    "an unset one, and not at all under it)"),
    **dict.fromkeys(("--use-mup", "--mup-embedding-mult", "--mup-output-mult", "--mup-base-hidden-size"),
                    "model.mup_embedding_mult / mup_output_mult (μP's scaled copies of the embeddings and the logits)"),
    "--make-vocab-size-divisible-by": "framework.make_vocab_size_divisible_by",
    **dict.fromkeys(("--fp8-format", "--fp8-recipe"), "training.fp8_recipe (delayed, tensorwise, blockwise, mxfp8; "
                    "custom refused)"),
    "--fp8-param-gather": "training.fp8_param_gather",
    "--reuse-grad-buf-for-mxfp8-param-ag": "training.mxfp8_reuse_grad_buf (MXFP8 weights without a param buffer: "
                                           "graph/dp_buffers.py)",
    **dict.fromkeys(("--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "--num-layers-at-end-in-bf16"),
                    "training.fp8_bf16_first_layers / fp8_bf16_last_layers (the layers outside FP8)"),
    "--fp8-amax-history-len": "training.fp8_amax_history_len (the delayed recipe's per-module amax histories: "
                              "profiles/megatron_fp8.py amax_histories)",
    "--tp-comm-overlap": "framework.tp_comm_overlap (the userbuffer GEMMs' cuBLAS workspace; the overlap itself is "
                         "simulated as the schedule without it)",
    "--qk-layernorm": "model.qk_norm",
    **dict.fromkeys(("--fine-grained-activation-offloading", "--offload-modules"),
                    "offload.modules (io/megatron_offload.py; the groups: graph/offload.py, their frees and reloads: "
                    "sim/offload.py)"),
    "--min-offloaded-tensor-size": "offload.min_elements",
    "--activation-offload-fraction": "offload.fraction (post_warmup_callback's share of each chunk's groups, "
                                     "69c486825c on: sim/offload.py)",
    "--delta-offload-bytes-across-pp-ranks": "offload.delta_bytes (the bytes each later pipeline rank keeps on the "
                                             "GPU, 69c486825c on: sim/offload.py)",
    "--fine-grained-offloading-max-inflight-offloads": "a wait of the compute stream for older copies to the host; "
                                                       "the model frees each offloaded tensor at its group's commit",
    "--empty-unused-memory-level": "framework.empty_unused_memory_level (torch.cuda.empty_cache around the optimizer "
                                   "step: training.py train_step)",
    "--use-nccl-ub": "with DDP no rule moves a byte: param_and_grad_buffer.py (core_v0.13.0 … d98e8a64dd) allocates "
                     "the same param and grad buffers inside an NCCL MemPool, whose blocks PyTorch counts as "
                     "allocated and reserved like the default pool's; with Megatron-FSDP refused (it forces "
                     "--fsdp-double-buffer: io/megatron_state_args.py megatron_fsdp)",
    **dict.fromkeys(("--window-size", "--window-attn-skip-freq"), "model.sliding_window / layer_types "
                    "(transformer/utils.py: is_layer_window_attention)"),
    "--softmax-type": "model.attention_sinks (learnable; off-by-one: sink_fixed)",
    "--attention-output-gate": "model.attention_output_gate (not with MLA, which Megatron rejects)",
    **dict.fromkeys(("--quick-geglu", "--glu-linear-offset", "--activation-func-clamp-value"),
                    "model.hidden_act / swiglu_alpha / glu_linear_offset / swiglu_limit (GPT-OSS's gated unit)"),
    "--bert-no-binary-head": "model.binary_head / type_vocab_size (a BERT job; pretrain_gpt.py never reads it)",
    **dict.fromkeys(("--multi-latent-attention", "--kv-lora-rank", "--q-lora-rank", "--qk-head-dim",
                     "--qk-pos-emb-head-dim", "--v-head-dim"), "model MLA sizes"),
    **dict.fromkeys(("--num-experts", "--moe-ffn-hidden-size", "--moe-router-topk",
                     "--moe-shared-expert-intermediate-size", "--moe-layer-freq", "--moe-router-enable-expert-bias"),
                    "model MoE sizes"),
    "--mtp-num-layers": "model.mtp_layers",
    "--delay-wgrad-compute": "framework.delay_wgrad_compute (with --overlap-moe-expert-parallel-comm: each "
                             "schedule-plan node's weight gradients at its backward_dw, graph/backward.py "
                             "delay_wgrads; refused under Megatron-FSDP)",
    "--moe-shared-expert-overlap": "no byte moves (the shared experts on their own stream, the same tensors); refused "
                                   "with a moe_router CUDA graph, which then leaves them out of the graph "
                                   "(io/megatron_framework.py cuda_graph_scope)",
    "--moe-latent-size": "model.moe_latent_size (the routed experts, dispatch and combine in the latent width "
                         "between fc1/fc2_latent_proj: moe_layer.py)",
    "--use-legacy-models": "framework.use_legacy_models (its own layer under --transformer-impl local, TE's "
                           "TransformerLayer under transformer_engine; before Megatron-Core 0.18; its SwitchMLP "
                           "and local flash-attn path refused)",
    **dict.fromkeys(("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
                     "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--sequence-parallel"),
                    "[parallel]"),
    "--cp-comm-type": "framework.cp_comm_type (p2p, a2a, a2a+p2p; allgather refused when cp > 1)",
    "--hierarchical-context-parallel-sizes": "framework.cp_a2a_size (a2a+p2p's all-to-all group)",
    **dict.fromkeys(("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                     "--pipeline-model-parallel-layout", "--decoder-first-pipeline-num-layers",
                     "--decoder-last-pipeline-num-layers", "--account-for-embedding-in-pipeline-split",
                     "--account-for-loss-in-pipeline-split", "--microbatch-group-size-per-virtual-pipeline-stage"),
                    "parallel.vpp / layout, schedule"),
    "--no-overlap-p2p-communication": "refused with vpp > 1 (the interleaved schedule's receive order); "
                                      "1F1B posts the same buffers batched or not",
    **dict.fromkeys(("--micro-batch-size", "--global-batch-size", "--rampup-batch-size", "--step-batch-size-schedule",
                     "--decrease-batch-size-if-needed"), "training.micro_batch_size / num_microbatches"),
    **dict.fromkeys(("--fp16", "--bf16"), "training.dtype"),
    **dict.fromkeys(("--initial-loss-scale", "--loss-scale"), "training.optimizer_step (fp16 overflow skips)"),
    **dict.fromkeys(("--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"), "training.grad_dtype"),
    "--use-distributed-optimizer": "training.zero",
    "--num-distributed-optimizer-instances": "training.optimizer_instances",
    "--optimizer": "training.optimizer / muon_layer_wise (adam, sgd, muon, dist_muon; others refused)",
    "--sgd-momentum": "training.sgd_momentum (0: no momentum buffer)",
    "--weight-decay": "training.weight_decay (SGD's foreach step copies the gradients it decays)",
    **dict.fromkeys(("--use-precision-aware-optimizer", "--main-grads-dtype", "--main-params-dtype", "--exp-avg-dtype",
                     "--exp-avg-sq-dtype"), "training.precision_aware / grad_dtype / master_dtype / master_remainders / "
                    "moment_dtype / exp_avg_sq_dtype (TE FusedAdam's states; fp8 states refused)"),
    **dict.fromkeys(("--optimizer-cpu-offload", "--optimizer-offload-fraction"),
                    "training.optimizer_cpu_offload / optimizer_offload_fraction (the hybrid optimizer's GPU share: "
                    "fp32 masters and moments; graph/optim_state.py: hybrid_split)"),
    "--no-use-layer-wise-param-layout": "training.zero = 0 under Muon's layer-wise optimizer (its legacy ping-pong "
                                        "path over unsharded buffers)",
    "--muon-scalar-optimizer": "Muon's fallback for non-matrix parameters: adam (lion refused)",
    **dict.fromkeys(("--moe-expert-capacity-factor", "--moe-pad-expert-input-to-capacity"),
                    "training.capacity_factor / pad_to_capacity"),
    **dict.fromkeys(("--moe-router-padding-for-quantization", "--moe-router-padding-for-fp8"),
                    "training.moe_router_padding (each expert's token count padded to the FP8 alignment: "
                    "graph/families/router.py padded_rows)"),
    **dict.fromkeys(("--recompute-granularity", "--recompute-activations", "--recompute-method",
                     "--recompute-num-layers", "--recompute-modules", "--moe-layer-recompute"), "[recompute]"),
    "--transformer-impl": "framework.transformer_impl",
    "--attention-backend": "framework.attention_backend",
    "--deterministic-mode": "framework.deterministic",
    "--no-gradient-accumulation-fusion": "framework.gradient_accumulation_fusion",
    **dict.fromkeys(("--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl"), "framework.cross_entropy_fusion"),
    "--no-masked-softmax-fusion": "framework.masked_softmax_fusion",
    "--use-fused-weighted-squared-relu": "framework.fused_weighted_squared_relu (the experts' relu(x)² · probs as one "
                                         "Function keeping its input and the probs)",
    "--moe-router-fusion": "framework.moe_router_fusion (TE's fused top-k keeps the bool routing map and its "
                           "[t, E] intermediate)",
    "--no-bias-swiglu-fusion": "framework.bias_swiglu_fusion (SwiGLU as torch ops; no effect without --swiglu)",
    "--no-create-attention-mask-in-dataloader": "framework.dataloader_batch",
    "--rerun-mode": "framework.rerun_keeps_batch",
    **dict.fromkeys(("--attention-softmax-in-fp32", "--apply-query-key-layer-scaling"),
                    "framework.attention_softmax_in_fp32"),
    **dict.fromkeys(("--overlap-grad-reduce", "--ddp-bucket-size", "--ddp-pad-buckets-for-high-nccl-busbw"),
                    "framework DDP buckets"),
    **dict.fromkeys(("--defer-embedding-wgrad-compute", "--wgrad-deferral-limit"),
                    "framework.defer_embedding_wgrad / wgrad_deferral_limit (the output layer's held input and "
                    "logits gradient)"),
    **dict.fromkeys(("--finetune", "--no-load-optim"), "training.resumed false: the checkpoint's weights only, the "
                    "moments made in the first step"),
    "--ckpt-format": "framework.checkpoint_format (a resumed run's load; formats other than torch_dist and torch "
                     "refused when a checkpoint is loaded)",
    **dict.fromkeys(("--ckpt-fully-parallel-load", "--ckpt-fully-parallel-load-exchange-algo",
                     "--ckpt-fully-parallel-load-process-group"),
                    "a resumed run's load in place, as the plain load (expert shards some but not all of the DP·CP "
                    "group need: the plain load as the lower bound, with a note; refused for gather_object or FP8 "
                    "parameters: megatron_state_args.fully_parallel_load)"),
    "--log-params-norm": "framework.log_params_norm (read under Megatron-FSDP: calc_params_l2_norm's "
                         "stop_communication releases the gathered parameter groups after each step)",
    **dict.fromkeys(("--use-megatron-fsdp", "--use-custom-fsdp", "--data-parallel-sharding-strategy"),
                    "framework.fsdp_sharding (Megatron-FSDP's parameter groups, sharded per strategy; training.zero = 1)"),
    **dict.fromkeys(("--fsdp-double-buffer", "--megatron-fsdp-max-pool-double-buffer",
                     "--suggested-communication-unit-size", "--outer-dp-sharding-strategy", "--megatron-fsdp-version",
                     "--megatron-fsdp-enable-fine-grained-param-gather"),
                    "refused under Megatron-FSDP unless at its default (pools, HSDP, v2, dtypes not modelled)"),
    "--megatron-fsdp-main-params-dtype": "training.master_dtype / moment_dtype (auto: no main-weight buffer, the "
                                         "model-weight shards stepped; fsdp_main_params)",
    **dict.fromkeys(("--megatron-fsdp-main-grads-dtype", "--megatron-fsdp-grad-comm-dtype"),
                    "training.grad_dtype (Megatron-FSDP's main gradients by release: fsdp_main_grads_dtype; a "
                    "communication dtype apart from them refused)"),
    "--overlap-param-gather-with-optimizer-step": "framework.overlap_param_gather_with_optimizer_step (one bucket "
                                                  "per chunk; the first chunk's own optimizer)",
    "--ddp-num-buckets": "refused with --overlap-grad-reduce (bucket size = parameters ÷ N); no effect without",
    **dict.fromkeys(("--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend", "--moe-enable-deepep"),
                    "framework.moe_token_dispatcher / moe_flex_backend"),
    **dict.fromkeys(("--moe-router-load-balancing-type", "--moe-aux-loss-coeff"), "framework.moe_router_load_balancing"),
    "--moe-router-dtype": "framework.moe_router_dtype",
    "--moe-router-force-load-balancing": "framework.moe_router_force_load_balancing (RandomSTE's random copy of the "
                                         "logits routes; training.routing balanced, as it is by default)",
    "--moe-permute-fusion": "framework.moe_permute_fusion",
    "--overlap-moe-expert-parallel-comm": "schedule.combined_1f1b (refused where Megatron refuses it) and "
                                          "framework.combined_1f1b_keeps_node_io by version",
    "--ep-overlap-early-attn-memory-release": "framework.ep_overlap_early_attn_memory_release",
    "--moe-grouped-gemm": "framework.moe_grouped_gemm",
    "--moe-use-legacy-grouped-gemm": "framework.moe_legacy_grouped_gemm",
    **dict.fromkeys(("--moe-router-score-function", "--moe-router-pre-softmax"), "router score (same shapes)"),
    "--moe-z-loss-coeff": "framework.moe_z_loss",
    **dict.fromkeys(("--no-clone-scatter-output-in-embedding", "--disable-clone-scatter-output-in-embedding"),
                    "refused with sequence parallelism (the embedding's scatter keeps its full output); no effect "
                    "without"),
    **dict.fromkeys(("--cuda-graph-impl", "--external-cuda-graph", "--enable-cuda-graph", "--cuda-graph-scope",
                     "--cuda-graph-modules", "--cuda-graph-warmup-steps"),
                    "framework.cuda_graph_impl / cuda_graph_scope / cuda_graph_warmup_steps (TE make_graphed_callables "
                    "per decoder and MTP layer: the whole layer or the attn, mlp, moe_router, moe_preprocess modules; "
                    "the local and full_iteration impls, whole-MoE and Mamba graphs are refused in one line)"),
    **dict.fromkeys(("--cpu-offloading-num-layers", "--mlp-chunks-for-training",
                     "--moe-dispatch-fwd-dtype", "--moe-combine-bwd-dtype", "--tensor-parallel-num-weight-shards",
                     "--expert-tensor-parallel-num-weight-shards", "--output-logit-dtype"),
                    "refused unless its default (no effect) value: REFUSED_UNLESS"),
}

#: arguments refused at any value other than these (their defaults, which change nothing), and why; ``=tp`` / ``=etp``
#: stand for the job's tensor / expert-tensor parallel size (``validate_args`` writes the shard counts back as
#: ``resolve_tensor_parallel_weight_shards`` reconciles them: tp · 1 without GTP, so a printed block holds them)
REFUSED_UNLESS: dict[str, tuple[tuple[str, ...], str]] = {
    "--cpu-offloading-num-layers": (("0",), "activation offloading to CPU (transformer_block.py: "
                                           "cpu_offloading_num_layers) is not modelled"),
    "--mlp-chunks-for-training": (("1",), "an MLP run in sequence chunks (transformer_layer.py: "
                                         "mlp_chunks_for_training) is not modelled"),
    "--moe-dispatch-fwd-dtype": (("bf16",), "an FP8 token dispatch (token_dispatcher.py) is not modelled"),
    "--moe-combine-bwd-dtype": (("bf16",), "an FP8 token combine (token_dispatcher.py) is not modelled"),
    "--tensor-parallel-num-weight-shards": (("=tp",), "weights sharded beyond tp and re-materialised per layer "
                                               "(model_parallel_config.py: gtp_weight_remat_size) are not modelled"),
    "--expert-tensor-parallel-num-weight-shards": (("=etp",), "expert weights sharded beyond etp and re-materialised "
                                                      "(model_parallel_config.py) are not modelled"),
    "--muon-scalar-optimizer": (("adam",), "Lion's state for Muon's non-matrix parameters is not modelled; use adam"),
    "--output-logit-dtype": ((), "logits in another dtype (gpt_model.py: logit_dtype) are not modelled"),
}

_CKPT = "the job loads a checkpoint before the measured iterations (not modelled)"
_FSDP = ("torch FSDP2's per-module sharding (torch/distributed/fsdp/_fully_shard) is not modelled; Megatron-FSDP "
         "(--use-megatron-fsdp) is")
_REJECTED = "Megatron-LM itself rejects it (arguments.py: validate_args); use "
_PACKED = "packed variable-length batches (THD format, per-document masks) are not modelled"

#: arguments whose memory the simulator does not model: refused with the reason
REFUSED: dict[str, str] = {
    "--perform-rl-step": "an RL loop (inference engine and training in one process) is not modelled",
    "--inference-max-seq-length": "an inference job (no training step); timeline simulates training",
    "--fp8-output-proj": "the attention output projection's FP8 output (core_attention's input quantized "
                         "by it) is not modelled",
    "--fp8-quantizer-factory": "a custom quantizer factory's tensors are not modelled",
    **dict.fromkeys(("--no-fp8-wgrad", "--disable-fp8-wgrad"), "weight gradients in high precision (TE "
                    "Recipe override_linear_precision: the input kept unquantized for wgrad) are not modelled"),
    "--fp4-format": "FP4 training is not modelled yet", "--fp4-param-gather": "FP4 parameters are not modelled yet",
    "--te-precision-config-file": "a Transformer Engine per-layer precision recipe is not modelled yet",
    "--kitchen-config-file": "NVIDIA Kitchen quantized layers (core/extensions/kitchen.py) are not modelled",
    "--kitchen-recipe-number": "NVIDIA Kitchen quantized layers (core/extensions/kitchen.py) are not modelled",
    "--use-kitchen-attention": "NVIDIA Kitchen attention (core/extensions/kitchen.py) is not modelled",
    "--optimizer-cuda-graph": "a CUDA-graphed optimizer step keeps its own memory pool (not modelled yet)",
    "--moe-pad-experts-for-cuda-graph-inference": "CUDA-graph inference padding is not modelled",
    "--use-torch-fsdp2": _FSDP,
    "--export-kd-teacher-load": "distillation keeps a teacher model in memory (not modelled)",
    "--logits-load-dir": "distillation from stored teacher logits (training/training.py) is not modelled",
    "--logits-save-dir": "saving each step's top-k logits (training/training.py) is not modelled",
    "--export-quant-cfg": "ModelOpt quantization (post_training/model_builder.py) is not modelled",
    "--qad-train-target": "ModelOpt quantization-aware distillation is not modelled",
    "--modelopt-enabled": "a ModelOpt-built model (post_training/model_builder.py) is not modelled",
    "--freeze-base-for-mtp": "a frozen base model (no gradients for most parameters) is not modelled",
    "--freeze-all-layers": "frozen layers (no gradients or optimizer states for them) are not modelled",
    "--moe-use-upcycling": _CKPT,
    "--overlap-dispatch-backward-with-experts-wgrad": "experts' weight gradients delayed to a second stream "
                                                      "(moe_layer.py) are not modelled yet",
    "--ddp-reduce-scatter-with-fp32-accumulation": "fp32 reduce-scatter accumulation buffers are not modelled",
    "--ddp-param-name-patterns-for-fp32-local-accumulation": "fp32 local gradient accumulation for chosen "
                                                             "parameters is not modelled",
    "--fused-residual-rmsnorm": "TE's fused residual-add + RMSNorm (its saved tensors) is not modelled",
    "--fp32-residual-connection": "an fp32 residual stream (transformer_layer.py) is not modelled",
    "--qk-clip": "QK-clip returns each head's max logit (attention.py) and rescales weights; not modelled",
    "--log-max-attention-logit": "the attention kernels' max-logit output per head (attention.py) is not modelled",
    "--enable-mhc-connections": "hyper-connections' several residual streams (hyper_connection.py) are not modelled",
    "--batch-invariant-mode": "batch-invariant kernels (their own workspaces) are not modelled",
    "--flash-attention-version": "which FlashAttention generation TE runs (NVTE_FLASH_ATTN_V*) is not modelled",
    "--symmetric-ar-type": "all-reduces through symmetric-memory buffers are not modelled",
    "--disable-jit-fuser": "the un-fused (eager) forms of Megatron's fused kernels and their intermediates are "
                           "not modelled",
    "--hybrid-context-parallel": "hybrid (per-batch) context parallelism is not modelled",
    "--heterogeneous-layers-config-path": "heterogeneous per-layer configurations are not modelled",
    "--heterogeneous-layers-config-encoded-json": "heterogeneous per-layer configurations are not modelled",
    "--sft": "SFT's " + _PACKED, "--dataloader-inter-document-masking": _PACKED,
    "--moe-router-force-biased": "biased random router logits (moe_utils.py: apply_biased_logits) are not modelled",
    "--moe-expert-rank-capacity-factor": "a per-rank token capacity (token_dispatcher.py) is not modelled",
    "--moe-extended-tp": "extended expert tensor parallelism is not modelled",
    "--moe-mlp-glu-interleave-size": "interleaved GLU weights and their reordering copies are not modelled",
    "--moe-shared-expert-glu-interleave-size": "interleaved GLU weights and their reordering copies are not modelled",
    "--moe-use-grouped-tensor": "TE grouped tensors (per-expert token padding, experts.py) are not modelled",
    "--moe-paged-stash": "MoE activations stashed in paged buffers (moe/paged_stash.py) are not modelled",
    "--moe-permute-fusion-into-hybridep": "the permute fused into HybridEP's dispatch is not modelled",
    "--moe-hybridep-pad-uneven-dispatch-inputs": "HybridEP's padded uneven dispatch inputs are not modelled",
    **dict.fromkeys(("--save-activations-interval", "--save-dgrads-interval", "--save-wgrads-interval"),
                    "debug dumps of activations or gradients (training/training.py: train_step captures them, "
                    "weight gradients all-reduced whole) are not modelled"),
    "--moe-routing-trace-path": "capturing routing traces (hidden states, logits) during training is not modelled",
    "--use-grouped-gemm-for-dense-mlp": "a grouped GEMM for dense MLPs is not modelled",
    "--use-grouped-gemm-for-shared-expert": "a grouped GEMM for shared experts is not modelled",
    "--mla-down-proj-fusion": "MLA's q and kv down-projections fused into one GEMM output is not modelled",
    "--mtp-detach-heads": "MTP with detached heads (its own gradient flow) is not modelled",
    "--mtp-hsm": "MTP's hidden-state mixing variant is not modelled",
    # arguments of Megatron-LM's dev branch (tests/data/megatron/parser_args_between.json, read at dev d48bd6be0a):
    # each builds or keeps tensors no family here models
    "--enable-hyper-connections": "hyper-connections (several residual streams per layer, dev's mHC) are not modelled",
    "--num-residual-streams": "hyper-connections' residual streams (dev's mHC) are not modelled",
    "--use-fused-mhc": "hyper-connections' fused kernels (dev's mHC) are not modelled",
    "--csa-compress-ratios": "compressed sparse attention (dev's CSA) is not modelled",
    "--csa-compress-rotary-base": "compressed sparse attention (dev's CSA) is not modelled",
    "--csa-dense-mode": "compressed sparse attention (dev's CSA) is not modelled",
    "--csa-window-size": "compressed sparse attention (dev's CSA) is not modelled",
    "--no-dsa-kernel-fusion": "DeepSeek sparse attention (its indexer and top-k selection) is not modelled",
    "--o-groups": "a grouped low-rank attention output projection (MLA's o_groups) is not modelled",
    "--o-lora-rank": "a low-rank attention output projection (MLA's o_lora_rank) is not modelled",
    "--head-wise-attn-gate": "a head-wise attention output gate is not modelled",
    "--linear-cp-mode": "linear-attention layers under context parallelism are not modelled",
    "--gdn-conv-pad-alignment": "padding packed gated-delta-net conv inputs to an alignment (dev's option) is not "
                                "modelled",
    "--gdn-pre-gated-delta-rule-fusion": "the streamed Triton fusion of the gated delta net's pre-delta-rule steps "
                                         "(dev's option) is not modelled",
    "--cp-partition-mode": "context-parallel partitions other than the load-balanced halves are not modelled",
    "--dynamic-context-parallel": "a context-parallel size chosen per micro-batch is not modelled",
    "--min-dynamic-context-parallel-size": "a context-parallel size chosen per micro-batch is not modelled",
    "--cuda-graph-dynamic-microbatches": "CUDA graphs captured per micro-batch shape are not modelled",
    "--dense-grouped-gemm": "dense MLPs run as grouped GEMMs are not modelled",
    "--moe-n-hash-layers": "hash-routed MoE layers are not modelled",
    "--moe-hybridep-pad-variable-tokens": "HybridEP's padding of variable token counts is not modelled",
    "--moe-ncclep-use-symm-mem": "NCCL EP's symmetric-memory buffers are not modelled",
    "--enable-routing-replay": "replaying recorded routing decisions (their stored indices) is not modelled",
    "--fallback-to-eager-attn": "TE's eager attention fallback (its s² softmax) is not modelled as chosen at run time",
    "--mrope-interleaved": "multimodal RoPE (interleaved sections) is not modelled",
    "--rotary-base-per-layer": "a rotary base per layer (its per-layer cos/sin caches) is not modelled",
    "--pad-packed-seq-alignment": "packed (THD) sequences are not modelled",
    "--sequence-packing-scheduler": "packed (THD) sequences are not modelled",
    "--thd-max-packed-sequences": "packed (THD) sequences are not modelled",
    "--thd-tail-padding-policy": "packed (THD) sequences are not modelled",
    "--use-varlen-dataset": "variable-length batches are not modelled",
    "--varlen-mock-dataset-config-json": "variable-length batches (a mock dataset of them) are not modelled",
    "--varlen-sbhd-validation": "variable-length batches are not modelled",
    "--sft-mock-dataset-config-json": "SFT's packed variable-length batches are not modelled",
    "--offload-optimizer-states": "optimizer states offloaded to the host are not modelled",
    "--chunked-optimizer-state-offload": "optimizer states offloaded to the host are not modelled",
    "--optimizer-state-offload-chunk-size-mb": "optimizer states offloaded to the host are not modelled",
    "--optimizer-state-offload-fraction": "optimizer states offloaded to the host are not modelled",
    "--disable-grad-buffers-cpu-backup": "the grad buffers' host backup (and turning it off) is not modelled",
    "--disable-param-buffers-cpu-backup": "the param buffers' host backup (and turning it off) is not modelled",
    "--megatron-fsdp-cache-param-bucket-views": "Megatron-FSDP's cached bucket views are not modelled",
    "--megatron-fsdp-prefetch-recompute-forward-weights": "Megatron-FSDP's weight prefetch for recompute is not modelled",
    "--use-layer-wise-param-layout": "the dev branch's layer-wise DDP layout switch is not modelled as an argument "
                                     "(its compact layout is [framework] layer_wise_layout = \"compact\")",
    "--spec": "a custom layer spec (--spec MODULE FUNCTION) builds layers timeline does not know (the hybrid "
              "stack, mamba_layer_specs mamba_stack_spec / hybrid_layer_specs hybrid_stack_spec, and BERT's "
              "--spec local are modelled)",
    "--disable-mamba-mem-eff-path": "the Mamba mixer's unfused path (a separate conv1d, then "
                                    "mamba_chunk_scan_combined) is not modelled",
    "--mamba-training-ssm-states-dtype": "Mamba SSM states kept in another dtype in training are not modelled",
    "--checkpoint-activations": _REJECTED + "--recompute-granularity",
    "--batch-size": _REJECTED + "--micro-batch-size", "--warmup": _REJECTED + "--lr-warmup-iters",
    "--model-parallel-size": _REJECTED + "--tensor-model-parallel-size",
}

#: arguments that name a model family the simulator lacks (refused as that family)
FAMILY_ARGS: dict[str, str] = {
    **dict.fromkeys(("--retro-add-retriever", "--retro-attention-gate", "--retro-cyclic-train-iters",
                     "--retro-encoder-attention-dropout", "--retro-encoder-hidden-dropout",
                     "--retro-encoder-layers",
                     "--retro-no-verify-neighbor-count", "--retro-num-neighbors", "--retro-num-retrieved-chunks",
                     "--retro-project-dir"), "RETRO"),
    **dict.fromkeys(("--vision-pretraining", "--vision-pretraining-type"), "multimodal (vision)"),
}

#: arguments of Megatron-LM's other entry points (not pretrain_gpt.py's parser); refused as that job
OTHER_SCRIPTS: dict[str, str] = {
    **dict.fromkeys(("--num-tokens-to-generate", "--prompts", "--no-record-throughput"),
                    "an inference script's argument (megatron/inference/utils.py); timeline simulates training"),
    **dict.fromkeys(("--model-provider", "--dataset-provider"),
                    "examples/mimo/train.py's argument: a multimodal (MIMO) model; timeline models GPT-style decoders"),
    **dict.fromkeys(("--flextron", "--lr-mult-router"),
                    "megatron/elastification's argument: an elastic (Flextron) model is not modelled"),
}

#: names users bring from other frameworks, with the Megatron-LM argument they mean
NOT_MEGATRON: dict[str, str] = {"--num-experts-per-tok": "--moe-router-topk"}

#: model families a functional test's folder or a ``pretrain_<family>.py`` names; gpt, the MoE folders and
#: bert are modelled, the rest are not
MODELLED_FAMILIES = ("gpt", "moe", "mixtral", "deepseek", "llama", "qwen", "hybrid", "mamba", "nemotron", "bert",
                     "t5", "vlm", "multimodal-llava")
#: the families that run pretrain_vlm.py (LLaVA): the script's own name and its functional tests' folder
VLM_FAMILIES = ("vlm", "multimodal-llava")
FAMILY_NAMES = {"rl": "RL-trained (an inference engine and training in one process)", "bert": "BERT encoder", "t5": "T5 encoder-decoder", "hybrid": "Mamba/hybrid",
                "mamba": "Mamba/hybrid", "nemotron": "Mamba/hybrid (Nemotron-H)", "mimo": "multimodal (MIMO)",
                "multimodal-llava": "multimodal (LLaVA)", "vlm": "multimodal (LLaVA, pretrain_vlm.py)",
                "multimodal-example": "multimodal (examples/multimodal/train.py)", "qwenvl": "multimodal (Qwen-VL)",
                "retro": "RETRO",
                "ict": "ICT retriever", "gpt-nemo": "NeMo-launched GPT (gpt-nemo)",
                "vision": "vision (ViT / DINO / inpainting)", "ul2": "UL2 (legacy T5/GPT)", "albert": "ALBERT encoder",
                "dmc": "GPT with dynamic memory compression (DMC)", "engram": "Engram GPT",
                "gemma4": "Gemma-4 (Gemma4Model)", "diffusion": "Mamba text diffusion", "flextron": "elastic (Flextron)"}

#: Megatron-LM's own entry scripts (``pretrain_<name>.py`` at the repository root or under examples/, on any
#: branch of its history up to d98e8a64dd) and the model family each builds, read from each script's
#: ``model_provider``; a ``pretrain_*.py`` outside this table is a fork's (Pai-Megatron-Patch's
#: ``pretrain_qwen.py``, …), whose model the name does not tell
ENTRY_SCRIPTS = {
    **dict.fromkeys(("gpt", "gpt2", "gpt2_old", "gpt_core", "gpt_terapipe", "deepseek_v2", "llama"), "gpt"),
    "bert": "bert", "albert": "albert", "t5": "t5", "t5_core": "t5", "ul2": "ul2", "mamba": "mamba",
    "hybrid": "hybrid", "hybrid_flex": "flextron", "mamba_tt_diffusion": "diffusion", "gpt_with_dmc": "dmc",
    "engram": "engram", "gemma4": "gemma4", "vlm": "vlm", "qwenvl": "qwenvl", "mimo": "mimo", "retro": "retro",
    "retro_core": "retro", "ict": "ict", "bert_ict": "ict", "realm": "ict",
    **dict.fromkeys(("vit", "vision_classify", "vision_dino", "vision_inpaint"), "vision"),
}
#: Megatron-LM's own entry scripts not named ``pretrain_*.py``, by their path, and the job each runs:
#: ``train_rl.py`` (the repository root, core_v0.15.0 on: GRPO with an inference engine in the training process)
#: and ``examples/multimodal/train.py`` (its arguments in examples/multimodal/multimodal_args.py)
OWN_TRAIN_SCRIPTS = ((r"(^|/)train_rl\.py$", "rl"), (r"(^|/)examples/multimodal/train\.py$", "multimodal-example"))
#: what ``--family`` may say a fork's entry script builds (the entry script of Megatron-LM it stands for)
FORK_FAMILIES = {"gpt": "pretrain_gpt.py", "bert": "pretrain_bert.py", "t5": "pretrain_t5.py",
                 "mamba": "pretrain_mamba.py", "vlm": "pretrain_vlm.py"}

#: a functional test's ``MODE`` other than pretraining: the job it describes
MODE_JOBS = {"inference": "an inference job (MODE: inference); timeline simulates training",
             "rl": "an RL job (MODE: rl: inference engine and training in one process) is not modelled"}

#: ``--model-provider`` / ``--spec`` values outside GPTModel
PROVIDER_FAMILIES = {"llava_vlm": "multimodal (LLaVA)",
                     "mimo": "multimodal (MIMO)"}

#: environment variables that change PyTorch-allocator memory; every other variable (NCCL's, whose
#: buffers are outside PyTorch's allocator, CUDA_DEVICE_MAX_CONNECTIONS, paths) is memory-neutral
ENV_MAPPED = ("PYTORCH_CUDA_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG", "NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN",
              "NVTE_UNFUSED_ATTN", "NVTE_ALLOW_NONDETERMINISTIC_ALGO", "TORCH_NCCL_AVOID_RECORD_STREAMS")


def label(reason: str) -> str:
    """A neutral reason's short form, as the run file's header lists it: the part before its colon."""
    return reason.split(": ", 1)[0]


#: every memory-neutral argument → why
NEUTRAL_REASON: dict[str, str] = {
    **{name: why for why, names in NEUTRAL.items() for name in names},
    **{name: f"acts only with {parent} (refused)" for parent, names in UNDER.items() for name in names},
}


def classification(name: str) -> str | None:
    """Where ``name`` is classified ("mapped", "neutral", "refused"), or None when nowhere."""
    if name in MAPPED:
        return "mapped"
    if name in NEUTRAL_REASON:
        return "neutral"
    if name in REFUSED or name in FAMILY_ARGS or name in OTHER_SCRIPTS:
        return "refused"
    return None
