"""The layer families, one file each: what one device holds of a layer and the ops it runs.

One vocabulary across the families (``attention``, ``mla``, ``mlp``, ``moe``, ``embedding``,
``head``, ``norm``, ``mtp``; ``decoder`` joins them into a decoder layer):

- ``params(ctx, prefix, …) -> list[TensorDef]`` — the family's *parameter shard*: the tensors one
  device holds after tensor/expert parallelism, from a :class:`~timeline.graph.context.BuildCtx`;
- ``local_*(params, prefix)`` — local widths (heads, FFN columns, experts, vocabulary rows) read back
  off a chunk's parameter shard, never re-derived from the sharding degrees;
- ``forward(b, prefix, x, layer) -> TensorDef`` — the family's *forward ops*, written into an
  :class:`~timeline.graph.ir.Builder` on per-device shapes ``(rows, columns)`` (rows = local tokens);
  each reads its widths off ``Builder.params`` through ``local_*``.

``common`` holds the op helpers the families share (linears, TP/SP collectives, dropout, residual
adds), ``sinks`` GPT-OSS's eager attention with learned sinks, ``router`` the MoE router of each
framework. ``forward`` consults the profile's :class:`~timeline.profiles.base.Structure` for structure
(eager or flash attention, dropout, fused norms); what each op saves is the table's business.
"""
