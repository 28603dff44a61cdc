#!/usr/bin/env python3
"""Serve the published checkpoints of ``tests/data/hf`` under drawn engines, versions, GPUs and settings, and report
every crash: each draw must compute the engine's startup budget (and with ``--full`` run ``timeline serve`` on a
small load) or be refused in one line (a :class:`timeline.errors.UserError`).

A draw picks a checkpoint, vLLM or SGLang at one of their releases, a GPU preset, tp and pp, and maybe
``max_model_len``, ``kv_cache_dtype``, the memory fraction, ``enforce_eager``, ``max_num_seqs`` and the number of
requests. The same ``--seed`` gives the same draws.

    .venv/bin/python tools/perturb_serving_configs.py [--draws 300] [--seed 0] [--full]

Exit status 1 when any draw crashed; refusals are counted by their message with the numbers blanked.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from perturb_report import Outcome  # noqa: E402

from timeline.errors import UserError  # noqa: E402
from timeline.io.serve_runfile import load_serve_run  # noqa: E402
from timeline.serve.budget import compute_budgets  # noqa: E402
from timeline.spec.hardware import GPUS, TORCH_TOTAL_GIB  # noqa: E402

HF = ROOT / "tests" / "data" / "hf"
#: releases drawn from: vLLM's V0 era through V1, SGLang 0.3 … 0.5
VERSIONS = {"vllm": ("0.2.7", "0.3.3", "0.4.2", "0.5.4", "0.6.4", "0.7.3", "0.8.5", "0.9.2", "0.10.1", "0.11.0",
                     "0.15.0", "0.19.0", "0.24.0", "0.28.0"),
            "sglang": ("0.3.6", "0.4.3", "0.4.7", "0.5.2")}


def draws(seed: int, n: int) -> list[tuple[str, str]]:
    """``n`` (description, run-file text) pairs, the same for the same seed."""
    rng = random.Random(seed)
    configs = sorted(p for p in HF.iterdir() if (p / "config.json").exists())
    gpus = sorted(k for k in GPUS if k in TORCH_TOTAL_GIB)
    out = []
    for _ in range(n):
        cfg, engine = rng.choice(configs), rng.choice(("vllm", "vllm", "sglang"))
        sv = [f'engine = "{engine}"', f'engine_version = "{rng.choice(VERSIONS[engine])}"']
        if rng.random() < 0.5:
            sv.append(f"max_model_len = {rng.choice((2048, 4096, 8192, 32768, 131072))}")
        if rng.random() < 0.3:
            sv.append(f'kv_cache_dtype = "{rng.choice(("auto", "fp8", "fp8_e5m2"))}"')
        if rng.random() < 0.3:
            sv.append(f"gpu_memory_utilization = {rng.choice((0.5, 0.8, 0.9, 0.95))}" if engine == "vllm" else
                      f"mem_fraction_static = {rng.choice((0.5, 0.8, 0.88))}")
        if rng.random() < 0.2:
            sv.append("enforce_eager = true")
        if rng.random() < 0.2:
            sv.append(f"max_num_seqs = {rng.choice((1, 16, 256, 1024))}")
        tp, pp, gpu = rng.choice((1, 1, 2, 4, 8)), rng.choice((1, 1, 1, 2)), rng.choice(gpus)
        requests = rng.choice((1, 8, 64))
        text = (f'[model]\nhf_config = "{cfg / "config.json"}"\n[parallel]\ntp = {tp}\npp = {pp}\n'
                f'[hardware]\ngpu = "{gpu}"\n[serving]\n' + "\n".join(sv)
                + f"\n[serving.load]\nnum_requests = {requests}\n")
        out.append((f"{cfg.name} tp{tp} pp{pp} {gpu} {requests} requests: {'; '.join(sv)}", text))
    return out


def serve(path: Path, out_dir: Path, full: bool) -> None:
    """The draw's startup budget, and with ``full`` ``timeline serve`` on its load (exit 2: refused)."""
    from timeline.cli import main as cli

    compute_budgets(load_serve_run(path))
    if not full:
        return
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        rc = cli(["serve", str(path), "-o", str(out_dir), "--force", "--format", "summary,memory,requests"])
    if rc == 2:
        raise UserError((err.getvalue().strip().splitlines() or ["exit status 2"])[-1])
    if rc != 0:
        raise RuntimeError(f"timeline serve exited with status {rc}")


def run(seed: int = 0, n: int = 100, full: bool = False) -> Outcome:
    out = Outcome()
    with tempfile.TemporaryDirectory() as tmp:
        for i, (desc, text) in enumerate(draws(seed, n)):
            path = Path(tmp) / f"draw{i}.toml"
            path.write_text(text)
            out.attempt(desc, lambda: serve(path, Path(tmp) / f"out{i}", full))  # noqa: B023 — called at once
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draws", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--full", action="store_true", help="also run timeline serve on each budget that computes")
    args = ap.parse_args()
    out = run(args.seed, args.draws, args.full)
    print("\n".join(out.lines(f"{args.draws} draws (seed {args.seed})", "served")))
    return 1 if out.crashed else 0


if __name__ == "__main__":
    sys.exit(main())
