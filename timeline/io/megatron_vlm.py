"""A LLaVA job (``pretrain_vlm.py``, a ``test_cases/multimodal-llava/`` folder) → ``[model] architecture =
"llava"``, and a one-line refusal for what its model is not modelled with.

Read at ``NVIDIA/Megatron-LM@dabfbc4c6e`` (``pretrain_vlm.py: model_provider``, ``add_vlm_extra_args``;
``megatron/training/arguments.py: validate_args``; the same from 46fdcd5b7e to d98e8a64dd unless said):

- ``validate_args``: ``--num-layers`` and ``--encoder-num-layers`` are one value given once (each fills the other);
  the ViT has ``args.encoder_num_layers`` layers, the language model ``--decoder-num-layers`` if given, else
  ``--num-layers`` (``language_transformer_config.num_layers``, from 0f2ac9db53, 2025-04-03; before it
  ``config.num_layers``, the same value);
- ``model_provider``: ``vision_model_type = "clip"`` (one class token); the image's embeddings per sample
  ``get_num_image_embeddings`` (the patches, and the class token unless ``--disable-vision-class-token``); the
  text's tokens ``--dataloader-seq-length``, else ``--seq-length``; the language model's sequence
  ``decoder_seq_length`` = text + image embeddings + ``context_parallel.get_padding`` (to a multiple of tp under
  SP, of 2·cp under CP, …; the user's ``--decoder-seq-length`` only under ``--decoder-tp-comm-overlap``), which
  is also the rows of its learned position table (``language_max_sequence_length``); LLaVAModel's default
  ``share_embeddings_and_output_weights=False`` (untied whatever the flags); ``--freeze-LM`` / ``--freeze-ViT``
  (``LLaVAModel.freeze``); asserts ``--ckpt-format torch`` and no PP with CP; the decoder spec's MLP submodules
  build the projector, so an MoE decoder (``--num-experts``) fails there (``MLP`` over ``MoESubmodules``);
- ``add_vlm_extra_args`` (the script's own parser group, every version): ``--freeze-LM``, ``--freeze-ViT``,
  ``--disable-vision-class-token``, ``--dataloader-seq-length``, ``--decoder-tp-comm-overlap``,
  ``--use-packed-sequence`` (from 6e84ec7b5b, 2025-02-01).
"""

from __future__ import annotations

from timeline.errors import UserError
from timeline.io.megatron_map import ArgReader, Conversion, no_qk_norms
from timeline.io.megatron_table import VLM_FAMILIES

#: ``pretrain_vlm.py: add_vlm_extra_args`` — arguments of that script's parser only
VLM_ARGS = ("--freeze-LM", "--freeze-ViT", "--disable-vision-class-token", "--dataloader-seq-length",
            "--decoder-tp-comm-overlap", "--use-packed-sequence")


#: ``arguments.py: _add_vision_args`` defaults (core_r0.12.0 … d98e8a64dd)
IMAGE_DEFAULTS = {"--img-h": 224, "--img-w": 224, "--patch-dim": 16}


def is_vlm(family: str | None) -> bool:
    return family in VLM_FAMILIES


