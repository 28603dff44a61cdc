"""The trace front-end: a captured op trace (:class:`~timeline.spec.trace.CapturedTrace`) as a model source.

- :mod:`~timeline.graph.trace.source`: :class:`~timeline.graph.trace.source.TraceSource`, the
  trace's side of :class:`~timeline.graph.source.ModelSource`;
- :mod:`~timeline.graph.trace.params`: the captured parameters placed per virtual stage;
- :mod:`~timeline.graph.trace.lowering`: the captured ops lowered into chunk templates;
- :mod:`~timeline.graph.trace.recompute`: full recompute rewritten into the lowered rows;
- :mod:`~timeline.graph.trace.split`: the captured backward split into input- and weight-gradient work;
- :mod:`~timeline.graph.trace.steps`: a whole-step trace lowered per simulated iteration;
- :mod:`~timeline.graph.trace.shard`: each captured storage's size on one TP/EP rank (the parameters'
  rules are :mod:`timeline.spec.trace_shard`);
- :mod:`~timeline.graph.trace.collectives`: the SP all-gathers and reduce-scatters around TP GEMMs.

Nothing here imports torch or reads files; the trace rides on ``run.trace``.
"""
