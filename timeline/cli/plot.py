"""``timeline plot RUN_DIR [-o FILE] [--device N]``: memory over time of one device of a
simulated run directory, stacked by category with capacity drawn (PNG)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from timeline.cli.common import check_output_file, console, count, write_file_atomically
from timeline.compare.metrics import MemoryTrace
from timeline.compare.plots import memory_png
from timeline.errors import UserError
from timeline.graph.tensors import CATEGORIES
from timeline.io.rundir import read_memory, read_summary

HELP = "plot memory over time of a simulated run directory (PNG)"
DESCRIPTION = """\
Draw memory over time of one device of RUN_DIR (written by `timeline simulate`): categories
stacked, reserved memory as a line, capacity dashed. The device defaults to the one with the
highest peak reserved memory.

examples:
  timeline plot runs/deepseek-v3-pp16-tp2-ep8/
  timeline plot runs/x/ --device 0 -o rank0.png
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory from `timeline simulate`")
    parser.add_argument("-o", "--output", metavar="FILE", help="PNG to write (default: RUN_DIR/memory.png)")
    parser.add_argument("--force", action="store_true", help="replace FILE if it exists")
    parser.add_argument("--device", type=count, metavar="N", help="global rank to plot (default: the worst)")


def load_trace(run_dir: Path, device: int | None) -> MemoryTrace:
    summary, mem = read_summary(run_dir), read_memory(run_dir)
    try:
        return _trace(run_dir, summary, mem, device)
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{run_dir}: summary.json and memory.parquet do not match a simulated run "
                        f"({type(exc).__name__}: {exc}); simulate the run again") from None


def _trace(run_dir: Path, summary: dict, mem: dict[str, np.ndarray], device: int | None) -> MemoryTrace:
    devices = {d["device"]: d for d in summary["devices"]}
    if device is None:
        device = max(devices.values(), key=lambda d: (d["peak_reserved_bytes"], -d["device"]))["device"]
    if device not in devices:
        raise UserError(f"--device {device}: {run_dir} has devices {', '.join(map(str, sorted(devices)))}")
    hw = summary["run"]["hardware"]
    rows = mem["device"] == device
    return MemoryTrace(label=summary["run"]["name"], device=device, pp_rank=devices[device]["pp_rank"],
                       t_us=mem["t_us"][rows], allocated=mem["allocated_bytes"][rows],
                       reserved=mem["reserved_bytes"][rows],
                       by_category={c: mem[c][rows] if c in mem else np.zeros(int(rows.sum()), np.int64)
                                    for c in CATEGORIES},
                       capacity_bytes=int(devices[device].get("capacity_bytes") or
                                          (hw["capacity_gib"] - hw["non_pytorch_gib"]) * 2**30),
                       iteration_starts_us=tuple(devices[device].get("iteration_starts_us") or ()),
                       oom_t_us=(float(devices[device]["oom"]["t_us"]),) if devices[device].get("oom") else ())


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: not a directory; give a run directory written by `timeline simulate`")
    out = Path(args.output) if args.output else run_dir / "memory.png"
    check_output_file(out, force=args.force)
    trace = load_trace(run_dir, args.device)

    def write(path: Path) -> None:
        with open(path, "wb") as handle:
            memory_png([trace], handle)

    write_file_atomically(out, write, force=args.force)
    console().print(f"wrote {out}")
    return 0
