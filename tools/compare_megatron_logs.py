"""Hold the simulator against Megatron-LM jobs' own memory lines, reserved included
(``tests/data/megatron_logs.json``, split by ``tools/megatron_logs_split.json``).

Megatron-LM prints, after the first logged iteration N (``--log-interval``), one line per rank whose
data-parallel rank is 0: ``torch.cuda.memory_allocated`` / ``max_memory_allocated`` /
``memory_reserved`` / ``max_memory_reserved`` in MiB (``megatron/training/utils.py: report_memory``,
called from ``training.py: training_log`` after iteration N's optimizer step; the peaks are never
reset, so they cover the whole run up to then). Each record is converted in process as
``timeline from-megatron`` converts it (the record's world size, GPU, and the PyTorch / Transformer
Engine / Megatron-Core versions it ran, and which Adam Megatron imported where the record says which packages
were absent: :func:`optimizer_impl_of`), simulated for N iterations (``warmup_iterations`` 0), and the
device standing for the logged rank's pipeline rank (global rank R sits at pipeline rank
``R // (world_size / pp)`` under Megatron's rank order) is compared: allocated and reserved after the
last event, and their peaks over the whole simulation.

A record is refused, with one line, when it cannot be rebuilt (``not_rebuildable``: a world size or
GPU the page does not give) or when ``from-megatron`` refuses its arguments (an unknown or unmodelled
argument: counted). ``--assume-neutral A,B`` is a diagnostic for arguments ``from-megatron``'s table does
not classify yet: each named argument that ``from-megatron`` refuses as unknown (and only then) is left
out, and every row made so lists what was left out; the default report assumes nothing. ``--as-run`` applies what a record states about how the job
ran beyond its arguments: ``checkpoint_loaded: false`` (the log shows the job started at iteration 0)
drops ``--no-load-optim`` / ``--no-load-rng``, which act only on a checkpoint that is loaded
(``megatron/training/checkpointing.py: load_checkpoint@858694f929`` returns before reading optimizer
or RNG state when no checkpoint is found). Rows made so are marked ``as-run``.
Rows are printed (and written by ``--json``) for calibration records only; the unseen side is reported as
its summary (median, worst, within 1/2/4 %) and its refusals.

    .venv/bin/python tools/compare_megatron_logs.py [--as-run] [--assume-neutral A,B] [--only SUBSTRING]
        [--reserved] [--json FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "tests" / "data" / "megatron_logs.json"
SPLIT = ROOT / "tools" / "megatron_logs_split.json"
SALT = b"timeline-megatron-logs-v1:"
MIB = 2**20
QUANTITIES = ("allocated", "max_allocated", "reserved", "max_reserved")
#: arguments that act only on a checkpoint Megatron actually loads (see the module docstring)
LOAD_ONLY = ("--no-load-optim", "--no-load-rng")


def side_of(url: str) -> str:
    """The record's side, fixed by its URL alone before any of its numbers were read."""
    return "unseen" if int(hashlib.sha256(SALT + url.encode()).hexdigest(), 16) % 3 == 0 else "calibration"


def split_problems(records: list[dict], split: dict) -> list[str]:
    """Records missing from the committed split, or whose side or URL differ from it or from the rule."""
    by_id = {s["id"]: s for s in split["records"]}
    out = []
    for r in records:
        s = by_id.get(r["id"])
        if s is None:
            out.append(f"{r['id']}: not in {SPLIT.name}")
        elif s["url"] != r["url"] or s["side"] != r["side"] or side_of(r["url"]) != r["side"]:
            out.append(f"{r['id']}: side or url differs from the split ({s['side']}, rule {side_of(r['url'])})")
    return out


def record_args(rec: dict, as_run: bool) -> dict[str, Any]:
    """The record's arguments; a tokenizer's vocabulary size the page gives becomes ``--vocab-size`` (the
    tokenizer file is not read); ``as_run``: the record's facts about how the job ran applied."""
    args = dict(rec["model_args"])
    if rec.get("tokenizer_vocab_size") and "--vocab-size" not in args:
        args["--vocab-size"] = rec["tokenizer_vocab_size"]
    if as_run and rec.get("checkpoint_loaded") is False:
        for name in LOAD_ONLY:
            args.pop(name, None)
    return args


