"""``timeline compare RUN.toml --recompute P1,P2,…`` or ``timeline compare A.toml B.toml …``:
simulate each variant and print peaks per device against recompute cost; ``-o DIR`` also
writes compare.parquet, memory.png and peaks.png."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.table import Table

from timeline.cli.common import (
    RECOMPUTE_FORMS,
    SET_HELP,
    add_max_events,
    check_output_dir,
    check_work,
    console,
    gib,
    load_csv_rows,
    positive,
    refuse_step_trace,
    templates,
    write_dir_atomically,
)
from timeline.compare.metrics import MAX_WORKERS, VariantResult, simulate_variants
from timeline.compare.plots import memory_png, peaks_png
from timeline.compare.report import SCHEMA, compare_columns, compare_dict
from timeline.compare.variants import Variant, policy_variants
from timeline.errors import UserError
from timeline.exporters.parquet_util import write_table
from timeline.io.runfile import load_run

HELP = "compare recompute policies or run files side by side: peak memory per device vs recompute cost"
DESCRIPTION = """\
Simulate every variant — one per --recompute policy, or one per run file — and print, per
variant and device: peak allocated and reserved memory, fragmentation, saved activations at the
peak, recomputed TFLOPs and time per iteration, iteration time, and headroom to capacity (OOM
marked). Policies use the grammar none | selective:MOD[+MOD…] | full:uniform|block:N[,N…]
(one N per pipeline rank, or one for all).

  -o DIR writes compare.parquet (one row per variant × device), memory.png (memory over time
  of each variant's worst device, stacked by category, capacity drawn) and peaks.png (peak
  reserved per pipeline rank, one bar per variant).

examples:
  timeline compare schedules/deepseek-v3-pp16-tp2-ep8.toml \\
      --recompute none,selective:core_attn,selective:core_attn+moe_act,full:uniform:1 -o cmp/
  timeline compare a.toml b.toml --json
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN.toml", help="run file(s)")
    parser.add_argument("--recompute", action="append", default=[], metavar="POLICY[,POLICY…]",
                        help=f"recompute policies to compare on each run file (repeatable): {RECOMPUTE_FORMS}")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help=SET_HELP + "; applies to every run file")
    parser.add_argument("--json", action="store_true", help=f"print the comparison as JSON ({SCHEMA})")
    parser.add_argument("-o", "--output", metavar="DIR", help="also write compare.parquet and the plots here")
    parser.add_argument("--force", action="store_true", help="replace DIR if it exists")
    add_max_events(parser, "memory events per variant")
    parser.add_argument("--workers", type=positive, default=MAX_WORKERS, metavar="N",
                        help=f"simulate in up to N processes (default {MAX_WORKERS}; more than {MAX_WORKERS} "
                             f"still uses {MAX_WORKERS}: each holds a whole simulation; 1: in process)")


def build_variants(args: argparse.Namespace) -> list[Variant]:
    variants: list[Variant] = []
    for path in args.runs:
        run = load_run(path, args.overrides)
        rows = load_csv_rows(run)
        if args.recompute:
            prefix = f"{run.name}/" if len(args.runs) > 1 else ""
            variants += policy_variants(run, args.recompute, prefix=prefix, csv_rows=rows)
        else:
            variants.append(Variant(name=run.name, run=run, csv_rows=rows))
    if len(variants) < 2:
        raise UserError("compare needs two or more variants: several run files, or "
                        "--recompute none,selective:core_attn,full:uniform:1 (any of the policies)")
    seen: dict[str, int] = {}
    out = []
    for v in variants:  # two run files with the same name stay apart
        seen[v.name] = seen.get(v.name, 0) + 1
        out.append(v if seen[v.name] == 1 else Variant(name=f"{v.name}#{seen[v.name]}", run=v.run,
                                                        csv_rows=v.csv_rows))
    return out


def print_table(results: list[VariantResult]) -> None:
    table = Table(title="recompute comparison (GiB; time per iteration)")
    for col in ("variant", "pp rank", "device", "peak alloc", "peak reserved", "frag.", "act. at peak",
                "recompute TFLOP", "recompute ms", "iteration ms", "headroom"):
        table.add_column(col, justify="left" if col == "variant" else "right", no_wrap=col == "variant")
    for res in results:
        for i, d in enumerate(res.devices):
            room = gib(d.headroom_bytes) + ("" if d.fits else " OOM")
            table.add_row(res.name if i == 0 else "", str(d.pp_rank), str(d.device), gib(d.peak_allocated_bytes),
                          gib(d.peak_reserved_bytes), gib(d.fragmentation_bytes), gib(d.activations_at_peak_bytes),
                          f"{d.recompute_flops / 1e12:,.2f}", f"{d.recompute_time_us / 1e3:,.2f}",
                          f"{d.iteration_time_us / 1e3:,.1f}", room,
                          style=None if d.fits else "red",
                          end_section=i == len(res.devices) - 1)
    console().print(table)


def write_results(results: list[VariantResult], folder: Path) -> None:
    """compare.parquet, memory.png and peaks.png into ``folder``."""
    with open(folder / "compare.parquet", "wb") as handle:
        write_table(compare_columns(results), handle, SCHEMA)
    with open(folder / "memory.png", "wb") as handle:
        memory_png([r.worst for r in results], handle, title="memory over time, worst device per variant")
    with open(folder / "peaks.png", "wb") as handle:
        peaks_png(results, handle)


def run(args: argparse.Namespace) -> int:
    out = Path(args.output) if args.output else None
    if out is not None:
        check_output_dir(out, args.force)
    variants = build_variants(args)
    for v in variants:
        refuse_step_trace(v.run, "compare")
        check_work(v.run, args.max_events, label=f"{v.name}: ")
    results = simulate_variants(variants, templates(), workers=args.workers)
    if out is not None:
        write_dir_atomically(out, args.force, lambda folder: write_results(results, folder), command="compare")
    if args.json:
        print(json.dumps(compare_dict(results), indent=1))
        return 0
    print_table(results)
    if out is not None:
        console().print(f"wrote {out}/ (compare.parquet, memory.png, peaks.png)")
    return 0
