"""Vision-language checkpoints: split a ``config.json`` into its language model's config and a
:class:`~timeline.spec.vision.VisionSpec`.

A config with a ``vision_config`` is a vision-language checkpoint. Mistral-3 (``model_type`` ``mistral3``,
``Mistral3ForConditionalGeneration``) is read as transformers' ``Mistral3Config`` and vLLM's
``Mistral3ForConditionalGeneration`` (``vllm/model_executor/models/mistral3.py``, 0.19.0) read it:
``text_config`` is the language model, ``vision_config`` the Pixtral tower (``PixtralVisionConfig``'s defaults
where a key is missing), ``spatial_merge_size`` (default 2) and ``multimodal_projector_bias`` (default false) the
projector; ``vision_feature_layer`` −1
builds every vision layer. The top-level ``quantization_config`` stays with the checkpoint (its ``ignore``
list says which vision modules are quantized). Gemma-3 (``gemma3``, ``Gemma3ForConditionalGeneration``) is
read as ``Gemma3Config``: its ``text_config`` a Gemma-3 language model, its ``vision_config`` the SigLIP tower
(:mod:`timeline.serve.vision`). Qwen3.5 (``qwen3_5``, ``qwen3_5_moe``) is read for its language model (a gated
delta-net hybrid); its Qwen3-VL tower is not modelled, so it is served with ``limit_mm_per_prompt = 0``. Any other
vision-language family is refused by name.
"""

from __future__ import annotations

import math
from typing import Any

from timeline.errors import UserError
from timeline.spec.vision import VisionSpec

#: the classes read (config.json ``architectures`` / ``model_type``) → the vision tower's kind
VISION_LANGUAGE = {"Mistral3ForConditionalGeneration": "pixtral", "mistral3": "pixtral",
                   "Gemma3ForConditionalGeneration": "siglip", "gemma3": "siglip",
                   "Qwen3_5ForConditionalGeneration": "qwen3_vl", "qwen3_5": "qwen3_vl",
                   "Qwen3_5MoeForConditionalGeneration": "qwen3_vl", "qwen3_5_moe": "qwen3_vl"}


def is_vision_language(cfg: dict[str, Any]) -> bool:
    """A checkpoint with a vision tower (a ``vision_config``)."""
    return isinstance(cfg.get("vision_config"), dict)


def _kind(cfg: dict[str, Any]) -> str:
    raw = cfg.get("architectures")
    archs: list[Any] = raw if isinstance(raw, list) else []
    for name in [*archs, cfg.get("model_type")]:
        if isinstance(name, str) and name in VISION_LANGUAGE:
            return VISION_LANGUAGE[name]
    label = ", ".join(map(str, archs)) or str(cfg.get("model_type"))
    raise UserError(f"vision-language checkpoint {label} is not modelled (its vision tower and its encoder "
                    "profile); modelled: Mistral3ForConditionalGeneration (Mistral-Small-3.1/3.2, Pixtral), "
                    "Gemma3ForConditionalGeneration (Gemma-3, SigLIP); Qwen3_5ForConditionalGeneration / "
                    "Qwen3_5MoeForConditionalGeneration for their language model alone")


def split_vision(cfg: dict[str, Any]) -> tuple[dict[str, Any], VisionSpec]:
    """(the language model's config, the vision tower) of a vision-language ``cfg``."""
    kind = _kind(cfg)
    text, vision = cfg.get("text_config"), cfg["vision_config"]
    if not isinstance(text, dict):
        raise UserError("a vision-language config.json without a text_config object")
    text = dict(text)
    if kind == "siglip":
        return _siglip(cfg, text, vision)
    if kind == "qwen3_vl":
        return _qwen3_vl(cfg, text, vision)
    layer = cfg.get("vision_feature_layer", -1)
    layers = int(vision.get("num_hidden_layers", 24))
    if not isinstance(layer, int) or not -layers <= layer < layers:
        raise UserError(f"vision_feature_layer {layer!r} is not modelled: one layer index of the vision tower "
                        "(a list of layers is not modelled)")
    # mistral3.py _get_num_hidden_layers: the tower is built up to the deepest feature layer
    built = layers + layer + 1 if layer < 0 else layer + 1
    text.setdefault("model_type", "mistral")
    try:
        spec = VisionSpec(kind=kind, architecture=str((cfg.get("architectures") or [""])[0]),
                          hidden_size=int(vision.get("hidden_size", 1024)), num_hidden_layers=built,
                          num_attention_heads=int(vision.get("num_attention_heads", 16)),
                          intermediate_size=int(vision.get("intermediate_size", 4096)),
                          patch_size=int(vision.get("patch_size", 16)), image_size=int(vision.get("image_size", 1024)),
                          num_channels=int(vision.get("num_channels", 3)),
                          spatial_merge_size=int(cfg.get("spatial_merge_size", 2)),
                          text_hidden_size=int(text.get("hidden_size", 4096)),
                          projector_bias=bool(cfg.get("multimodal_projector_bias", False)))
    except (TypeError, ValueError) as exc:
        raise UserError(f"vision_config: {exc}") from None
    return text, _checked(spec)


