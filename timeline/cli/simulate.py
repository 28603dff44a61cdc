"""``timeline simulate RUN.toml [-o DIR]``: simulate every device over time and write the run
directory (summary.json, memory.parquet, events.parquet, ops.parquet, devices.parquet,
trace.json, snapshot.pickle; trace.perfetto-trace on request)."""

from __future__ import annotations

import argparse
from pathlib import Path

from timeline.cli.capacity import add_capacity, with_capacity
from timeline.cli.common import (
    add_max_events,
    add_run_args,
    check_csv_schedule,
    check_output_dir,
    check_work,
    count,
    exporter_writer,
    gib,
    load,
    templates,
    write_dir_atomically,
)
from timeline.cli.notes import notes
from timeline.cli.progress import progress_reporter
from timeline.cli.tables import Column, View, add_wide, table_console
from timeline.compare.variants import recompute_name
from timeline.errors import UserError
from timeline.exporters import DEFAULT_FORMATS, EXPORTERS
from timeline.result.build import SUMMARY_LEVEL, build_timeline
from timeline.result.categories import CATEGORIES
from timeline.result.queries import explain_peak, worst_device
from timeline.result.timeline import Timeline
from timeline.spec.run import RunSpec

HELP = "simulate memory over time on every device and write the run directory"
DESCRIPTION = """\
Simulate the run's pipeline schedule on every pipeline rank's representative device: static
state, every micro-batch's saved activations, recomputation, communication buffers, each
device's allocator. Prints a per-device peak table and writes DIR (default runs/<run name>/):

  summary.json     resolved run; per device: peaks (requested/allocated/reserved), when,
                   breakdown by category, top tensors at the peak, OOM
  memory.parquet   per device, one row per distinct time: bytes by category
  events.parquet   every alloc/free with tensor, op, micro-batch, stage, address
  ops.parquet      every op span
  devices.parquet  one row per device: global rank, pp rank, stages, represents, capacity
  trace.json       Chrome trace: open in ui.perfetto.dev (a process per device, op slices
                   per stream, memory counters per category, peak and OOM markers)
  snapshot.pickle  PyTorch memory snapshot: open in pytorch.org/memory_viz (device i there is
                   the i-th row of the table; timeline_devices in the pickle maps it)
  trace.perfetto-trace   (--format …,perfetto) the same trace as native Perfetto protobuf,
                   byte-valued counters; needs pip install 'timeline[perfetto]'

Every file numbers devices by their global rank. `timeline report DIR` turns DIR into one
self-contained HTML page.

examples:
  timeline simulate schedules/deepseek-v3-pp16-tp2-ep8.toml
  timeline simulate RUN.toml -o out/ --force --set training.num_microbatches=64
  timeline simulate RUN.toml --recompute selective:core_attn+moe_act
  timeline simulate RUN.toml --format summary,trace,perfetto --gzip --max-samples 20000
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    add_run_args(parser, recompute=True)
    parser.add_argument("-o", "--output", metavar="DIR", help="run directory (default: runs/<run name>/)")
    parser.add_argument("--force", action="store_true", help="replace DIR if it exists")
    parser.add_argument("--format", default=",".join(DEFAULT_FORMATS),
                        help=f"comma-separated outputs to write (default: {','.join(DEFAULT_FORMATS)})")
    parser.add_argument("--gzip", action="store_true", help="write trace.json.gz instead of trace.json")
    parser.add_argument("--max-samples", type=count, default=0, metavar="N",
                        help="at most N memory counter samples per device in the traces; peaks are kept "
                             "(default 0: every distinct time)")
    parser.add_argument("--snapshot-entries", type=count, default=DEFAULT_SNAPSHOT_ENTRIES, metavar="N",
                        help="keep each device's last N snapshot trace entries, like PyTorch's ring buffer "
                             f"(default {DEFAULT_SNAPSHOT_ENTRIES:,}; 0: all)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress on stderr (a bar on a terminal, plain lines otherwise)")
    add_capacity(parser, "the run's hardware.capacity_gib")
    add_wide(parser)
    add_max_events(parser)


#: memory_viz slows down past a few hundred thousand entries per device
DEFAULT_SNAPSHOT_ENTRIES = 200_000


def parse_formats(text: str) -> list[str]:
    """``--format a,b`` → the exporter names, each known, at least one."""
    formats = [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in formats if f not in EXPORTERS]
    if unknown:
        raise UserError(f"--format: unknown output {unknown[0]!r}; choose from {', '.join(EXPORTERS)}")
    if not formats:
        raise UserError(f"--format: name at least one output; choose from {', '.join(EXPORTERS)}")
    return formats


def write_outputs(tl: Timeline, out: Path, formats: list[str], force: bool, options: dict | None = None) -> None:
    """Write the run directory ``out`` with the named exporters (see :func:`write_dir_atomically`)."""
    write_dir_atomically(out, force, exporter_writer(tl, formats, options), command="simulate")


def default_output(name: str) -> Path:
    """``runs/NAME``; the run-file reader has checked NAME, and the folder must stay inside runs/."""
    root = Path("runs").resolve()
    out = (root / name).resolve()
    if out.parent != root:
        raise UserError(f"name {name!r}: runs/{name} is not a folder inside runs/; choose another name")
    return Path("runs") / name


#: the per-device table; ``--wide`` adds the columns marked wide
COLUMNS = (Column("pp\nrank"), Column("device"), Column("×"), Column("peak\nalloc"), Column("frag."),
           Column("at (ms)"), Column("iter", wide=True), Column("dominant"), Column("peak\nreserved"),
           Column("reserved\nat (ms)", wide=True), Column("act/\nµbatch", wide=True), Column("capacity", wide=True),
           Column("first OOM\n(GiB at ms)"))


def simulated_run(tl: Timeline) -> RunSpec:
    """The run a simulated Timeline resolved (a replay has none: it never reaches this table)."""
    if tl.meta.run is None:
        raise UserError("a replayed snapshot has no run to tabulate")
    return tl.meta.run


def table_title(tl: Timeline) -> str:
    """What was simulated, the resolved recompute policy included (``selective`` alone is
    ``selective:core_attn``), so a pasted table says what it shows."""
    run = simulated_run(tl)
    p = run.parallel
    return (f"{run.name}: {run.schedule.kind}, {run.training.num_microbatches} micro-batches, PP{p.pp} TP{p.tp} "
            f"EP{p.ep} DP{p.dp}\nprofile {run.profile}, recompute {recompute_name(run.recompute)}, "
            + (f"offload {'+'.join(run.offload.modules)}, " if run.offload.modules else "")
            + f"{run.allocator.kind} allocator (GiB; frag. = reserved − allocated at the peak)")


def print_table(tl: Timeline, *, wide: bool = False) -> None:
    view = View(table_title(tl), COLUMNS, wide=wide)
    cap = simulated_run(tl).hardware.capacity_bytes
    for d, dev in enumerate(tl.devices):
        pk = tl.peak(d)
        dom = max(CATEGORIES, key=lambda c: pk.breakdown_bytes[c])
        oom = tl.memory[d].oom
        view.row(str(dev.pp_rank), str(dev.device), str(dev.represents), gib(pk.allocated_bytes),
                 gib(pk.fragmentation_bytes), f"{pk.requested_time_us / 1e3:,.1f}", str(tl.peak_iteration(d)),
                 f"{dom} {gib(pk.breakdown_bytes[dom])}", gib(pk.reserved_bytes),
                 f"{pk.reserved_time_us / 1e3:,.1f}", gib(dev.activation_bytes_per_microbatch), gib(cap),
                 f"+{gib(oom[0]['request_bytes'])} at {oom[0]['t_us'] / 1e3:,.1f}" if oom else "-")
    view.print(table_console(wide))
    con = table_console()
    for line in notes(tl):
        con.print(line, markup=False, highlight=False)
    con.print(f"iteration time {tl.meta.iteration_time_us / 1e3:,.1f} ms; {tl.num_events:,} memory events")
    con.print(explain_worst(tl), markup=False, highlight=False)


def explain_worst(tl: Timeline) -> str:
    """One paragraph on the device with the highest peak: when, during which action, how many
    micro-batches' activations it holds, and its largest live tensors."""
    why = explain_peak(tl, worst_device(tl))
    dev, pk, flight = why.device, why.peak, why.in_flight
    top = ", ".join(f"{t['tensor']} {gib(t['bytes'])} GiB ({t['category']}"
                    + (f", µbatch {t['microbatch']}" if t["microbatch"] >= 0 else "") + ")" for t in why.largest)
    return (f"worst: pp rank {dev.pp_rank} (device {dev.device}) reserves {gib(pk.reserved_bytes)} GiB at "
            f"{pk.reserved_time_us / 1e3:,.1f} ms; its requested "
            f"peak {gib(pk.requested_bytes)} GiB comes at {pk.requested_time_us / 1e3:,.1f} ms during {why.action}, "
            f"holding activations of {len(flight)} micro-batch(es) on stage(s) {', '.join(map(str, why.stages)) or '-'}; "
            f"largest live non-static tensors: {top or '-'}")


def run(args: argparse.Namespace) -> int:
    formats = parse_formats(args.format)
    spec = with_capacity(load(args), args)
    out = Path(args.output) if args.output else default_output(spec.name)
    check_output_dir(out, args.force)
    summary_only = set(formats) <= SUMMARY_LEVEL  # one device in memory at a time
    check_work(spec, args.max_events, formats, out, per_device=summary_only)
    check_csv_schedule(spec)
    with progress_reporter("simulate", not args.no_progress) as progress:
        tl = build_timeline(spec, templates(), progress=progress, summary_only=summary_only)
        progress("writing", 0, len(formats))
        write_outputs(tl, out, formats, args.force, {"gzip": args.gzip, "max_samples": args.max_samples,
                                                     "max_entries": args.snapshot_entries})
        progress("writing", len(formats), len(formats))
    print_table(tl, wide=args.wide)
    table_console().print(f"wrote {out}/")
    return 0
