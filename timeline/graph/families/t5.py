"""Megatron-Core's T5 (``[model] architecture = "t5"``): the encoder's bidirectional layers under the padding
mask, the decoder's layers with cross-attention over the encoder's output, the shared embedding's output layer
with a bias, and the batch ``pretrain_t5.py`` puts on the device.

Read at ``NVIDIA/Megatron-LM@92f052b8`` (the memory-relevant code the same from 46fdcd5b7e, 2025-01, to
58baa0e6de, 2026-03, the collected T5 records' span; later commits refactor the submodule specs only):

- ``megatron/core/models/T5/t5_model.py: T5Model.forward``: ``self.embedding`` of the encoder tokens (word and
  learned position embeddings, dropout), the encoder ``TransformerBlock`` (its final layernorm:
  ``post_process``), the same embedding of the decoder tokens, the decoder ``TransformerBlock`` with
  ``context`` = the encoder's output and ``context_mask``, its final layernorm, then ``T5LMHead``
  (``ColumnParallelLinear(bias=True)`` on the shared word embedding: ``torch.matmul`` then ``output + bias``) and
  ``compute_language_model_loss``;
- ``t5_spec.py``: the encoder layer is GPT's layer with the padding mask type; the decoder layer adds
  ``pre_cross_attn_layernorm`` (``TENorm`` / ``FusedLayerNorm``) and ``CrossAttention`` (``linear_q`` and
  ``linear_kv`` column-parallel, the core attention under the padding mask, ``linear_proj``) with its
  bias-dropout-add between the self-attention and the MLP; the decoder's self-attention is causal;
- ``transformer/attention.py: CrossAttention.get_query_key_value_tensors``: ``linear_kv`` on the encoder's
  output, its ``[sk, b, np, 2·hn]`` view split into key and value (views, so the attention keeps the whole
  output), ``linear_q`` on the normed decoder rows;
- ``pretrain_t5.py: get_batch``: ``tensor_parallel.broadcast_data`` of six int64 keys (``text_enc`` and
  ``enc_mask`` ``[b, s_enc]``, ``text_dec``, ``labels``, ``loss_mask``, ``dec_mask`` ``[b, s_dec]``) as one flat
  buffer, ``loss_mask.float()``, ``enc_mask < 0.5`` and ``dec_mask < 0.5``, then
  ``t5_dataset.py: T5MaskedWordPieceDataset.config_attention_mask``: under TE from 1.10 the two bool masks'
  ``[b, 1, 1, s]`` views (the decoder's self-attention is causal); under the local implementation, and under TE
  before 1.10 without the flash and fused backends, ``_build_b1ss_attention_mask`` stacks per-sample bool
  ``[s_q, s_kv]`` masks into ``[b, 1, s_q, s_kv]`` (the decoder's with the history mask: local only). They live
  through the forward step.

Under TE's unfused attention the encoder's self-attention and every cross-attention widen their padding
masks per layer (:func:`timeline.graph.families.bert.padding_mask`, ``[b, 1, s_q, s_kv]``). This module decides
no bytes: each op names the profile rule that says what it keeps.
"""

from __future__ import annotations

from dataclasses import replace

from timeline.graph.context import BuildCtx
from timeline.graph.families import attention, decoder, embedding, head, norm
from timeline.graph.families.common import add, column_linear, dropout, row_linear
from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef, param

#: the keys ``pretrain_t5.py: get_batch`` broadcasts, with the sequence each spans
BATCH_KEYS = (("text_enc", "enc"), ("text_dec", "dec"), ("labels", "dec"), ("loss_mask", "dec"),
              ("enc_mask", "enc"), ("dec_mask", "dec"))


def head_params(ctx: BuildCtx, *, shares_embedding: bool) -> list[TensorDef]:
    """``T5LMHead``'s output layer: the word embedding's weight where the stage holds it (else its own) and a
    bias split with the vocabulary."""
    return [*head.params(ctx, shares_embedding=shares_embedding),
            param("output_layer.bias", (ctx.padded_vocab,), module="head", dtype=ctx.dtype, split=ctx.tp)]


def _mask(b: Builder, name: str, rows: int, cols: int, source: dict[str, TensorDef]) -> TensorDef:
    """``_build_b1ss_attention_mask``: per sample the bool ``[rows, cols]`` product of two comparisons (for the
    decoder's, times the history mask: one more temporary of that shape, freed at once), negated and kept in a
    list, then ``torch.stack`` into ``[b, rows, cols]``, viewed ``[b, 1, rows, cols]``."""
    d = b.dims
    per = {f"sample{i}": b.tensor(f"{name}.sample{i}", (rows, cols), "bool") for i in range(d.b)}
    b.op(f"{name}.samples", "t5_mask", None, {f"_{k}": t for k, t in source.items()}, per)
    out = b.tensor(f"{name}", (d.b, 1, rows, cols), "bool")
    b.op(f"{name}.stack", "t5_mask", None, {f"_{k}": t for k, t in per.items()}, {"y": out})
    return out


