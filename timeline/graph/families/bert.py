"""Megatron-Core's BERT (``[model] architecture = "bert"``): what its ``BertModel`` adds around the decoder
layers the GPT families build — the token-type embedding, the padding mask of every self-attention, the
LM head's transform, the output layer's bias, the pooler and the binary head — and the batch
``pretrain_bert.py`` puts on every pipeline stage.

Read at ``NVIDIA/Megatron-LM@92f052b8`` (the same code from 46fdcd5b7e, 2025-01, to 64bee49c96, 2026-07, the
collected BERT records' span; the training script moved to ``examples/bert/`` in 547fb1713e unchanged):

- ``megatron/core/models/bert/bert_model.py: BertModel.__init__``: ``LanguageModelEmbedding`` with
  ``num_tokentypes`` (2 with ``--bert-binary-head``) on the first stage; on the last, ``BertLMHead``,
  the output layer (``ColumnParallelLinear(bias=True)``, its weight the word embedding's where shared)
  and, with the binary head, ``get_linear_layer(h, 2)`` and ``Pooler``;
- ``BertModel.forward``: the encoder, then ``self.pooler(hidden_states, 0)``, ``self.lm_head``, the
  output layer and ``compute_language_model_loss``, then ``self.binary_head(pooled_output)``;
- ``bert_lm_head.py: BertLMHead.forward``: ``dense`` (``torch.nn.Linear(h, h)``), ``F.gelu``,
  ``layer_norm`` (``fusions/fused_layer_norm.py: FusedLayerNorm``);
- ``pooler.py: Pooler.forward``: the sequence-parallel all-gather, ``hidden_states[0]``, ``dense``,
  ``torch.tanh``;
- ``bert_layer_specs.py: get_bert_layer_with_transformer_engine_spec``: GPT's TE layer with
  ``attn_mask_type = padding`` (``BertModel._sanity_check_attention_and_get_attn_mask_dimension``: a
  ``[b, 1, 1, s]`` mask with TE ≥ 1.10), which TE's unfused attention widens per layer (:func:`padding_mask`);
- ``bert_layer_specs.py: bert_layer_local_spec`` (``--spec local``): GPT's local layer (apex ``FusedLayerNorm``,
  ``ColumnParallelLinear`` / ``RowParallelLinear``, Megatron's ``DotProductAttention``) with the padding type,
  which reads the ``[b, 1, s, s]`` mask as given (``FusedScaleMaskSoftmax``: apex's ``ScaledMaskedSoftmax`` keeps
  its output only; without the kernel, ``masked_fill_`` in place and ``torch.softmax``).

This module decides no bytes: each op names the profile rule that says what it keeps
(:mod:`timeline.profiles.megatron_bert`).
"""

from __future__ import annotations

from timeline.graph.context import BuildCtx
from timeline.graph.families import head, norm
from timeline.graph.families.common import NONE, Tags, linear, sp_gather
from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef, param

#: the keys ``pretrain_bert.py: get_batch`` broadcasts (int64 [b, s] each)
BATCH_KEYS = ("text", "types", "labels", "is_random", "loss_mask", "padding_mask")


def head_params(ctx: BuildCtx, *, shares_embedding: bool) -> list[TensorDef]:
    """The last stage's parameters after the final norm: the LM head's transform (replicated over TP), the
    output layer (weight unless it is the first stage's word embedding; bias split with the vocabulary),
    and the pooler and binary head (replicated) where the model has the binary head."""
    m, dt, h = ctx.model, ctx.dtype, ctx.model.hidden_size
    out = [param("lm_head.dense.weight", (h, h), module="head", dtype=dt),
           param("lm_head.dense.bias", (h,), module="head", dtype=dt),
           *norm.params(ctx, "lm_head.layer_norm", h, module="head", kind="layernorm"),
           *head.params(ctx, shares_embedding=shares_embedding),
           param("output_layer.bias", (ctx.padded_vocab,), module="head", dtype=dt, split=ctx.tp)]
    if m.binary_head:
        out += [param("pooler.dense.weight", (h, h), module="head", dtype=dt),
                param("pooler.dense.bias", (h,), module="head", dtype=dt),
                param("binary_head.weight", (2, h), module="head", dtype=dt),
                param("binary_head.bias", (2,), module="head", dtype=dt)]
    return out


