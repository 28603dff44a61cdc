"""Megatron-Core's LLaVA (``[model] architecture = "llava"``) as ``pretrain_vlm.py`` builds and feeds it: the batch,
the CLIP ViT over each micro-batch's images, the MLP projector, the language model's embedding of the text and the
combined sequence the decoder (GPT's layers, :mod:`timeline.graph.families.decoder`) runs on.

Read at ``NVIDIA/Megatron-LM@dabfbc4c6e`` (``MC`` = ``megatron/core``; the memory-relevant code the same from
46fdcd5b7e, 2025-01, on):

- ``pretrain_vlm.py: model_provider``: the ViT's ``TransformerConfig`` is a deep copy of the language model's
  (hidden size, heads, FFN, norm, activation, biases, recompute settings) with ``--encoder-num-layers`` layers, CP 1
  and no sequence parallelism; the projector (``vision_projection_type = "mlp"``) is an ``MLP`` of the decoder
  spec's MLP submodules (TE: ``TELayerNormColumnParallelLinear`` fc1, its norm fused, and ``TERowParallelLinear``
  fc2) from the ViT's width to the language model's; both live on the first pipeline stage with the embedding;
  ``decoder_seq_length`` = the text's tokens + the image's embeddings (+ SP/CP padding) is the language model's
  sequence (``training.seq_len`` here) and its learned position table's rows (``language_max_sequence_length``).
- ``pretrain_vlm.py: get_batch``: ``tensor_parallel.broadcast_data`` of ``tokens``, ``position_ids``, ``labels``
  (int64 ``[b, t]``, t = the text's tokens and the image token ``_preprocess_data_for_llava`` prepends) as one flat
  buffer, and of ``image`` (fp32 ``[b, 3, H, W]``, one image per sample: ``MockMultimodalDataset``) and
  ``loss_mask`` (fp32 ``[b, t]``) as another; the step's tensors are views of them, alive through the forward step.
- ``MC/transformer/module.py: Float16Module.forward``: on the first stage the fp32 positional inputs (the images and
  the loss mask) become bf16 copies; on the last the model's outputs back to fp32 (the bf16 loss mask's copy).
- ``MC/models/vision/clip_vit_model.py: CLIPViTModel.forward``: ``conv1`` (``Conv2d`` 3 → h, kernel = stride =
  ``patch_dim``, no bias, keeps its input), ``torch.cat`` of the class token and the patches, ``+ position
  embeddings``, ``ln_pre``, ``permute(1, 0, 2).contiguous()``, the ``TransformerBlock`` (no final norm, no attention
  mask: ``vit_layer_specs.py`` ``AttnMaskType.no_mask``), ``permute(1, 0, 2).contiguous()``.
- ``MC/models/multimodal/llava_model.py: LLaVAModel.forward``: the class token dropped by slicing (a view) under
  ``--disable-vision-class-token``, ``permute(1, 0, 2).contiguous()``, the projector and ``encoder_output +
  encoder_output_bias`` (a new tensor, with biases); the embedding of ``input_ids.clone()`` (the image token set to 0)
  and its ``transpose(1, 0).contiguous()``; ``_preprocess_data``: ``torch.zeros`` of the combined ``[b, S, h]``, the
  text rows gathered (``language_embeddings[batch_indices, non_image_indices]``) and the image rows copied
  (``.reshape(-1, h).contiguous()``) into it by ``index_put_``, the final labels and loss mask ``[b, S]``, then
  ``final_embedding.transpose(1, 0).contiguous()``, the decoder's input.

This module decides no bytes: each op names the profile rule that says what it keeps
(:mod:`timeline.profiles.megatron_llava`).
"""

from __future__ import annotations

from dataclasses import replace

from timeline.graph.context import BuildCtx
from timeline.graph.families import decoder, embedding, mlp, norm
from timeline.graph.families.common import add
from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef, param


def vision_params(ctx: BuildCtx) -> list[TensorDef]:
    """``CLIPViTModel``'s own parameters (its layers are :func:`timeline.graph.build.decoder_layer`'s): ``conv1``
    ``[h, 3, p, p]``, the class token ``[1, 1, h]``, the position table ``[seq, h]`` and ``ln_pre``, none split by TP."""
    m, dt, h = ctx.model, ctx.dtype, ctx.model.hidden_size
    return [param("vision_model.conv1.weight", (h, 3, m.patch_size, m.patch_size), module="embedding", dtype=dt),
            param("vision_model.class_token", (1, 1, h), module="embedding", dtype=dt),
            param("vision_model.position_embeddings.weight", (m.vision_seq_len, h), module="embedding", dtype=dt),
            *norm.params(ctx, "vision_model.ln_pre", h)]


