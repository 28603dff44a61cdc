#!/usr/bin/env python3
"""SHA-256 of every output file of a fixed set of runs, so that a speed change can show that it
changes no byte (issue 29: "the SHA-256 of each shipped output before and after").

The runs: the shipped DeepSeek-V3 run with every default output; its summaries under skewed
routing, selective recompute and the megatron profile; DualPipeV with and without full
recompute; the Llama CSV-schedule run; the 2,048-GPU layout's summary; and ``timeline plan`` of
the reduced DeepSeek-V3 space (``plan.parquet`` and ``best/``; ``plan.log`` holds wall times and
is left out). Each runs the CLI in a child process.

    python tools/output_hashes.py [--root DIR] [--out hashes.txt] [--no-plan]

``--root`` hashes another checkout's outputs with this interpreter (its ``timeline`` package first
on PYTHONPATH), so ``diff`` of two listings compares two commits. Run on purpose; the listing is
``<sha256>  <run>/<file>`` per line, sorted.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = "schedules/deepseek-v3-pp16-tp2-ep8.toml"
#: (name, arguments after ``timeline``) — paths relative to the checkout's root
RUNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("shipped", ("simulate", SHIPPED)),
    ("skewed", ("simulate", SHIPPED, "--set", "training.routing=skew", "--set", "training.routing_skew=1.3",
                "--format", "summary")),
    ("selective", ("simulate", SHIPPED, "--recompute", "selective:core_attn+moe_act", "--format", "summary")),
    ("megatron", ("simulate", SHIPPED, "--set", "model.profile=megatron", "--format", "summary")),
    ("dualpipev", ("simulate", "schedules/deepseek-v3-dualpipev-megatron.toml", "--format", "summary,memory,events")),
    ("dualpipev-full", ("simulate", "schedules/deepseek-v3-dualpipev-megatron.toml", "--recompute",
                        "full:uniform:1", "--format", "summary")),
    ("llama-csv", ("simulate", "schedules/llama3-8b-csv.toml")),
    ("2048", ("simulate", "schedules/deepseek-v3-2048.toml", "--format", "summary")),
)
PLAN = ("plan", ("plan", "schedules/deepseek-v3-2048.toml", "--world-size", "2048", "--global-batch-size", "15360",
                 "--space", "tools/plan/deepseek-v3-2048-reduced.toml", "--workers", "1"))
#: files whose bytes hold wall times
SKIP = {"plan.log"}


def _hashes(out: Path) -> list[str]:
    lines = []
    for p in sorted(out.rglob("*")):
        if p.is_file() and p.name not in SKIP:
            lines.append(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(out)}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=str(ROOT), help="the checkout whose timeline package runs (default: this one)")
    ap.add_argument("--out", help="write the listing here as well as to stdout")
    ap.add_argument("--no-plan", action="store_true", help="leave out the plan run (about a minute)")
    args = ap.parse_args()
    root = Path(args.root).resolve()
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    runs = RUNS + (() if args.no_plan else (PLAN,))
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, argv in runs:
            out = Path(tmp) / name
            cmd = [sys.executable, "-m", "timeline", *argv, "-o", str(out), "--force"]
            if argv[0] == "simulate":
                cmd.append("--no-progress")
            done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
            if done.returncode not in (0, 1) or not out.exists():  # 1: a run that does not fit
                print(f"{name}: exit {done.returncode}\n{done.stderr[-2000:]}", file=sys.stderr)
                return 1
            lines += [f"{h}  {name}/{f}" for h, f in (x.split("  ", 1) for x in _hashes(out))]
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
