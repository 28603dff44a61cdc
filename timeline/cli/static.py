"""``timeline static RUN.toml``: per-device static memory (weights, gradients, optimizer) and the
activation bytes one micro-batch's forward keeps on each device."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from timeline.cli.common import (
    add_max_events,
    add_run_args,
    check_csv_schedule,
    estimate,
    gib,
    load,
    templates,
)
from timeline.cli.tables import Column, View, add_wide, table_console
from timeline.compare.variants import recompute_name
from timeline.errors import UserError
from timeline.graph.activations import DeviceActivations, device_activations
from timeline.graph.tensors import MODULES
from timeline.pipeline.placement import stage_placement
from timeline.placement.devices import StaticDevice, static_devices
from timeline.profiles import profile
from timeline.sim.plan import run_schedule_of
from timeline.sim.static_state import ddp_of
from timeline.spec.run import RunSpec

HELP = "per-device static memory (weights, gradients, optimizer states) and activations per micro-batch"
DESCRIPTION = """\
Print, for each pipeline rank's representative device, the parameters it holds (by module)
and the bytes of weights, gradients and optimizer states (master weights + moments) under
the run's ZeRO level and profile, and the activation bytes one micro-batch's forward of the
device's chunks keeps until its backward (no pipeline in-flight multiplier).

examples:
  timeline static schedules/deepseek-v3-pp16-tp2-ep8.toml
  timeline static schedules/deepseek-v3-pp16-tp2-ep8.toml --set training.zero=0 --json
  timeline static schedules/deepseek-v3-pp16-tp2-ep8.toml --recompute full:uniform:1
  timeline static schedules/deepseek-v3-pp16-tp2-ep8.toml --set model.profile=megatron --tensors
"""

SCHEMA = "timeline.static/1"


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    add_run_args(parser, recompute=True)
    parser.add_argument("--json", action="store_true", help=f"print a {SCHEMA} JSON document")
    add_max_events(parser, "ops per micro-batch")
    parser.add_argument("--tensors", action="store_true",
                        help="list each layer's saved tensors (name, op, shape, dtype, bytes)")
    add_wide(parser)


def activations(spec: RunSpec, devices: list[StaticDevice]) -> list[DeviceActivations]:
    """Per device, the activations one micro-batch's forward keeps."""
    source = templates()(spec)
    return [device_activations([source.template(c, pp_rank=d.pp_rank) for c in d.stages]) for d in devices]


def tensors_json(a: DeviceActivations) -> list[dict]:
    return [{"layer": st.layer, "name": st.tensor.name, "op": st.op, "shape": list(st.tensor.shape),
             "dtype": st.tensor.dtype, "bytes": st.tensor.size_bytes} for st in a.saved]


def device_json(d: StaticDevice) -> dict:
    return {
        "device": d.device, "pp_rank": d.pp_rank, "stages": list(d.stages), "represents": d.represents,
        "layers": list(d.layers),
        "params": {"total": d.params_total, "by_module": dict(d.params_by_module)},
        "buffers": d.buffers,
        "bytes": {"weights": d.weights_bytes, "grads": d.grads_bytes, "optimizer": d.optimizer_bytes,
                  "total": d.total_bytes},
    }


def static_json(run: RunSpec, devices: list[StaticDevice], acts: list[DeviceActivations], *,
                tensors: bool = False) -> dict:
    out = []
    for d, a in zip(devices, acts, strict=True):
        entry = device_json(d)
        entry["activation_bytes_per_microbatch"] = a.bytes_per_microbatch
        entry["layer_activation_bytes"] = [{"layer": k, "bytes": v} for k, v in a.layer_bytes]
        if tensors:
            entry["saved_tensors"] = tensors_json(a)
        out.append(entry)
    return {
        "schema": SCHEMA,
        "run": {"name": run.name, "profile": run.profile, "model": run.model_source,
                "zero": run.training.zero, "recompute": recompute_name(run.recompute)},
        "model": {"total_params": templates()(run).total_params()},
        "devices": out,
    }


#: the static table; ``--wide`` adds the columns marked wide
COLUMNS = (Column("pp\nrank"), Column("device"), Column("×"), Column("stages", wide=True), Column("layers"),
           Column("parameters"), Column("weights"), Column("grads"), Column("optimizer"), Column("total"),
           Column("activations\n/µbatch"))


