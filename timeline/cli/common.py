"""What several subcommands share: the run-file arguments (``RUN.toml``, ``--set``,
``--recompute``), argparse types for counts, the CSV schedule rows of a run, and writing an
output folder or file so that a failure leaves nothing that looks complete.

Every problem a user can cause here becomes a :class:`~timeline.errors.UserError` naming the
flag and the path; this module does not simulate or format results.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from timeline import __version__
from timeline.cli.parallel import parallel_enabled, write_in_two
from timeline.cli.variants import with_recompute
from timeline.errors import UserError
from timeline.exporters import EXPORTERS
from timeline.io.runfile import load_run
from timeline.sim.estimate import (
    DEFAULT_MAX_EVENTS,
    RSS_BYTES_PER_EVENT,
    WorkEstimate,
    check_bound,
    estimate_steps,
    estimate_work,
)
from timeline.spec.recompute import FORMS as RECOMPUTE_FORMS
from timeline.spec.recompute import parse_recompute
from timeline.spec.run import RunSpec

if TYPE_CHECKING:
    from timeline.graph.source import SourceFn
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
    for note in spec.notes:
        print(f"note: {args.run}: {note}", file=sys.stderr)
    policy = getattr(args, "recompute", None)
    if policy:
        spec = with_recompute(spec, parse_recompute(policy))
    return spec


def add_max_events(parser: argparse.ArgumentParser, what: str = "memory events") -> None:
    parser.add_argument("--max-events", type=bounded_events, default=DEFAULT_MAX_EVENTS, metavar="N",
                        help=f"refuse, before any work, a run estimated to make more than N {what} "
                             f"(default {DEFAULT_MAX_EVENTS:,}; about {RSS_BYTES_PER_EVENT} bytes of memory each)")


def check_work(spec: RunSpec, max_events: int, formats: Sequence[str] = (), out: Path | None = None,
               label: str = "", per_device: bool = False) -> WorkEstimate:
    """Estimate the run's work (:mod:`timeline.sim.estimate`) and refuse it, in one line, over
    ``max_events`` (``per_device``: one device's, for a summary-level build) or over the free
    space where ``out`` would be written."""
    est = estimate(spec)
    try:
        check_bound(est, max_events, per_device=per_device)
    except UserError as exc:
        raise UserError(f"{label}{exc}") from None
    if out is not None and formats:
        need = est.output_bytes(list(formats))
        free = shutil.disk_usage(_nearest_existing(out.parent)).free
        if need > free:
            raise UserError(f"{label}the outputs would take about {need / 2**30:,.1f} GiB and "
                            f"{_nearest_existing(out.parent)} has {free / 2**30:,.1f} GiB free; write fewer "
                            "(--format summary,memory) or elsewhere (-o)")
    return est


def estimate(spec: RunSpec) -> WorkEstimate:
    """The run's work estimate (:func:`timeline.sim.estimate.estimate_work`) over its slices; a
    whole-step trace's from the trace itself (:func:`timeline.sim.estimate.estimate_steps`)."""
    if spec.trace is not None and spec.trace.is_step:
        return estimate_steps(spec.trace, spec.training)
    return estimate_work(templates()(spec), model=spec.model, parallel=spec.parallel, training=spec.training,
                         recompute=spec.recompute, schedule_kind=spec.schedule.kind, hardware=spec.hardware,
                         traced=spec.trace is not None)


def check_csv_schedule(spec: RunSpec) -> None:
    """Check the rows of the run's CSV schedule (``[schedule] kind = "csv"``; ``io`` read them with the
    run file into ``spec.csv_rows``) as a schedule, so a logic error (a missing backward, a cycle)
    names the CSV file, whichever command reads it."""
    if spec.schedule.kind != "csv":
        return
    from timeline.pipeline import build_schedule

    assert spec.schedule.csv is not None  # validation: kind = "csv" names its file
    path = resolve_from_run(spec, spec.schedule.csv)
    par = spec.parallel
    try:
        build_schedule("csv", pp=par.pp, vpp=par.vpp, num_microbatches=spec.training.num_microbatches,
                       microbatch_group_size=spec.schedule.microbatch_group_size, csv_rows=spec.csv_rows)
    except UserError as exc:
        lines = exc.lines()
        if lines and not lines[0].startswith(str(path)):
            raise UserError(f"{path}: " + " ".join(lines)) from None
        raise


def resolve_from_run(spec: RunSpec, path: str) -> Path:
    """``path`` as written in the run file, resolved against the run file's folder."""
    return (Path(spec.source).parent / path).resolve()


def templates() -> SourceFn:
    """The graph layer's model source of a run (imported lazily: it is the heavy part)."""
    return importlib.import_module("timeline.graph.source").model_source


# -- argparse types -----------------------------------------------------------------------------

def _whole(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {least} or more, got {value}")
    return value


def bounded_events(text: str) -> int:
    """argparse type for --max-events: 1 … 2**31 − 1 (events are indexed by 32-bit integers)."""
    value = _whole(text, 1)
    if value > 2**31 - 1:
        raise argparse.ArgumentTypeError(f"expected at most {2**31 - 1:,}, got {value:,}")
    return value


def count(text: str) -> int:
    """argparse type: a whole number, 0 or more."""
    return _whole(text, 0)


def positive(text: str) -> int:
    """argparse type: a whole number, 1 or more."""
    return _whole(text, 1)


# -- writing outputs ----------------------------------------------------------------------------

#: the file every output folder holds, naming the command that wrote it; ``--force`` replaces a
#: folder only when it holds this file, so it never deletes a folder timeline did not write
MARKER = "timeline-output.json"
MARKER_SCHEMA = "timeline.output/1"
#: longest file name most file systems take (ext4, xfs, btrfs, APFS: 255 bytes)
NAME_MAX = 255
#: room the temporary sibling needs beside a name: ``.NAME.partial-PID``
_PARTIAL_EXTRA = len(".") + len(".partial-") + 10


@contextlib.contextmanager
def _no_interrupt() -> Iterator[None]:
    """Hold Ctrl-C back while cleaning up, so a second one cannot leave half a folder behind; it is
    delivered (as KeyboardInterrupt) when the block ends."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _nearest_existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_path_length(flag: str, out: Path) -> None:
    """A one-line error, before any work, for a path the file system would refuse."""
    absolute = Path(os.path.abspath(out))
    parts = absolute.parts[1:]
    for i, part in enumerate(parts):
        room = NAME_MAX - (_PARTIAL_EXTRA if i == len(parts) - 1 else 0)
        if len(os.fsencode(part)) > room:
            raise UserError(f"{flag} {out}: the name {part[:40]}… is {len(os.fsencode(part))} bytes; "
                            f"file systems take names of at most {room} bytes here — choose a shorter one")
    if len(os.fsencode(str(absolute))) > 4000:
        raise UserError(f"{flag} {out}: the path is longer than 4,000 bytes; choose a shorter one")


def _probe(flag: str, out: Path) -> None:
    """Fail now, not after minutes of work, if nothing can be created next to ``out``."""
    check_path_length(flag, out)
    folder = _nearest_existing(out.parent)
    if not folder.is_dir():
        raise UserError(f"{flag} {out}: {folder} is not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".timeline-probe-", dir=folder))
    except OSError as exc:
        raise UserError(f"{flag} {out}: cannot write in {folder} ({exc.strerror or exc})") from None


def is_output_folder(folder: Path) -> bool:
    """Whether ``folder`` (not a link) holds a regular ``timeline-output.json`` of our schema."""
    marker = folder / MARKER
    if folder.is_symlink() or marker.is_symlink() or not marker.is_file():
        return False
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("schema") == MARKER_SCHEMA


def _listing(folder: Path, limit: int = 3) -> str:
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
    return shown or "nothing"


def _is_empty_dir(folder: Path) -> bool:
    try:
        return folder.is_dir() and not folder.is_symlink() and not os.listdir(folder)
    except OSError:
        return False


def check_output_dir(out: Path, force: bool, flag: str = "-o") -> None:
    """Raise a UserError unless ``out`` can become an output folder: absent or empty, or — with
    ``force`` — an earlier timeline output folder (never a link, a file, a foreign folder, the
    current folder or one above it); a name the file system takes; writable."""
    check_path_length(flag, out)
    if out.is_symlink():
        raise UserError(f"{flag} {out}: is a symbolic link; timeline does not write or replace through "
                        "links — remove it yourself or choose another folder")
    if out.exists() and not out.is_dir():
        raise UserError(f"{flag} {out}: exists and is not a folder")
    if out.exists() and not _is_empty_dir(out):
        if not is_output_folder(out):
            raise UserError(f"{out} is not a timeline output folder (found {_listing(out)}); remove it "
                            "yourself or choose another folder with -o")
        if not force:
            raise UserError(f"{out} exists; pass --force to replace it or -o to choose another folder")
        cwd = Path.cwd().resolve()
        if out.resolve() == cwd or out.resolve() in cwd.parents:
            raise UserError(f"{flag} {out}: refusing to replace the current folder or one above it")
    _probe(flag, out)


def write_dir_atomically(out: Path, force: bool, write: Callable[[Path], None], flag: str = "-o",
                         command: str = "") -> None:
    """Call ``write(tmp)`` on a fresh sibling folder of ``out`` (which gets the output marker
    naming ``command``), then rename it to ``out``, replacing an earlier output folder under
    ``force``: an interrupted or failed write leaves no complete-looking ``out`` and nothing
    else. OS errors become a UserError naming the path."""
    check_output_dir(out, force, flag)
    absolute = Path(os.path.abspath(out))
    tmp = absolute.with_name(f".{absolute.name}.partial-{os.getpid()}")
    old = absolute.with_name(f".{absolute.name}.replaced-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        (tmp / MARKER).write_text(json.dumps({"schema": MARKER_SCHEMA, "command": command,
                                              "version": __version__}, indent=1) + "\n", encoding="utf-8")
        write(tmp)
        if out.exists() and not _is_empty_dir(out):
            check_output_dir(out, force, flag)  # again: it may have changed while we worked
            os.rename(absolute, old)
        elif out.exists():
            out.rmdir()
        tmp.rename(absolute)
    except OSError as exc:
        where = exc.filename or out
        raise UserError(f"{flag} {out}: cannot write {where} ({exc.strerror or exc})") from None
    finally:
        with _no_interrupt():
            shutil.rmtree(tmp, ignore_errors=True)
            if old.exists() and not old.is_symlink():
                if not os.path.lexists(absolute):  # stopped between the two renames: put it back
                    os.rename(old, absolute)
                else:
                    shutil.rmtree(old, ignore_errors=True)


#: the exporters that read ``Timeline.series`` (summary and the traces through the peaks and counters)
SERIES_READERS = {"summary", "memory", "trace", "perfetto"}


def exporter_writer(tl: Timeline, formats: Sequence[str], options: dict | None = None) -> Callable[[Path], None]:
    """A ``write(folder)`` for :func:`write_dir_atomically` that runs each named exporter into
    ``folder`` (in two processes where that helps, :mod:`timeline.cli.parallel`); ``options`` go
    to every exporter (``gzip``, ``max_samples``, ``max_entries``)."""
    options = dict(options or {})

    def write_one(folder: Path, fmt: str) -> None:
        module = importlib.import_module(EXPORTERS[fmt])
        name = module.FILENAME + (".gz" if options.get("gzip") and getattr(module, "GZIP", False) else "")
        with open(folder / name, "wb") as handle:
            module.write(tl, handle, options)

    def write(folder: Path) -> None:
        if parallel_enabled(formats) and set(formats) & SERIES_READERS:
            # the memory series every one of these reads, made once before the fork so both
            # writing processes share them instead of each making its own
            for d in range(tl.num_devices):
                tl.series(d)
        write_in_two(list(formats), lambda fmt: write_one(folder, fmt))

    return write


def check_output_file(out: Path, flag: str = "-o", force: bool = False) -> None:
    """Raise a UserError unless a file can be written at ``out``: not a folder, not a link, not an
    existing file unless ``force`` (the user's own files are never replaced silently), writable."""
    if out.is_symlink():
        raise UserError(f"{flag} {out}: is a symbolic link; timeline does not write through links — remove "
                        "it yourself or choose another file")
    if out.is_dir():
        raise UserError(f"{flag} {out}: is a folder; give a file name")
    if out.exists() and not out.is_file():
        raise UserError(f"{flag} {out}: exists and is not a regular file")
    if out.exists() and not force:
        raise UserError(f"{out} exists; pass --force to replace it or {flag} to choose another file")
    _probe(flag, out)


def write_file_atomically(out: Path, write: Callable[[Path], None], flag: str = "-o",
                          force: bool = False) -> None:
    """Call ``write(tmp)`` on a sibling temp path, then rename it to ``out`` (an existing file only
    under ``force``); nothing partial is left at ``out`` on failure. OS errors become a UserError
    naming the path."""
    check_output_file(out, flag, force)
    absolute = Path(os.path.abspath(out))
    tmp = absolute.with_name(f".{absolute.name}.partial-{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        os.replace(tmp, out)
    except OSError as exc:
        raise UserError(f"{flag} {out}: cannot write ({exc.strerror or exc})") from None
    finally:
        with _no_interrupt():
            tmp.unlink(missing_ok=True)


def add_gpu_arguments(parser: argparse.ArgumentParser) -> None:
    """``--gpu NAME`` and ``--gpu-field KEY=VALUE`` of a command that writes a run file (from-megatron, from-vllm)."""
    from timeline.spec.hardware import GPUS, UNKNOWN_GPU_NEEDS, UNKNOWN_GPU_NEEDS_MULTI

    parser.add_argument("--gpu", metavar="NAME",
                        help=f"GPU kind: a preset ({', '.join(GPUS)}), or any name with its fields given by "
                             "--gpu-field (default: the GPU a log names — a fused-MoE config file's device_name, "
                             "collect_env's or nvidia-smi's GPU lines — else h100)")
    parser.add_argument("--gpu-field", action="append", default=[], metavar="KEY=VALUE",
                        help=f"a [hardware] field of the GPU, over its preset's; a GPU no preset holds needs "
                             f"{', '.join(UNKNOWN_GPU_NEEDS)} and, on more than one GPU, "
                             f"{', '.join(UNKNOWN_GPU_NEEDS_MULTI)} (an error says what each is) — e.g. --gpu "
                             "rtx-a5000 --gpu-field sm=86 --gpu-field sms=64 …")


def gpu_fields(items: list[str]) -> dict[str, float | int | str]:
    """``--gpu-field KEY=VALUE`` values: a ``[hardware]`` field each, checked as the run file checks it."""
    from timeline.spec.run import HardwareSpec

    # the field annotations are strings here (``from __future__ import annotations`` in timeline.spec.run)
    known = {f.name: str(f.type) for f in dataclasses.fields(HardwareSpec) if f.name != "gpu"}
    out: dict[str, float | int | str] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or key not in known:
            raise UserError(f"--gpu-field {item!r}: expected KEY=VALUE with KEY one of {', '.join(known)}")
        kind = known[key]
        try:
            out[key] = int(text) if kind == "int" else float(text) if kind == "float" else text.strip()
        except ValueError:
            raise UserError(f"--gpu-field {item!r}: {key} takes {'an integer' if kind == 'int' else 'a number'}") \
                from None
    return out


def script_env(items: list[str]) -> dict[str, str]:
    """``--script-env NAME=VALUE`` words as a dict (the last of a repeated name wins, as in a shell)."""
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise UserError(f"--script-env {item}: give NAME=VALUE, NAME a shell variable's name (e.g. "
                            "--script-env MP_PP0_LAYERS=6)")
        env[name] = value
    return env


def emit_checked_run_file(text: str, out: Path | None, force: bool, source: str, load: Callable[[Path], object],
                          stdout_check_text: str | None = None) -> None:
    """Write a converted run file ``text`` to ``out`` (stdout when None) only if it loads as it stands with
    ``load``; its error names ``source`` (the user's input), not the temporary file checked. ``stdout_check_text``:
    what to check instead when printing (paths written relative to a file that is not written)."""

    def check(tmp: Path) -> None:
        try:
            load(tmp)
        except UserError as exc:
            raise UserError(f"{source}: {str(exc).removeprefix(f'{tmp}: ')}") from None

    if out is None:
        with tempfile.TemporaryDirectory() as folder:  # what is printed must load as it stands
            tmp = Path(folder) / "run.toml"
            tmp.write_text(stdout_check_text if stdout_check_text is not None else text, encoding="utf-8")
            check(tmp)
        print(text, end="")
        return

    def write(tmp: Path) -> None:
        tmp.write_text(text, encoding="utf-8")
        check(tmp)  # or nothing is left at RUN.toml

    write_file_atomically(out, write, force=force)
    print(f"wrote {out}")


# -- printing -----------------------------------------------------------------------------------

def gib(n: int | float) -> str:
    return f"{n / 2**30:,.2f}"


def console() -> Console:
    """A console that does not squeeze tables when output is piped."""
    width = shutil.get_terminal_size((160, 40)).columns
    return Console(width=max(width, 140))


def refuse_step_trace(spec: RunSpec, command: str, varies: str = "recompute policies") -> None:
    """``compare``/``fit`` vary recompute policies and ``plan`` layouts too, which a whole-step trace (one
    device, the step as captured) does not take."""
    if spec.trace is not None and spec.trace.is_step:
        raise UserError(f"{spec.model_source}: timeline {command} varies {varies}; a whole-step trace "
                        "(capture --step) runs the step as captured; use timeline simulate")
