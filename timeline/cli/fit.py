"""``timeline fit RUN.toml [--capacity 80GiB]``: the recompute policy with the least recompute
time whose peak reserved memory fits every device, with runner-ups, or by how much none fits."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from dataclasses import replace

from rich.table import Table

from timeline.cli.common import (
    add_max_events,
    add_run_args,
    check_work,
    console,
    count,
    gib,
    load,
    load_csv_rows,
    refuse_step_trace,
    templates,
)
from timeline.compare.fit import FitResult, Outcome, fit
from timeline.errors import SpecError, UserError
from timeline.spec.run import RunSpec
from timeline.spec.validate import validate_run

HELP = "find the recompute policy with the least recompute time that fits every device"
DESCRIPTION = """\
Search recompute policies for the one with the least recompute time per iteration (the
slowest pipeline rank's, then the sum) whose peak reserved memory fits every device:

  none
  selective:S   every set S of the model's modules, less dominated sets (no more bytes saved
                on any rank for at least the recompute time of another set), ordered by bytes
                saved per recomputed FLOP
  full:uniform:N        N = 1 … layers per chunk
  full:block:N0,N1,…    N_r = 0 … layers of rank r's chunks

Policies are simulated cheapest first; one that cannot fit by a static bound (the baseline's
peak less what it saves on every micro-batch in flight) is not simulated. Prints every policy
considered, the best and up to --alternatives runner-ups; if none fits, which device is short
and by how much under the policy that saves the most.

--capacity takes a size with a unit (80GiB, 80GB, 81920MiB, 0.5TiB) or a bare number of GiB
(--capacity 80 is 80 GiB).

examples:
  timeline fit schedules/deepseek-v3-pp16-tp2-ep8.toml --capacity 80GiB
  timeline fit RUN.toml --capacity 64GiB --json
"""
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*(GiB|GB|MiB|MB|TiB|TB)?\s*", re.IGNORECASE)
_UNITS = {"gib": 1.0, "gb": 1e9 / 2**30, "mib": 1 / 1024, "mb": 1e6 / 2**30, "tib": 1024.0, "tb": 1e12 / 2**30}


def parse_capacity(text: str) -> float:
    """``80GiB``, ``80GB``, ``81920MiB`` or a bare number of GiB → GiB."""
    m = _SIZE.fullmatch(text)
    if not m or float(m.group(1)) <= 0:
        raise UserError(f"--capacity {text!r}: give a size such as 80GiB, 80GB or 81920MiB")
    return float(m.group(1)) * _UNITS[(m.group(2) or "gib").lower()]


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    add_run_args(parser)
    parser.add_argument("--capacity", metavar="SIZE", help="device memory: 80GiB, 80GB, 81920MiB, or a bare "
                        "number of GiB (80 = 80GiB); default: the run's hardware.capacity_gib. "
                        "hardware.non_pytorch_gib is still subtracted")
    parser.add_argument("--alternatives", type=count, default=3, metavar="N", help="runner-ups to show (default 3)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (timeline.fit/1)")
    add_max_events(parser, "memory events per candidate")


def outcome_dict(o: Outcome) -> dict:
    c = o.candidate
    out = {"policy": c.name, "recompute_time_us": max(c.recompute_time_us, default=0.0),
           "recompute_time_us_per_rank": list(c.recompute_time_us), "recompute_flops_per_rank": list(c.recompute_flops),
           "activation_bytes_per_microbatch": list(c.activation_bytes), "simulated": o.result is not None,
           "fits": o.fits, "note": o.note}
    if o.result is not None:
        out["devices"] = [dataclasses.asdict(d) for d in o.result.devices]
    return out


def fit_dict(res: FitResult) -> dict:
    return {"schema": "timeline.fit/1", "capacity_bytes": res.capacity_bytes, "search_space": res.space,
            "best": outcome_dict(res.best) if res.best else None,
            "alternatives": [outcome_dict(o) for o in res.alternatives],
            "considered": [outcome_dict(o) for o in res.outcomes],
            "shortfall": None if res.shortfall is None else dict(zip(("policy", "device", "bytes"), res.shortfall,
                                                                     strict=True))}


def print_result(res: FitResult) -> None:
    con = console()
    sp = res.space
    con.print(f"search space: none, {sp['selective']} selective sets ({sp['selective_dominated']} dominated sets "
              f"pruned), {sp['uniform']} full:uniform, {sp['block']} full:block; capacity {gib(res.capacity_bytes)} GiB")
    table = Table(title="policies considered, cheapest first (GiB; recompute ms per iteration, slowest rank)")
    for col in ("policy", "recompute ms", "max peak reserved", "min headroom", "result"):
        table.add_column(col, justify="left" if col in ("policy", "result") else "right")
    pruned = [o for o in res.outcomes if o.result is None]
    for o in res.outcomes:
        if o.result is None and len(pruned) > 8:
            continue  # summarised below the table
        w = o.result.worst_device() if o.result else None
        style = "dim" if w is None else "green" if o is res.best else None if o.fits else "red"
        table.add_row(o.candidate.name, f"{o.candidate.cost[0] / 1e3:,.2f}",
                      gib(w.peak_reserved_bytes) if w else "-", gib(w.headroom_bytes) if w else "-", o.note,
                      style=style)
    con.print(table)
    if len(pruned) > 8:
        con.print(f"{len(pruned)} policies not simulated: a static bound shows they cannot fit "
                  f"(e.g. {pruned[-1].candidate.name}: {pruned[-1].note.removeprefix('pruned: ')}); --json lists them")
    if res.best:
        con.print(f"best: [bold]{res.best.candidate.name}[/bold] "
                  f"({res.best.candidate.cost[0] / 1e3:,.2f} ms recompute per iteration on the slowest rank)")
        for o in res.alternatives:
            con.print(f"  runner-up: {o.candidate.name} ({o.candidate.cost[0] / 1e3:,.2f} ms)")
    elif res.shortfall:
        policy, device, over = res.shortfall
        con.print(f"[red]nothing fits[/red]: even under {policy}, device {device} needs {gib(over)} GiB more")


def check_capacity(spec: RunSpec, text: str, capacity_gib: float) -> None:
    """Validate the run under ``--capacity`` before searching, so a problem names the flag."""
    problems = validate_run(replace(spec, hardware=replace(spec.hardware, capacity_gib=capacity_gib)))
    if problems:
        raise SpecError([(k, f"{m} (with --capacity {text})") for k, m in problems], spec.source)


def run(args: argparse.Namespace) -> int:
    cap = parse_capacity(args.capacity) if args.capacity is not None else None
    spec = load(args)
    refuse_step_trace(spec, "fit")
    if cap is not None:
        check_capacity(spec, args.capacity, cap)
    check_work(spec, args.max_events)
    res = fit(spec, templates(), capacity_gib=cap, csv_rows=load_csv_rows(spec), alternatives=args.alternatives)
    if args.json:
        print(json.dumps(fit_dict(res), indent=1))
    else:
        print_result(res)
    return 0 if res.best else 1
