"""Token (and learned position) embeddings; vocabulary-parallel over TP (Megatron
``VocabParallelEmbedding``); position embeddings are replicated."""

from __future__ import annotations

from timeline.graph.context import BuildCtx
from timeline.graph.tensors import TensorDef, param


def embedding_params(ctx: BuildCtx, prefix: str = "embedding", module: str = "embedding") -> list[TensorDef]:
    m = ctx.model
    out = [param(f"{prefix}.word_embeddings.weight", (ctx.padded_vocab, m.hidden_size), module=module,
                 dtype=ctx.dtype, split=ctx.tp, dim=0)]
    if m.position_embedding == "learned":
        out.append(param(f"{prefix}.position_embeddings.weight", (m.max_position_embeddings, m.hidden_size),
                         module=module, dtype=ctx.dtype))
    return out
