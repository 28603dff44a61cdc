"""Hold the simulator against measured Megatron-LM jobs (``../shared/measured/megatron_calibration.json``).

Every expressible case (``expressible_note`` empty, ``model_args`` present) goes through
``timeline from-megatron`` (in process) and a 2-iteration simulation with summary output only; the
last pipeline rank's device — global rank ``world_size − 1`` under Megatron's rank order — is
compared with ``measured.max_allocated_bytes_second_logged``. Prints predicted, measured and error per
case, then median and worst |error| per family (dense / MoE, published / inferred world size), the
counts within 1, 2 and 4 %, and the wall time. ``--json FILE`` also writes the rows.

The steady state is compared too: what the device holds after iteration 1's optimizer step (the
blocks of the static state's and iteration 1's events) against ``measured.allocated_bytes_first_iter``, which
``training_log()`` logged then — weights, gradients, optimizer state and persistent workspaces, no
activations. Cases whose first logged iteration is not 1 (a resumed run's goldens) have no steady
column.

    .venv/bin/python tools/validate_measured.py [--data PATH] [--only SUBSTRING] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from timeline.io.megatron_args import MegatronArgs
    from timeline.io.megatron_map import Conversion
    from timeline.result.timeline import Timeline

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_DATA = ROOT.parent / "shared" / "measured" / "megatron_calibration.json"

#: measured.gpu prefix → --gpu
GPU_KINDS = {"H100": "h100", "GB200": "gb200", "A100": "a100", "B200": "b200", "H200": "h200"}


#: Megatron-LM's CI "dev" container, as ``docker/.ngc_version.dev`` names it from each commit on
#: (``git log -- docker/.ngc_version.dev`` in NVIDIA/Megatron-LM), with the PyTorch release line of
#: the main-branch snapshot that NGC's ``pytorch:YY.MM`` container ships (NGC's release notes:
#: 25.12 is based on 2.10.0a0+b4e4ee81d3; each container takes main about a month before it ships,
#: and main is X.Y.0a0 from the X−1 release branch cut on). Only the PyTorch version's effect on the
#: default cuBLAS workspace of Blackwell GPUs depends on it here (2.12 is the first with 32 MiB there);
#: the GB200 goldens re-recorded at the 26.04 bump (5fe3f06) show it: the same configurations'
#: steady-state allocated rose by 47.0 MiB, two workspaces of 32 − 8.125 MiB.
DEV_CONTAINERS = (  # (from date, commit, container, PyTorch)
    ("2025-11-05", "eb48e81bd7", "25.09", "2.9"),
    ("2026-01-14", "82049aa847", "25.11", "2.10"),
    ("2026-03-05", "f5b2ec0130", "26.02", "2.11"),
    ("2026-05-07", "5fe3f06658", "26.04", "2.12"),
    ("2026-07-08", "64bee49c96", "26.06", "2.13"),
)


#: The Transformer Engine Megatron-LM's CI image builds (``docker/Dockerfile.ci.dev``: ``uv sync --extra te
#: --locked``) from each commit on: ``pyproject.toml``'s ``[tool.uv.sources] transformer-engine`` git rev
#: (``git log --first-parent -- pyproject.toml`` in NVIDIA/Megatron-LM), its version read from that rev's
#: ``build_tools/VERSION.txt`` in NVIDIA/TransformerEngine (a ``release_vX.Y`` branch is X.Y). Where the
#: source line was commented out (2025-11-25 to 2026-01-13) the PyPI range ``>=2.9.0a0,<2.10.0`` stood.
TE_PINS = (  # (from date, commit, TE)
    ("2025-08-06", "cc227f797c", "2.6"),    # rev c90a720 (release_v2.6)
    ("2025-09-23", "f32b2731ac", "2.7"),    # rev 0289e76 (release_v2.7)
    ("2025-10-21", "adc69dba2d", "2.8"),    # release_v2.8
    ("2025-10-22", "754dfa2de4", "2.9"),    # release_v2.9 (committed 2025-10-21, after adc69db)
    ("2026-01-14", "2490e0c08a", "2.10"),   # release_v2.10
    ("2026-01-17", "20d66d5c7b", "2.11"),   # release_v2.11
    ("2026-02-09", "30695913bd", "2.12"),   # rev d9b7fc5
    ("2026-03-11", "da469460be", "2.13"),   # rev 2877704
    ("2026-04-09", "b5354a82fc", "2.14"),   # rev 71bbefb
    ("2026-05-28", "4f2e7ce74a", "2.15"),   # rev 42b8400
    ("2026-06-02", "b0eb9143c3", "2.16"),   # rev f8a01cd
    ("2026-07-14", "834abc1950", "2.17"),   # rev 2e559f0
    ("2026-08-11", "0c1fc4c5c9", "2.18"),   # rev e7c550c
    ("2026-08-22", "2c8ac9b753", "2.17"),   # rev 4329ff8 (2.17.1)
)


#: Megatron-Core's version on Megatron-LM's main branch from each commit on
#: (``git log --first-parent -- megatron/core/package_info.py``: MAJOR.MINOR.PATCH + PRE_RELEASE); the
#: calibration cases were recorded from 2025-09 on.
MC_VERSIONS = (  # (from date, commit, Megatron-Core)
    ("2025-08-18", "8e11c520e4", "0.15.0rc0"),
    ("2025-08-25", "48406695c4", "0.15.0rc1"),
    ("2025-09-01", "3271c42838", "0.15.0rc2"),
    ("2025-09-02", "402549482f", "0.15.0rc3"),
    ("2025-09-08", "ba97a7e282", "0.15.0rc4"),
    ("2025-09-15", "2fbece51ec", "0.15.0rc5"),
    ("2025-09-22", "c78fb08765", "0.15.0rc6"),
    ("2025-09-29", "e65669313a", "0.15.0rc7"),
    ("2025-10-06", "f3452948bb", "0.15.0rc8"),
    ("2025-10-21", "4666de7a28", "0.16.0rc0"),
    ("2026-03-31", "e1db3211a0", "0.17.0rc0"),
    ("2026-03-31", "f09f5c98e6", "0.18.0rc0"),
    ("2026-04-09", "2f5c62c312", "0.18.0"),
    ("2026-06-03", "7a7f7b4130", "0.19.0"),
    ("2026-07-29", "efb3963f3c", "0.20.0"),
)


def _recorded(record: dict) -> tuple[str, str]:
    """(commit, date) the case's memory values were recorded at."""
    commit = str(record.get("memory_values_first_commit") or record.get("commit") or "")
    date = str(record.get("memory_values_first_commit_date") or record.get("commit_date") or "")
    return commit, date


