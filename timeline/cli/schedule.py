"""``timeline schedule RUN.toml``: draw the run's pipeline schedule (ranks × time) or write it
as a PyTorch-pipelining CSV."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from timeline.cli.common import add_run_args, check_csv_schedule, load, write_file_atomically
from timeline.pipeline import render

if TYPE_CHECKING:
    from timeline.pipeline.actions import Schedule
from timeline.sim.plan import run_schedule_of
from timeline.spec.schedule_rules import kinds_help

HELP = "draw the pipeline schedule in the terminal, or write it as CSV"
DESCRIPTION = """\
Draw the run's schedule: one row per pipeline rank, one column per unit time step (F, I and W
take one step, a full backward B two); each cell is an action [stage][F|B|I|W][micro-batch],
'.' is idle. --csv writes PyTorch pipelining's CSV (one row per rank), which a run file can
read back with [schedule] kind = "csv".

examples:
  timeline schedule schedules/deepseek-v3-pp16-tp2-ep8.toml --set parallel.pp=4 --set training.num_microbatches=8
  timeline schedule RUN.toml --set schedule.kind=zbv --set parallel.vpp=2 --csv my.csv
  timeline schedule schedules/deepseek-v3-pp16-tp2-ep8.toml --steps 0:20     the first 20 steps

Without --steps a row longer than 100 columns is cut into windows of steps printed one after
the other, each with its step numbers, so no line is wider than 100 columns.

schedule kinds ([schedule] kind):
""" + kinds_help() + "\n"


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    add_run_args(parser)
    parser.add_argument("--csv", metavar="FILE", help="write the schedule as CSV to FILE ('-' for stdout)")
    parser.add_argument("--force", action="store_true", help="replace the --csv FILE if it exists")
    parser.add_argument("--steps", type=step_window, metavar="A:B",
                        help="draw only unit steps A … B−1 (0-based, half-open; A: or :B leave an end open)")


#: widest line ``schedule`` prints without --steps
LINE_WIDTH = 100


def step_window(text: str) -> tuple[int, int | None]:
    """argparse type for ``--steps A:B`` (0-based, half-open; either end may be left out)."""
    a, sep, b = text.partition(":")
    try:
        lo = int(a) if a.strip() else 0
        hi = int(b) if b.strip() else None
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A:B with whole numbers, e.g. 0:40, got {text!r}") from None
    if not sep or lo < 0 or (hi is not None and hi <= lo):
        raise argparse.ArgumentTypeError(f"expected A:B with 0 ≤ A < B, e.g. 0:40, got {text!r}")
    return lo, hi


def windows(schedule: Schedule, total_steps: int) -> str:
    """The whole schedule as consecutive windows of steps, each line at most :data:`LINE_WIDTH`."""
    first = render(schedule, steps=(0, 1)).splitlines()
    cell = len(first[1]) - len(first[1].split("|")[0]) - 2  # the width of one step's cell
    label = len(first[1].split("|")[0]) + 2
    per = max(1, (LINE_WIDTH - label + 1) // (cell + 1))
    parts = []
    for lo in range(0, total_steps, per):
        text = render(schedule, steps=(lo, lo + per))
        head, body = text.split("\n", 1)
        parts.append(head.replace(f" [0:{min(per, total_steps)}]", "") + f"\n(in windows of {per} steps; "
                     "--steps A:B draws one)\n" + body if lo == 0 else body)
    return "\n".join(parts)


def run(args: argparse.Namespace) -> int:
    spec = load(args)
    check_csv_schedule(spec)
    schedule = run_schedule_of(spec.schedule, spec.parallel, spec.training.num_microbatches, spec.csv_rows)
    if args.csv:
        from timeline.io.csv_schedule import write_csv
        text = write_csv(schedule)
        if args.csv == "-":
            sys.stdout.write(text)
        else:
            def write(path: Path) -> None:
                path.write_text(text, encoding="utf-8")

            write_file_atomically(Path(args.csv), write, flag="--csv", force=args.force)
        return 0
    if args.steps is not None:
        sys.stdout.write(render(schedule, steps=args.steps))
        return 0
    text = render(schedule)
    if max(len(line) for line in text.splitlines()[1:]) <= LINE_WIDTH:
        sys.stdout.write(text)
    else:
        total = len(text.splitlines()[1].split("|")[1].split())
        sys.stdout.write(windows(schedule, total))
    return 0
