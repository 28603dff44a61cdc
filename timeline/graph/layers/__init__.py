"""The layer library: one layer family per file, each returning its parameter TensorDefs.

Every builder takes a :class:`~timeline.graph.context.BuildCtx` and a name prefix and returns
the tensors *one device* holds after tensor/expert parallelism.
"""
