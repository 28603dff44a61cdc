"""The comparison plots: each PNG opens, has a sensible size and is not blank."""

from __future__ import annotations

import io

import matplotlib.image as mpimg
import numpy as np
from recompute_template import recompute_template, tiny_run

from timeline.compare.metrics import simulate_variants
from timeline.compare.plots import memory_png, peaks_png, thin
from timeline.compare.variants import policy_variants


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
