"""Parquet v2 (issue 14, item 6): ``iteration`` on events, ops and memory rows; ``alloc_id``
pairing an alloc with its free; nulls instead of −1; ``devices.parquet``."""

from __future__ import annotations

import io
from collections import Counter

import numpy as np
import pyarrow.parquet as pq
from tiny import synthetic_template, tiny_run

from timeline.exporters import devices_parquet, events_parquet, memory_parquet, ops_parquet
from timeline.result.build import build_timeline


def table(module, tl):
    buf = io.BytesIO()
    module.write(tl, buf, {})
    buf.seek(0)
    return pq.read_table(buf)


def test_events_v2_pair_allocs_and_frees_and_use_nulls():
    tl = build_timeline(tiny_run(), synthetic_template)
    ev = table(events_parquet, tl)
    assert ev.schema.metadata[b"schema"] == b"timeline.events/2"
    cols = ev.to_pydict()
    for dev in {d.device for d in tl.sim.devices}:
        rows = [i for i, d in enumerate(cols["device"]) if d == dev]
        ids = Counter(cols["alloc_id"][i] for i in rows)
        kinds = {cols["alloc_id"][i]: [] for i in rows}
        for i in rows:
            kinds[cols["alloc_id"][i]].append((cols["kind"][i], cols["tensor"][i], cols["requested_bytes"][i]))
        for aid, entries in kinds.items():
            assert ids[aid] in (1, 2)  # an alloc alone (live at the end) or an alloc and its free
            if ids[aid] == 2:
                (k1, t1, b1), (k2, t2, b2) = entries
                assert (k1, k2) == ("alloc", "free") and t1 == t2 and b1 == b2
    # the same tensor of the same micro-batch recurs in each iteration with its own id
    its = [x for x in cols["iteration"] if x is not None]
    assert sorted(set(its)) == [0, 1] and -1 not in cols["microbatch"] and -1 not in cols["stage"]
    static = [i for i, a in enumerate(cols["action"]) if a is None]
    assert static and all(cols["iteration"][i] is None and cols["microbatch"][i] is None for i in static)


def test_ops_and_memory_carry_the_iteration():
    tl = build_timeline(tiny_run(), synthetic_template)
    ops = table(ops_parquet, tl).to_pydict()
    mem = table(memory_parquet, tl)
    assert mem.schema.metadata[b"schema"] == b"timeline.memory/2"
    starts = tl.iteration_starts(0)
    for t, it, dev in zip(ops["t_start_us"], ops["iteration"], ops["device"], strict=True):
        if dev == tl.sim.devices[0].device:
            assert it == (1 if t >= starts[1] else 0 if t >= starts[0] else None)
    m = mem.to_pydict()
    first = [i for i, d in enumerate(m["device"]) if d == tl.sim.devices[0].device]
    assert m["iteration"][first[0]] in (None, 0) and m["iteration"][first[-1]] == 1
    assert -1 not in ops["microbatch"] and -1 not in ops["layer"]


def test_devices_parquet():
    tl = build_timeline(tiny_run(), synthetic_template)
    t = table(devices_parquet, tl)
    assert t.schema.metadata[b"schema"] == b"timeline.devices/1"
    rows = t.to_pylist()
    assert [r["device"] for r in rows] == [d.device for d in tl.sim.devices]
    assert [r["pp_rank"] for r in rows] == [d.pp_rank for d in tl.sim.devices]
    assert [r["stages"] for r in rows] == [list(d.stages) for d in tl.sim.devices]
    assert {r["capacity_bytes"] for r in rows} == {tl.sim.run.hardware.capacity_bytes}
    assert np.all(np.array([r["represents"] for r in rows]) >= 1)
