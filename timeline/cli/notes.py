"""One-line notes under a result table when the run's own assumptions, not the job, explain what
the table shows — today: the ``paper`` profile's eager attention behind an OOM.

Why: the README's first command shows a 390 GiB OOM under the shipped file's ``paper``
profile, whose Korthikanti-style attention keeps the s² scores, softmax and dropout mask of
every layer; fused attention (``megatron``) keeps none of them. Without a note nothing on
screen says so. This module reads a Timeline; it prints nothing itself.
"""

from __future__ import annotations

import re

import numpy as np

from timeline.cli.common import gib
from timeline.result.queries import worst_device
from timeline.result.timeline import Timeline

#: the s²-sized tensors eager attention saves (see timeline/graph/families/attention.py)
S2_TENSOR = re.compile(r"\.core_attn\.(scores|softmax|softmax_cast|dropout\.out|dropout\.mask)$")


def eager_attention_bytes(tl: Timeline, d: int) -> int:
    """Bytes of s²-sized attention tensors live on device ``d`` at its requested peak."""
    pk = tl.peak(d)
    if pk.event_index < 0:
        return 0
    ev = tl.events(d)
    live = tl.live_at(d, pk.event_index)
    names = tl.names
    s2 = np.array([bool(S2_TENSOR.search(names[t])) for t in range(len(names))] or [False])
    return int(ev.size[live][s2[ev.tensor[live]]].sum())


def notes(tl: Timeline) -> list[str]:
    """Lines to print under the table (empty when nothing needs saying)."""
    cap = tl.meta.capacity_bytes
    if tl.meta.profile != "paper" or cap is None:
        return []
    over = [d for d in range(tl.num_devices) if tl.memory[d].oom or tl.peak(d).reserved_bytes > cap]
    if not over:
        return []
    d = worst_device(tl, over)
    s2 = eager_attention_bytes(tl, d)
    pk = tl.peak(d)
    if s2 * 10 < pk.requested_bytes:  # under a tenth of the peak: not what explains it
        return []
    dev = tl.devices[d]
    return [f"note: profile paper counts eager attention (s² scores, softmax, dropout mask): {gib(s2)} GiB of device "
            f"{dev.device}'s {gib(pk.requested_bytes)} GiB peak; fused attention keeps none of them "
            "(--set model.profile=megatron)"]