def load_batch(b: Builder) -> dict[str, TensorDef]:
    """``pretrain_bert.py: get_batch`` on every pipeline stage: ``tensor_parallel.broadcast_data`` moves the
    six keys as one flat int64 buffer (``torch.cat(...).cuda()`` on TP rank 0, ``torch.empty`` elsewhere)
    whose views the step unpacks (``.long()`` keeps them), and ``loss_mask.float()`` copies one; ``BertModel.forward``
    derives the bool mask every layer reads (``b.table.bert_mask``: ``[b, 1, 1, s]``, or ``[b, 1, s, s]`` through an
    int64 ``[b, s, s]`` product). All but the product live through the forward step
    (:func:`timeline.graph.families.batch.release`)."""
    d = b.dims
    out = {"flat": b.tensor("batch.bert_flat", (len(BATCH_KEYS) * d.b * d.s,), "int64"),
           "loss_mask": b.tensor("batch.loss_mask_fp32", (d.b, d.s), "fp32")}
    b.op("batch.get_batch", "batch", None, {}, dict(out))  # a copy: the op keeps its own outputs
    if b.table.bert_mask == "b1ss":
        # BertModel.bert_extended_attention_mask ("b1ss"): the int64 [b, s, s] product of the [b, 1, s] and
        # [b, s, 1] views, then `< 0.5` over its [b, 1, s, s] view; the product dies as the function returns
        product = b.tensor("batch.mask_product", (d.b, d.s, d.s), "int64")
        b.op("batch.mask_product", "bert_mask", None, {"_flat": out["flat"]}, {"y": product})
        mask = b.tensor("batch.extended_mask", (d.b, 1, d.s, d.s), "bool")
        b.op("batch.extended_mask", "bert_mask", None, {"_product": product}, {"y": mask})
    else:  # "b11s": `attention_mask.unsqueeze(1).unsqueeze(1) < 0.5`
        mask = b.tensor("batch.extended_mask", (d.b, 1, 1, d.s), "bool")
        b.op("batch.extended_mask", "bert_mask", None, {"_flat": out["flat"]}, {"y": mask})
    out["extended_mask"] = mask
    return out


def padding_mask(b: Builder, name: str, layer: int, tags: Tags = NONE, *, kv_len: int = 0) -> dict[str, TensorDef]:
    """The ``[b, 1, s, s]`` bool mask TE's ``UnfusedDotProductAttention.forward`` builds from the ``[b, 1, 1, s]``
    padding mask, per layer, before the scores; returns ``{"mask": …}`` plus any tensor that lives on to the
    end of the attention's forward (``"diag"``).

    TE before 2.0 (``NVIDIA/TransformerEngine@v1.11:transformer_engine/pytorch/attention.py``):
    ``torch.logical_or`` of the mask with its transpose (kept), ``.squeeze(1).logical_not()`` and the
    int32 ``arange`` difference ``[1, 1, s, s]`` held by the local ``mask`` to the end of ``forward``.
    TE 2.0 … 2.18 (``dot_product_attention/utils.py: get_full_mask``, padding with bottom-right alignment,
    the default): the same ``logical_or`` and ``logical_not`` (its local ``m``), the ``arange`` difference,
    ``swa_left`` / ``swa_right`` (its ``expand`` to ``[b, 1, s, s]`` plus a per-sequence offset: int32
    each), ``logical_not((swa_left <= 0) & ~(swa_right < 0))`` (three bool temporaries at a time), and
    ``logical_or(swa_mask, attention_mask)``, the mask returned; the function's locals die as it returns.
    ``kv_len``: a cross-attention's key length (``get_full_mask`` with ``attention_type="cross"`` ORs the
    query mask's column with the key mask's row into the same ``[b, 1, s_q, s_kv]`` shapes)."""
    d = b.dims
    sk = kv_len or d.s  # a cross-attention's keys (T5): the mask is [b, 1, s_q, s_kv]
    full, square = (d.b, 1, d.s_local, sk), (1, 1, d.s_local, sk)

    def step(key: str, refs: dict[str, TensorDef], **made: tuple[tuple[int, ...], str]) -> dict[str, TensorDef]:
        outs = {k: b.tensor(f"{name}.{k}", shape, dtype) for k, (shape, dtype) in made.items()}
        b.op(f"{name}.{key}", "attn_mask", layer, {f"_{k}": v for k, v in refs.items()}, outs, tags=tags)
        return dict(outs)  # a copy: the op keeps its own outputs

    m = step("pad", {}, padded=(full, "bool"), inverse=(full, "bool"))
    m |= step("diag", {"inverse": m["inverse"]}, diag=(square, "int32"))
    if not b.table.te_full_mask:
        return {"mask": m["padded"], "diag": m["diag"]}
    m |= step("window", {"diag": m["diag"]}, swa_left=(full, "int32"), swa_right=(full, "int32"))
    m |= step("compare", {"l": m["swa_left"], "r": m["swa_right"]}, left_le=(full, "bool"),
              right_lt=(full, "bool"), right_ge=(full, "bool"))
    m |= step("and", {"l": m["left_le"], "r": m["right_ge"]}, in_window=(full, "bool"))
    m |= step("not", {"x": m["in_window"]}, swa_mask=(full, "bool"))
    held = {k: m[k] for k in ("padded", "inverse", "diag", "swa_left", "swa_right", "swa_mask")}
    return {"mask": step("or", held, full=(full, "bool"))["full"]}