def params(n: int) -> str:
    """A parameter count with its unit, so it does not read as bytes: ``429.65 M params``."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:,.2f} {unit} params"
    return f"{n:,} params"


def print_table(run: RunSpec, devices: list[StaticDevice], console: Console,
                acts: list[DeviceActivations], *, wide: bool = False) -> None:
    p = run.parallel
    title = (f"{run.name}: {run.model.name}, profile={run.profile}, PP{p.pp}·VPP{p.vpp} TP{p.tp} CP{p.cp} "
             f"EP{p.ep} ETP{p.etp} DP{p.dp}\nZeRO-{run.training.zero}, recompute {recompute_name(run.recompute)} "
             + ("(offload not counted: activations as kept) " if run.offload.modules else "")
             + "(GiB per device; parameters as a count; activations per micro-batch)")
    view = View(title, COLUMNS, wide=wide)
    for d, a in zip(devices, acts, strict=True):
        layers = f"{d.layers[0]}–{d.layers[-1]}" if d.layers else "-"
        view.row(str(d.pp_rank), str(d.device), str(d.represents), ",".join(map(str, d.stages)), layers,
                 f"{d.params_total:,}", gib(d.weights_bytes), gib(d.grads_bytes), gib(d.optimizer_bytes),
                 gib(d.total_bytes), gib(a.bytes_per_microbatch))
    view.print(table_console(wide))
    top = max(devices, key=lambda d: d.total_bytes)
    mods = ", ".join(f"{m} {params(top.params_by_module[m])}" for m in MODULES if top.params_by_module[m])
    console.print(f"largest: pp rank {top.pp_rank} (device {top.device}, {gib(top.total_bytes)} GiB): {mods}",
                  markup=False, highlight=False)
    total = templates()(run).total_params()
    console.print(f"model: {total:,} parameters ({params(total)})", markup=False, highlight=False)


def print_tensors(devices: list[StaticDevice], acts: list[DeviceActivations], console: Console) -> None:
    for d, a in zip(devices, acts, strict=True):
        table = Table(title=f"pp rank {d.pp_rank}: saved tensors per micro-batch "
                            f"({a.bytes_per_microbatch:,} bytes)")
        for col in ("layer", "tensor", "op", "shape", "dtype", "bytes"):
            table.add_column(col, justify="right" if col in ("layer", "bytes") else "left")
        for st in a.saved:
            t = st.tensor
            table.add_row(str(st.layer), t.name, st.op, "×".join(map(str, t.shape)), t.dtype, f"{t.size_bytes:,}")
        console.print(table)


def run(args: argparse.Namespace) -> int:
    spec = load(args)
    if spec.trace is not None and spec.trace.is_step:
        raise UserError(f"{spec.model_source}: a whole-step trace (capture --step) holds its weights, gradients and "
                        "optimizer state as the step made them; `timeline simulate` reports them (summary.json "
                        "static_bytes, per_iteration)")
    est = estimate(spec)
    if est.ops_per_microbatch > args.max_events:
        raise UserError(f"this model has about {est.ops_per_microbatch:,} ops per micro-batch, over --max-events "
                        f"{args.max_events:,}; lower model.num_hidden_layers or raise --max-events")
    check_csv_schedule(spec)
    rows = spec.csv_rows  # a CSV schedule's rows decide which chunks each rank holds
    placed = None if rows is None else run_schedule_of(spec.schedule, spec.parallel, spec.training.num_microbatches,
                                                       rows).stages_of_rank
    par = spec.parallel
    if placed is None:
        placed = stage_placement(spec.schedule.kind, par.pp, par.vpp)
    devices = static_devices(templates()(spec), placed, parallel=par, training=spec.training,
                             num_layers=spec.model.num_hidden_layers,
                             expert_state_group=profile(spec.profile).params.expert_state_group,
                             ddp=ddp_of(spec.profile, spec.framework, spec.model, spec.training, par,
                                        traced=spec.trace is not None))
    acts = activations(spec, devices)
    if args.json:
        json.dump(static_json(spec, devices, acts, tensors=args.tensors), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        con = table_console()
        print_table(spec, devices, con, acts, wide=args.wide)
        if args.tensors:  # a listing of long names, printed at full width
            print_tensors(devices, acts, table_console(wide=True))
    return 0