def projector_params(ctx: BuildCtx) -> list[TensorDef]:
    """``MultimodalProjector``'s MLP: fc1's fused norm, fc1 and fc2 of the decoder's FFN width (split by TP)."""
    m = ctx.model
    return [*norm.params(ctx, "vision_projection.norm", m.hidden_size),
            *mlp.params(ctx, "vision_projection.mlp", m.intermediate_size, split=ctx.tp)]


def text_tokens(b: Builder) -> int:
    """Tokens per sample the dataloader gives: the text's and the prepended image token (``get_batch`` pads them
    so that with the image's embeddings they make ``decoder_seq_length``)."""
    return b.dims.s - b.model.image_tokens + 1


def load_batch(b: Builder) -> dict[str, TensorDef]:
    """``get_batch``'s two broadcast buffers; both live to the end of the forward step."""
    d, m, t = b.dims, b.model, text_tokens(b)
    out = {"ints": b.tensor("batch.vlm_int64", (3 * d.b * t,), "int64"),
           "floats": b.tensor("batch.vlm_fp32", (d.b * 3 * m.image_height * m.image_width + d.b * t,), "fp32")}
    b.op("batch.get_batch", "batch", None, {}, dict(out))
    return out


def _to_bf16(b: Builder, loaded: dict[str, TensorDef]) -> tuple[TensorDef, TensorDef]:
    """Float16Module on the first pipeline stage: `fp32_to_float16` of the positional fp32 inputs (the images and
    the loss mask)."""
    d, m = b.dims, b.model
    images = b.tensor("batch.images_bf16", (d.b, 3, m.image_height, m.image_width))
    mask16 = b.tensor("batch.loss_mask_bf16", (d.b, text_tokens(b)))
    b.op("batch.to_bf16", "copy", None, {"_floats": loaded["floats"]}, {"images": images, "loss_mask": mask16})
    return images, mask16


def vision_stage(b: Builder, loaded: dict[str, TensorDef]) -> TensorDef:
    """The ViT's own pipeline stage (``--encoder-pipeline-model-parallel-size 1``: ``add_decoder`` false there,
    ``LLaVAModel.forward`` returns the projected image embeddings, which the schedule sends on as
    ``[encoder_seq_length, b, h]``); returns them."""
    images, _ = _to_bf16(b, loaded)
    return _vision(b, images)


def image_input(b: Builder) -> TensorDef:
    """The first decoder stage's input under a ViT stage of its own: the image embeddings received
    (``LLaVAModel.set_input_tensor`` → ``encoder_hidden_state``)."""
    x = b.tensor("input", (b.dims.b * b.model.image_tokens, b.model.hidden_size))
    b.op("recv_forward", "comm", None, {}, {"y": x}, kind="p2p", stream="pp")
    return x


def first_stage(b: Builder, loaded: dict[str, TensorDef], *, last: bool, image: TensorDef | None = None) -> TensorDef:
    """The first decoder stage's forward up to the decoder: returns the combined ``[S·b, h]`` sequence. ``last``: the
    stage also holds the loss (its final labels and loss mask are made here too); ``image``: the image embeddings
    received from a ViT stage of its own (else the ViT runs here, on the first pipeline stage)."""
    d = b.dims
    t = text_tokens(b)
    if image is None:
        images, mask16 = _to_bf16(b, loaded)
        image_rows, mask = _vision(b, images), (mask16.dtype, {"_mask": mask16})
    else:  # not the first pipeline stage: Float16Module converts nothing, the loss mask stays the batch's fp32 view
        image_rows, mask = image, ("fp32", {"_floats": loaded["floats"]})
    # LLaVAModel.forward: `input_ids.clone()` with the image token zeroed, the embedding of the text, then
    # `language_embeddings.transpose(1, 0).contiguous()`
    ids = b.tensor("llava.input_ids_text", (d.b, t), "int64")
    b.op("llava.input_ids_text", "copy", None, {"_ints": loaded["ints"]}, {"y": ids})
    dims = b.dims
    b.dims = replace(dims, s=t)
    try:
        text = embedding.forward(b, "embedding", None)
    finally:
        b.dims = dims
    text_bsh = b.tensor("llava.text_embeddings_bsh", text.shape)
    b.op("llava.text_transpose", "copy", None, {"x": text, "_ids": ids}, {"y": text_bsh})
    return _combine(b, text_bsh, image_rows, mask, last=last)


