"""What a model class other than the causal decoder (``[model] architecture``) can be simulated with: run
validation's rules, one line each. This module decides no bytes (:mod:`timeline.graph.families.bert` does).

BERT is Megatron-Core's ``BertModel`` as ``pretrain_bert.py`` builds it (``NVIDIA/Megatron-LM@92f052b8``):
``bert_layer_specs.py`` gives every layer dense self-attention (padding mask) and a dense MLP — no experts,
MLA, Mamba mixers, learned sinks or MTP; q/k norms from core_v0.19.0 only, from the TE spec — and its batch is
not split over context-parallel ranks (``get_batch`` has no ``get_batch_on_this_cp_rank``). Modelled under the ``megatron`` profile with Transformer
Engine's layers and its unfused attention only: TE's flash and fused backends run the padding mask on unpadded
sequences, the local spec (``--spec local``) and the legacy ``BertModel`` are other code, none of it modelled.
"""

from __future__ import annotations

from timeline.spec.engine_versions import parse_version
from timeline.spec.framework import FrameworkSpec
from timeline.spec.model import ModelSpec
from timeline.spec.run import ParallelSpec, TrainingSpec

#: TE backends modelled under a padding mask: the unfused one widens it per layer (graph/families/bert.py); the
#: cuDNN one reads the sequence lengths off it (``dot_product_attention.py: DotProductAttention.forward``:
#: ``get_cu_seqlens``, int32 ``[b + 1]``) and runs on the padded q, k, v; FlashAttention packs the unpadded
#: tokens into copies (``backends.py: FlashAttention.forward``: ``PackTensors``), not modelled
PADDED_BACKENDS = ("unfused", "fused")

#: the TE release from which the unfused attention asserts a [b, 1, 1, s] padding mask and widens it itself
#: (attention.py: UnfusedDotProductAttention.forward@v1.10); before, it applies a [b, 1, s, s] mask as given —
#: the legacy BertModel's, which it always builds
LEGACY_TE_MASK = (1, 10)


def legacy_bert_te_modelled(attention_backend: str, transformer_engine: str) -> bool:
    """Whether the legacy BertModel on TE's TransformerLayer is modelled: TE's unfused attention before
    :data:`LEGACY_TE_MASK`, which applies its ``[b, 1, s, s]`` mask as given."""
    te = parse_version(transformer_engine) or (0, 0, 0)
    return attention_backend == "unfused" and te[:2] < LEGACY_TE_MASK


def architecture_problems(m: ModelSpec) -> list[tuple[str, str]]:
    """Contradictions inside ``[model]`` between the architecture and the layer kinds it builds."""
    out: list[tuple[str, str]] = []
    if m.architecture != "bert":
        for field, given in (("type_vocab_size", m.type_vocab_size > 0), ("binary_head", m.binary_head)):
            if given:
                out.append((f"model.{field}", f'belongs to BERT; set architecture = "bert" or remove it '
                                              f'(architecture is "{m.architecture}")'))
    if m.architecture != "t5" and m.encoder_layers:
        out.append(("model.encoder_layers", f'belongs to T5; set architecture = "t5" or remove it '
                                            f'(architecture is "{m.architecture}")'))
    if m.architecture != "llava":
        for field, given in (("vision_layers", m.vision_layers > 0), ("frozen", bool(m.frozen))):
            if given:
                out.append((f"model.{field}", f'belongs to LLaVA; set architecture = "llava" or remove it '
                                              f'(architecture is "{m.architecture}")'))
    else:
        out += _llava_problems(m)
    if m.architecture == "t5" and not 0 < m.encoder_layers < m.num_hidden_layers:
        out.append(("model.encoder_layers", f"T5 needs encoder and decoder layers: give 1 … "
                                            f"{m.num_hidden_layers - 1} encoder layers of the {m.num_hidden_layers}"))
    if m.architecture in ("gpt", "llava"):
        return out
    family = "BertModel layers (bert_layer_specs.py)" if m.architecture == "bert" else "T5Model layers (t5_spec.py)"
    for has, what, field in ((m.is_moe, "experts", "n_routed_experts"), (m.is_mla, "MLA", "kv_lora_rank"),
                             (m.is_hybrid, "Mamba/hybrid layers", "hybrid_override_pattern"),
                             (m.mtp_layers > 0, "multi-token prediction", "mtp_layers"),
                             (m.attention_sinks, "learned attention sinks", "attention_sinks"),
                             (m.attention_output_gate, "attention output gate", "attention_output_gate"),
                             # bert_layer_specs.py leaves the TE spec's q/k norms unset from core_v0.19.0
                             # (2c579b45b9): SelfAttention builds TENorm / L2Norm per head, as a GPT layer's
                             (m.qk_norm and m.architecture == "t5", "q/k norms", "qk_norm")):
        if has:
            out.append((f"model.{field}", f"Megatron's {family} have no {what}; remove it or set architecture = "
                                          f"\"gpt\""))
    if m.architecture == "t5":
        if not m.tie_word_embeddings:
            out.append(("model.tie_word_embeddings", "pretrain_t5.py shares the embedding with the output layer "
                                                     "(share_embeddings_and_output_weights=True); set it true"))
        return out
    if m.binary_head and m.type_vocab_size == 0:
        out.append(("model.type_vocab_size", "BERT's binary head reads the segment ids (pretrain_bert.py: "
                                             "num_tokentypes = 2 with it); give type_vocab_size = 2"))
    if not m.binary_head and m.type_vocab_size:
        out.append(("model.type_vocab_size", "pretrain_bert.py passes segment ids only with the binary head "
                                             "(types = None otherwise); set it to 0 or binary_head = true"))
    return out


