"""Benchmark: `timeline serve` on a 1,000-request Llama-3.1-8B trace (one H100), summary and
memory.parquet written. Run on purpose (`python tools/bench_serve.py`); issue 15 asks for under
20 s on 2 cores. Writes the trace and the outputs to a temporary folder."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from timeline.cli import main

ROOT = Path(__file__).resolve().parents[1]


def write_trace(path: Path, n: int = 1000, seed: int = 0) -> None:
    rng = np.random.Generator(np.random.PCG64(seed))
    arrivals = np.cumsum(rng.exponential(1e6 / 20, size=n))
    prompts = rng.integers(128, 4097, size=n)
    outputs = rng.integers(16, 513, size=n)
    prefixes = rng.integers(0, 4, size=n)
    lines = ["arrival_us,prompt_tokens,output_tokens,prefix_id"]
    lines += [f"{a:.1f},{p},{o},{'sys' + str(x) if x else ''}" for a, p, o, x in zip(arrivals, prompts, outputs, prefixes, strict=True)]
    path.write_text("\n".join(lines) + "\n")


def main_bench() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_trace(folder / "trace.csv")
        text = (ROOT / "schedules" / "llama3.1-8b-h100-serve.toml").read_text()
        text = text.replace("../tests/data/hf", str(ROOT / "tests" / "data" / "hf"))
        text = text.split("[serving.load]")[0] + 'requests = "trace.csv"\n'
        (folder / "run.toml").write_text(text)
        t0 = time.perf_counter()
        rc = main(["serve", str(folder / "run.toml"), "-o", str(folder / "out"), "--format", "summary,memory"])
        elapsed = time.perf_counter() - t0
    print(f"1,000-request Llama-3.1-8B trace: {elapsed:.2f} s (rc {rc})", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main_bench())
