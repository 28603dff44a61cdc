"""Command-line entry point: one thin module per subcommand, one table naming them.

Each subcommand module exposes ``HELP`` (one line), ``prepare_parser(parser)`` and
``run(args) -> int``. This module only dispatches and turns :class:`~timeline.errors.UserError`
into ``error:`` lines on stderr with exit code 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from timeline import __version__
from timeline.errors import UserError

# name -> module (relative to timeline.cli); a new subcommand is one file and one entry here.
COMMANDS: dict[str, str] = {
    "static": "static",
    "presets": "presets",
    "schedule": "schedule",
    "simulate": "simulate",
    "replay": "replay",
    "compare": "compare",
    "fit": "fit",
    "plot": "plot",
    "capture": "capture",
}

EPILOG = """\
examples:
  timeline static schedules/deepseek-v3-pp16-tp2-ep8.toml          per-device static memory
  timeline static RUN.toml --set parallel.tp=4 --json               override a key, print JSON
  timeline presets                                                   list model presets
"""


def _load(name: str):
    return importlib.import_module(f"timeline.cli.{COMMANDS[name]}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="timeline",
        description="Simulate per-device GPU memory over time for large-model training jobs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"timeline {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = _load(name)
        except ModuleNotFoundError:
            continue  # a subcommand still being built is simply absent
        p = sub.add_parser(name, help=module.HELP, description=getattr(module, "DESCRIPTION", module.HELP),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.prepare_parser(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except UserError as exc:
        for line in exc.lines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `timeline static … --json | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