def _vision(b: Builder, images: TensorDef) -> TensorDef:
    """``CLIPViTModel.forward``, the class token's drop and the projector; returns the image rows ``[n·b, h]`` in
    the ``[n, b, h]`` order the combine reads them."""
    d, m, h = b.dims, b.model, b.model.hidden_size
    n = m.vision_seq_len
    grid = (m.image_height // m.patch_size) * (m.image_width // m.patch_size)
    patches = b.tensor("vision_model.conv1.out", (d.b * grid, h))
    f = 2.0 * d.b * grid * h * 3 * m.patch_size ** 2
    b.op("vision_model.conv1", "conv2d", None, {"x": images}, {"y": patches}, flops=f, wflops=f)
    tokens = b.tensor("vision_model.cat.out", (d.b * n, h))
    b.op("vision_model.cat", "copy", None, {"x": patches}, {"y": tokens})
    pos = b.tensor("vision_model.position_embeddings.out", (n, h))
    b.op("vision_model.position_embeddings", "embedding", None, {}, {"y": pos})
    x = add(b, "vision_model.position_add", tokens, pos, None)
    x = norm.forward(b, "vision_model.ln_pre", x, None)
    sbh = b.tensor("vision_model.to_sbh", x.shape)
    b.op("vision_model.to_sbh", "copy", None, {"x": x}, {"y": sbh})
    vis = replace(b.dims, s=n, cp=1, sp=False)  # the ViT: the image's tokens, no CP or SP (model_provider)
    dims, model = b.dims, b.model
    b.dims = vis
    # CLIPViTModel.forward calls its TransformerBlock without rotary embeddings: its positions are the learned
    # table added above, whatever the decoder's type
    b.model = replace(m, position_embedding="learned")
    try:
        x = sbh
        for k in range(m.vision_layers):
            x = decoder.forward(b, m.vision_layer(k), f"vision_model.layers.{k}", x, moe=False)
        bsh = b.tensor("vision_model.to_bsh", x.shape)
        b.op("vision_model.to_bsh", "copy", None, {"x": x}, {"y": bsh})
        keep = m.image_tokens
        # the class token dropped by a slice (a view of the whole output), then `permute(1, 0, 2).contiguous()`
        rows = b.tensor("llava.image_embeddings", (d.b * keep, h))
        b.op("llava.image_to_sbh", "copy", None, {"x": bsh}, {"y": rows})
        b.dims = replace(vis, s=keep)
        start = len(b.ops)
        ln = norm.forward(b, "vision_projection.norm", rows, None)
        out = mlp.project(b, "vision_projection", ln, None)
        if m.linear_bias:  # MultimodalProjector.forward: `encoder_output + encoder_output_bias`, a new tensor
            biased = b.tensor("vision_projection.bias_add.out", out.shape)
            b.op("vision_projection.bias_add", "add", None, {"x": out}, {"y": biased})
            out = biased
        for op in b.ops[start:]:  # the projector is no TransformerLayer: no recompute module reaches it
            op.tags = frozenset()
    finally:
        b.dims, b.model = dims, model
    return out


def _combine(b: Builder, text: TensorDef, image: TensorDef, mask: tuple[str, dict[str, TensorDef]], *,
             last: bool) -> TensorDef:
    """``LLaVAModel._preprocess_data`` on the first decoder stage and the decoder input's transpose; ``mask``: the
    loss mask's dtype and what holds it."""
    d, h = b.dims, b.model.hidden_size
    t = text_tokens(b)
    combined = b.tensor("llava.final_embedding", (d.b * d.s, h))
    b.op("llava.final_embedding", "zeros", None, {}, {"y": combined})
    picked = b.tensor("llava.text_rows", (d.b * (t - 1), h))
    b.op("llava.text_rows", "index", None, {"x": text}, {"y": picked})
    b.op("llava.put_text", "index_put", None, {"x": picked, "_into": combined}, {})
    flat = b.tensor("llava.image_rows", image.shape)
    b.op("llava.image_rows", "copy", None, {"x": image}, {"y": flat})
    b.op("llava.put_image", "index_put", None, {"x": flat, "_into": combined}, {})
    if last:
        _final_labels(b, *mask)
    out = b.tensor("llava.decoder_input", combined.shape)
    b.op("llava.decoder_input", "copy", None, {"x": combined}, {"y": out})
    return out


def _final_labels(b: Builder, dtype: str, refs: dict[str, TensorDef]) -> None:
    """``_preprocess_data`` on the stage holding the loss: ``final_labels`` (int64) and ``final_loss_mask`` (the loss
    mask's ``dtype``) ``[b, S]``, alive to the end of the forward step (:func:`held_to_step_end`);
    the bf16 mask's fp32 copy Float16Module makes of the outputs where it is bf16 (the first stage's)."""
    d = b.dims
    outs = {"labels": b.tensor("llava.final_labels", (d.b, d.s), "int64"),
            "loss_mask": b.tensor("llava.final_loss_mask", (d.b, d.s), dtype)}
    if dtype != "fp32":
        outs["loss_mask_fp32"] = b.tensor("llava.final_loss_mask_fp32", (d.b, d.s), "fp32")
    b.op("llava.final_labels", "batch", None, refs, outs)
    b.shared.update({f"llava.{k}": t for k, t in outs.items()})


def last_stage_batch(b: Builder, loaded: dict[str, TensorDef]) -> None:
    """A last stage that is not the first: ``_preprocess_data``'s final labels and loss mask (fp32 there, the
    batch's own view)."""
    _final_labels(b, "fp32", {"_floats": loaded["floats"]})


def held_to_step_end(b: Builder) -> dict[str, TensorDef]:
    """The final labels and loss masks the loss function reads at the forward step's end."""
    return {k: t for k, t in b.shared.items() if k.startswith("llava.")}


#: the ops of each freezable module (``LLaVAModel.freeze``: ``language_model`` and ``vision_model``; the projector
#: is never frozen by pretrain_vlm.py)
FROZEN_PREFIXES = {"vision": ("vision_model.",), "language": ("embedding", "layers.", "final_norm", "output")}
#: rules of ops that hold weights without a weight-gradient GEMM of their own (norms, lookups)
WEIGHT_RULES = ("layernorm", "rmsnorm", "fused_layernorm", "embedding")


def mark_frozen(b: Builder) -> None:
    """``--freeze-LM`` / ``--freeze-ViT`` (``LLaVAModel.freeze``: ``requires_grad = False`` on each parameter):
    a frozen module's ops have no weight gradient and keep nothing only it reads (TE ``_Linear`` / ``_LayerNormLinear``
    save the GEMM input only ``if weight.requires_grad``, v1.6 … v2.18 — before v1.6 ``_LayerNormLinear`` keeps its
    norm output anyway, v1.2 … v1.5; Megatron's frozen output layer is
    ``linear_with_frozen_weight``); an op none of whose inputs or weights takes a gradient has no autograd node at all
    (a frozen ViT on the images, the frozen embedding of the text). A stage's received input takes one, and an
    ``index_put_`` of a tensor that takes one makes its target take one."""
    prefixes = tuple(p for k in b.model.frozen for p in FROZEN_PREFIXES[k])
    if not prefixes:
        return
    grad: set[str] = set()
    producer: dict[str, int] = {}
    # a layer's norms, which TE fuses into the linear after them (the final norm is a TENorm of its own, before
    # Megatron's output layer, whose frozen path keeps no input)
    norms = {t.storage for op in b.ops if op.rule in ("layernorm", "rmsnorm") and "layers." in op.name
             for t in op.outputs.values()}
    for i, op in enumerate(b.ops):
        op.frozen = op.name.startswith(prefixes)
        # TE before 1.6: LayerNormLinear (a linear whose saved input is the fused norm's output) keeps it anyway
        save = op.inputs.get("_save")
        op.frozen_keeps = op.frozen and b.table.te_frozen_ln_out and b.table.fused_norm_linear and \
            save is not None and save.storage in norms
        weights = (op.wflops > 0 or op.rule in WEIGHT_RULES) and not op.frozen
        takes = weights or op.name == "recv_forward" or any(t.storage in grad for t in op.dataflow_inputs())
        op.no_grad = not takes
        for t in (*op.outputs.values(), *op.extras.values()):
            producer[t.storage] = i
            if takes:
                grad.add(t.storage)
        into = op.inputs.get("_into")
        if takes and into is not None:  # written in place: the target now takes the gradient
            grad.add(into.storage)
            b.ops[producer[into.storage]].no_grad = False