def _siglip(cfg: dict[str, Any], text: dict[str, Any], vision: dict[str, Any]) -> tuple[dict[str, Any], VisionSpec]:
    """Gemma-3 (``Gemma3ForConditionalGeneration``; transformers 5.24 ``Gemma3Config``, vLLM 0.19.0
    ``models/gemma3_mm.py``): ``text_config`` is a ``Gemma3TextConfig`` (its defaults where the published file
    leaves a key out), ``vision_config`` a ``SiglipVisionConfig`` (hidden 768, 12 layers, 12 heads, MLP 3072,
    224-pixel images of 16-pixel patches where a key is missing); ``Gemma3MultiModalProjector`` average-pools the
    patch grid to ``mm_tokens_per_image`` (default 256) embeddings, ``image_size // patch_size`` over
    ``√mm_tokens_per_image`` patches a side."""
    text.setdefault("model_type", "gemma3_text")
    try:
        grid = int(vision.get("image_size", 224)) // int(vision.get("patch_size", 16))
        tokens = int(cfg.get("mm_tokens_per_image", 256))
        side = math.isqrt(tokens)
        if tokens < 1 or side * side != tokens or grid % side:
            raise ValueError(f"mm_tokens_per_image {tokens} is not a square that divides the {grid}×{grid} patch "
                             "grid")
        spec = VisionSpec(kind="siglip", architecture=str((cfg.get("architectures") or [""])[0]),
                          hidden_size=int(vision.get("hidden_size", 768)),
                          num_hidden_layers=int(vision.get("num_hidden_layers", 12)),
                          num_attention_heads=int(vision.get("num_attention_heads", 12)),
                          intermediate_size=int(vision.get("intermediate_size", 3072)),
                          patch_size=int(vision.get("patch_size", 16)), image_size=int(vision.get("image_size", 224)),
                          num_channels=int(vision.get("num_channels", 3)), spatial_merge_size=grid // side,
                          text_hidden_size=int(text.get("hidden_size", 2304)))
    except (TypeError, ValueError) as exc:
        raise UserError(f"vision_config: {exc}") from None
    return text, _checked(spec)


def _qwen3_vl(cfg: dict[str, Any], text: dict[str, Any], vision: dict[str, Any]) -> tuple[dict[str, Any],
                                                                                          VisionSpec]:
    """Qwen3.5 (vLLM 0.19.0 ``models/qwen3_5.py`` ``Qwen3_5ForConditionalGeneration`` and its MoE sibling, configs
    ``transformers_utils/configs/qwen3_5.py`` / ``qwen3_5_moe.py``): ``text_config`` a ``Qwen3_5TextConfig`` (its
    ``model_type`` ``qwen3_5_text`` or ``qwen3_5_moe_text`` by the checkpoint's class), ``vision_config`` the
    Qwen3-VL tower (``Qwen3_5VisionConfig``: depth 27, width 1152, 16 heads, MLP 4304, 16-pixel patches, 2×2
    merge, ``out_hidden_size`` the text width) — read, not modelled (:mod:`timeline.spec.vision`)."""
    raw = cfg.get("architectures")
    moe = cfg.get("model_type") == "qwen3_5_moe" or (isinstance(raw, list) and
                                                     "Qwen3_5MoeForConditionalGeneration" in raw)
    text.setdefault("model_type", "qwen3_5_moe_text" if moe else "qwen3_5_text")
    try:
        spec = VisionSpec(kind="qwen3_vl", architecture=str((raw or [""])[0]) if isinstance(raw, list) else "",
                          hidden_size=int(vision.get("hidden_size", 1152)),
                          num_hidden_layers=int(vision.get("depth", 27)),
                          num_attention_heads=int(vision.get("num_heads", 16)),
                          intermediate_size=int(vision.get("intermediate_size", 4304)),
                          patch_size=int(vision.get("patch_size", 16)),
                          num_channels=int(vision.get("in_channels", 3)),
                          spatial_merge_size=int(vision.get("spatial_merge_size", 2)),
                          text_hidden_size=int(vision.get("out_hidden_size", text.get("hidden_size", 4096))))
    except (TypeError, ValueError) as exc:
        raise UserError(f"vision_config: {exc}") from None
    return text, _checked(spec)


def _checked(spec: VisionSpec) -> VisionSpec:
    if spec.hidden_size % spec.num_attention_heads:
        raise UserError(f"vision_config: hidden_size {spec.hidden_size} is not a multiple of num_attention_heads "
                        f"{spec.num_attention_heads}")
    return spec
