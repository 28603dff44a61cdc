"""``timeline plan RUN.toml --world-size N``: the fastest layout, micro-batch size, schedule and
recompute policy that fits on N GPUs, from a space of candidates (:mod:`timeline.plan`)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from rich.table import Table

from timeline.cli.capacity import add_capacity, with_capacity
from timeline.cli.common import (
    add_max_events,
    add_run_args,
    check_output_dir,
    check_work,
    console,
    gib,
    load,
    positive,
    refuse_step_trace,
    templates,
)
from timeline.cli.plan_files import default_output, write_outputs
from timeline.errors import UserError
from timeline.plan.engines import ENGINES, make_engine
from timeline.plan.search import PlanResult, Row, known, plan
from timeline.plan.space import build_space
from timeline.spec.run import RunSpec

HELP = "search layouts, micro-batch sizes, schedules and recompute for the fastest job that fits N GPUs"
DESCRIPTION = """\
Enumerate candidates — TP/PP/VPP/CP/EP/ETP (dp = N/(tp·pp·cp)), micro-batch size, schedule and
recompute policy — around the run file (which fixes the model, hardware, sequence length and
everything else), bound each one statically (milliseconds), simulate only those the bound cannot
rule out (fastest first: each is timed before its memory is simulated, summary level) and rank
the ones whose peak reserved memory fits every device by iteration time, then max peak reserved,
then name.

