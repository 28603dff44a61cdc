"""Output head (vocabulary-parallel over TP) and the final norm before it.

With tied embeddings the head reuses the embedding when both live on one device; on a
separate last stage Megatron keeps a synchronised copy (``word_embeddings`` on the last
stage), counted under ``head``. :func:`head_vocab` reads the local vocabulary rows back off the
built parameters, for the op builders.
"""

from __future__ import annotations

from collections.abc import Mapping

from timeline.graph.context import BuildCtx
from timeline.graph.layers.norm import norm_params
from timeline.graph.tensors import TensorDef, param


def final_norm_params(ctx: BuildCtx) -> list[TensorDef]:
    if not ctx.profile.final_norm:
        return []
    return norm_params(ctx, "final_norm", ctx.model.hidden_size)


def head_params(ctx: BuildCtx, *, shares_embedding: bool) -> list[TensorDef]:
    if ctx.model.tie_word_embeddings and shares_embedding:
        return []
    return [param("output_layer.weight", (ctx.padded_vocab, ctx.model.hidden_size), module="head",
                  dtype=ctx.dtype, split=ctx.tp)]


def head_vocab(params: Mapping[str, TensorDef]) -> int:
    """Vocabulary rows of the output layer one device holds (the embedding's, when the head reuses it)."""
    w = params.get("output_layer.weight") or params.get("embedding.word_embeddings.weight")
    if w is None:
        raise KeyError("no output layer or word embedding in this chunk")
    return w.shape[0]
