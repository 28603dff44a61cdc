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
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "schedules" / "deepseek-v3-2048.toml"
REDUCED = ROOT / "tools" / "plan" / "deepseek-v3-2048-reduced.toml"
PUBLISHED = "tp=1 pp=16 vpp=1 cp=1 ep=64 etp=1 mbs=1 schedule=dualpipe"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default="reduced")
    ap.add_argument("--workers", default="2")
    ap.add_argument("--engine", default="local")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan"
        cmd = [sys.executable, "-m", "timeline", "plan", str(RUN), "--world-size", "2048",
               "--global-batch-size", "15360", "--workers", args.workers, "--engine", args.engine, "-o", str(out)]
        if args.space != "default":
            cmd += ["--space", str(REDUCED if args.space == "reduced" else args.space)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT)
        wall = time.perf_counter() - t0
        print(f"wall {wall:,.1f} s (exit {proc.returncode})")
        if not (out / "plan.log").exists():
            return 1
        print((out / "plan.log").read_text())
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