def _pinned(record: dict, history: tuple[tuple[str, str, str], ...]) -> str | None:
    """The value of ``history`` (date, commit, value) in force when the case was recorded."""
    commit, date = _recorded(record)
    version = None
    for since, bump, value in history:
        if date > since or commit.startswith(bump):
            version = value
    return version


def pytorch_of(record: dict) -> str | None:
    """The PyTorch release line of the container the case's memory values were recorded in (None:
    recorded before ``.ngc_version.dev`` existed, where the run file's default stands; no Blackwell
    case is that old)."""
    return _pinned(record, tuple((since, bump, pytorch) for since, bump, _c, pytorch in DEV_CONTAINERS))


def megatron_of(record: dict) -> str | None:
    """The Megatron-Core version of the commit the case's memory values were recorded at."""
    return _pinned(record, MC_VERSIONS)


def te_of(record: dict) -> str | None:
    """The Transformer Engine version the case ran (None: recorded before the first pin listed, where
    the run file's default stands)."""
    return _pinned(record, TE_PINS)


def expressible(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("model_args") and not r.get("expressible_note")]


def _layout(record: dict) -> tuple:
    par = record["parallel"]
    return tuple(par.get(k) or 1 for k in ("tp", "pp", "vpp", "cp", "ep"))


def measurement_copies(records: list[dict]) -> dict[str, str]:
    """Cases whose measured memory cannot be of their own configuration: byte-identical (steady and peak
    allocated both) to another case's golden, current or previous, of a different parallel layout. Two
    layouts give different per-rank shapes, so identical bytes mean a golden file copied between test
    directories (as Megatron-LM's 22c69fa did, copying gpt3_15b_8t_release_sm's H100 golden of
    f57304256e into the new gpt3_15b_8t_release_sm_gb200). Case name → the case it copies."""
    seen: dict[tuple, list[dict]] = {}
    for r in records:
        prev = r.get("previous_memory_values") or {}
        if prev.get("alloc_last") and prev.get("max_last"):
            seen.setdefault((prev["alloc_last"][1], prev["max_last"][1]), []).append(r)
        m = r["measured"]
        seen.setdefault((m.get("allocated_bytes"), m.get("max_allocated_bytes_last_iter")), []).append(r)
    out = {}
    for r in records:
        m = r["measured"]
        key = (m.get("allocated_bytes"), m.get("max_allocated_bytes_last_iter"))
        if None in key:
            continue
        other = next((o for o in seen.get(key, []) if o is not r and _layout(o) != _layout(r)), None)
        if other is not None:
            out[r["name"]] = other["name"]
    return out


