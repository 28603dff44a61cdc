"""PNG plots of a comparison, drawn onto a binary handle the caller opens.

``memory_png``: memory over time of one device per variant (the worst), stacked by category,
with reserved memory, capacity, the peak, OOMs and iteration boundaries drawn, every panel on
the same axes. ``peaks_png``: peak reserved memory per pipeline
rank, one bar per variant, capacity drawn. matplotlib is imported inside the functions (the
Agg canvas, no pyplot state), so ``import timeline`` stays fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from timeline.compare.metrics import MemoryTrace, VariantResult
from timeline.graph.tensors import CATEGORIES

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.figure import Figure

GIB = 2**30
COLORS = {"weights": "#4c72b0", "grads": "#55a868", "optimizer": "#8172b2", "activations": "#dd8452",
          "recompute": "#c44e52", "comm": "#937860", "temporary": "#8c8c8c"}


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


#: rows drawn per panel: a few per pixel column of the 1,100-pixel-wide figure
PLOT_POINTS = 4_000


def thin(tr: MemoryTrace, max_points: int = PLOT_POINTS) -> MemoryTrace:
    """At most ``max_points`` rows, one per equal slice of time (what one pixel column shows):
    in each slice the row using the most; reserved is the slice's own maximum (an envelope), so a
    reserved line that dips and recovers on every OOM retry stays a line, not a smear."""
    n = len(tr.t_us)
    if n <= max_points:
        return tr
    t = tr.t_us.astype(np.float64)
    edges = np.linspace(t[0], t[-1], max_points + 1)[1:-1]
    starts = np.unique(np.concatenate([[0], np.searchsorted(t, edges, side="left")]))
    starts = starts[starts < n]
    total = np.asarray(sum(tr.by_category.values()), dtype=np.float64)
    bucket = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
    idx = np.lexsort((-total, bucket))[starts]  # sorted by slice, then most used first: each slice's first
    res = np.maximum.reduceat(tr.reserved, starts)
    return replace(tr, t_us=tr.t_us[idx], allocated=tr.allocated[idx], reserved=res,
                   by_category={c: v[idx] for c, v in tr.by_category.items()})


#: at most this many OOM markers per panel (a run over capacity can record thousands)
MAX_OOM_MARKERS = 50


def memory_png(traces: Sequence[MemoryTrace], handle: BinaryIO, *, title: str = "") -> None:
    """:func:`memory_figure` as PNG onto ``handle``."""
    memory_figure(traces, title=title).savefig(handle, format="png")


def memory_figure(traces: Sequence[MemoryTrace], *, title: str = "") -> Figure:
    """One panel per trace, all on the same time and memory axes (so variants compare by eye):
    categories stacked (GiB vs ms from 0), the reserved line, capacity dashed, the peak reserved
    value marked, OOMs as red ticks, iteration boundaries dotted; one legend naming every
    category drawn in any panel."""
    fig = _figure(11, 2.6 * len(traces) + 0.9)
    axes = fig.subplots(len(traces), 1, squeeze=False, sharex=True, sharey=True)[:, 0]
    drawn: list[str] = []
    t_end = max((float(tr.t_us[-1]) for tr in traces if len(tr.t_us)), default=1.0) / 1e3
    top = max(max(tr.capacity_bytes, int(tr.reserved.max(initial=0))) for tr in traces) / GIB * 1.12
    for ax, tr in zip(axes, traces, strict=True):
        tr = thin(tr)
        t_ms = tr.t_us / 1e3
        cats = [c for c in CATEGORIES if tr.by_category[c].any()]
        drawn += [c for c in cats if c not in drawn]
        # steps, not slopes: memory holds its value until the next event
        ax.stackplot(np.repeat(t_ms, 2)[1:], *[np.repeat(tr.by_category[c] / GIB, 2)[:-1] for c in cats],
                     colors=[COLORS[c] for c in cats], alpha=0.9)
        ax.step(t_ms, tr.reserved / GIB, where="post", color="black", lw=1.0)
        ax.axhline(tr.capacity_bytes / GIB, color="red", ls="--", lw=1.2)
        for t in tr.iteration_starts_us[1:]:
            ax.axvline(t / 1e3, color="#555555", ls=":", lw=1.0)
        ooms_at = tr.oom_t_us[::max(1, -(-len(tr.oom_t_us) // MAX_OOM_MARKERS))]  # spread over the run
        for t in ooms_at:
            ax.axvline(t / 1e3, ymin=0.0, ymax=0.04, color="red", lw=1.5)
        if len(tr.reserved):
            i = int(np.argmax(tr.reserved))
            peak = tr.reserved[i] / GIB
            ax.plot([t_ms[i]], [peak], marker="v", color="black", ms=6)
            ax.annotate(f"peak reserved {peak:,.2f} GiB at {t_ms[i]:,.0f} ms", (t_ms[i], peak),
                        xytext=(4, 4), textcoords="offset points", fontsize=8)
        ooms = f", {len(tr.oom_t_us):,} OOM" + ("s" if len(tr.oom_t_us) != 1 else "") if tr.oom_t_us else ""
        ax.set_title(f"{tr.label}: device {tr.device} (pp rank {tr.pp_rank}){ooms}", fontsize=10, loc="left")
        ax.set_ylabel("GiB")
        ax.set_ylim(0, top)
    axes[0].set_xlim(0, t_end)
    axes[-1].set_xlabel("time (ms)")
    fig.legend(handles=legend_handles(drawn, any(tr.iteration_starts_us[1:] for tr in traces),
                                      any(tr.oom_t_us for tr in traces)),
               loc="outside right upper", fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    return fig


def legend_handles(categories: Sequence[str], iterations: bool, ooms: bool) -> list[Artist]:
    """Legend entries: every category drawn, then the lines and markers."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    out: list[Artist] = [Patch(facecolor=COLORS[c], alpha=0.9, label=c) for c in categories]
    out += [Line2D([], [], color="black", lw=1.0, label="reserved"),
            Line2D([], [], color="red", ls="--", lw=1.2, label="capacity"),
            Line2D([], [], color="black", marker="v", ls="", label="peak reserved")]
    if iterations:
        out.append(Line2D([], [], color="#555555", ls=":", lw=1.0, label="iteration start"))
    if ooms:
        out.append(Line2D([], [], color="red", lw=1.5, label="OOM"))
    return out


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
