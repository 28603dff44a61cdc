"""``timeline report DIR [-o FILE.html] [--force]``: one self-contained HTML page to share, from a
``simulate``, ``replay``, ``compare -o`` or ``serve`` folder (default ``DIR/report.html``).

Reads the folder (which command wrote it: its ``timeline-output.json``), gathers the page's data
(:mod:`timeline.exporters.report_data`) and writes the page (:mod:`timeline.exporters.report_html`)
atomically; an existing page is replaced only with ``--force``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from timeline.cli.common import MARKER, is_output_folder, write_file_atomically
from timeline.cli.tables import table_console
from timeline.errors import UserError
from timeline.exporters.report_data import compare_data, report_document, run_data
from timeline.exporters.report_html import FILENAME, render
from timeline.exporters.report_serve import serve_data
from timeline.io.rundir import read_columns, read_memory, read_summary

HELP = "write one self-contained HTML page (opens offline) for a simulate, replay, compare or serve folder"
DESCRIPTION = """\
Write DIR/report.html (or -o FILE.html): the run's settings, the per-device table, memory over
time per device (categories stacked, reserved and capacity lines, iteration boundaries, the peak;
drag to zoom, double-click to reset), the breakdown and largest tensors at each device's peak,
and the schedule; for a `compare -o` folder, the variants side by side on the same axes; for a
`serve` folder, the serving settings and the engine's budget, memory over time by part, KV
blocks used vs the pool, requests running / waiting / preempted, and the request latencies.
The page's script and data are inline: it needs no network.

examples:
  timeline simulate schedules/deepseek-v3-pp16-tp2-ep8.toml && timeline report runs/deepseek-v3-pp16-tp2-ep8
  timeline compare RUN.toml --recompute none,full:uniform:1 -o cmp/ && timeline report cmp/ -o cmp.html
  timeline serve schedules/llama3.1-8b-h100-serve.toml && timeline report runs/llama3.1-8b-h100-serve
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", metavar="DIR", help="a folder written by simulate, replay, compare -o or serve")
    parser.add_argument("-o", "--output", metavar="FILE.html", help=f"the page to write (default DIR/{FILENAME})")
    parser.add_argument("--force", action="store_true", help="replace FILE.html if it exists")


def command_of(folder: Path) -> str:
    """Which command wrote ``folder`` (its output marker), or a UserError."""
    if not folder.is_dir():
        raise UserError(f"{folder}: not a folder; give a folder written by simulate, replay, compare -o or serve")
    if not is_output_folder(folder):
        raise UserError(f"{folder}: no {MARKER}; give a folder written by simulate, replay, compare -o or serve")
    command = json.loads((folder / MARKER).read_text(encoding="utf-8")).get("command")
    if command not in ("simulate", "replay", "compare", "serve"):
        raise UserError(f"{folder}: written by {command!r}; report reads simulate, replay, compare and serve folders")
    return command


def summary_from_memory(mem: dict[str, np.ndarray]) -> dict[str, Any]:
    """A replay folder has no summary.json: per device, its peaks from memory.parquet."""
    devices = []
    for dev in sorted(set(mem["device"].tolist())):
        rows = np.flatnonzero(mem["device"] == dev)
        ia, ir = rows[np.argmax(mem["allocated_bytes"][rows])], rows[np.argmax(mem["reserved_bytes"][rows])]
        devices.append({"device": int(dev), "pp_rank": 0, "stages": [], "represents": 1,
                        "peak_requested_bytes": int(mem["requested_bytes"][rows].max()),
                        "peak_allocated_bytes": int(mem["allocated_bytes"][ia]), "peak_time_us": float(mem["t_us"][ia]),
                        "peak_reserved_bytes": int(mem["reserved_bytes"][ir]),
                        "peak_reserved_time_us": float(mem["t_us"][ir]),
                        "fragmentation_bytes_at_peak": int(mem["reserved_bytes"][ia] - mem["allocated_bytes"][ia]),
                        "capacity_bytes": 0, "num_ooms": 0})
    return {"run": None, "devices": devices}


def folder_data(folder: Path, command: str) -> dict[str, Any]:
    """The page's data for one simulate or replay folder."""
    mem = read_memory(folder)
    summary = read_summary(folder) if (folder / "summary.json").is_file() else summary_from_memory(mem)
    ops = read_columns(folder / "ops.parquet", "timeline.ops/")
    return run_data(summary, mem, ops, kind=command)


def compare_folder_data(folder: Path) -> dict[str, Any]:
    rows = read_columns(folder / "compare.parquet", "timeline.compare/")
    listing = folder / "variants.json"
    if rows is None or not listing.is_file():
        raise UserError(f"{folder}: no compare.parquet and variants.json; run `timeline compare … -o {folder}` again")
    variants = json.loads(listing.read_text(encoding="utf-8"))["variants"]
    return compare_data(rows, [(v["name"], folder_data(folder / v["dir"], "simulate")) for v in variants])


def serve_folder_data(folder: Path) -> dict[str, Any]:
    """The page's data for one ``timeline serve`` folder (summary.json needed; memory.parquet and
    requests.parquet drawn when present)."""
    path = folder / "summary.json"
    if not path.is_file():
        raise UserError(f"{folder}: no summary.json; run `timeline serve` with --format including summary")
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read as JSON ({exc}); run `timeline serve` again") from None
    schema = summary.get("schema") if isinstance(summary, dict) else None
    if not str(schema or "").startswith("timeline.serve/"):
        raise UserError(f"{path}: not a timeline serve summary (schema {schema!r})")
    mem = read_columns(folder / "memory.parquet", "timeline.serve.memory/")
    req = read_columns(folder / "requests.parquet", "timeline.serve.requests/")
    return serve_data(summary, mem, req)


def is_report(path: Path) -> bool:
    """Whether ``path`` is a page this command wrote (its title says so): ``--force`` replaces
    nothing else."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(4096)
    except OSError:
        return False
    return head.startswith(b"<!DOCTYPE html>") and b"<title>timeline report: " in head


def run(args: argparse.Namespace) -> int:
    folder = Path(args.folder)
    command = command_of(folder)
    out = Path(args.output) if args.output else folder / FILENAME
    if out.is_symlink():
        raise UserError(f"-o {out}: is a symbolic link; timeline does not write through links — remove it "
                        "yourself or choose another file")
    if out.exists() and not is_report(out):
        raise UserError(f"{out} is not a timeline report; remove it yourself or choose another file with -o")
    if out.exists() and not args.force:
        raise UserError(f"{out} exists; pass --force to replace it or -o to choose another file")
    data = (compare_folder_data(folder) if command == "compare" else serve_folder_data(folder) if command == "serve"
            else folder_data(folder, command))
    title = (f"timeline report: {folder.resolve().name} ({command}"
             + (f", {data['run']['name']}" if data.get("run") else "") + ")")
    page = render(report_document(data, title)).encode("utf-8")

    def write(path: Path) -> None:
        path.write_bytes(page)

    write_file_atomically(out, write, force=True)  # checked above: only an earlier report
    table_console().print(f"wrote {out} ({len(page) / 2**20:,.1f} MiB)")
    return 0
