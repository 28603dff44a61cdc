"""Arguments shared by subcommands that read a run file (``RUN.toml``, ``--set``)."""

from __future__ import annotations

import argparse
import shutil

from rich.console import Console

from timeline.io.runfile import load_run
from timeline.spec.run import RunSpec

SET_HELP = ("override a run-file key, e.g. --set parallel.tp=4 --set schedule.kind=gpipe "
            "(repeatable; values are TOML literals, bare words are strings)")


def add_run_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN.toml", help="run file (see schedules/ for examples)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help=SET_HELP)


def load(args: argparse.Namespace) -> RunSpec:
    return load_run(args.run, args.overrides)


def gib(n: int | float) -> str:
    return f"{n / 2**30:,.2f}"


def console() -> Console:
    """A console that does not squeeze tables when output is piped."""
    width = shutil.get_terminal_size((160, 40)).columns
    return Console(width=max(width, 140))
