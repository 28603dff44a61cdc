"""Command-line entry point: one thin module per subcommand, one table naming them.

Each subcommand module exposes ``HELP`` (one line), ``prepare_parser(parser)`` and
``run(args) -> int``. This module only dispatches and turns :class:`~timeline.errors.UserError`
into ``error:`` lines on stderr with exit code 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

from timeline import __version__
from timeline.cli.malloc import keep_freed_memory
from timeline.errors import UserError

# name -> module (relative to timeline.cli); a new subcommand is one file and one entry here.
COMMANDS: dict[str, str] = {
    "static": "static",
    "presets": "presets",
    "schedule": "schedule",
    "simulate": "simulate",
    "serve": "serve",
    "replay": "replay",
    "compare": "compare",
    "fit": "fit",
    "plan": "plan",
    "plot": "plot",
    "report": "report",
    "capture": "capture",
    "from-megatron": "from_megatron",
    "from-vllm": "from_serve",
    "from-sglang": "from_serve",
}

EPILOG = """\
examples:
  timeline simulate schedules/deepseek-v3-pp16-tp2-ep8.toml    simulate; writes runs/deepseek-v3-pp16-tp2-ep8/
  timeline plot runs/deepseek-v3-pp16-tp2-ep8                   PNG of the worst device's memory over time
  timeline report runs/deepseek-v3-pp16-tp2-ep8                 one offline HTML page to share
  timeline static schedules/deepseek-v3-pp16-tp2-ep8.toml       per-device static memory
  timeline fit schedules/deepseek-v3-pp16-tp2-ep8.toml --capacity 80GiB
                                                                cheapest recompute policy that fits
  timeline presets                                              list model presets
  timeline serve schedules/llama3.1-8b-h100-serve.toml          an inference engine's budget and memory over time
  timeline from-vllm "vllm serve Qwen/Qwen3-8B -tp 2" -o q.toml  a serving run file from a launch command

`timeline COMMAND --help` describes each command.
"""


def one_line(text: str) -> str:
    """``text`` with every unprintable character (newlines, control and separator characters a
    user's input may hold) written as its escape, so an error stays one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one ``error:`` line, like every other user error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {one_line(message)} (see `{self.prog} --help`)\n")


def _load(name: str) -> ModuleType:
    return importlib.import_module(f"timeline.cli.{COMMANDS[name]}")


def version_line() -> str:
    """``timeline 0.1.0 (allocator core: compiled; writers: compiled)``: the version, which
    allocator core runs and which writers format snapshot.pickle and trace.json."""
    from timeline.alloc import batch
    from timeline.exporters import compiled

    def which(module: ModuleType, variable: str) -> str:
        core = module.active_core()
        return core + ("" if core == "compiled" else
                       f", {variable}=python" if module.compiled_available() else ", the compiled core is not built")

    return (f"timeline {__version__} (allocator core: {which(batch, 'TIMELINE_ALLOC_CORE')}; "
            f"writers: {which(compiled, 'TIMELINE_EXPORT_CORE')})")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; when ``argv`` starts with a command, only that command's module is imported
    (the others are listed by name), so a command does not pay for importing all the others."""
    parser = Parser(
        prog="timeline",
        description="Simulate per-device GPU memory over time for large-model training jobs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = argv[0] if argv and argv[0] in COMMANDS else None
    for name in COMMANDS:
        if chosen is not None and name != chosen:
            sub.add_parser(name)
            continue
        module = _load(name)
        p = sub.add_parser(name, help=module.HELP, description=getattr(module, "DESCRIPTION", module.HELP),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.prepare_parser(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``timeline`` command (``argv`` None: the process's own arguments, and the process
    ends after it)."""
    if argv is not None:
        return _main(list(argv))
    keep_freed_memory()
    try:
        return _main(sys.argv[1:])
    finally:
        # the process exits next: the interpreter's last collection would walk every object the
        # run made looking for cycles (0.1–0.2 s after the shipped run's files are written) only
        # for the kernel to free the memory anyway
        gc.freeze()


def _main(argv: list[str]) -> int:
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except UserError as exc:
        for line in exc.lines():
            print(f"error: {one_line(line)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `timeline static … --json | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:  # the file system refused a path the user gave (too long, no access, full disk)
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {one_line(f'{where}{exc.strerror or exc}')}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # every output is written to a temporary sibling, removed on the way out
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
