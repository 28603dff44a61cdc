"""PNG plots of a comparison, drawn onto a binary handle the caller opens.

``memory_png``: memory over time of one device per variant (the worst), stacked by category,
with reserved memory and the capacity drawn. ``peaks_png``: peak reserved memory per pipeline
rank, one bar per variant, capacity drawn. matplotlib is imported inside the functions (the
Agg canvas, no pyplot state), so ``import timeline`` stays fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import BinaryIO

import numpy as np

from timeline.compare.metrics import MemoryTrace, VariantResult
from timeline.graph.tensors import CATEGORIES

GIB = 2**30
COLORS = {"weights": "#4c72b0", "grads": "#55a868", "optimizer": "#8172b2", "activations": "#dd8452",
          "recompute": "#c44e52", "comm": "#937860", "temporary": "#8c8c8c"}


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def thin(tr: MemoryTrace, max_points: int = 20_000) -> MemoryTrace:
    """At most about ``max_points`` rows: in each run of consecutive rows, the one using the most."""
    n = len(tr.t_us)
    if n <= max_points:
        return tr
    k = -(-n // max_points)
    total = sum(tr.by_category.values()).astype(np.float64)
    padded = np.concatenate([total, np.full(-n % k, -np.inf)]).reshape(-1, k)
    idx = np.minimum(np.argmax(padded, axis=1) + np.arange(len(padded)) * k, n - 1)
    return replace(tr, t_us=tr.t_us[idx], allocated=tr.allocated[idx], reserved=tr.reserved[idx],
                   by_category={c: v[idx] for c, v in tr.by_category.items()})


def memory_png(traces: Sequence[MemoryTrace], handle: BinaryIO, *, title: str = "") -> None:
    """One panel per trace: categories stacked over time (GiB vs ms), reserved and capacity lines."""
    fig = _figure(11, 2.6 * len(traces) + 0.6)
    axes = fig.subplots(len(traces), 1, squeeze=False)[:, 0]
    for ax, tr in zip(axes, traces, strict=True):
        tr = thin(tr)
        t_ms = tr.t_us / 1e3
        cats = [c for c in CATEGORIES if tr.by_category[c].any()]
        # steps, not slopes: memory holds its value until the next event
        ax.stackplot(np.repeat(t_ms, 2)[1:], *[np.repeat(tr.by_category[c] / GIB, 2)[:-1] for c in cats],
                     labels=cats, colors=[COLORS[c] for c in cats], alpha=0.9)
        ax.step(t_ms, tr.reserved / GIB, where="post", color="black", lw=1.0, label="reserved")
        ax.axhline(tr.capacity_bytes / GIB, color="red", ls="--", lw=1.2, label="capacity")
        ax.set_title(f"{tr.label}: device {tr.device} (pp rank {tr.pp_rank})", fontsize=10, loc="left")
        ax.set_ylabel("GiB")
        ax.set_ylim(0, max(tr.capacity_bytes, int(tr.reserved.max(initial=0))) / GIB * 1.08)
        ax.margins(x=0)
    axes[-1].set_xlabel("time (ms)")
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    fig.savefig(handle, format="png")


def peaks_png(results: Sequence[VariantResult], handle: BinaryIO, *, title: str = "") -> None:
    """Grouped bars: peak reserved per pipeline rank, one bar per variant."""
    ranks = sorted({d.pp_rank for r in results for d in r.devices})
    fig = _figure(min(14.0, max(6.0, 0.35 * len(ranks) * len(results) + 2.5)), 4.2)
    ax = fig.subplots()
    width = 0.8 / max(len(results), 1)
    x = np.arange(len(ranks), dtype=float)
    cap = max((d.capacity_bytes for r in results for d in r.devices), default=0)
    for i, res in enumerate(results):
        by_rank = {d.pp_rank: d for d in res.devices}
        reserved = [by_rank[k].peak_reserved_bytes / GIB if k in by_rank else 0.0 for k in ranks]
        ax.bar(x + (i - (len(results) - 1) / 2) * width, reserved, width, label=res.name,
               color=f"C{i % 10}", edgecolor="black", lw=0.4)
    ax.axhline(cap / GIB, color="red", ls="--", lw=1.2, label="capacity")
    ax.set_xticks(x, [str(k) for k in ranks])
    ax.set_xlabel("pipeline rank")
    ax.set_ylabel("peak reserved (GiB)")
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title or "peak reserved memory per pipeline rank", fontsize=10, loc="left")
    fig.savefig(handle, format="png")