def head_forward(b: Builder, x: TensorDef) -> TensorDef:
    """The last stage after the encoder: final norm, pooler, LM head, output layer with its bias, the
    vocab-parallel cross entropy and the binary head; returns the LM loss."""
    m, h = b.model, b.model.hidden_size
    hidden = norm.forward(b, "final_norm", x, None)
    pooled = _pooler(b, hidden) if m.binary_head else None
    dense = linear(b, "lm_head.dense", hidden, h, None, rule="torch_linear")
    act = b.tensor("lm_head.gelu.out", dense.shape)
    b.op("lm_head.gelu", "torch_gelu", None, {"x": dense}, {"y": act}, flops=8.0 * dense.shape[0] * h)
    ln = norm.forward(b, "lm_head.layer_norm", act, None, kind="layernorm", rule="fused_layernorm")
    # the output layer's GEMM result, to which `output + bias` adds the bias into a new tensor: made before
    # the logits, freed once they are (a reference of the output layer, not dataflow)
    vocab = head.local_vocab(b.params)
    pre = b.tensor("output.output_layer.matmul", (b.dims.t_full, vocab))
    b.op("output.output_layer.matmul", "matmul_out", None, {}, {"y": pre})
    logits = head.logits(b, "output", ln, None, refs={"_pre_bias": pre})
    loss = head.cross_entropy(b, "output", logits, None)
    if pooled is not None:
        sop = linear(b, "binary_head", pooled, 2, None, rule="torch_linear")
        b.op("binary_head.loss", "sop_loss", None, {"x": sop}, {})
    return loss


def _pooler(b: Builder, hidden: TensorDef) -> TensorDef:
    """``Pooler.forward``: ``hidden_states[0, :, :]`` (a view, which keeps the gathered hidden states), the
    dense layer on it and ``torch.tanh``; the view's gradient is the whole hidden states' (select_backward)."""
    h, rows = b.model.hidden_size, b.dims.b
    full = sp_gather(b, "pooler", hidden, None)
    dense = b.tensor("pooler.dense.out", (rows, h))
    f = 2.0 * rows * h * h
    b.op("pooler.dense", "torch_linear", None, {"x": full, "_save": full}, {"y": dense}, flops=f, wflops=f)
    out = b.tensor("pooler.tanh.out", (rows, h))
    b.op("pooler.tanh", "tanh", None, {"x": dense}, {"y": out}, flops=float(rows * h))
    return out
