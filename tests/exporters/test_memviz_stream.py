"""snapshot.pickle from the columns (the compiled writer) against the reference dict's pickle.

Byte for byte on the caching and ideal allocators, with and without OOMs, under expandable
segments, on a run whose first iteration has more micro-batches in flight (pp = 4, 8
micro-batches), each with the trace capped at several lengths (a cap may fall on a
free_requested/free_completed pair); a run whose columns break the reference loop's assumption
(frees that do not follow their alloc at the same address) falls back to the reference; and the
exporter's output equals the reference either way. Without the extension built, the module skips.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import replace

import numpy as np
import pytest
from tiny import synthetic_template, tiny_run

from timeline.exporters import compiled, memviz_snapshot, memviz_stream
from timeline.result.build import build_timeline

pytestmark = pytest.mark.skipif(not compiled.compiled_available(), reason="the compiled writers are not built "
                                "(no C compiler at install time): only the Python writers run")

RUNS = {
    "caching": {},
    "caching-oom": {"capacity_gib": 40 / 1024},
    "ideal": {"allocator": "ideal"},
    "ideal-oom": {"allocator": "ideal", "capacity_gib": 40 / 1024},
    "expandable": {"expandable": True},
    "expandable-oom": {"expandable": True, "capacity_gib": 40 / 1024},
    "pp4": {"pp": 4, "m": 8},
}


@pytest.fixture(scope="module", params=list(RUNS))
def timeline_of(request):
    return request.param, build_timeline(tiny_run(**RUNS[request.param]), synthetic_template)


def _stream(tl, max_entries: int) -> bytes | None:
    out = io.BytesIO()
    return out.getvalue() if memviz_stream.write(tl, out, max_entries, compiled.extension()) else None


@pytest.mark.parametrize("max_entries", [0, 1, 2, 40, 41, 1000])
def test_stream_writes_the_reference_bytes(timeline_of, max_entries):
    name, tl = timeline_of
    want = pickle.dumps(memviz_snapshot.snapshot(tl, max_entries), protocol=4)
    got = _stream(tl, max_entries)
    assert got is not None, f"{name}: the stream writer fell back"
    assert got == want, name
    if name.endswith("oom") and not max_entries:  # the run does exercise what it is named for
        assert b"device_free" in got and b"oom" in got


def test_unexpected_columns_fall_back_to_the_reference():
    tl = build_timeline(tiny_run(capacity_gib=40 / 1024), synthetic_template)
    want = io.BytesIO()
    memviz_snapshot.write(tl, want, {})
    mem = tl.memory[0]
    frees = np.flatnonzero(tl.events(0).sign < 0)
    address = mem.address.copy()
    address[frees[0]] = address[frees[1]]  # two frees at one address: not the reference loop's pairing
    tl.memory[0] = replace(mem, address=address)
    assert _stream(tl, 0) is None
    tl.memory[0] = replace(mem, segment_events=[(i, a, np.int64(x), sz, st, r)  # a numpy int would pickle as one
                                                for i, a, x, sz, st, r in mem.segment_events])
    assert _stream(tl, 0) is None
    tl.memory[0] = mem
    assert _stream(tl, 0) == want.getvalue()