def optimizer_impl_of(rec: dict) -> str | None:
    """The Adam Megatron-Core imported, from the packages the record shows absent (``packages_absent``, with its
    ``packages_evidence``): ``megatron/core/optimizer/__init__.py`` takes Transformer Engine's ``FusedAdam``, else
    Apex's, else ``torch.optim.AdamW``; None (TE's) where the record says nothing."""
    absent = set(rec.get("packages_absent") or ())
    if "transformer_engine" not in absent:
        return None
    return "torch_foreach" if "apex" in absent else "apex_fused"


#: how ``from-megatron`` refuses an argument its table does not classify (timeline/io/megatron_write.py: convert)
UNKNOWN = ": not a Megatron-LM argument timeline knows"


def run_of(rec: dict, iterations: int, as_run: bool, assume_neutral: tuple[str, ...] = ()):
    """(the run spec ``from-megatron`` writes for the record, simulated for ``iterations``; the
    ``assume_neutral`` arguments left out because ``from-megatron`` refused them as unknown)."""
    from timeline.errors import UserError
    from timeline.io.megatron_args import from_mapping
    from timeline.io.megatron_write import convert, run_file_text
    from timeline.io.runfile import run_from_data

    args, left_out = record_args(rec, as_run), []
    meg = rec.get("megatron") or {}
    while True:
        margs = from_mapping(args, rec.get("env"))
        try:
            conv = convert(margs, world_size=int(rec["world_size"]), gpu=rec["gpu"],
                           pytorch_version=rec.get("pytorch"), te_version=rec.get("transformer_engine"),
                           megatron_core=meg.get("core"), optimizer_impl=optimizer_impl_of(rec))
            break
        except UserError as exc:
            name = str(exc).partition(UNKNOWN)[0]
            if UNKNOWN not in str(exc) or name not in assume_neutral or name not in args:
                raise
            args.pop(name)
            left_out.append(name)
    conv.sections["training"]["iterations"] = iterations
    conv.sections["training"]["warmup_iterations"] = 0
    text = run_file_text(conv, name=rec["id"], source=rec["url"], world_size=int(rec["world_size"]))
    return run_from_data(tomllib.loads(text), Path(f"<from-megatron>/{rec['id']}.toml")), left_out


def device_of(tl, rank: int, world_size: int, pp: int) -> int:
    """The simulated device standing for global rank ``rank``'s pipeline rank."""
    pp_rank = rank // (world_size // pp)
    return next(d for d in range(tl.num_devices) if tl.devices[d].pp_rank == pp_rank)


def predicted(tl, d: int) -> dict[str, int]:
    """Allocated and reserved bytes after the last event, and their peaks over the whole simulation."""
    import numpy as np

    mem = tl.memory[d]
    allocated = np.cumsum(mem.block_bytes, dtype=np.int64)
    return {"allocated": int(allocated[-1]), "max_allocated": int(allocated.max()),
            "reserved": int(mem.reserved[-1]), "max_reserved": int(mem.reserved.max())}


def compare(records: list[dict], *, as_run: bool = False, assume_neutral: tuple[str, ...] = (), only: str = "",
            refused: list | None = None, reserved_gap: bool = False) -> list[dict]:
    """One row per memory line simulated; refusals go to ``refused`` as (record id, side, gpu, reason)."""
    from timeline.errors import UserError
    from timeline.result.build import build_timeline

    refused = [] if refused is None else refused
    rows = []
    for rec in records:
        if only and only not in rec["id"]:
            continue
        if rec.get("not_rebuildable"):
            refused.append((rec["id"], rec["side"], rec.get("gpu"), f"not rebuildable: {rec['not_rebuildable']}"))
            continue
        iterations = max(m["iteration"] for m in rec["memory"])
        try:
            run, left_out = run_of(rec, iterations, as_run, assume_neutral)
        except UserError as exc:
            refused.append((rec["id"], rec["side"], rec["gpu"], str(exc)))
            continue
        tl = build_timeline(run)
        applied = as_run and rec.get("checkpoint_loaded") is False and any(a in rec["model_args"] for a in LOAD_ONLY)
        for line in rec["memory"]:
            d = device_of(tl, line["rank"], int(rec["world_size"]), run.parallel.pp)
            pred = predicted(tl, d)
            row = {"id": rec["id"], "side": rec["side"], "gpu": rec["gpu"], "rank": line["rank"],
                   "iteration": line["iteration"], "device": tl.devices[d].device, "as_run": applied,
                   "assumed_neutral": left_out,
                   "family": "moe" if rec["model_args"].get("--num-experts") else "dense"}
            for q in QUANTITIES:
                meas = round(float(line[f"{q}_mb"]) * MIB)
                row[q] = {"predicted": pred[q], "measured": meas, "error_pct": 100.0 * (pred[q] - meas) / meas}
            if reserved_gap:
                from timeline.result.reserved_gap import reserved_gap as gap

                row["reserved_gap"] = gap(tl, d, top=1)["by_last_occupant"]
            rows.append(row)
    return rows


