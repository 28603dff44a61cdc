"""``--use-legacy-models`` → ``[framework] use_legacy_models``: Megatron-LM's legacy GPT model
(``megatron/legacy/model``), modelled as its differences from the Megatron-Core model of the same
``--transformer-impl`` (:mod:`timeline.profiles.megatron_legacy`), and a one-line refusal for each thing the legacy path
cannot run or runs through code that is not modelled.

Read at ``NVIDIA/Megatron-LM@60166922d3`` (``pretrain_gpt.py: model_provider``, ``megatron/legacy/model/
transformer.py``, ``megatron/training/arguments.py: validate_args``) and checked unchanged in what it
decides to core_v0.17.0; Megatron-LM 39ec5ebeb4 (2026-05-06) removed the legacy GPT code, and no release
from 0.18.0 on parses the argument (:func:`timeline.io.megatron_versions.check_argument` refuses it there).
"""

from __future__ import annotations

from timeline.errors import UserError
from timeline.io.megatron_map import ArgReader, Conversion

FLAG = "--use-legacy-models"

#: memory-neutral arguments (megatron_neutral.py) read only to refuse them with the legacy model
CHECKED_ONLY = ("--use-flash-attn", "--fp16-lm-cross-entropy")

#: what only the legacy local layer reads (transformer.py: ParallelAttention's FlashSelfAttention); TE's
#: TransformerLayer chooses its own attention backend
LOCAL_ONLY = ("--use-flash-attn",)

#: what only TE's TransformerLayer refuses (the local layer builds SwitchMLP for experts)
TE_ONLY = ("--num-experts",)

#: arguments whose legacy path is not modelled (or that Megatron-LM refuses with the legacy model), and why
REFUSED = {
    "--num-experts": "TE's TransformerLayer, which the legacy model builds under --transformer-impl "
                     "transformer_engine, has a dense MLP: the experts would not be built (transformer.py: "
                     "ParallelTransformer.build_layer); give --transformer-impl local for its SwitchMLP, or drop it",
    "--multi-latent-attention": "the legacy model has no MLA (transformer.py: ParallelAttention)",
    "--qk-layernorm": "the legacy model has no q/k layernorm (transformer.py: ParallelAttention ignores it)",
    "--mtp-num-layers": "the legacy model has no MTP",
    "--fp16-lm-cross-entropy": "the legacy model's cross entropy on 16-bit logits (gpt_model.py: "
                               "post_language_model_processing, no fp32 copy) is not modelled",
}


def legacy_model(a: ArgReader, c: Conversion) -> None:
    """Map ``--use-legacy-models`` (written only when given) or raise a one-line UserError.

    ``--transformer-impl`` chooses the layer (``transformer.py: ParallelTransformer.build_layer``): ``local``
    builds ``ParallelTransformerLayer``, ``transformer_engine`` (the default) TE's ``TransformerLayer``
    (``fuse_qkv_params=True``, ``set_parallel_mode=True``: ``LayerNormLinear`` q/k/v, ``DotProductAttention``,
    row-parallel ``Linear``, ``LayerNormMLP``), the modules Megatron-Core's TE layer spec builds one by one."""
    if not a.flag(FLAG):
        return
    impl = a.str("--transformer-impl", "transformer_engine")
    for name, why in REFUSED.items():
        if name in (LOCAL_ONLY if impl != "local" else TE_ONLY):
            continue
        if a.raw.get(name) not in (None, False, 0):
            raise UserError(f"{name} with {FLAG}: {why}")
    if c.sections["parallel"].get("cp", 1) > 1:
        raise UserError(f"--context-parallel-size with {FLAG}: Megatron-LM refuses it (arguments.py: "
                        "validate_args, \"Context parallelism is not supported in legacy models\")")
    fmt = a.str("--ckpt-format", "torch_dist")
    if fmt != "torch":
        raise UserError(f"--ckpt-format {fmt} with {FLAG}: Megatron-LM refuses it (arguments.py: validate_args, "
                        "\"legacy model format only supports the 'torch' checkpoint format\"); give --ckpt-format torch")
    pos = str(a.raw.get("--position-embedding-type", "learned_absolute"))
    if pos not in ("learned_absolute", "rope"):
        raise UserError(f"--position-embedding-type {pos} with {FLAG}: the legacy model builds learned absolute "
                        "or rope position embeddings only (language_model.py: TransformerLanguageModel)")
    # transformer.py: ParallelAttention checkpoints core attention alone under selective recompute
    mods = c.sections.get("recompute", {}).get("modules", ["core_attn"])
    if c.sections.get("recompute", {}).get("policy") == "selective" and list(mods) != ["core_attn"]:
        raise UserError(f"--recompute-modules {' '.join(mods)} with {FLAG}: the legacy model recomputes core "
                        "attention only (transformer.py: ParallelAttention.checkpoint_core_attention); give "
                        "--recompute-modules core_attn")
    if c.sections["model"].get("n_routed_experts"):
        switch_mlp(a, c)
    if impl == "local" and a.flag("--use-flash-attn"):
        # transformer.py: ParallelAttention.forward runs FlashSelfAttention in place of CoreAttention, which alone
        # --recompute-granularity selective checkpoints: with flash the selective policy recomputes nothing
        c.put("framework.legacy_flash_attn", True, "--use-flash-attn")
        if c.sections.get("recompute", {}).get("policy") == "selective":
            del c.sections["recompute"]
            c.notes.append("--recompute-granularity selective with --use-flash-attn on the legacy model: its "
                           "ParallelAttention checkpoints CoreAttention only, which FlashSelfAttention replaces "
                           "(transformer.py: ParallelAttention.forward): nothing is recomputed")
    c.put("framework.use_legacy_models", True, FLAG)


def switch_mlp(a: ArgReader, c: Conversion) -> None:
    """The experts of the legacy local layer: ``transformer.py: ParallelTransformerLayer.__init__`` builds
    ``SwitchMLP`` in every layer when ``--num-experts`` is given, whose ``forward`` routes each token to the
    one expert sinkhorn picks and whose experts are ``ParallelMLP(config, is_expert=True)`` of
    ``--ffn-hidden-size``, with no shared experts and no expert bias: ``--moe-router-topk``,
    ``--moe-ffn-hidden-size``, ``--moe-shared-expert-intermediate-size`` and ``--moe-layer-freq`` are not
    read by it (graph/families/switch_mlp.py)."""
    model = c.sections["model"]
    for key, value in (("num_experts_per_tok", 1), ("moe_intermediate_size", model["intermediate_size"]),
                       ("n_shared_experts", 0), ("shared_expert_intermediate_size", 0),
                       ("first_k_dense_replace", 0), ("moe_layer_freq", 1), ("router_bias", False)):
        model[key] = value
    for name in ("--moe-router-topk", "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size",
                 "--moe-layer-freq", "--moe-router-enable-expert-bias"):
        a.has(name)
