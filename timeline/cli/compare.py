"""``timeline compare RUN.toml --recompute P1,P2,…`` or ``timeline compare A.toml B.toml …``:
simulate each variant and print peaks per device against recompute cost; ``-o DIR`` also
writes compare.parquet, memory.png and peaks.png."""

from __future__ import annotations

import argparse
import json
import re
from functools import partial
from pathlib import Path

from timeline.cli.capacity import add_capacity, with_capacity
from timeline.cli.common import (
    RECOMPUTE_FORMS,
    SET_HELP,
    add_max_events,
    check_csv_schedule,
    check_output_dir,
    check_work,
    gib,
    positive,
    refuse_step_trace,
    templates,
    write_dir_atomically,
)
from timeline.cli.progress import progress_reporter
from timeline.cli.tables import Column, View, add_wide, table_console
from timeline.cli.variants import policy_variants
from timeline.compare.metrics import MAX_WORKERS, VariantResult, simulate_variants
from timeline.compare.plots import memory_png, peaks_png
from timeline.compare.report import SCHEMA, compare_columns, compare_dict
from timeline.compare.variants import Variant
from timeline.errors import UserError
from timeline.exporters import EXPORTERS
from timeline.exporters.parquet_util import write_table
from timeline.io.runfile import load_run
from timeline.result.timeline import Timeline

