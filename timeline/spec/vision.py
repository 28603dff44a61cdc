"""A vision-language checkpoint's vision tower and projector, as an inference engine builds them.

Read from the checkpoint's ``config.json`` (:mod:`timeline.io.hf_vision`); the language model is the
config's ``text_config`` (a :class:`~timeline.spec.model.ModelSpec`). One kind so far:

* ``pixtral`` — Mistral-3 (``Mistral3ForConditionalGeneration``: Mistral-Small-3.1/3.2): vLLM's
  ``PixtralHFVisionModel`` (``vllm/model_executor/models/pixtral.py``, read at 0.19.0): a bias-free
  ``patch_size``² convolution, ``ln_pre`` (RMSNorm), ``num_hidden_layers`` pre-norm blocks (RMSNorm,
  QKV, 2-D RoPE, attention, ``o_proj``; RMSNorm, gated-SiLU MLP), and ``Mistral3MultiModalProjector``
  (``mistral3.py``): RMSNorm, ``Mistral3PatchMerger`` (``spatial_merge_size``² patches unfolded into one
  row, a bias-free ``nn.Linear`` back to the vision width), ``linear_1`` → act → ``linear_2`` into the
  text width (biases with ``multimodal_projector_bias``).
* ``siglip`` — Gemma-3 (``Gemma3ForConditionalGeneration``): vLLM's ``SiglipVisionModel`` (``siglip.py``, read at
  0.19.0): a biased ``patch_size``² convolution plus a learned position table, ``num_hidden_layers`` pre-norm
  blocks (LayerNorm, biased QKV, attention, ``out_proj``; LayerNorm, ``fc1`` → tanh-GeLU → ``fc2``), a
  ``post_layernorm``; and ``Gemma3MultiModalProjector`` (``gemma3_mm.py``): an average pool of
  ``spatial_merge_size``² patches to one embedding, a Gemma RMSNorm and one ``[vision, text]`` matrix.
* ``qwen3_vl`` — Qwen3.5 (``Qwen3_5ForConditionalGeneration``, ``Qwen3_5MoeForConditionalGeneration``): vLLM's
  ``Qwen3_VisionTransformer`` (``qwen3_vl.py``). Read from the config, not modelled yet: its language model is
  served alone (``serving.limit_mm_per_prompt = 0``, vLLM ``--limit-mm-per-prompt`` with every modality 0, which
  builds no tower).
"""

from __future__ import annotations

from dataclasses import dataclass

from timeline.spec.fields import spec_field

VISION_KINDS = ("pixtral", "siglip", "qwen3_vl")


@dataclass(frozen=True, slots=True, kw_only=True)
class VisionSpec:
    kind: str = spec_field("pixtral", choices=VISION_KINDS, doc="the vision tower's family")
    architecture: str = spec_field("", doc="the checkpoint's class (config.json architectures)")
    hidden_size: int = spec_field(1024, positive=True, maximum=2**16)
    num_hidden_layers: int = spec_field(24, positive=True, maximum=1024)
    num_attention_heads: int = spec_field(16, positive=True, maximum=2**10)
    intermediate_size: int = spec_field(4096, positive=True, maximum=2**20)
    patch_size: int = spec_field(14, positive=True, maximum=1024)
    image_size: int = spec_field(1540, positive=True, maximum=2**16, doc="the longest image edge it takes")
    num_channels: int = spec_field(3, positive=True, maximum=64)
    spatial_merge_size: int = spec_field(1, positive=True, maximum=16, doc="patches merged per side")
    text_hidden_size: int = spec_field(4096, positive=True, maximum=2**20, doc="the language model's width")
    projector_bias: bool = spec_field(False, doc="biases on linear_1 / linear_2 (multimodal_projector_bias)")

    @property
    def grid(self) -> int:
        """Patches per side of the largest image (``image_size // patch_size``)."""
        return self.image_size // self.patch_size

    @property
    def patches(self) -> int:
        """Patches of the largest image, the encoder's sequence for it."""
        return self.grid * self.grid

    @property
    def merged_grid(self) -> int:
        """Image tokens per side after the patch merger (``PixtralHFEncoderInfo.get_patch_grid_size``: the image
        over ``patch_size · spatial_merge_size``)."""
        return self.image_size // (self.patch_size * self.spatial_merge_size)

    @property
    def image_embeddings(self) -> int:
        """Embeddings the projector gives the largest image (one per merged patch)."""
        return self.merged_grid * self.merged_grid

    @property
    def image_placeholder_tokens(self) -> int:
        """Prompt tokens the largest image takes, text between its embeddings included:
        ``Mistral3MultiModalProcessor._get_prompt_updates`` — each row's ``[IMG]`` tokens and one ``[IMG_BREAK]``,
        the last an ``[IMG_END]``; Gemma-3's ``full_image_sequence`` (transformers ``Gemma3Processor``) —
        ``"\\n\\n"``, ``<start_of_image>``, the image tokens, ``<end_of_image>``, ``"\\n\\n"`` (``"\\n\\n"`` one token
        of Gemma's vocabulary)."""
        if self.kind == "siglip":
            return self.image_embeddings + 4
        return (self.merged_grid + 1) * self.merged_grid
