"""Forward op builders, one layer family per file, writing into an :class:`~timeline.graph.ir.Builder`.

Each builder takes the builder, a name prefix, the layer index and its input tensor(s) and
returns its output tensor. Shapes are per device: ``(rows, columns)`` with rows = local tokens.
Local widths (heads, FFN columns, experts per rank, vocabulary rows) are never re-derived from
the sharding degrees: they are read off the chunk's parameter TensorDefs (``Builder.params``,
built by :mod:`timeline.graph.layers`) through that library's readers (``mlp_ffn``,
``attention_heads``, ``mla_heads``, ``moe_local``, ``head_vocab``).
Builders consult the profile's :class:`~timeline.profiles.base.Structure` for structure (eager or
flash attention, dropout, fused norms); what each op saves is the table's business.
"""
