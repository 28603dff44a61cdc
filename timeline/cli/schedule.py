"""``timeline schedule RUN.toml``: draw the run's pipeline schedule (ranks × time) or write it
as a PyTorch-pipelining CSV."""

from __future__ import annotations

import argparse
import sys

from timeline.cli.common import add_run_args, load, load_csv_rows
from timeline.errors import UserError
from timeline.pipeline import build_schedule, render

HELP = "draw the pipeline schedule in the terminal, or write it as CSV"
DESCRIPTION = """\
Draw the run's schedule: one row per pipeline rank, one column per unit time step (F, I and W
take one step, a full backward B two); each cell is an action [stage][F|B|I|W][micro-batch],
'.' is idle. --csv writes PyTorch pipelining's CSV (one row per rank), which a run file can
read back with [schedule] kind = "csv".

examples:
  timeline schedule schedules/deepseek-v3-pp16-tp2-ep8.toml --set parallel.pp=4 --set training.num_microbatches=8
  timeline schedule RUN.toml --set schedule.kind=zbv --set parallel.vpp=2 --csv my.csv
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    add_run_args(parser)
    parser.add_argument("--csv", metavar="FILE", help="write the schedule as CSV to FILE ('-' for stdout)")


def run(args: argparse.Namespace) -> int:
    spec = load(args)
    par, tr = spec.parallel, spec.training
    rows = load_csv_rows(spec)
    schedule = build_schedule(spec.schedule.kind, pp=par.pp, vpp=par.vpp, num_microbatches=tr.num_microbatches,
                              microbatch_group_size=spec.schedule.microbatch_group_size, csv_rows=rows)
    if args.csv:
        from timeline.io.csv_schedule import write_csv
        text = write_csv(schedule)
        if args.csv == "-":
            sys.stdout.write(text)
        else:
            try:
                with open(args.csv, "w", encoding="utf-8") as f:
                    f.write(text)
            except OSError as exc:
                raise UserError(f"--csv {args.csv}: {exc.strerror or exc}") from None
        return 0
    sys.stdout.write(render(schedule))
    return 0
