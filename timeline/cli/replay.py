"""``timeline replay``: replay a PyTorch memory snapshot through the caching allocator model.

Reads the pickle with the restricted loader, replays each device's trace
(:func:`timeline.alloc.replay.replay_report`) and prints how often the model chose the real
address and the real segment, and the real and modelled peak reserved bytes — as a table, or as
``timeline.replay/1`` JSON with ``--json``. Only formats; the replay logic lives in ``timeline.alloc``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from timeline.alloc.config import MIB, UNLIMITED, AllocatorConfig
from timeline.alloc.replay import SCHEMA, replay_snapshot
from timeline.cli.capacity import add_capacity, capacity_arg
from timeline.cli.common import (
    check_output_dir,
    count,
    exporter_writer,
    gib,
    write_dir_atomically,
)
from timeline.cli.tables import Column, View, add_wide, table_console
from timeline.errors import UserError
from timeline.exporters import EXPORTERS
from timeline.io.snapshot import load_snapshot

HELP = "replay a PyTorch memory snapshot through the caching allocator model"
DESCRIPTION = """\
Replay the trace of a torch.cuda.memory._dump_snapshot() pickle through the caching allocator
model and report how closely it follows the real allocator: addresses of every allocation, the
segments it creates (the model decides them; only a new segment's address comes from the trace),
and peak reserved bytes. Settings come from the snapshot's allocator_settings unless overridden.

examples:
  timeline replay memory_snapshot.pickle
  timeline replay memory_snapshot.pickle --json
  timeline replay memory_snapshot.pickle --expandable-segments true --capacity 80GiB
"""


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("snapshot", type=Path, help="snapshot pickle written by torch.cuda.memory._dump_snapshot")
    parser.add_argument("--json", action="store_true", help="print timeline.replay/1 JSON instead of a table")
    parser.add_argument("--expandable-segments", type=_bool, metavar="BOOL", help="override expandable_segments")
    parser.add_argument("--max-split-size-mb", type=count, metavar="MB",
                        help="override max_split_size_mb: 0 = unlimited, else more than 20")
    parser.add_argument("--max-non-split-rounding-mb", type=count, metavar="MB",
                        help="override max_non_split_rounding_mb (0 or more)")
    parser.add_argument("--roundup-power2-divisions", metavar="N|TABLE",
                        help="override roundup_power2_divisions: a power of two, or a table such as 1MB:4,>:8")
    add_capacity(parser, "from the trace's oom entries, else unlimited (memory PyTorch may reserve per device)")
    parser.add_argument("-o", "--out", type=Path, metavar="DIR",
                        help="also write the replayed run like a simulation (memory.parquet, events.parquet, trace)")
    parser.add_argument("--force", action="store_true", help="replace DIR if it exists")
    add_wide(parser)


def _divisions(text: str) -> tuple[int, ...]:
    """``--roundup-power2-divisions``: ``8``, ``1MB:4,>:8`` or ``[1MB:4,>:8]``, as PyTorch spells it."""
    value = text.strip()
    if ":" in value and not value.startswith("["):
        value = f"[{value}]"
    try:
        return AllocatorConfig.parse(f"roundup_power2_divisions:{value}").roundup_power2_divisions
    except (UserError, ValueError) as exc:
        raise UserError(f"--roundup-power2-divisions {text!r}: {exc}") from None


def _config(args: argparse.Namespace, settings: dict[str, Any] | None) -> AllocatorConfig:
    """The snapshot's allocator settings with the flags' overrides."""
    changes: dict[str, Any] = {}
    if args.expandable_segments is not None:
        changes["expandable_segments"] = args.expandable_segments
    if args.max_split_size_mb is not None:
        mb = args.max_split_size_mb
        if 0 < mb <= 20:
            raise UserError(f"--max-split-size-mb {mb}: give 0 (unlimited) or more than 20 MB")
        changes["max_split_size_bytes"] = mb * MIB if mb else UNLIMITED
    if args.max_non_split_rounding_mb is not None:
        changes["max_non_split_rounding_bytes"] = args.max_non_split_rounding_mb * MIB
    if args.roundup_power2_divisions is not None:
        changes["roundup_power2_divisions"] = _divisions(args.roundup_power2_divisions)
    return replace(AllocatorConfig.from_snapshot_settings(settings), **changes)


REPLAY_FORMATS = ("memory", "events", "trace")


def device_labels(snapshot: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Snapshot device index → the device ``timeline`` simulated there (``timeline_devices``, which
    a timeline snapshot carries: index i is the i-th simulated device, whose global rank memory_viz
    cannot show); empty for a real PyTorch snapshot, whose indices are its own devices."""
    labels = snapshot.get("timeline_devices")
    if not isinstance(labels, list):
        return {}
    out = {}
    for i, entry in enumerate(labels):
        if isinstance(entry, dict) and isinstance(entry.get("device"), int):
            out[i] = {k: entry[k] for k in ("device", "pp_rank", "stages", "represents") if k in entry}
    return out


def _write_outputs(records: dict[int, list[tuple]], out_dir: Path, force: bool,
                   labels: dict[int, dict[str, Any]] | None = None) -> None:
    """``-o DIR``: the replayed run as memory.parquet and events.parquet (plus the trace
    formats registered for replays), written like a simulated run directory."""
    from timeline.result.replayed import timeline_from_replay

    formats = [f for f in REPLAY_FORMATS if f in EXPORTERS]
    write_dir_atomically(out_dir, force, exporter_writer(timeline_from_replay(records, labels), formats),
                         command="replay")


def _pct(part: int, whole: int) -> str:
    return f"{part:,}/{whole:,} {100.0 * part / whole:.2f}%" if whole else "-"


#: the replay table; ``--wide`` adds the columns marked wide
COLUMNS = (Column("device"), Column("allocs at\nreal address"), Column("from cache", wide=True),
           Column("new\nsegments"), Column("empty_cache", wide=True), Column("OOM\nreal/model"),
           Column("peak reserved\nGiB real"), Column("\nmodel"), Column("reserved\nerr", wide=True),
           Column("end state", justify="left"))


def _print_table(report: dict[str, Any], source: str, wide: bool = False) -> None:
    view = View(f"replay of {source}", COLUMNS, wide=wide)
    for d in report["devices"]:
        view.row(
            str(d["device"]), _pct(d["alloc_address_matches"], d["allocs"]),
            _pct(d["cache_alloc_address_matches"], d["cache_allocs"]),
            _pct(d["segment_alloc_matches"], d["segment_allocs"]),
            _pct(d["release_run_matches"], d["release_runs"]),
            f"{d['ooms_real']:,}/{d['ooms_model']:,}" + (" over" if over_capacity(d) else ""),
            gib(d["peak_reserved_bytes_real"]), gib(d["peak_reserved_bytes_model"]),
            f"{100 * d['max_reserved_rel_error']:.2f}%",
            "match" if d["end_segments_match"] and d["end_blocks_match"] else "differs",
        )
    view.print(table_console(wide))
    for d in report["devices"]:
        if over_capacity(d) and not d["ooms_model"]:  # over capacity with no OOM to show it
            table_console().print(f"device {d['device']}: reserves {gib(d['peak_reserved_bytes_model'])} GiB, over the "
                            f"capacity of {gib(d['capacity_bytes'])} GiB"
                            + (f" already at the trace's start ({gib(d['start_reserved_bytes'])} GiB)"
                               if d["start_reserved_bytes"] > d["capacity_bytes"] else "")
                            + "; the model records an OOM only when it needs a new segment (none here)",
                            markup=False, highlight=False)


def over_capacity(d: dict[str, Any]) -> bool:
    """Whether the replayed device reserves more than the capacity at some point: an OOM the
    OOM count alone misses when the start state (the snapshot's segments) is already over it."""
    cap = d.get("capacity_bytes")
    return cap is not None and max(d["peak_reserved_bytes_model"], d["start_reserved_bytes"]) > cap


def run(args: argparse.Namespace) -> int:
    given = capacity_arg(args)
    capacity = given[1] if given else None
    if args.out is not None:
        check_output_dir(args.out, args.force)
    snapshot = load_snapshot(args.snapshot)
    config = _config(args, snapshot.get("allocator_settings"))
    try:
        records: dict[int, list[tuple]] | None = {} if args.out is not None else None
        devices = replay_snapshot(snapshot, config=config, capacity_bytes=capacity, records=records)
        rows: list[dict[str, Any]] = [d.to_dict() for d in devices]
        report = {"schema": SCHEMA, "devices": rows}
        labels = device_labels(snapshot)
        for d in rows:
            d["over_capacity"] = over_capacity(d)
            if d["device"] in labels:  # a timeline snapshot: report the global rank, keep the index
                d["snapshot_index"] = d["device"]
                d["device"] = labels[d["snapshot_index"]]["device"]
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{args.snapshot}: inconsistent snapshot trace ({type(exc).__name__}: {exc})") from None
    if args.out is not None:
        _write_outputs(records or {}, args.out, args.force, labels)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=False))
    else:
        _print_table(report, args.snapshot.name, wide=args.wide)
    return 0