HELP = "compare recompute policies or run files side by side: peak memory per device vs recompute cost"
DESCRIPTION = """\
Simulate every variant — one per --recompute policy, or one per run file — and print, per
variant and device: peak allocated and reserved memory, fragmentation, saved activations at the
peak, recomputed TFLOPs and time per iteration, iteration time, and headroom to capacity (OOM
marked). Policies use the grammar none | selective:MOD[+MOD…] | full:uniform|block:N[,N…]
(one N per pipeline rank, or one for all).

  -o DIR writes compare.parquet (one row per variant × device), memory.png (memory over time
  of each variant's worst device on shared axes, stacked by category, capacity, peak, OOMs and
  iteration boundaries drawn), peaks.png (peak reserved per pipeline rank, one bar per variant),
  variants.json and DIR/<variant>/summary.json + memory.parquet (`timeline report DIR` reads them).

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
    add_capacity(parser, "each run's hardware.capacity_gib")
    add_wide(parser)
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress on stderr (a bar on a terminal, plain lines otherwise)")
    parser.add_argument("--workers", type=positive, default=MAX_WORKERS, metavar="N",
                        help=f"simulate in up to N processes (default {MAX_WORKERS}; more than {MAX_WORKERS} "
                             f"still uses {MAX_WORKERS}: each holds a whole simulation; 1: in process)")


def build_variants(args: argparse.Namespace) -> list[Variant]:
    variants: list[Variant] = []
    for path in args.runs:
        run = with_capacity(load_run(path, args.overrides), args)
        check_csv_schedule(run)
        if args.recompute:
            prefix = f"{run.name}/" if len(args.runs) > 1 else ""
            variants += policy_variants(run, args.recompute, prefix=prefix)
        else:
            variants.append(Variant(name=run.name, run=run))
    if len(variants) < 2:
        raise UserError("compare needs two or more variants: several run files, or "
                        "--recompute none,selective:core_attn,full:uniform:1 (any of the policies)")
    seen: dict[str, int] = {}
    out = []
    for v in variants:  # two run files with the same name stay apart
        seen[v.name] = seen.get(v.name, 0) + 1
        out.append(v if seen[v.name] == 1 else Variant(name=f"{v.name}#{seen[v.name]}", run=v.run))
    return out


#: the comparison table; ``--wide`` adds the columns marked wide
COLUMNS = (Column("variant", justify="left"), Column("pp\nrank"), Column("device"), Column("peak\nalloc"),
           Column("peak\nreserved"), Column("frag."), Column("act. at\npeak", wide=True),
           Column("recompute\nTFLOP", wide=True), Column("recompute\nms"), Column("iteration\nms"),
           Column("headroom"))


#: longest variant name on one row; a longer one continues on the variant's next rows
NAME_WIDTH = 22


def name_lines(name: str, rows: int, width: int = NAME_WIDTH) -> list[str]:
    """``name`` cut after a ``+`` or ``,`` into pieces of at most ``width`` characters (where it
    can), one per table row of the variant — its other rows have no name to show — padded with
    empty strings to ``rows``; what does not fit stays on the last row."""
    pieces, cur = [], ""
    for part in re.split(r"(?<=[+,])", name):
        if cur and len(cur) + len(part) > width:
            pieces.append(cur)
            cur = "  " + part
        else:
            cur += part
    pieces.append(cur)
    if len(pieces) > rows:
        pieces = pieces[:rows - 1] + ["".join(p.strip() for p in pieces[rows - 1:])]
    return pieces + [""] * (rows - len(pieces))


def print_table(results: list[VariantResult], *, wide: bool = False) -> None:
    view = View("recompute comparison (GiB; time per iteration; frag. = reserved − allocated at the peak)",
                COLUMNS, wide=wide)
    for res in results:
        names = name_lines(res.name, len(res.devices))
        for i, d in enumerate(res.devices):
            room = gib(d.headroom_bytes) + ("" if d.fits else " OOM")
            view.row(names[i], str(d.pp_rank), str(d.device), gib(d.peak_allocated_bytes),
                     gib(d.peak_reserved_bytes), gib(d.fragmentation_bytes), gib(d.activations_at_peak_bytes),
                     f"{d.recompute_flops / 1e12:,.2f}", f"{d.recompute_time_us / 1e3:,.2f}",
                     f"{d.iteration_time_us / 1e3:,.1f}", room,
                     style=None if d.fits else "red", end_section=i == len(res.devices) - 1)
    view.print(table_console(wide))


def variant_dirs(variants: list[Variant]) -> dict[str, str]:
    """A folder name per variant: its name with every character but letters, digits, ``.``, ``_``
    and ``-`` written as ``_`` (``selective:core_attn`` → ``selective_core_attn``), numbered on
    a clash."""
    out: dict[str, str] = {}
    for v in variants:
        base = re.sub(r"[^A-Za-z0-9._-]", "_", v.name).strip(".") or "variant"
        name, k = base[:100], 2
        while name in out.values():
            name, k = f"{base[:96]}-{k}", k + 1
        out[v.name] = name
    return out


def write_variant(folder: Path, dirs: dict[str, str], tl: Timeline, variant: Variant) -> None:
    """``folder/<variant>/summary.json`` and ``memory.parquet`` (run in the worker that simulated it)."""
    import importlib

    sub = folder / dirs[variant.name]
    sub.mkdir()
    for fmt in VARIANT_FORMATS:
        module = importlib.import_module(EXPORTERS[fmt])
        with open(sub / module.FILENAME, "wb") as handle:
            module.write(tl, handle, {})


#: what compare -o writes per variant (what `timeline report` and `timeline plot` read)
VARIANT_FORMATS = ("summary", "memory")


def write_results(results: list[VariantResult], folder: Path, dirs: dict[str, str] | None = None) -> None:
    """compare.parquet, memory.png, peaks.png (and variants.json naming each variant's folder) into ``folder``."""
    if dirs is not None:
        (folder / "variants.json").write_text(json.dumps(
            {"schema": "timeline.compare-variants/1",
             "variants": [{"name": r.name, "dir": dirs[r.name]} for r in results]}, indent=1) + "\n", encoding="utf-8")
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
    holder: list[list[VariantResult]] = []
    with progress_reporter("compare", not args.no_progress) as progress:
        if out is None:
            holder.append(simulate_variants(variants, templates(), workers=args.workers, progress=progress))
        else:  # the variants write their own summary.json and memory.parquet as they finish
            dirs = variant_dirs(variants)

            def write(folder: Path) -> None:
                holder.append(simulate_variants(variants, templates(), workers=args.workers, progress=progress,
                                                on_timeline=partial(write_variant, folder, dirs)))
                write_results(holder[0], folder, dirs)

            write_dir_atomically(out, args.force, write, command="compare")
    results = holder[0]
    if args.json:
        print(json.dumps(compare_dict(results), indent=1))
        return 0
    print_table(results, wide=args.wide)
    if out is not None:
        table_console().print(f"wrote {out}/ (compare.parquet, memory.png, peaks.png, variants.json and "
                              "<variant>/summary.json + memory.parquet; `timeline report` makes a page of it)")
    return 0
