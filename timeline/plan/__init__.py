"""``timeline plan``: search parallel layouts, micro-batch sizes, schedules and recompute policies
for N GPUs and a global batch; bound every candidate statically, time and then simulate only those
the bound cannot rule out, rank the fitting ones by iteration time (DESIGN §13).

- :mod:`timeline.plan.space`: the candidate space and each candidate's run;
- :mod:`timeline.plan.bound`: the static bound (memory and time, from probes);
- :mod:`timeline.plan.engines`: where simulations run (a local process pool, or Ray);
- :mod:`timeline.plan.search`: bound, simulate cheapest first, rank.
"""
