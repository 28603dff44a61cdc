"""The comparison plots: each PNG opens, has a sensible size and is not blank."""

from __future__ import annotations

import io

import matplotlib.image as mpimg
import numpy as np
from recompute_template import recompute_template, tiny_run

from timeline.cli.variants import policy_variants
from timeline.compare.metrics import simulate_variants
from timeline.compare.plots import memory_png, peaks_png, thin
from timeline.graph.tensors import CATEGORIES


def read_png(draw) -> np.ndarray:
    buf = io.BytesIO()
    draw(buf)
    assert buf.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"
    buf.seek(0)
    return mpimg.imread(buf, format="png")


def test_memory_and_peaks_pngs():
    results = simulate_variants(policy_variants(tiny_run(), ["none,selective:core_attn,full:uniform:1"]),
                                recompute_template, workers=1)
    mem = read_png(lambda h: memory_png([r.worst for r in results], h, title="t"))
    peaks = read_png(lambda h: peaks_png(results, h))
    assert mem.shape[0] >= 3 * 200 and mem.shape[1] >= 1000  # one panel per variant
    assert peaks.shape[0] >= 300 and peaks.shape[1] >= 500
    for img in (mem, peaks):
        rgb = img[..., :3]
        assert rgb.std() > 0.05 and (rgb < 0.9).mean() > 0.02  # ink, not a blank page


def test_thin_keeps_the_peak():
    (res,) = simulate_variants(policy_variants(tiny_run(m=8), ["none"]), recompute_template, workers=1)
    tr = res.worst
    small = thin(tr, max_points=10)
    total = sum(tr.by_category.values())
    assert len(small.t_us) <= 11 and sum(small.by_category.values()).max() == total.max()


def test_memory_figure_shares_axes_and_names_everything_drawn():
    from dataclasses import replace

    from timeline.compare.plots import memory_figure

    run = tiny_run()
    run = replace(run, training=replace(run.training, iterations=2))
    results = simulate_variants(policy_variants(run, ["none,full:uniform:1"]), recompute_template, workers=1)
    traces = [r.worst for r in results]
    assert traces[1].by_category["recompute"].any() and not traces[0].by_category["recompute"].any()
    assert len(traces[0].iteration_starts_us) == 2 and traces[0].iteration_starts_us[1] > 0
    fig = memory_figure(traces)
    axes = fig.axes
    assert len({ax.get_ylim() for ax in axes}) == 1 and len({ax.get_xlim() for ax in axes}) == 1
    assert axes[0].get_xlim()[0] == 0  # time from the run's start
    top = max(max(int(t.reserved.max()), t.capacity_bytes) for t in traces) / 2**30
    assert axes[0].get_ylim()[1] >= top
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    drawn = [c for c in CATEGORIES if any(t.by_category[c].any() for t in traces)]
    assert labels[:len(drawn)] == drawn and "recompute" in labels  # drawn in the second panel only
    assert {"reserved", "capacity", "peak reserved", "iteration start"} <= set(labels)
    for ax, tr in zip(axes, traces, strict=True):
        texts = [t.get_text() for t in ax.texts]
        peak = tr.reserved.max() / 2**30
        assert any(f"peak reserved {peak:,.2f} GiB" in t for t in texts)
        # iteration boundaries: one dotted line per iteration after the first
        dotted = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]
        assert [ln.get_xdata()[0] for ln in dotted] == [t / 1e3 for t in tr.iteration_starts_us[1:]]


def test_oom_markers_and_title():
    from dataclasses import replace

    from timeline.compare.plots import memory_figure

    (res,) = simulate_variants(policy_variants(tiny_run(), ["none"]), recompute_template, workers=1)
    tr = replace(res.worst, oom_t_us=(10.0, 20.0))
    fig = memory_figure([tr])
    assert "2 OOMs" in fig.axes[0].get_title(loc="left")
    assert "OOM" in [t.get_text() for t in fig.legends[0].get_texts()]
    red = [ln for ln in fig.axes[0].get_lines() if ln.get_color() == "red" and ln.get_linestyle() == "-"]
    assert sorted(ln.get_xdata()[0] for ln in red) == [0.01, 0.02]
