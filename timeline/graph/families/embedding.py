"""Token (and learned position, and BERT's token-type) embeddings; vocabulary-parallel over TP (Megatron
``VocabParallelEmbedding``); position and token-type embeddings are replicated.

Forward ops (:func:`forward`): a vocabulary-parallel lookup whose partial rows are reduce-scattered (SP) or
all-reduced (TP), then the embedding dropout where the profile has dropout. Token ids are not
modelled as tensors here (int64, ``b·s`` — a few KB; Megatron's batch is :mod:`batch`'s). Under a table
with ``embedding_wgrad`` the lookup's backward returns dense weight gradients of the weights' shapes
(extras ``wgrad`` / ``pos_wgrad``, never made in forward), which the weight-gradient step adds into the
grads buffer and frees. BERT's token-type lookup is added to the sum after it (its [2, h] weight gradient,
a few KiB, is not modelled); under sequence parallelism Megatron's BertModel all-reduces the word embedding
and scatters the sum (``LanguageModelEmbedding`` without ``reduce_scatter_embeddings``), which this op
sequence does not distinguish.
"""

from __future__ import annotations

from timeline.graph.context import BuildCtx
from timeline.graph.families.common import add, dropout
from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef, param


def params(ctx: BuildCtx, prefix: str = "embedding", module: str = "embedding") -> list[TensorDef]:
    m = ctx.model
    out = [param(f"{prefix}.word_embeddings.weight", (ctx.padded_vocab, m.hidden_size), module=module,
                 dtype=ctx.dtype, split=ctx.tp, dim=0)]
    if m.position_embedding == "learned":
        out.append(param(f"{prefix}.position_embeddings.weight",
                         (m.max_position_embeddings + m.position_offset_rows, m.hidden_size), module=module,
                         dtype=ctx.dtype))
    if m.type_vocab_size:  # BERT's segment embedding (LanguageModelEmbedding.tokentype_embeddings)
        out.append(param(f"{prefix}.tokentype_embeddings.weight", (m.type_vocab_size, m.hidden_size),
                         module=module, dtype=ctx.dtype))
    return out


def forward(b: Builder, prefix: str, layer: int | None, *, name: str | None = None) -> TensorDef:
    """The embedding of ``prefix``'s parameters on this micro-batch's tokens; ``name`` names its ops and tensors
    (T5 embeds its encoder and its decoder tokens with one embedding)."""
    d, h = b.dims, b.model.hidden_size
    params, prefix = prefix, name or prefix
    extras = {}
    if b.table.position_ids and b.model.position_embedding == "learned":  # wpe(position_ids): (1, s) int64
        rows = d.b if b.model.position_offset_rows else 1  # OPT: cumsum of a (b, s) mask, + offset
        extras["position_ids"] = b.tensor(f"{prefix}.position_ids", (rows, d.s_local), "int64")
    if b.table.embedding_wgrad:  # the dense weight gradients its backward returns (made in backward only)
        for key, name in (("wgrad", "word_embeddings"), ("pos_wgrad", "position_embeddings")):
            w = b.params.get(f"{params}.{name}.weight")
            if w is not None:
                extras[key] = b.tensor(f"{prefix}.{name}.wgrad", w.shape, w.dtype)
    if d.tp > 1 and d.sp:
        partial = b.tensor(f"{prefix}.partial", (d.t_full, h), comm=True)
        b.op(prefix, "embedding", layer, {}, {"y": partial}, extras=extras, wflops=2.0 * d.t_full * h)
        out = b.tensor(f"{prefix}.out", (d.t_sp, h))
        b.op(f"{prefix}.reduce_scatter", "comm", layer, {"x": partial}, {"y": out}, kind="collective", stream="tp")
    else:
        out = b.tensor(f"{prefix}.out", (d.t_full, h))
        b.op(prefix, "embedding", layer, {}, {"y": out}, extras=extras, wflops=2.0 * d.t_full * h)
        if d.tp > 1:
            b.op(f"{prefix}.all_reduce", "comm", layer, {"x": out}, {}, kind="collective", stream="tp")
    if b.model.type_vocab_size:  # LanguageModelEmbedding.forward: `embeddings + tokentype_embedding` (a new tensor)
        tok = b.tensor(f"{prefix}.tokentype.out", out.shape)
        b.op(f"{prefix}.tokentype", "embedding", layer, {}, {"y": tok})
        out = add(b, f"{prefix}.tokentype_add", out, tok, layer)
    if b.model.mup_embedding_mult != 1.0:  # LanguageModelEmbedding.forward under use_mup: embeddings * mult
        y = b.tensor(f"{prefix}.mup_scaled", out.shape)
        b.op(f"{prefix}.mup_scale", "scale", layer, {"x": out}, {"y": y}, flops=float(out.shape[0] * out.shape[1]))
        out = y
    if b.table.model_code and b.model.residual_dropout and not b.model.embedding_dropout:
        return out  # OPTDecoder adds the position embeddings and goes on: no dropout here
    return dropout(b, f"{prefix}.dropout", out, layer)

