"""Which virtual stages build the same template up to names (``ModelSource.signature``).

Most chunks of a deep model hold the same kind of layers (DeepSeek-V3 under PP16: chunks 1–14
are four MoE layers each, between a receive and a send). Their forward ops are then the same
but for the decoder-layer numbers in names, and under a policy that reads only the ops
(``none``, ``selective``: regions come from op tags, not layer numbers) so are their
templates: the same bytes, FLOPs and op order. A search over many policies (``timeline
fit``) then builds one template per class of chunks, not per chunk. The analytic signature
(:func:`timeline.graph.analytic.ops_signature`) is conservative: every field of every forward
op and tensor is in it, only ``layers.N`` in strings and ``layer`` are renumbered from the
chunk's first layer, so chunks that differ in anything else never share one; a captured
trace's chunks never share one.
"""

from __future__ import annotations

#: recompute policies whose regions depend on the forward ops alone
OPS_ONLY_POLICIES = ("none", "selective")