def gpu_of(record: dict) -> str:
    text = str(record["measured"].get("gpu", "H100"))
    return next((v for k, v in sorted(GPU_KINDS.items(), key=lambda kv: -len(kv[0])) if text.startswith(k)), "h100")


def family(record: dict) -> str:
    moe = bool(record["model_args"].get("--num-experts"))
    inferred = bool(record["parallel"].get("world_size_inferred"))
    return f"{'moe' if moe else 'dense'}{' (inferred world size)' if inferred else ''}"


def steady_after_first(tl: Timeline, d: int) -> int:
    """Allocated bytes of device ``d`` after iteration 1 (index 0) and its optimizer step: the blocks of
    the static state's and that iteration's events (each event belongs to the iteration of the action
    making it, so a step of no duration at the next iteration's first instant still counts)."""
    import numpy as np

    its = tl.event_iterations(d)
    blocks = tl.memory[d].block_bytes
    return int(np.sum(blocks[its <= 0], dtype=np.int64))


def world_size_candidates(record: dict) -> list[int]:
    """The published world size; for an inferred one the dataset's choice, then its other candidates
    (``world_size_inference``) by the |residual| it ranked them with."""
    par = record["parallel"]
    first = int(par["world_size"])
    if not par.get("world_size_inferred"):
        return [first]
    ranked = sorted(record.get("world_size_inference") or [], key=lambda c: abs(c["residual_bytes"]))
    return [first] + [int(c["world_size"]) for c in ranked if int(c["world_size"]) != first]


def convert_at_world_size(record: dict, margs: MegatronArgs) -> tuple[int, Conversion]:
    """(world size, conversion): the first candidate world size whose micro-batch count Megatron's
    schedule accepts — an inferred world size it would refuse cannot be the one the job ran on."""
    from timeline.io.megatron_write import UnschedulableJob, convert

    candidates = world_size_candidates(record)
    for i, world in enumerate(candidates):
        try:
            return world, convert(margs, world_size=world, gpu=gpu_of(record), pytorch_version=pytorch_of(record),
                                  te_version=te_of(record), megatron_core=megatron_of(record))
        except UnschedulableJob:
            if i == len(candidates) - 1:
                raise
    raise AssertionError("unreachable")


def predict(record: dict) -> tuple[int, int, dict, int, int]:
    """(peak allocated, peak reserved, the reserved gap explained, allocated after iteration 1) of the
    last pipeline rank's device, and the world size simulated."""
    from timeline.io.megatron_args import from_mapping
    from timeline.io.megatron_write import run_file_text
    from timeline.io.runfile import run_from_data
    from timeline.result.build import build_timeline

    fam = record.get("family_dir", "")
    margs = from_mapping(record["model_args"], record.get("env"), family=fam,
                         family_source=f"the path test_cases/{fam}/")
    world, conv = convert_at_world_size(record, margs)
    text = run_file_text(conv, name=record["name"].replace("/", "-"), source=record["config_file"], world_size=world)
    run = run_from_data(tomllib.loads(text), Path(f"<from-megatron>/{record['name']}.toml"))
    tl = build_timeline(run)
    last = max(range(tl.num_devices), key=lambda d: tl.devices[d].pp_rank)
    pk = tl.peak(last)
    from timeline.result.reserved_gap import reserved_gap

    return pk.allocated_bytes, pk.reserved_bytes, reserved_gap(tl, last, top=1), steady_after_first(tl, last), world


def gap_lines(rows: list[dict]) -> list[str]:
    """Per case, reserved − allocated at the reserved peak by what last occupied the free space."""
    out = []
    for r in rows:
        parts = ", ".join(f"{k} {v / 2**20:,.0f} MiB" for k, v in r["reserved_gap"].items())
        out.append(f"{r['name']:<78} reserved gap: {parts or '-'}")
    return out


def _steady_cell(r: dict) -> str:
    if r["steady_measured"] is None:
        return f"{'-':>10} {'-':>10}"
    return f"{r['steady_predicted'] / 2**20:>10,.1f} {(r['steady_predicted'] - r['steady_measured']) / 2**20:>+10.1f}"


