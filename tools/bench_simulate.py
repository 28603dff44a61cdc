#!/usr/bin/env python3
"""Benchmark ``timeline simulate`` (and ``compare``, ``fit``) on the full DeepSeek-V3 run file.

Every measurement runs in a child process, so peak RSS is that child's own, and each is the
median of ``--repeat`` runs (spread in ``*_all``). Cases (``--cases``, default all):

  full     the CLI with its default outputs, at each of ``--microbatches``: wall, events/s, RSS
  phases   the same run in process, timed per phase: load, plan (op templates), simulate
           (compile, simpy timing, expansion into events), allocate, then each exporter (wall
           and CPU)
  summary  the CLI with ``--format summary`` at 32 micro-batches
  skew     the 128-device skewed run (``training.routing=skew``, ``routing_skew=1.3``),
           summary output, 32 micro-batches
  skew2048 the 2,048-GPU DeepSeek-V3 layout (schedules/deepseek-v3-2048.toml: PP16 EP64, DualPipe,
           120 micro-batches) skewed at each ``routing_skew`` of ``--skews``, summary output:
           1,024 simulated devices, one in memory at a time
  compare  ``timeline compare`` of the README's 4 recompute policies
  fit      ``timeline fit --capacity 80GiB``

Children run with the package's bytecode compiled (``compileall`` first, ``PYTHONDONTWRITEBYTECODE`` dropped), as an
installed package runs. ``--root DIR`` benchmarks another checkout's ``timeline`` package (put first on PYTHONPATH)
with this interpreter, so a before/after comparison runs under the same conditions.

    python tools/bench_simulate.py [--microbatches 16,32,64] [--repeat 3] [--json] [--cases full,phases]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUN = "schedules/deepseek-v3-pp16-tp2-ep8.toml"
CASES = ("full", "phases", "summary", "skew", "skew2048", "compare", "fit")
RUN_2048 = "schedules/deepseek-v3-2048.toml"
SKEW = ["training.routing=skew", "training.routing_skew=1.3"]
POLICIES = "none,selective:core_attn,selective:core_attn+moe_act,full:uniform:1"


def _child(argv: list[str], root: Path) -> tuple[float, int, subprocess.CompletedProcess]:
    """Run ``python argv`` with ``root`` first on the path: (wall s, peak RSS MiB, process).
    ``wait4`` gives this child's own peak RSS (its reaped workers included), not the maximum over
    every child so far as ``RUSAGE_CHILDREN`` would."""
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # as an installed package runs: its modules' bytecode compiled once (main() warms it), not every run
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, *argv], cwd=root, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())
    if done.returncode:
        sys.exit(f"{' '.join(argv)} failed:\n{done.stderr}")
    _cpu[0] = round(usage.ru_utime + usage.ru_stime, 3)
    return wall, round(usage.ru_maxrss / 1024), done


#: user + system CPU seconds of the last child (its workers included): steadier than the wall
#: when other work shares the cores
_cpu = [0.0]


def _cli(root: Path, args: list[str], sets: list[str]) -> list[str]:
    cmd = ["-m", "timeline", *args]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def _median(rows: list[dict]) -> dict:
    """Median of every numeric field over the repeats (and the raw walls as ``wall_s_all``)."""
    out = dict(rows[0])
    for k, v in rows[0].items():
        if isinstance(v, int | float) and not isinstance(v, bool):
            vals = [r[k] for r in rows]
            med = statistics.median(vals)
            out[k] = round(med, 3) if isinstance(v, float) else int(med)
        elif isinstance(v, dict) and all(isinstance(x, int | float) for x in v.values()):
            out[k] = {kk: round(statistics.median(r[k][kk] for r in rows), 3) for kk in v}
    out["wall_s_all"] = [r["wall_s"] for r in rows]
    return out


def bench_cli(root: Path, mb: int | None, sets: list[str], fmt: str | None, run: str = RUN) -> dict:
    """``simulate`` of ``run`` at ``mb`` micro-batches (None: the file's own)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        args = ["simulate", run, "-o", str(out), "--no-progress"]
        if mb is not None:
            args += ["--set", f"training.num_microbatches={mb}"]
        if fmt:
            args += ["--format", fmt]
        wall, rss, _ = _child(_cli(root, args, sets), root)
        summary = json.loads((out / "summary.json").read_text())
        sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    n = summary["num_events"]
    return {"microbatches": summary["run"]["training"]["num_microbatches"], "devices": len(summary["devices"]), "wall_s": round(wall, 3), "cpu_s": _cpu[0],
            "events": n,
            "events_per_s": round(n / wall), "peak_rss_mib": rss, "output_bytes": sizes}


def bench_phases(root: Path, mb: int, sets: list[str]) -> dict:
    argv = [str(Path(__file__).resolve()), "--child-phases", str(mb), *[a for s in sets for a in ("--set", s)]]
    wall, rss, proc = _child(argv, root)
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    row.update(microbatches=mb, wall_s=round(wall, 3), cpu_s=_cpu[0], peak_rss_mib=rss)
    return row


def child_phases(mb: int, sets: list[str]) -> None:
    """In process: time each phase of build_timeline through its progress callback, then each
    exporter into a scratch folder; print one JSON line."""
    import importlib

    from timeline.cli.common import check_csv_schedule, templates
    from timeline.exporters import DEFAULT_FORMATS, EXPORTERS
    from timeline.io.runfile import load_run
    from timeline.result.build import build_timeline

    t0 = time.perf_counter()
    run = load_run(RUN, [f"training.num_microbatches={mb}", *sets])
    check_csv_schedule(run)
    t_load = time.perf_counter()
    source_fn, spent = templates(), [0.0]

    class Timed:
        """The run's model source, its template builds timed."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def under(self, **k: Any) -> Timed:
            return Timed(self.inner.under(**k))

        def template(self, *a: Any, **k: Any) -> Any:
            s = time.perf_counter()
            try:
                return self.inner.template(*a, **k)
            finally:
                spent[0] += time.perf_counter() - s

    def timed_templates(r: Any) -> Any:
        return Timed(source_fn(r))

    marks: dict[str, float] = {}

    def progress(stage: str, done: int, total: int) -> None:
        marks.setdefault(stage, time.perf_counter())

    tl = build_timeline(run, timed_templates, progress=progress)
    t_built = time.perf_counter()
    t_sim_end = marks.get("allocator", t_built)
    phases = {"load": t_load - t0, "plan": spent[0], "simulate": t_sim_end - t_load - spent[0],
              "allocate": t_built - t_sim_end}
    cpu: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in DEFAULT_FORMATS:
            module = importlib.import_module(EXPORTERS[fmt])
            s, c = time.perf_counter(), time.process_time()
            with open(Path(tmp) / module.FILENAME, "wb") as handle:
                module.write(tl, handle, {"max_entries": 200_000})
            phases[f"export.{fmt}"] = time.perf_counter() - s
            cpu[f"export.{fmt}"] = time.process_time() - c
    n = tl.num_events
    print(json.dumps({"events": n, "phases_s": {k: round(v, 3) for k, v in phases.items()},
                      "exports_cpu_s": {k: round(v, 3) for k, v in cpu.items()},
                      "allocate_events_per_s": round(n / max(phases["allocate"], 1e-9)),
                      "total_s": round(time.perf_counter() - t0, 3)}))


def bench_compare(root: Path) -> dict:
    wall, rss, _ = _child(["-m", "timeline", "compare", RUN, "--recompute", POLICIES, "--json"], root)
    return {"policies": POLICIES, "wall_s": round(wall, 3), "cpu_s": _cpu[0], "peak_rss_mib": rss}


def bench_fit(root: Path) -> dict:
    wall, rss, _ = _child(["-m", "timeline", "fit", RUN, "--capacity", "80GiB", "--json"], root)
    return {"capacity": "80GiB", "wall_s": round(wall, 3), "cpu_s": _cpu[0], "peak_rss_mib": rss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--microbatches", default="16,32,64", help="comma-separated (case full)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement; the median is reported")
    ap.add_argument("--json", action="store_true", help="one JSON object per line, nothing else")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated of {', '.join(CASES)}")
    ap.add_argument("--skews", default="1.2,1.5,2.0", help="comma-separated routing_skew values (case skew2048)")
    ap.add_argument("--set", dest="extra", action="append", default=[], help="extra run-file override")
    ap.add_argument("--root", type=Path, default=ROOT, help="checkout whose timeline package to benchmark")
    ap.add_argument("--child-phases", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_phases is not None:
        child_phases(args.child_phases, args.extra)
        return
    root = args.root.resolve()
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad:
        sys.exit(f"unknown case {bad[0]!r}; choose from {', '.join(CASES)}")
    mbs = [int(x) for x in args.microbatches.split(",")]

    def emit(case: str, fn, *a) -> None:
        row = {"case": case, **_median([fn(*a) for _ in range(args.repeat)])}
        print(json.dumps(row) if args.json else _human(row), flush=True)

    # pip compiles an installed package's bytecode; an editable checkout gets it on first import, unless the
    # environment forbids writing it (PYTHONDONTWRITEBYTECODE), which would add the compile to every child's wall
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "timeline")], check=True)
    if not args.json:
        print(f"cpus={os.cpu_count()} python={sys.version.split()[0]} root={root} repeat={args.repeat} "
              "(bytecode compiled)")
    for case in cases:
        if case == "full":
            for mb in mbs:
                emit("full", bench_cli, root, mb, args.extra, None)
        elif case == "phases":
            for mb in mbs:
                emit("phases", bench_phases, root, mb, args.extra)
        elif case == "summary":
            emit("summary", bench_cli, root, 32, args.extra, "summary")
        elif case == "skew":
            emit("skew", bench_cli, root, 32, args.extra + SKEW, "summary")
        elif case == "skew2048":
            for skew in args.skews.split(","):
                emit(f"skew{skew.strip()}", bench_cli, root, None,
                     [*args.extra, "training.routing=skew", f"training.routing_skew={skew.strip()}"], "summary",
                     RUN_2048)
        elif case == "compare":
            emit("compare", bench_compare, root)
        elif case == "fit":
            emit("fit", bench_fit, root)


def _human(row: dict) -> str:
    head = f"{row['case']:8s}"
    if "microbatches" in row:
        head += f" mb={row['microbatches']:<3d}"
    parts = [f"wall {row['wall_s']:.2f} s (runs {', '.join(f'{w:.2f}' for w in row['wall_s_all'])}), "
             f"CPU {row['cpu_s']:.2f} s",
             f"RSS {row['peak_rss_mib']} MiB"]
    if "events_per_s" in row:
        parts.append(f"{row['events']:,} events, {row['events_per_s'] / 1e6:.2f} M events/s")
    if "phases_s" in row:
        parts.append(" ".join(f"{k}={v:.2f}" for k, v in row["phases_s"].items()))
        if "exports_cpu_s" in row:  # CPU, steadier than the wall when other work shares the cores
            parts.append("CPU " + " ".join(f"{k}={v:.2f}" for k, v in row["exports_cpu_s"].items()))
        parts.append(f"allocator {row['allocate_events_per_s'] / 1e6:.2f} M events/s")
    return head + " " + "; ".join(parts)


if __name__ == "__main__":
    main()
