"""``chunk_signature(run, chunk)``: which virtual stages build the same template up to names.

Most chunks of a deep model hold the same kind of layers (DeepSeek-V3 under PP16: chunks 1–14
are four MoE layers each, between a receive and a send). Their forward ops are then the same
but for the decoder-layer numbers in names, and under a policy that reads only the ops
(``none``, ``selective``: regions come from op tags, not layer numbers) so are their
templates: the same bytes, FLOPs and op order. A search over many policies (``timeline
fit``) then builds one template per class of chunks, not per chunk. The signature is
conservative: every field of every forward op and tensor is in it, only ``layers.N`` in strings
and ``layer`` are renumbered from the chunk's first layer, so chunks that differ in anything
else never share one. This module builds no template.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from dataclasses import replace

from timeline.graph.build import chunk_layers
from timeline.graph.template import _forward_ops_cached
from timeline.graph.tensors import TensorDef
from timeline.spec.run import RecomputeSpec, RunSpec

_LAYER = re.compile(r"layers\.(\d+)")
#: recompute policies whose regions depend on the forward ops alone
OPS_ONLY_POLICIES = ("none", "selective")


def chunk_signature(run: RunSpec, chunk: int) -> Hashable:
    """Equal for two chunks of ``run`` only if their forward ops are equal up to renumbering
    their decoder layers from 0; a captured trace's chunks never share one."""
    if run.model_source.startswith("trace:"):
        return ("chunk", chunk)
    ranges = chunk_layers(run)
    layers = tuple(ranges[chunk])
    base = layers[0] if layers else 0

    def s(text: str) -> str:
        return _LAYER.sub(lambda m: f"layers.{int(m.group(1)) - base}", text)

    def t(td: TensorDef) -> tuple:
        return (s(td.name), td.shape, td.dtype, td.category, s(td.module), s(td.storage), td.split, td.expert,
                td.trainable, td.in_moe)

    ops = _forward_ops_cached(replace(run, recompute=RecomputeSpec()), chunk)
    return (chunk == 0, chunk == len(ranges) - 1, tuple(x - base for x in layers), tuple(
        (s(o.name), s(o.module), None if o.layer is None else o.layer - base, o.rule,
         tuple((k, t(v)) for k, v in o.inputs.items()), tuple((k, t(v)) for k, v in o.outputs.items()),
         tuple((k, t(v)) for k, v in o.extras.items()), o.kind, o.stream, o.flops, o.wflops, o.tags)
        for o in ops))