def table(rows: list[dict]) -> str:
    out = [f"{'case':<78} {'family':<28} {'predicted':>14} {'measured':>14} {'error':>8} {'reserved':>14} "
           f"{'steady MiB':>10} {'vs meas.':>10}"]
    for r in rows:
        out.append(f"{r['name']:<78} {r['family']:<28} {r['predicted']:>14,} {r['measured']:>14,} "
                   f"{r['error_pct']:>+7.2f}% {r['reserved']:>14,} {_steady_cell(r)}")
    out.append("")
    copied = [r for r in rows if r.get("copy_of")]
    rows = [r for r in rows if not r.get("copy_of")]
    for fam in sorted({r["family"] for r in rows}):
        errs = [abs(r["error_pct"]) for r in rows if r["family"] == fam]
        out.append(f"{fam:<30} n={len(errs):>3}  median |error| {statistics.median(errs):6.2f}%  "
                   f"worst {max(errs):6.2f}%")
    for label, keep in (("published world size (gated)", lambda r: "inferred" not in r["family"]),
                        ("all", lambda r: True)):
        errs = [abs(r["error_pct"]) for r in rows if keep(r)]
        if errs:
            out.append(f"{label:<30} n={len(errs):>3}  median |error| {statistics.median(errs):6.2f}%  "
                       f"worst {max(errs):6.2f}%  within 1/2/4 %: {sum(e <= 1 for e in errs)}/"
                       f"{sum(e <= 2 for e in errs)}/{sum(e <= 4 for e in errs)}")
    out.append("")
    out.append("steady state after iteration 1 (predicted − measured allocated_bytes_first_iter):")
    for label, keep in (("pp = 1", lambda r: r["pp"] == 1), ("pp > 1", lambda r: r["pp"] > 1), ("all", lambda r: True)):
        ds = [(r["steady_predicted"] - r["steady_measured"]) / 2**20 for r in rows
              if keep(r) and r["steady_measured"] is not None]
        pct = [100.0 * abs(r["steady_predicted"] - r["steady_measured"]) / r["steady_measured"] for r in rows
               if keep(r) and r["steady_measured"] is not None]
        if ds:
            out.append(f"  {label:<28} n={len(ds):>3}  median |error| {statistics.median(map(abs, ds)):8.1f} MiB "
                       f"({statistics.median(pct):.2f}%)  worst {max(ds, key=abs):+9.1f} MiB ({max(pct):.2f}%)")
    for r in copied:
        out.append(f"not compared: {r['name']}: its measured memory is byte for byte a golden of "
                   f"{r['copy_of']}, a different parallel layout (a golden file copied between test directories)")
    return "\n".join(out)


def validate(records: list[dict], only: str = "", failed: list | None = None) -> list[dict]:
    """Rows per simulated case; cases that cannot be simulated go to ``failed`` as (name, message)."""
    from timeline.errors import UserError

    failed = [] if failed is None else failed
    copies = measurement_copies(records)
    rows = []
    for rec in expressible(records):
        if only and only not in rec["name"]:
            continue
        measured = int(rec["measured"]["max_allocated_bytes_second_logged"]["bytes"])
        try:
            alloc, reserved, gap, steady, world = predict(rec)
        except UserError as exc:
            failed.append((rec["name"], str(exc)))
            continue
        m = rec["measured"]
        steady_measured = int(m["allocated_bytes_first_iter"]) if m.get("first_iter") == 1 else None
        rows.append({"name": rec["name"], "family": family(rec), "predicted": alloc, "measured": measured,
                     "error_pct": 100.0 * (alloc - measured) / measured, "reserved": reserved,
                     "reserved_gap": gap["by_last_occupant"], "pp": int(rec["parallel"].get("pp") or 1),
                     "steady_predicted": steady, "steady_measured": steady_measured, "world_size": world,
                     "dataset_world_size": int(rec["parallel"]["world_size"]),
                     "copy_of": copies.get(rec["name"])})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--only", default="", help="cases whose name contains this")
    parser.add_argument("--json", help="write the rows as JSON here")
    parser.add_argument("--reserved", action="store_true",
                        help="also explain each case's reserved − allocated from the event stream")
    args = parser.parse_args()
    start = time.perf_counter()
    failed: list[tuple[str, str]] = []
    rows = validate(json.loads(Path(args.data).read_text()), args.only, failed)
    print(table(rows))
    if args.reserved:
        print("\n".join(gap_lines(rows)))
    for r in rows:
        if r["world_size"] != r["dataset_world_size"]:
            print(f"world size: {r['name']}: the dataset's inferred {r['dataset_world_size']} gives a micro-batch "
                  f"count Megatron's schedule refuses; its next candidate, {r['world_size']}, is simulated")
    for name, message in failed:
        print(f"not simulated: {name}: {message}")
    print(f"wall time {time.perf_counter() - start:.1f} s for {len(rows)} cases")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
