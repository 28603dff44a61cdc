"""Text rows from columns: the compiled formatter against the Python one, byte for byte.

Random int, nanosecond (negative ones included: ``-0.001``), table and float columns (floats
whose ``repr`` switches to exponent form, infinities, -0.0, values repeated many times and
distinct ones past the formatter's first table size); the Chrome trace of every exporter test
run through both; the nesting of slices (partial overlaps clipped) through both. Without the
extension built, the module skips.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from tiny import synthetic_template, tiny_run

from timeline.exporters import chrome_trace, compiled, trace_common
from timeline.exporters.text_rows import SLOT, Slot, render
from timeline.result.build import build_timeline

pytestmark = pytest.mark.skipif(not compiled.compiled_available(), reason="the compiled writers are not built "
                                "(no C compiler at install time): only the Python writers run")


def _both(template: str, slots: list[Slot], sep: str = ",\n") -> tuple[bytes, bytes]:
    out: list[bytes] = [b"", b""]
    for k, writer in enumerate((compiled.extension(), False)):
        chunks: list[bytes] = []
        render(chunks.append, template, slots, sep, writer=writer)
        out[k] = b"".join(chunks)
    return out[0], out[1]


@pytest.mark.parametrize("seed", range(4))
def test_random_columns(seed):
    rng = np.random.default_rng(seed)
    n = 3000 if seed else 0
    table = ["", "é", '"quoted"', "100%", "%d", "x" * 300]
    floats = np.concatenate([rng.integers(0, 2**40, n // 2) / 2**30, rng.choice(
        [0.0, -0.0, 1e-5, 1e16, 1.5e300, np.inf, -np.inf, 0.1, 80.0], n - n // 2)])
    slots = [Slot("d", rng.integers(-(2**63), 2**63 - 1, n)), Slot("u", rng.integers(-5000, 5000, n)),
             Slot("u", rng.integers(0, 2**62, n)), Slot("s", rng.integers(0, len(table), n), table),
             Slot("r", rng.permutation(floats)), Slot("r", rng.integers(0, 20_000, n) * 4096 / 2**30)]
    template = f'{{"a":{SLOT},"ts":{SLOT},"big":{SLOT},"s":"{SLOT}%s","f":{SLOT},"g":{SLOT}}}'
    got, want = _both(template, slots)
    assert got == want and want.count(b",\n{\"a\":") == n
    if n:
        assert b'"ts":-0.001' in want or b'"ts":-' in want


def test_chrome_trace_both_ways(monkeypatch):
    runs = [tiny_run(), tiny_run(allocator="ideal"), tiny_run(capacity_gib=40 / 1024), tiny_run(expandable=True),
            tiny_run(pp=4, m=8)]
    for run in runs:
        tl = build_timeline(run, synthetic_template)
        for options in ({}, {"max_samples": 16}):
            out = []
            for core in ("compiled", "python"):
                monkeypatch.setenv("TIMELINE_EXPORT_CORE", core)
                buf = io.BytesIO()
                chrome_trace.write(tl, buf, options)
                out.append(buf.getvalue())
            assert out[0] == out[1]


def test_nesting_both_ways(monkeypatch):
    rng = np.random.default_rng(3)
    start = rng.integers(0, 10_000, 5000)
    end = start + rng.integers(0, 3000, 5000)
    out = []
    for core in ("compiled", "python"):
        monkeypatch.setenv("TIMELINE_EXPORT_CORE", core)
        out.append(trace_common.nest(start, end))
    (o1, d1, c1), (o2, d2, c2) = out
    assert c1 == c2 > 0 and np.array_equal(o1, o2) and np.array_equal(d1, d2)