def load_batch(b: Builder, s_enc: int, s_dec: int) -> dict[str, TensorDef]:
    """``pretrain_t5.py: get_batch`` and ``config_attention_mask`` (see the module's docstring); every tensor
    returned lives to the end of the forward step."""
    d = b.dims
    local = not b.table.te_qkv_layout
    flat = b.tensor("batch.t5_flat", (d.b * sum(s_enc if seq == "enc" else s_dec for _, seq in BATCH_KEYS),), "int64")
    out = {"flat": flat, "loss_mask": b.tensor("batch.loss_mask_fp32", (d.b, s_dec), "fp32")}
    if not local:  # `enc_mask < 0.5`, `dec_mask < 0.5`: the masks TE reads (as views, or to build b1ss from)
        out["enc_mask"] = b.tensor("batch.enc_mask", (d.b, s_enc), "bool")
        out["dec_mask"] = b.tensor("batch.dec_mask", (d.b, s_dec), "bool")
    b.op("batch.get_batch", "batch", None, {}, dict(out))
    if b.table.bert_mask == "b1ss":
        src = {"flat": flat}
        out["enc_b1ss"] = _mask(b, "batch.enc_b1ss", s_enc, s_enc, src)
        out["enc_dec_b1ss"] = _mask(b, "batch.enc_dec_b1ss", s_dec, s_enc, src)
        if local:
            out["dec_b1ss"] = _mask(b, "batch.dec_b1ss", s_dec, s_dec, src)
    return out


def cross_attention(b: Builder, prefix: str, x: TensorDef, context: TensorDef, layer: int, s_enc: int) -> TensorDef:
    """``pre_cross_attn_layernorm`` and ``CrossAttention.forward`` on the decoder rows ``x`` over the encoder's
    output ``context``; returns the output projection's result (before its bias-dropout-add)."""
    m = b.model
    p = f"{prefix}.cross_attn"
    hd = m.attn_head_dim
    nq, nkv = attention.local_heads(b.params, p, hd)
    ln = norm.forward(b, f"{prefix}.pre_cross_attn_layernorm", x, layer, tags=frozenset({"layernorm"}))
    q = column_linear(b, f"{p}.linear_q", ln, nq * hd, layer)
    kv = column_linear(b, f"{p}.linear_kv", context, 2 * nkv * hd, layer)
    ctx = attention.core_attention(b, p, q, kv, kv, layer, nq, hd, hd, kv_len=s_enc, padding=True)
    return row_linear(b, f"{p}.linear_proj", ctx, m.hidden_size, layer)


def decoder_layer(b: Builder, layer: int, prefix: str, x: TensorDef, context: TensorDef, s_enc: int) -> TensorDef:
    """A T5 decoder layer: causal self-attention, cross-attention, MLP, each with its bias-dropout-add."""
    start = len(b.ops)
    a = dropout(b, f"{prefix}.self_attn.dropout", attention.forward(b, prefix, x, layer), layer)
    h = add(b, f"{prefix}.attn_residual", a, x, layer)
    c = dropout(b, f"{prefix}.cross_attn.dropout", cross_attention(b, prefix, h, context, layer, s_enc), layer)
    h = add(b, f"{prefix}.cross_attn_residual", c, h, layer)
    for op in b.ops[start:]:
        op.tags = op.tags | {"sub:attn"}
    return decoder.ffn(b, layer, prefix, h, moe=False)


def forward(b: Builder, layers: range) -> dict[str, TensorDef]:
    """The whole model on one stage for one micro-batch: batch, encoder, decoder, head and loss; returns the
    batch tensors (released by the caller at the end of the forward step)."""
    m, enc = b.model, b.dims
    s_enc, s_dec = enc.s, b.training.decoder_seq_len
    dec = replace(enc, s=s_dec)
    loaded = load_batch(b, s_enc, s_dec) if b.table.dataloader_batch != "none" else {}
    x = embedding.forward(b, "embedding", None)
    for i in layers:
        if i < m.encoder_layers:
            x = decoder.forward(b, i, f"layers.{i}", x, moe=False)
    context = norm.forward(b, "encoder.final_norm", x, None)
    b.dims = dec
    try:
        y = embedding.forward(b, "embedding", None, name="embedding.decoder")
        for i in layers:
            if i >= m.encoder_layers:
                y = decoder_layer(b, i, f"layers.{i}", y, context, s_enc)
        head_forward(b, y)
    finally:
        b.dims = enc
    return loaded


def head_forward(b: Builder, x: TensorDef) -> TensorDef:
    """The decoder's final norm, ``T5LMHead`` (the matmul, then ``output + bias`` into a new tensor) and the
    vocab-parallel cross entropy; returns the loss."""
    hidden = norm.forward(b, "final_norm", x, None, final=True)
    vocab = head.local_vocab(b.params)
    pre = b.tensor("output.output_layer.matmul", (b.dims.t_full, vocab))
    b.op("output.output_layer.matmul", "matmul_out", None, {}, {"y": pre})
    logits = head.logits(b, "output", hidden, None, refs={"_pre_bias": pre})
    return head.cross_entropy(b, "output", logits, None)