def _llava_problems(m: ModelSpec) -> list[tuple[str, str]]:
    """LLaVA as ``pretrain_vlm.py`` builds it (``NVIDIA/Megatron-LM@dabfbc4c6e``, the same from 46fdcd5b7e to
    d98e8a64dd): a CLIP ViT (``clip_vit_model.py``: a class token, ``img_h`` and ``img_w`` multiples of
    ``patch_dim``) and the projector reading the decoder spec's MLP submodules (``MultimodalProjector`` builds
    ``MLP``, which an MoE spec's submodules do not make)."""
    out: list[tuple[str, str]] = []
    if m.vision_layers <= 0:
        out.append(("model.vision_layers", "LLaVA needs the ViT's layers (--encoder-num-layers); give 1 or more"))
    for field, side in (("image_height", m.image_height), ("image_width", m.image_width)):
        if side % m.patch_size:
            out.append((f"model.{field}", f"{side} is not a multiple of patch_size {m.patch_size} (CLIPViTModel "
                                          "asserts it); give a multiple"))
    for has, what, field in ((m.is_moe, "an MoE decoder (the projector builds an MLP from the decoder spec's "
                                        "MLP submodules, which an MoE spec does not hold)", "n_routed_experts"),
                             (m.is_mla, "MLA", "kv_lora_rank"), (m.is_hybrid, "Mamba/hybrid layers",
                                                                 "hybrid_override_pattern"),
                             (m.mtp_layers > 0, "multi-token prediction", "mtp_layers"),
                             (m.has_linear_attention, "gated delta-net layers", "layer_types")):
        if has:
            out.append((f"model.{field}", f"LLaVA with {what} is not modelled; remove it"))
    return out