Default space (without --space): every factorisation of N into tp·pp·cp·dp with ep·etp dividing
dp·tp·cp, vpp 1 and 2, micro-batch 1 and 2, schedules 1f1b, interleaved, dualpipe, dualpipev,
recompute none / the selective sets `timeline fit` keeps / full:uniform:1. num_microbatches =
G/(micro_batch_size·dp) (Megatron's rule). When pp·vpp does not divide the layers, the middle
virtual stages get ⌈layers/(pp·vpp)⌉ each and the first and last share the rest, the first taking
the larger half (Megatron's decoder_first/last_pipeline_num_layers).

SPACE.toml holds one table:
  [space]
  "parallel.tp" = [1, 2, 4, 8]
  "schedule.kind" = ["1f1b", "dualpipe"]
  "recompute" = ["none", "selective:core_attn", "full:uniform:1"]
  "parallel.pp" = "auto"            # the default space's values
Other run-file keys (e.g. "training.zero" = [0, 1]) are searched too.

Writes DIR (default runs/<run name>-plan/): plan.parquet (one row per candidate, sorted by the
candidate string), plan.log (timings), best/01.toml … (the top K as run files `timeline simulate`
opens). Progress goes to stderr.

examples:
  timeline plan schedules/deepseek-v3-pp16-tp2-ep8.toml --world-size 256 --space space.toml
  timeline plan RUN.toml --world-size 2048 --global-batch-size 15360 --engine ray --address auto
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    add_run_args(parser)
    parser.add_argument("--world-size", type=positive, required=True, metavar="N", help="GPUs of the job")
    add_capacity(parser, "the run's hardware.capacity_gib (hardware.non_pytorch_gib is still subtracted)")
    parser.add_argument("--global-batch-size", type=positive, metavar="G", help="sequences per iteration "
                        "(default: the run file's num_microbatches · micro_batch_size · dp)")
    parser.add_argument("--space", metavar="SPACE.toml", help="the candidate space (default: see above)")
    parser.add_argument("--top", type=positive, default=10, metavar="K", help="candidates to show and write (10)")
    parser.add_argument("--engine", choices=ENGINES, default="local", help="where simulations run (local)")
    parser.add_argument("--workers", type=positive, default=2, metavar="W", help="worker processes (2)")
    parser.add_argument("--address", metavar="ADDR", help="--engine ray: a running cluster (auto, ray://HOST:PORT)")
    parser.add_argument("-o", "--output", metavar="DIR", help="output folder (default: runs/<run name>-plan/)")
    parser.add_argument("--force", action="store_true", help="replace DIR if timeline wrote it")
    parser.add_argument("--max-simulations", type=positive, metavar="N", help="stop after N simulations; the "
                        "candidates left are marked budget and the ranking is the best of those simulated")
    add_max_events(parser, "memory events per simulated candidate")


def read_space(path: str) -> dict:
    from timeline.io.runfile import read_toml

    data = read_toml(Path(path))
    if set(data) != {"space"} or not isinstance(data["space"], dict):
        raise UserError(f"{path}: a space file holds one table, [space], of run-file keys with lists of values")
    return data["space"]


def default_selective(spec: RunSpec) -> tuple[str, ...]:
    """The selective sets `timeline fit` keeps (undominated), judged on the run's two-layer probe."""
    from timeline.compare.fit import Statics, selective_space
    from timeline.graph.build import chunk_layers
    from timeline.plan.bound import Probe
    from timeline.sim.plan import plan_pipeline
    from timeline.spec.run import RecomputeSpec

    probe = replace(spec, **Probe.of(spec.model, spec.recompute, spec.parallel, spec.training).edits())
    par = probe.parallel
    pipe = plan_pipeline(probe.schedule, par, probe.training.num_microbatches, probe.hardware, probe.csv_rows)
    st = Statics(templates()(probe), pipe, probe.model, chunk_layers(par, probe.model.num_hidden_layers))
    kept, _ = selective_space(st, st.candidate(RecomputeSpec()))
    return tuple(sorted(c.name for c in kept))


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    spec = with_capacity(load(args), args)
    refuse_step_trace(spec, "plan", "parallel layouts, micro-batch sizes, schedules and recompute policies")
    if args.address and args.engine != "ray":
        raise UserError("--address applies to --engine ray only")
    check_work(spec, args.max_events)
    table = read_space(args.space) if args.space else {}
    par, tr = spec.parallel, spec.training
    global_batch = args.global_batch_size or tr.num_microbatches * tr.micro_batch_size * par.dp
    needs_default = table.get("recompute", "auto") == "auto"
    space = build_space(spec.model, table, world=args.world_size, global_batch=global_batch,
                        selective=default_selective(spec) if needs_default else (),
                        where=args.space or "--space")
    out = Path(args.output) if args.output else default_output(spec.name)
    check_output_dir(out, args.force)
    stamps: dict[str, float] = {"setup": time.perf_counter() - t0}
    last = [0.0]

    seen: dict[str, tuple[int, int]] = {}

    def progress(stage: str, done: int, total: int) -> None:
        """One stderr line at most every 2 s (and at the end of each stage)."""
        seen[stage] = (done, total)
        now = time.perf_counter()
        if stage == "bounded":
            stamps["bounding"] = now - t1
        if stage == "fitting" or (done < total and now - last[0] < 2.0):
            return
        last[0] = now
        parts = [f"{s} {d:,} / {t:,}" if s != "fitting" else f"fitting {d:,}" for s, (d, t) in seen.items()]
        print("plan: " + " · ".join(parts), file=sys.stderr)

    engine = make_engine(args.engine, args.workers, args.address)
    try:
        t1 = time.perf_counter()
        res = plan(spec, space, engine, keep=args.top, max_events=args.max_events,
                   max_simulations=args.max_simulations or 0, progress=progress)
        stamps["search"] = time.perf_counter() - t1
        stamps["simulating"] = stamps["search"] - stamps.get("bounding", 0.0)
    finally:
        engine.close()
    print_result(res, args.top)
    t2 = time.perf_counter()
    stamps["writing"] = 0.0  # set as plan.log is written, last (plan_log)
    stamps["total"] = t2 - t0
    write_outputs(out, args.force, res, spec, args, lambda: plan_log(res, args, stamps, t2))
    print(f"wrote {out}{os.sep}", file=sys.stderr)
    return 0 if res.ranked else 1


def plan_log(res: PlanResult, args: argparse.Namespace, stamps: dict[str, float], writing_since: float) -> str:
    """plan.log: the command, the counts, wall times per phase (``bounding``: every candidate's
    coarse bound; ``simulating``: the rest of the search, exact bounds included; ``writing``:
    plan.parquet and the best run files, up to this log) and the parent's peak RSS."""
    import resource

    now = time.perf_counter()
    stamps = {**stamps, "writing": now - writing_since, "total": stamps["total"] + now - writing_since}
    lines = [f"timeline plan {args.run} --world-size {args.world_size} (engine {args.engine}, "
             f"{args.workers} workers{f', address {args.address}' if args.address else ''})",
             f"global batch {res.space.global_batch}; capacity {gib(res.capacity_bytes)} GiB",
             "counts: " + ", ".join(f"{k} {v:,}" for k, v in res.counts.items())]
    lines += [f"wall {k}: {v:,.1f} s" for k, v in stamps.items()]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    lines.append(f"peak RSS of this process: {peak / 2**20:,.2f} GiB")
    return "\n".join(lines) + "\n"


def _why(r: Row, kth: Row | None) -> str:
    if r.pruned_by == "oom":
        return f"short of {gib(r.short_bytes)} GiB on device {r.worst_device}"
    if r.fits and kth is not None:
        return f"{(known(r.iteration_time_us) - known(kth.iteration_time_us)) / 1e3:,.1f} ms slower than #{kth.rank}"
    return r.pruned_by or ""


def print_result(res: PlanResult, top: int) -> None:
    con = console()
    c = res.counts
    con.print(f"{c['candidates']:,} candidates: {c['invalid']:,} invalid, {c['bounded']:,} bounded "
              f"({c['static_bound']:,} ruled out by the static bound), {c['simulated']:,} simulated "
              f"({c['oom']:,} short of memory), {c['fit']:,} fit; {c['time_bound']:,} not simulated (their time "
              f"bound is slower than the top {top})" + (f", {c['too_large']:,} over --max-events" if c['too_large']
                                                        else "")
              + (f", {c['budget']:,} left unsimulated by --max-simulations (the ranking is the best of those "
                 "simulated)" if c['budget'] else "") + f"; capacity {gib(res.capacity_bytes)} GiB")
    table = Table(title="fastest candidates that fit (GiB; ms per iteration)")
    for col in ("#", "candidate", "max peak reserved", "min headroom", "iteration ms", "tokens/s/GPU", "note"):
        table.add_column(col, justify="left" if col in ("candidate", "note") else "right")
    best = res.ranked[:top]
    for r in best:
        peak = known(r.peak_reserved_bytes)
        table.add_row(str(r.rank), r.name, gib(peak), gib(res.capacity_bytes - peak),
                      f"{known(r.iteration_time_us) / 1e3:,.1f}", f"{r.tokens_per_s_per_gpu:,.0f}", "", style="green"
                      if r.rank == 1 else None)
    kth = best[-1] if best else None
    losers = res.ranked[top:top + 3] + sorted((r for r in res.rows.values() if r.pruned_by == "oom"),
                                             key=lambda r: (known(r.iteration_time_us), r.name))[:3]
    for r in losers:
        peak = known(r.peak_reserved_bytes)
        table.add_row("-" if r.rank is None else str(r.rank), r.name, gib(peak),
                      gib(res.capacity_bytes - peak), f"{known(r.iteration_time_us) / 1e3:,.1f}",
                      f"{r.tokens_per_s_per_gpu:,.0f}", _why(r, kth), style="dim" if r.fits else "red")
    con.print(table)
    if not res.ranked:
        con.print("[red]nothing fits[/red]")
