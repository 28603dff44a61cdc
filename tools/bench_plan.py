#!/usr/bin/env python3
"""Benchmark ``timeline plan`` on DeepSeek-V3 (61 layers + MTP, seq 4096) on 2,048 H800s with a
global batch of 15,360 sequences, and say where the published layout (TP1, PP16, EP64, DualPipe,
ZeRO-1, MLA up-projection + RMSNorm recomputed) ranks.

    python tools/bench_plan.py [--space default|reduced|FILE] [--workers 2] [--engine local|ray]

``reduced`` (the default here) is ``tools/plan/deepseek-v3-2048-reduced.toml``; ``default`` is the
plan's own default space (5,294,016 candidates, about 6–11 minutes on 2 cores: CHANGELOG,
"timeline plan on DeepSeek-V3"). Runs the CLI in a child process and reports its wall time and
``plan.log`` — the counts, the wall time of each phase (bounding every candidate, simulating
with the exact bounds, writing) and the parent's peak RSS — then reads ``plan.parquet`` for the
published layout's row. Run on purpose, never as a timed test.

On a shared machine wall time says little, so it also samples the CPU seconds (user + system)
of the CLI and its workers from ``/proc`` every 0.2 s and splits them at plan.log's phase
boundaries (to the sampling step; the total is the exact one the kernel reports for the child
and its reaped workers), with the peak RSS of the parent and of each worker. ``--repeat N``
runs it N times and prints the median of each phase; ``--keep DIR`` keeps the last run's outputs.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "schedules" / "deepseek-v3-2048.toml"
REDUCED = ROOT / "tools" / "plan" / "deepseek-v3-2048-reduced.toml"
PUBLISHED = "tp=1 pp=16 vpp=1 cp=1 ep=64 etp=1 mbs=1 schedule=dualpipe"
PHASES = ("setup", "bounding", "simulating", "writing")
TICK = os.sysconf("SC_CLK_TCK")


def _tree(root: int) -> dict[int, tuple[float, int]]:
    """pid → (CPU seconds, RSS KiB) of ``root`` and its descendants, read from /proc."""
    parent: dict[int, int] = {}
    stats: dict[int, tuple[float, int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            status = Path(f"/proc/{d}/status").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        parent[int(d)] = int(fields[1])
        rss = re.search(r"VmRSS:\s+(\d+)", status)
        stats[int(d)] = ((int(fields[11]) + int(fields[12])) / TICK, int(rss.group(1)) if rss else 0)
    keep, todo = set(), [root]
    while todo:
        pid = todo.pop()
        keep.add(pid)
        todo += [c for c, pp in parent.items() if pp == pid and c not in keep]
    return {pid: stats[pid] for pid in keep if pid in stats}


def _phases(log: str) -> dict[str, float]:
    return {k: float(v.replace(",", "")) for k, v in re.findall(r"^wall (\w+): ([\d,.]+) s$", log, re.M)}


def run_once(cmd: list[str], out: Path) -> dict[str, float]:
    """Run the CLI once; its wall and CPU seconds per phase, the total CPU and peak RSS (GiB)."""
    samples: list[tuple[float, float]] = []  # (wall since start, CPU seconds of the tree so far)
    done: dict[int, float] = {}  # CPU seconds of processes of the tree that have gone
    rss: dict[int, int] = {}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT)
    stop = threading.Event()

    def watch() -> None:
        last: dict[int, float] = {}
        while not stop.is_set():
            now = _tree(proc.pid)
            for pid in set(last) - set(now):
                done[pid] = last[pid]
            last = {pid: cpu for pid, (cpu, _) in now.items()}
            for pid, (_, kib) in now.items():
                rss[pid] = max(rss.get(pid, 0), kib)
            samples.append((time.perf_counter() - t0, sum(last.values()) + sum(done.values())))
            stop.wait(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    stop.set()
    watcher.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    total_cpu = usage.ru_utime + usage.ru_stime  # the child and the workers it reaped: exact
    out_log = (out / "plan.log").read_text() if (out / "plan.log").exists() else ""
    walls = _phases(out_log)
    res = {"wall": wall, "exit": proc.returncode, "cpu_total": total_cpu}
    # CPU at each phase boundary (wall stamps counted from the CLI's start, after its imports)
    offset = wall - walls.get("total", wall)
    edge = offset
    cpu_at = [0.0]
    for ph in PHASES:
        edge += walls.get(ph, 0.0)
        cpu_at.append(next((c for t, c in samples if t >= edge), samples[-1][1] if samples else 0.0))
    cpu_at[-1] = total_cpu
    cpu_at[1] = max(cpu_at[1], 0.0)
    for i, ph in enumerate(PHASES):
        res[f"wall_{ph}"] = walls.get(ph, float("nan"))
        res[f"cpu_{ph}"] = cpu_at[i + 1] - cpu_at[i]
    res["rss_parent_gib"] = rss.get(proc.pid, 0) / 2**20
    workers = [v for pid, v in rss.items() if pid != proc.pid]
    res["rss_worker_gib"] = max(workers, default=0) / 2**20
    res["workers_seen"] = len(workers)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default="reduced")
    ap.add_argument("--workers", default="2")
    ap.add_argument("--engine", default="local")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--keep", help="copy the last run's output folder here")
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan"
        cmd = [sys.executable, "-m", "timeline", "plan", str(RUN), "--world-size", "2048",
               "--global-batch-size", "15360", "--workers", args.workers, "--engine", args.engine, "-o", str(out),
               "--force"]
        if args.space != "default":
            cmd += ["--space", str(REDUCED if args.space == "reduced" else args.space)]
        for i in range(args.repeat):
            res = run_once(cmd, out)
            runs.append(res)
            print(f"run {i + 1}: wall {res['wall']:,.1f} s, CPU {res['cpu_total']:,.1f} s (exit {res['exit']:.0f}); "
                  + ", ".join(f"{ph} {res[f'cpu_{ph}']:,.1f} s CPU / {res[f'wall_{ph}']:,.1f} s wall" for ph in PHASES)
                  + f"; peak RSS parent {res['rss_parent_gib']:,.2f} GiB, worker {res['rss_worker_gib']:,.2f} GiB "
                  f"({res['workers_seen']:.0f} workers)", flush=True)
        if args.repeat > 1:
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(f"median of {args.repeat}: CPU {med['cpu_total']:,.1f} s; "
                  + ", ".join(f"{ph} {med[f'cpu_{ph}']:,.1f} s CPU" for ph in PHASES))
        if not (out / "plan.log").exists():
            return 1
        print((out / "plan.log").read_text())
        if args.keep:
            shutil.copytree(out, args.keep, dirs_exist_ok=True)
        import pyarrow.parquet as pq

        rows = pq.read_table(out / "plan.parquet").to_pylist()
        def num(v, scale: float, unit: str) -> str:
            return "-" if v is None else f"{v / scale:,.2f} {unit}"

        for r in rows:
            if r["candidate"].startswith(PUBLISHED):
                print(f"{r['candidate']}: rank {r['rank']}, pruned_by {r['pruned_by'] or '-'}, "
                      f"bound {num(r['bound_peak_bytes'], 2**30, 'GiB')} / {num(r['bound_time_us'], 1e3, 'ms')}, "
                      f"peak reserved {num(r['peak_reserved_bytes'], 2**30, 'GiB')}, "
                      f"iteration {num(r['iteration_time_us'], 1e3, 'ms')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
