#!/usr/bin/env python3
"""Simulate measured Megatron-LM configurations perturbed the way a user's job differs from a test's, and report
every crash: a traceback where ``from-megatron`` or the simulation should either run the job or refuse it in one
line (a :class:`timeline.errors.UserError`).

Each draw takes a record's ``model_args`` (``../shared/measured/megatron_calibration.json`` by default, or the
collected records of ``tools/collect_megatron_cases.py --out``) and changes one to three of: the parallel sizes
(tp, pp, cp, ep), the layer count, micro-batch size, sequence length, the recompute granularity, sequence
parallelism, the distributed optimizer, grad-reduce overlap, a virtual pipeline, and one of the choices of an
enumerated argument (attention backend, dispatcher, recompute modules, optimizer, FP8 format and recipe, load
balancing, position embedding, normalization, transformer implementation, checkpoint format); with ``--flags`` it also
switches on up to three boolean arguments of Megatron-LM main drawn from ``tests/data/megatron/parser_args.json``.
Then it converts and simulates the job as ``tools/validate_measured.py`` does (the last pipeline rank's peak).
A draw is the same for the same ``--seed``.

    .venv/bin/python tools/perturb_megatron_configs.py [--draws 200] [--seed 0] [--flags]
        [--data ~/.cache/timeline/megatron-cases.json] [--side calibration]

Exit status 1 when any draw crashed; the refusals are counted by their message with the numbers blanked.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import validate_measured as vm  # noqa: E402
from perturb_report import Outcome  # noqa: E402

PARSER_ARGS = ROOT / "tests" / "data" / "megatron" / "parser_args.json"

#: (argument, values a draw picks from); False removes a flag
PERTURBATIONS: tuple[tuple[str, tuple], ...] = (
    ("--tensor-model-parallel-size", (1, 2, 4, 8)),
    ("--pipeline-model-parallel-size", (1, 2, 4)),
    ("--context-parallel-size", (1, 2, 4)),
    ("--expert-model-parallel-size", (1, 2, 4, 8)),
    ("--num-layers", (2, 4, 6, 8, 12)),
    ("--micro-batch-size", (1, 2, 3, 4)),
    ("--seq-length", (512, 1024, 2048, 4096)),
    ("--recompute-granularity", ("full", "selective")),
    ("--sequence-parallel", (True, False)),
    ("--use-distributed-optimizer", (True, False)),
    ("--overlap-grad-reduce", (True, False)),
    ("--num-layers-per-virtual-pipeline-stage", (1, 2)),
    # arguments.py's choices (d98e8a64dd)
    ("--attention-backend", ("flash", "fused", "unfused", "local", "auto")),
    ("--moe-token-dispatcher-type", ("allgather", "alltoall", "flex")),
    ("--recompute-modules", (["core_attn"], ["mlp"], ["moe_act"], ["layernorm"], ["mla_up_proj"], ["moe"],
                             ["shared_experts"], ["core_attn", "mlp"])),
    ("--cross-entropy-loss-fusion", (True, False)),
    ("--cross-entropy-fusion-impl", ("native", "te")),
    ("--optimizer", ("adam", "sgd", "muon", "dist_muon")),
    ("--fp8-format", ("e4m3", "hybrid")),
    ("--fp8-recipe", ("delayed", "tensorwise", "mxfp8", "blockwise")),
    ("--moe-router-load-balancing-type", ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")),
    ("--position-embedding-type", ("learned_absolute", "rope", "yarn", "none")),
    ("--normalization", ("LayerNorm", "RMSNorm")),
    ("--transformer-impl", ("transformer_engine", "local")),
    ("--ckpt-format", ("torch", "torch_dist")),
)


def main_flags() -> list[str]:
    """Megatron-LM main's boolean arguments (``store_true``) that ``from-megatron`` does not refuse by name."""
    from timeline.io import megatron_table as table

    args = json.loads(PARSER_ARGS.read_text())["arguments"]
    return sorted(k for k, v in args.items() if v.get("action") == "store_true" and v["versions"][-1][1] == "main"
                  and k not in table.REFUSED and k not in table.REFUSED_UNLESS)


def perturbed(records: list[dict], seed: int, draws: int, flags: list[str]) -> Iterator[tuple[dict, list[str]]]:
    """``draws`` (record, what changed) pairs, the same for the same seed."""
    rng = random.Random(seed)
    for _ in range(draws):
        record = copy.deepcopy(rng.choice(records))
        args = record["model_args"]
        changed = []
        for _ in range(rng.randint(1, 3)):
            name, values = rng.choice(PERTURBATIONS)
            value = rng.choice(values)
            if name == "--expert-model-parallel-size" and "--num-experts" not in args:
                continue
            if name == "--num-layers-per-virtual-pipeline-stage" and "--num-virtual-stages-per-pipeline-rank" in args:
                continue
            if value is False:
                args.pop(name, None)
            else:
                args[name] = value
            if (name, value) == ("--recompute-granularity", "full"):
                args.update({"--recompute-method": "uniform", "--recompute-num-layers": 1})
            changed.append(f"{name}={value}")
        if flags:
            for name in rng.sample(flags, min(len(flags), rng.randint(0, 3))):
                args[name] = True
                changed.append(name)
        yield record, changed


def run(records: list[dict], *, seed: int = 0, draws: int = 100, flags: bool = False) -> Outcome:
    provenance = vm.load_provenance()
    records = [vm.as_recorded(r, provenance) for r in records if r.get("model_args")]
    out = Outcome()
    for record, changed in perturbed(records, seed, draws, main_flags() if flags else []):
        draw = f"{record.get('record_id', record['name'])} with {' '.join(changed) or 'nothing changed'}"
        out.attempt(draw, lambda: vm.predict(record))  # noqa: B023 — called before the loop moves on
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=vm.DEFAULT_DATA)
    ap.add_argument("--side", default="calibration", help="collected records: this side's only (default "
                    "calibration; the shared dataset's records carry no side and are all read)")
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--flags", action="store_true", help="also switch on Megatron-LM main's boolean arguments")
    args = ap.parse_args()
    records = [r for r in json.loads(args.data.read_text()) if r.get("side", args.side) == args.side]
    out = run(records, seed=args.seed, draws=args.draws, flags=args.flags)
    print("\n".join(out.lines(f"{args.draws} draws (seed {args.seed}) of {len(records)} records", "simulated")))
    return 1 if out.crashed else 0


if __name__ == "__main__":
    sys.exit(main())
