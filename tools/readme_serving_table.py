#!/usr/bin/env python3
"""Print README's DeepSeek-V3 serving table (vLLM TP8 / DP / SGLang DP attention on 8×H200) from `timeline serve`.

Each row is the shipped example run file with the row's `--set` overrides and the TP8 example's chat load
(500 requests at 8/s); the numbers are read from the run's summary.json, nothing is typed by hand:

    python tools/readme_serving_table.py          # about a minute; paste the table into README.md
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TP8 = "schedules/deepseek-v3-tp8-fp8-h200-serve.toml"
DP8 = "schedules/deepseek-v3-dp8-attn-h200-serve.toml"
LOAD = ["serving.load.num_requests=500"]
SGLANG = ["serving.engine=sglang", "serving.block_size=1"]
ROWS: list[tuple[str, str, list[str]]] = [
    ("vLLM TP8", TP8, []),
    ("vLLM DP8 EP8 (the DP example)", DP8, LOAD),
    ("vLLM DP8, each expert split over 8 (ep = 1)", DP8, [*LOAD, "parallel.ep=1"]),
    ("vLLM DP2 × TP4, EP8", DP8, [*LOAD, "parallel.tp=4", "parallel.dp=2"]),
    ("SGLang TP8", TP8, SGLANG),
    ("SGLang TP8, DP8 attention", TP8, [*SGLANG, "parallel.dp=8", "serving.enable_dp_attention=true"]),
    ("SGLang TP8, DP4 attention", TP8, [*SGLANG, "parallel.dp=4", "serving.enable_dp_attention=true"]),
]
GIB = 2**30


def serve(run: str, sets: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-m", "timeline", "serve", run, "-o", str(out), "--force"]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "summary.json").read_text())


def row(label: str, summary: dict) -> str:
    devices = summary["devices"]
    first = devices[0]
    budget = first["budget"]
    per_rank = [d["requests"] for d in devices if "requests" in d] or [summary["requests"]["total"]]
    reqs = f"{min(per_rank)}–{max(per_rank)}" if min(per_rank) != max(per_rank) else f"{per_rank[0]}"
    req = summary["requests"]
    return (f"| {label} | {budget['weights_bytes'] / GIB:.2f} | {budget['activation_peak_bytes'] / GIB:.2f} | "
            f"{budget['kv_pool_bytes'] / GIB:.2f} | {first['num_kv_blocks']:,} × {first['block_size']} | {reqs} | "
            f"{req['ttft_ms']['p50']:.1f} | {req['tpot_ms']['p50']:.1f} | {req['makespan_us'] / 1e6:.1f} |")


def main() -> int:
    print("| setup | weights GiB | activation peak GiB | KV pool GiB | KV blocks per rank | requests per rank "
          "| TTFT p50 ms | TPOT p50 ms | makespan s |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, run, sets) in enumerate(ROWS):
            print(row(label, serve(run, sets, Path(tmp) / str(i))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
