"""What several subcommands share: the run-file arguments (``RUN.toml``, ``--set``,
``--recompute``), argparse types for counts, the CSV schedule rows of a run, and writing an
output folder or file so that a failure leaves nothing that looks complete.

Every problem a user can cause here becomes a :class:`~timeline.errors.UserError` naming the
flag and the path; this module does not simulate or format results.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from timeline.compare.variants import with_recompute
from timeline.errors import UserError
from timeline.exporters import EXPORTERS
from timeline.graph.recompute import FORMS as RECOMPUTE_FORMS
from timeline.graph.recompute import parse_recompute
from timeline.io.runfile import load_run
from timeline.spec.run import RunSpec

if TYPE_CHECKING:
    from timeline.result.timeline import Timeline

SET_HELP = ("override a run-file key, e.g. --set parallel.tp=4 --set schedule.kind=gpipe "
            "(repeatable; values are TOML literals, bare words are strings)")


def add_run_args(parser: argparse.ArgumentParser, *, recompute: bool = False) -> None:
    parser.add_argument("run", metavar="RUN.toml", help="run file (see schedules/ for examples)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help=SET_HELP)
    if recompute:
        parser.add_argument("--recompute", metavar="POLICY", help=f"override [recompute]: {RECOMPUTE_FORMS}")


def load(args: argparse.Namespace) -> RunSpec:
    """The run of ``args.run`` with ``--set`` applied, and ``--recompute`` if the command has it,
    validated as a whole run."""
    spec = load_run(args.run, args.overrides)
    policy = getattr(args, "recompute", None)
    if policy:
        spec = with_recompute(spec, parse_recompute(policy))
    return spec


def load_csv_rows(spec: RunSpec) -> tuple[tuple[str, ...], ...] | None:
    """The rows of the run's CSV schedule (``[schedule] kind = "csv"``), else None. A relative
    ``csv`` path is relative to the run file's folder."""
    if spec.schedule.kind != "csv":
        return None
    from timeline.io.csv_schedule import read_csv

    return tuple(tuple(row) for row in read_csv(resolve_from_run(spec, spec.schedule.csv)))


def resolve_from_run(spec: RunSpec, path: str) -> Path:
    """``path`` as written in the run file, resolved against the run file's folder."""
    return (Path(spec.source).parent / path).resolve()


def templates():
    """The op-template builder of the graph layer (imported lazily: it is the heavy part)."""
    return importlib.import_module("timeline.graph.template").chunk_template


# -- argparse types -----------------------------------------------------------------------------

def _whole(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {least} or more, got {value}")
    return value


def count(text: str) -> int:
    """argparse type: a whole number, 0 or more."""
    return _whole(text, 0)


def positive(text: str) -> int:
    """argparse type: a whole number, 1 or more."""
    return _whole(text, 1)


# -- writing outputs ----------------------------------------------------------------------------

def _nearest_existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _probe(flag: str, out: Path) -> None:
    """Fail now, not after minutes of work, if nothing can be created next to ``out``."""
    folder = _nearest_existing(out.parent)
    if not folder.is_dir():
        raise UserError(f"{flag} {out}: {folder} is not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".timeline-probe-", dir=folder))
    except OSError as exc:
        raise UserError(f"{flag} {out}: cannot write in {folder} ({exc.strerror or exc})") from None


def check_output_dir(out: Path, force: bool, flag: str = "-o") -> None:
    """Raise a UserError unless ``out`` can become an output folder: not an existing file, not
    an existing folder without ``force``, not the current folder or one above it, writable."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{flag} {out}: exists and is not a folder")
    if out.exists() and not force:
        raise UserError(f"{out} exists; pass --force to replace it or -o to choose another folder")
    cwd = Path.cwd().resolve()
    if out.exists() and (out.resolve() == cwd or out.resolve() in cwd.parents):
        raise UserError(f"{flag} {out}: refusing to replace the current folder or one above it")
    _probe(flag, out)


def write_dir_atomically(out: Path, force: bool, write: Callable[[Path], None], flag: str = "-o") -> None:
    """Call ``write(tmp)`` on a fresh sibling folder of ``out``, then rename it to ``out``
    (replacing it under ``force``): an interrupted or failed write leaves no complete-looking
    ``out``. OS errors become a UserError naming the path."""
    check_output_dir(out, force, flag)
    absolute = Path(os.path.abspath(out))
    tmp = absolute.with_name(f".{absolute.name}.partial-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except OSError as exc:
        where = exc.filename or out
        raise UserError(f"{flag} {out}: cannot write {where} ({exc.strerror or exc})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def exporter_writer(tl: Timeline, formats: Sequence[str], options: dict | None = None) -> Callable[[Path], None]:
    """A ``write(folder)`` for :func:`write_dir_atomically` that runs each named exporter into
    ``folder``; ``options`` go to every exporter (``gzip``, ``max_samples``, ``max_entries``)."""
    options = dict(options or {})

    def write(folder: Path) -> None:
        for fmt in formats:
            module = importlib.import_module(EXPORTERS[fmt])
            name = module.FILENAME + (".gz" if options.get("gzip") and getattr(module, "GZIP", False) else "")
            with open(folder / name, "wb") as handle:
                module.write(tl, handle, options)

    return write


def check_output_file(out: Path, flag: str = "-o") -> None:
    """Raise a UserError unless a file can be written at ``out`` (not a folder; writable folder)."""
    if out.is_dir():
        raise UserError(f"{flag} {out}: is a folder; give a file name")
    if out.exists() and not out.is_file():
        raise UserError(f"{flag} {out}: exists and is not a regular file")
    _probe(flag, out)


def write_file_atomically(out: Path, write: Callable[[Path], None], flag: str = "-o") -> None:
    """Call ``write(tmp)`` on a sibling temp path, then rename it to ``out``; nothing partial is
    left at ``out`` on failure. OS errors become a UserError naming the path."""
    check_output_file(out, flag)
    absolute = Path(os.path.abspath(out))
    tmp = absolute.with_name(f".{absolute.name}.partial-{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        os.replace(tmp, out)
    except OSError as exc:
        raise UserError(f"{flag} {out}: cannot write ({exc.strerror or exc})") from None
    finally:
        tmp.unlink(missing_ok=True)


# -- printing -----------------------------------------------------------------------------------

def gib(n: int | float) -> str:
    return f"{n / 2**30:,.2f}"


def console() -> Console:
    """A console that does not squeeze tables when output is piped."""
    width = shutil.get_terminal_size((160, 40)).columns
    return Console(width=max(width, 140))


def refuse_step_trace(spec, command: str) -> None:
    """``compare``/``fit`` vary recompute policies, which a whole-step trace does not take."""
    if spec.trace is not None and spec.trace.is_step:
        raise UserError(f"{spec.model_source}: timeline {command} varies recompute policies; a whole-step trace "
                        "(capture --step) runs the step as captured; use timeline simulate")