def padding(seq: int, *, tp: int, cp: int, sp: bool) -> int:
    """``megatron/core/models/multimodal/context_parallel.py: get_padding`` (without TP comm overlap or FP8): to a
    multiple of tp·cp·2 under SP and CP, of cp·2 under CP, of tp under SP."""
    factor = tp * cp * 2 if sp and cp > 1 else cp * 2 if cp > 1 else tp if sp else 1
    return -(-seq // factor) * factor - seq


def map_vlm(a: ArgReader, c: Conversion, family: str | None) -> None:
    """``[model]`` and ``[training]`` of a LLaVA job; nothing for another family."""
    if not is_vlm(family):  # pretrain_vlm.py's own arguments are refused by name (megatron_write.check_names)
        for name in IMAGE_DEFAULTS:
            if name in a.raw:
                raise UserError(f"{name}: a multimodal (vision) model; timeline models GPT-style decoders (dense, MoE, "
                                "MLA), BERT, T5 and LLaVA (pretrain_vlm.py) only")
        return
    fmt = a.str("--ckpt-format", "torch_dist")
    if fmt != "torch":
        raise UserError(f"--ckpt-format {fmt}: pretrain_vlm.py asserts \"Only ckpt-format torch is supported for VLM "
                        "training currently\"; give --ckpt-format torch")
    par = c.sections["parallel"]
    # the decoder's --pipeline-model-parallel-size (pp here also counts a ViT stage of its own)
    if par.get("cp", 1) > 1 and par.get("pp", 1) - par.get("encoder_pp", 0) > 1:
        raise UserError("--context-parallel-size with --pipeline-model-parallel-size: pretrain_vlm.py asserts \"PP+CP is "
                        "not yet supported by this script\"; use one of them")
    if a.raw.get("--num-experts") not in (None, False, 0, "None"):
        raise UserError("--num-experts with pretrain_vlm.py: the projector is an MLP built from the decoder spec's MLP "
                        "submodules, which an MoE spec's are not (the script fails there); drop it")
    if a.flag("--decoder-tp-comm-overlap"):
        raise UserError("--decoder-tp-comm-overlap: the language model's TP communication overlap with the user's "
                        "--decoder-seq-length padding is not modelled; drop it")
    if a.flag("--use-packed-sequence") and par.get("cp", 1) > 1:
        # get_packed_seq_params: THD only under CP; else sbhd with cu_seqlens, which a causal mask does not read
        raise UserError("--use-packed-sequence with --context-parallel-size: packed (THD) multimodal sequences are "
                        "not modelled; drop it")
    if a.flag("--attention-output-gate"):
        raise UserError("--attention-output-gate with pretrain_vlm.py: LLaVA's decoder spec (llava_spec.py) under a "
                        "gated attention output is not modelled; drop it")
    model, tr = c.sections["model"], c.sections["training"]
    # pretrain_vlm.py builds the decoder spec with its default qk_layernorm=False (llava_spec.py:
    # decoder_model_with_transformer_engine_default_spec / decoder_model_with_local_default_spec): IdentityOp q/k norms
    no_qk_norms(c, "LLaVA", "llava_spec.py, qk_layernorm=False")
    vision_layers = model["num_layers"]  # validate_args: --num-layers is --encoder-num-layers
    a.int("--encoder-num-layers")
    lm_layers = a.int("--decoder-num-layers") or vision_layers
    h, w, p = (a.int(k, d) for k, d in IMAGE_DEFAULTS.items())
    for name, side in (("--img-h", h), ("--img-w", w)):
        if side % p:
            raise UserError(f"{name} {side} is not a multiple of --patch-dim {p} (CLIPViTModel asserts it)")
    drop = a.flag("--disable-vision-class-token")
    image_tokens = (h // p) * (w // p) + (0 if drop else 1)
    text = a.int("--dataloader-seq-length") or tr["seq_len"]
    a.int("--encoder-seq-length")  # the ViT's sequence: model_provider overwrites it with the image's tokens
    a.int("--decoder-seq-length")  # overwritten by model_provider (read only under --decoder-tp-comm-overlap)
    tp, cp = par.get("tp", 1), par.get("cp", 1)
    seq = text + image_tokens
    seq += padding(seq, tp=tp, cp=cp, sp=bool(par.get("sp")) and tp > 1)
    c.put("model.architecture", "llava")
    c.put("model.vision_layers", vision_layers, "--num-layers", "--encoder-num-layers")
    c.put("model.num_layers", lm_layers, "--num-layers", "--decoder-num-layers")
    c.put("model.image_height", h, "--img-h")
    c.put("model.image_width", w, "--img-w")
    c.put("model.patch_size", p, "--patch-dim")
    c.put("model.vision_class_token", "drop" if drop else "keep", "--disable-vision-class-token")
    frozen = [name for flag, name in (("--freeze-LM", "language"), ("--freeze-ViT", "vision")) if a.flag(flag)]
    c.put("model.frozen", frozen, "--freeze-LM", "--freeze-ViT")
    # LLaVAModel(share_embeddings_and_output_weights=False): pretrain_vlm.py passes no tying flag
    c.put("model.tie_word_embeddings", False, "--untie-embeddings-and-output-weights")
    # GPTModel(max_sequence_length=language_max_sequence_length): the learned position table's rows
    c.put("model.max_position_embeddings", seq, "--max-position-embeddings")
    c.put("training.seq_len", seq, "--seq-length", "--dataloader-seq-length")
    c.notes.append(f"pretrain_vlm.py: the language model runs {seq} positions a sample ({text} text tokens and "
                   f"{image_tokens} image embeddings{' with padding' if seq > text + image_tokens else ''}); the ViT "
                   f"{(h // p) * (w // p) + 1} tokens an image")
