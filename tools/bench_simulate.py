#!/usr/bin/env python3
"""Benchmark ``timeline simulate`` on the full DeepSeek-V3 run file.

Runs the CLI in a child process (so peak RSS is the child's own) with its default outputs at
16, 32 and 64 micro-batches and reports wall time, memory events per second and peak RSS.
Run on purpose: ``python tools/bench_simulate.py [--microbatches 16,32,64] [--set k=v ...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"


def bench(mb: int, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "timeline", "simulate", str(RUN), "-o", str(out), "--no-progress",
               "--set", f"training.num_microbatches={mb}"]
        for e in extra:
            cmd += ["--set", e]
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t0
        rss_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        if proc.returncode:
            sys.exit(f"simulate failed:\n{proc.stderr}")
        summary = json.loads((out / "summary.json").read_text())
        sizes = {p.name: p.stat().st_size for p in out.iterdir()}
    return {"microbatches": mb, "wall_s": round(wall, 2), "events": summary["num_events"],
            "events_per_s": round(summary["num_events"] / wall), "peak_rss_mib": round(max(rss_kib, before) / 1024),
            "output_bytes": sizes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--microbatches", default="16,32,64")
    ap.add_argument("--set", dest="extra", action="append", default=[])
    args = ap.parse_args()
    print(f"cpus={os.cpu_count()} python={sys.version.split()[0]}")
    for mb in [int(x) for x in args.microbatches.split(",")]:
        print(json.dumps(bench(mb, args.extra)))


if __name__ == "__main__":
    main()