def row_lines(rows: list[dict]) -> list[str]:
    """One line per calibration row; unseen rows are counted in the summary only (never printed, so no
    rule is written against them)."""
    rows = [r for r in rows if r["side"] == "calibration"]
    head = f"{'record':<32} {'side':<11} {'rank':>4} {'it':>4}"
    for q in QUANTITIES:
        head += f" {q + ' MiB':>21} {'err':>7}"
    out = [head + "  (predicted/measured)"]
    for r in rows:
        mark = (" *" if r["as_run"] else "") + (" +" if r["assumed_neutral"] else "")
        line = f"{r['id'] + mark:<32} {r['side']:<11} {r['rank']:>4} {r['iteration']:>4}"
        for q in QUANTITIES:
            c = r[q]
            line += f" {c['predicted'] / MIB:>10,.0f}/{c['measured'] / MIB:>10,.0f} {c['error_pct']:>+6.2f}%"
        out.append(line)
    if any(r["as_run"] for r in rows):
        out.append("* as run: --no-load-optim / --no-load-rng dropped, the log shows no checkpoint was loaded")
    for r in rows:
        if r["assumed_neutral"]:
            out.append(f"+ {r['id']}: assumed memory-neutral, not in from-megatron's table: "
                       f"{' '.join(r['assumed_neutral'])}")
    return out


def summary_lines(rows: list[dict], refused: list[tuple]) -> list[str]:
    out = []
    for side in ("calibration", "unseen"):
        mine = [r for r in rows if r["side"] == side]
        n_ref = sum(1 for x in refused if x[1] == side)
        out.append(f"{side}: {len(mine)} memory lines simulated, {n_ref} records refused")
        for q in QUANTITIES:
            errs = [abs(r[q]["error_pct"]) for r in mine]
            if errs:
                out.append(f"  {q:<14} median |error| {statistics.median(errs):6.2f}%  worst "
                           f"{max(errs):6.2f}%  within 1/2/4 %: {sum(e <= 1 for e in errs)}/"
                           f"{sum(e <= 2 for e in errs)}/{sum(e <= 4 for e in errs)} of {len(errs)}")
    return out


def report_lines(rows: list[dict], refused: list[tuple], *, reserved: bool) -> list[str]:
    """The rows, the summary per side, each refusal with its reason and, with ``reserved``, each row's
    reserved − allocated at the reserved peak by what last occupied the free space."""
    out = row_lines(rows) + [""] + summary_lines(rows, refused)
    out += [f"refused: {rid} ({side}, {gpu or '?'}): {why}" for rid, side, gpu, why in refused]
    for r in [r for r in rows if r["side"] == "calibration"] if reserved else ():
        parts = ", ".join(f"{k} {v / MIB:,.0f} MiB" for k, v in r["reserved_gap"].items())
        out.append(f"reserved gap: {r['id']} rank {r['rank']}: {parts or '-'}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--only", default="", help="records whose id contains this")
    parser.add_argument("--as-run", action="store_true", help="apply what the records state about how the job ran")
    parser.add_argument("--assume-neutral", default="",
                        help="comma-separated arguments to leave out where from-megatron refuses them as unknown")
    parser.add_argument("--reserved", action="store_true", help="also explain reserved − allocated at the reserved peak")
    parser.add_argument("--json", help="write the rows as JSON here")
    args = parser.parse_args()
    start = time.perf_counter()
    records = json.loads(Path(args.data).read_text())["records"]
    problems = split_problems(records, json.loads(SPLIT.read_text()))
    if problems:
        print("\n".join(f"error: {p}" for p in problems), file=sys.stderr)
        return 2
    refused: list[tuple] = []
    assume = tuple(a.strip() for a in args.assume_neutral.split(",") if a.strip())
    rows = compare(records, as_run=args.as_run, assume_neutral=assume, only=args.only, refused=refused,
                   reserved_gap=args.reserved)
    if args.json:  # calibration rows only, as printed
        Path(args.json).write_text(json.dumps([r for r in rows if r["side"] == "calibration"], indent=1))
    print("\n".join(report_lines(rows, refused, reserved=args.reserved)
                    + [f"wall time {time.perf_counter() - start:.1f} s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
