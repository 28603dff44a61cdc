"""``timeline static RUN.toml``: per-device static memory (weights, gradients, optimizer)."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from timeline.cli.common import add_run_args, console, gib, load
from timeline.graph.static import model_total_params
from timeline.graph.tensors import MODULES
from timeline.pipeline.devices import StaticDevice, static_devices
from timeline.spec.run import RunSpec

HELP = "per-device static memory: weights, gradients and optimizer states"
DESCRIPTION = """\
Print, for each pipeline rank's representative device, the parameters it holds (by module)
and the bytes of weights, gradients and optimizer states (master weights + moments) under
the run's ZeRO level and profile.

examples:
  timeline static schedules/deepseek-v3-pp16-tp2-ep8.toml
  timeline static schedules/deepseek-v3-pp16-tp2-ep8.toml --set training.zero=0 --json
"""

SCHEMA = "timeline.static/1"


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    add_run_args(parser)
    parser.add_argument("--json", action="store_true", help=f"print a {SCHEMA} JSON document")


def device_json(d: StaticDevice) -> dict:
    return {
        "device": d.device, "pp_rank": d.pp_rank, "stages": list(d.stages), "represents": d.represents,
        "layers": list(d.layers),
        "params": {"total": d.params_total, "by_module": dict(d.params_by_module)},
        "buffers": d.buffers,
        "bytes": {"weights": d.weights_bytes, "grads": d.grads_bytes, "optimizer": d.optimizer_bytes,
                  "total": d.total_bytes},
    }


def static_json(run: RunSpec, devices: list[StaticDevice]) -> dict:
    return {
        "schema": SCHEMA,
        "run": {"name": run.name, "profile": run.profile, "model": run.model_source,
                "zero": run.training.zero},
        "model": {"total_params": model_total_params(run)},
        "devices": [device_json(d) for d in devices],
    }


def print_table(run: RunSpec, devices: list[StaticDevice], console: Console) -> None:
    p = run.parallel
    title = (f"{run.name}: {run.model.name}, profile={run.profile}, PP{p.pp}·VPP{p.vpp} TP{p.tp} CP{p.cp} "
             f"EP{p.ep} ETP{p.etp} DP{p.dp}, ZeRO-{run.training.zero}  (GiB per device)")
    table = Table(title=title)
    for col in ("pp rank", "device", "×", "stages", "layers", "params"):
        table.add_column(col, justify="right")
    for col in ("weights", "grads", "optimizer", "total"):
        table.add_column(col, justify="right")
    for d in devices:
        layers = f"{d.layers[0]}–{d.layers[-1]}" if d.layers else "-"
        table.add_row(str(d.pp_rank), str(d.device), str(d.represents), ",".join(map(str, d.stages)), layers,
                      f"{d.params_total:,}", gib(d.weights_bytes), gib(d.grads_bytes), gib(d.optimizer_bytes),
                      gib(d.total_bytes))
    console.print(table)
    top = max(devices, key=lambda d: d.total_bytes)
    mods = ", ".join(f"{m} {top.params_by_module[m]:,}" for m in MODULES if top.params_by_module[m])
    console.print(f"largest: pp rank {top.pp_rank} ({gib(top.total_bytes)} GiB): {mods}")
    console.print(f"model: {model_total_params(run):,} parameters")


def run(args: argparse.Namespace) -> int:
    spec = load(args)
    devices = static_devices(spec)
    if args.json:
        json.dump(static_json(spec, devices), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print_table(spec, devices, console())
    return 0
