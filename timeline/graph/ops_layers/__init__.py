"""Forward op builders, one layer family per file, writing into an :class:`~timeline.graph.ir.Builder`.

Each builder takes the builder, a name prefix, the layer index and its input tensor(s) and
returns its output tensor. Shapes are per device: ``(rows, columns)`` with rows = local tokens.
Builders consult the profile's :class:`~timeline.graph.saved.SavedTable` for structure (eager or
flash attention, dropout, fused norms); what each op saves is the table's business.
"""