def architecture_run_problems(m: ModelSpec, profile: str, traced: bool, par: ParallelSpec, tr: TrainingSpec,
                              fw: FrameworkSpec, full_recompute: bool = False) -> list[tuple[str, str]]:
    """A BERT or T5 model against the rest of a training run; a causal decoder's Megatron-only layers."""
    if (par.encoder_pp or par.encoder_tp) and m.architecture != "llava":
        return [("parallel.encoder_pp" if par.encoder_pp else "parallel.encoder_tp",
                 "a pipeline stage of its own holds a LLaVA model's ViT; set 0 (architecture "
                                        f'is "{m.architecture}")')]
    if m.attention_output_gate and (profile != "megatron" or traced):
        return [("model.attention_output_gate", 'the gated attention output is modelled as Megatron-Core runs it: '
                                                'profile = "megatron" with the layer library (no captured trace)')]
    if m.has_linear_attention and (profile != "megatron" or traced):
        return [("model.layer_types", "gated delta-net layers (linear_attention: Qwen3-Next, Qwen3.5) are trained as "
                                      'Megatron-Core runs them: profile = "megatron" with the layer library (no '
                                      "captured trace); or serve them (`timeline serve` on vLLM)")]
    if m.has_linear_attention and par.cp > 1:
        return [("parallel.cp", "gated delta-net layers under context parallelism (their all-to-alls, "
                                "gated_delta_net.py: tensor_a2a_cp2hp) are not modelled; set cp = 1")]
    if m.index_n_heads:
        return [("model.index_n_heads", "DeepSeek-V3.2's lightning indexer (sparse attention) is modelled for serving "
                                        "(`timeline serve` on vLLM 0.19); training with it is not modelled yet")]
    if m.local_rope and profile == "hf" and not traced:
        # models/gemma3/modeling_gemma3.py (transformers 5.24): the sliding layers' SDPA takes a mask
        # (masking_utils.create_sliding_window_causal_mask, a [b, 1, s, s] bool past the window), which moves CUDA
        # off the flash/cuDNN kernels, and Gemma3TextModel computes a second cos/sin pair for them
        return [("model.profile", "Gemma-3 under the hf profile (SDPA with a sliding-window mask and a second RoPE "
                                  "table for its local layers) is not modelled yet; use profile = \"megatron\" for a "
                                  "Megatron-style run of the same layers, or `timeline serve` for vLLM")]
    if m.architecture == "t5":
        return _t5_run_problems(profile, traced, par, tr, fw)
    if m.architecture == "llava":
        return _llava_run_problems(m, profile, traced, par, tr, fw, full_recompute)
    if m.architecture != "bert":
        return []
    out: list[tuple[str, str]] = []
    if profile != "megatron" or traced:
        out.append(("model.architecture", 'BERT is modelled as Megatron-Core runs it: profile = "megatron" with the '
                                          "layer library (no captured trace)"))
        return out
    if par.cp > 1:
        out.append(("parallel.cp", "pretrain_bert.py's get_batch does not split the sequence over context-parallel "
                                   "ranks; set cp = 1"))
    # pretrain_bert.py: the Transformer Engine layer spec, or bert_layer_local_spec under --spec local (transformer_impl
    # "local": Megatron's own DotProductAttention, which BertModel runs with the local or auto backend only), or the
    # legacy BertModel on the legacy local layer (spec/legacy_rules.py) whose CoreAttention is the same
    local = fw.transformer_impl == "local"
    out += _backend_problems(fw, "BERT's local layer spec", "(BertModel asserts the local backend)")
    if fw.use_legacy_models and not local and not legacy_bert_te_modelled(fw.attention_backend, fw.transformer_engine):
        out.append(("framework.use_legacy_models", "the legacy BertModel under TE's TransformerLayer hands its "
                                                   "[b, 1, s, s] mask to TE's padding attention, modelled for TE's "
                                                   "unfused attention before 1.10 only; set transformer_impl = "
                                                   '"local"'))
    if tr.fp8_recipe != "none":
        out.append(("training.fp8_recipe", "FP8 training of BERT (its LM head and pooler are torch.nn.Linear) is "
                                           'not modelled; set "none"'))
    return out


def _t5_run_problems(profile: str, traced: bool, par: ParallelSpec, tr: TrainingSpec,
                     fw: FrameworkSpec) -> list[tuple[str, str]]:
    """T5 as ``pretrain_t5.py`` runs it (graph/families/t5.py): what is modelled of it."""
    out: list[tuple[str, str]] = []
    if profile != "megatron" or traced:
        return [("model.architecture", 'T5 is modelled as Megatron-Core runs it: profile = "megatron" with the '
                                       "layer library (no captured trace)")]
    if tr.decoder_seq_len <= 0:
        out.append(("training.decoder_seq_len", "T5 needs the decoder's tokens per sample (--decoder-seq-length)"))
    out += _flagged(((par.pp > 1, "parallel.pp", "T5 across pipeline stages (the encoder and decoder split by "
                                                 "--encoder-pipeline-model-parallel-size) is not modelled; set 1"),
                     (par.cp > 1, "parallel.cp", "pretrain_t5.py's get_batch does not split sequences over "
                                                 "context-parallel ranks; set 1"),
                     (par.ep > 1, "parallel.ep", "T5's layers have no experts; set 1"),
                     (tr.fp8_recipe != "none", "training.fp8_recipe", 'FP8 T5 is not modelled; set "none"'),
                     (fw.use_legacy_models, "framework.use_legacy_models", "the legacy T5 model is not modelled; "
                                                                             "set false")))
    return out + _backend_problems(fw, "T5's local spec", "")


