"""``timeline fit RUN.toml [--capacity 80GiB]``: the recompute policy with the least recompute
time whose peak reserved memory fits every device, with runner-ups, or by how much none fits."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable

from timeline.cli.capacity import add_capacity, with_capacity
from timeline.cli.common import (
    add_max_events,
    add_run_args,
    check_csv_schedule,
    check_work,
    count,
    gib,
    load,
    refuse_step_trace,
    templates,
)
from timeline.cli.progress import progress_reporter
from timeline.cli.tables import Column, View, table_console
from timeline.compare.fit import FitResult, Outcome, Statics, fit
from timeline.compare.metrics import SourceFn, VariantResult, evaluate
from timeline.compare.variants import Variant
from timeline.errors import SpecError
from timeline.graph.build import chunk_layers
from timeline.profiles import LIMITS
from timeline.sim.plan import plan_pipeline
from timeline.spec.run import RecomputeSpec, RunSpec
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

--capacity takes a size with a unit (80GiB, 80GB, 81920MiB, 0.5TiB, 85899345920B) or a bare
number of GiB (--capacity 80 is 80 GiB); --capacity-gib 80 is the same.

examples:
  timeline fit schedules/deepseek-v3-pp16-tp2-ep8.toml --capacity 80GiB
  timeline fit RUN.toml --capacity 64GiB --json
"""
def prepare_parser(parser: argparse.ArgumentParser) -> None:
    add_run_args(parser)
    add_capacity(parser, "the run's hardware.capacity_gib (hardware.non_pytorch_gib is still subtracted)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress on stderr (a bar on a terminal, plain lines otherwise)")
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


#: the table of policies considered
COLUMNS = (Column("policy", justify="left", no_wrap=False), Column("recompute\nms"), Column("max peak\nreserved"),
           Column("min\nheadroom"), Column("result", justify="left", no_wrap=False))


def print_result(res: FitResult) -> None:
    con = table_console()
    sp = res.space
    con.print(f"search space: none, {sp['selective']} selective sets ({sp['selective_dominated']} dominated sets "
              f"pruned), {sp['uniform']} full:uniform, {sp['block']} full:block; capacity {gib(res.capacity_bytes)} GiB")
    view = View("policies considered, cheapest first (GiB; recompute ms per iteration, slowest rank;\n"
                "short of = reserved beyond capacity = −headroom)", COLUMNS)
    pruned = [o for o in res.outcomes if o.result is None]
    for o in res.outcomes:
        if o.result is None and len(pruned) > 8:
            continue  # summarised below the table
        w = o.result.worst_device() if o.result else None
        style = "dim" if w is None else "green" if o is res.best else None if o.fits else "red"
        view.row(o.candidate.name, f"{o.candidate.cost[0] / 1e3:,.2f}",
                 gib(w.peak_reserved_bytes) if w else "-", gib(w.headroom_bytes) if w else "-", o.note, style=style)
    view.print(con)
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


def fit_run(run: RunSpec, source_fn: SourceFn, *, capacity_gib: float | None = None, alternatives: int = 3,
            max_simulations: int = 24,
            evaluate_fn: Callable[[Variant, SourceFn], VariantResult] = evaluate) -> FitResult:
    """:func:`timeline.compare.fit.fit` over ``run`` (its capacity replaced by ``capacity_gib``):
    the static numbers of the run's model source ``source_fn(run)``, each policy simulated as
    ``evaluate_fn`` simulates a variant of the run."""
    if capacity_gib is not None:
        run = dataclasses.replace(run, hardware=dataclasses.replace(run.hardware, capacity_gib=capacity_gib))
    # every candidate is valid for the model by construction (selective_modules, N ≤ layers per
    # chunk): what can fail is the run under any policy, as a variant would report it
    problems = validate_run(dataclasses.replace(run, recompute=RecomputeSpec()), LIMITS)
    if problems:
        raise SpecError(problems, run.source)
    par = run.parallel
    pipe = plan_pipeline(run.schedule, par, run.training.num_microbatches, run.hardware, run.csv_rows)
    st = Statics(source_fn(run), pipe, run.model, chunk_layers(par, run.model.num_hidden_layers))

    def simulate_policy(name: str, spec: RecomputeSpec) -> VariantResult:
        return evaluate_fn(Variant(name=name, run=dataclasses.replace(run, recompute=spec)), source_fn)

    return fit(st, run.hardware.capacity_bytes, simulate_policy, alternatives=alternatives,
               max_simulations=max_simulations)


def run(args: argparse.Namespace) -> int:
    spec = with_capacity(load(args), args)
    refuse_step_trace(spec, "fit")
    check_work(spec, args.max_events)
    with progress_reporter("fit", not args.no_progress) as progress:
        simulated = [0]

        def evaluate_reporting(variant: Variant, source_fn: SourceFn) -> VariantResult:
            progress(f"simulating {variant.name}; policies simulated", simulated[0], 0)
            result = evaluate(variant, source_fn)
            simulated[0] += 1
            return result

        progress("building the search space", 0, 1)
        check_csv_schedule(spec)
        res = fit_run(spec, templates(), alternatives=args.alternatives, evaluate_fn=evaluate_reporting)
        progress("policies simulated", simulated[0], simulated[0])
    if args.json:
        print(json.dumps(fit_dict(res), indent=1))
    else:
        print_result(res)
    return 0 if res.best else 1
