"""The ``megatron`` profile's rules for the ops of Megatron-Core's LLaVA (``[model] architecture = "llava"``,
:mod:`timeline.graph.families.llava`) that GPT's layers do not have: what each keeps for its backward.

Read at ``NVIDIA/Megatron-LM@dabfbc4c6e`` (``MC``; unchanged 46fdcd5b7e … d98e8a64dd) and PyTorch's
``tools/autograd/derivatives.yaml`` (the formulas each autograd node saves, unchanged 2.2 … 2.13).
"""

from __future__ import annotations

from timeline.profiles.base import SaveRule, SaveRules

MC = "NVIDIA/Megatron-LM@dabfbc4c6e:megatron/core"
DERIVATIVES = "pytorch/pytorch tools/autograd/derivatives.yaml"

RULES: dict[str, SaveRule] = {
    "conv2d": SaveRule(saves=("in:x",), wgrad=("in:x",),
                       source=f"{MC}/models/vision/clip_vit_model.py: CLIPViTModel.conv1 (torch.nn.Conv2d, no bias) — "
                              f"{DERIVATIVES} convolution keeps its input for the weight gradient (and the weight, a "
                              "parameter); the images' first layer needs no input gradient"),
    "zeros": SaveRule(source=f"{MC}/models/multimodal/llava_model.py: LLaVAModel._preprocess_data — torch.zeros of "
                             "the combined [b, S, h] embedding, written in place by index_put_; keeps nothing"),
    "index": SaveRule(source=f"{MC}/models/multimodal/llava_model.py: _preprocess_data — "
                             "`language_embeddings[batch_indices, non_image_indices]`, a gather into a new tensor; "
                             f"{DERIVATIVES} index.Tensor keeps the int64 indices (b·t elements: not modelled)"),
    "index_put": SaveRule(source=f"{MC}/models/multimodal/llava_model.py: _preprocess_data — index_put_ of the text "
                                 f"and image rows into the zeros; {DERIVATIVES} index_put_ keeps the indices (the "
                                 "[b, S] bool image mask and int64 text positions: not modelled)"),
}


def extend(rules: SaveRules) -> SaveRules:
    """``rules`` (the megatron rules) with LLaVA's added; no rule is replaced."""
    return rules.extended(RULES)