def _flagged(checks: tuple[tuple[bool, str, str], ...]) -> list[tuple[str, str]]:
    """The (key, why) of each check whose condition holds."""
    return [(key, why) for bad, key, why in checks if bad]


def _llava_run_problems(m: ModelSpec, profile: str, traced: bool, par: ParallelSpec, tr: TrainingSpec,
                        fw: FrameworkSpec, full_recompute: bool) -> list[tuple[str, str]]:
    """LLaVA as ``pretrain_vlm.py`` runs it (graph/families/llava.py): what is modelled of it."""
    if profile != "megatron" or traced:
        return [("model.architecture", 'LLaVA is modelled as Megatron-Core runs it: profile = "megatron" with the '
                                       "layer library (no captured trace)")]
    out: list[tuple[str, str]] = []
    if par.encoder_pp and (par.pp < 2 or not par.layout or par.layout[0] != 0):
        out.append(("parallel.encoder_pp", "the ViT's own stage is the first of pp ≥ 2 and holds no decoder layer: "
                                           "give pp ≥ 2 and a layout whose first entry is 0"))
    if par.encoder_tp and (not par.encoder_pp or par.encoder_tp > par.tp or m.num_attention_heads % par.encoder_tp):
        out.append(("parallel.encoder_tp", "the ViT stage's own tensor parallelism needs encoder_pp = 1, at most tp "
                                           "ranks and a divisor of the heads (Megatron's validate_args); set 0 for tp"))
    if full_recompute:  # the ViT's TransformerBlock checkpoints its own layers by the copied config
        out.append(("recompute.policy", "full recompute of a LLaVA model (its ViT's TransformerBlock checkpoints "
                                        "its own layers by the same settings) is not modelled; use selective or "
                                        "none"))
    text = tr.seq_len - m.image_tokens
    if text < 0:
        out.append(("training.seq_len", f"{tr.seq_len} is under the {m.image_tokens} positions an image fills; give "
                                        "the language model's tokens: the text's and the image's"))
    checks = (
        (par.sp and par.tp > 1, "parallel.sp", "the combined sequence padded for sequence parallelism "
                                               "(padding_causal mask, packed-sequence parameters) is not modelled; "
                                               "set false"),
        (par.cp > 1, "parallel.cp", "LLaVA's context-parallel sharding of the combined sequence (THD format) is not "
                                    "modelled; set 1"),
        (par.vpp > 1, "parallel.vpp", "pretrain_vlm.py's model with virtual pipeline stages is not modelled; set 1"),
        (par.ep > 1, "parallel.ep", "LLaVA's modelled decoder has no experts; set 1"),
        (tr.fp8_recipe != "none", "training.fp8_recipe", 'FP8 LLaVA is not modelled; set "none"'),
        (fw.use_legacy_models, "framework.use_legacy_models", "LLaVA is a Megatron-Core model; set false"),
        (fw.transformer_impl == "local", "framework.transformer_impl",
         "LLaVA's local layer specs (llava_spec.py, vit_layer_specs.py local) are not modelled; use "
         '"transformer_engine"'))
    return out + _flagged(checks)


def _backend_problems(fw: FrameworkSpec, local_spec: str, why_local: str) -> list[tuple[str, str]]:
    """The attention backend of a model under padding masks (BERT, T5): Megatron's own DotProductAttention under
    its local spec, else one of TE's :data:`PADDED_BACKENDS`."""
    if fw.transformer_impl == "local":
        if fw.attention_backend == "local":
            return []
        why = f" {why_local}" if why_local else ""
        return [("framework.attention_backend", f"{local_spec} runs Megatron's own DotProductAttention{why}; use "
                                                '"local"')]
    if fw.attention_backend in PADDED_BACKENDS:
        return []
    return [("framework.attention_backend", f'"{fw.attention_backend}" under padding masks is not modelled (TE packs '
                                            'the unpadded sequences); use "unfused" or "fused", or transformer_impl = '
                                            '"local" with "local" for the local spec')]
