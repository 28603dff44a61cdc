"""The parts of ``tools/validate_measured.py``'s report: calibration and unseen, never mixed.

Which records a ``--set`` holds: ``shared`` — the calibration dataset
(``../shared/measured/megatron_calibration.json``); ``calibration`` — it and the collected records
(``tools/collect_megatron_cases.py``) on the calibration side of ``tools/megatron_split.json``;
``unseen`` — the collected records on the unseen side; ``all`` — every part.

A part's summary: per family (dense / MoE) and over all, median, p90 and worst |error| of the peak and
the counts within 1, 2 and 4 %, over every record and over the newest record per case and golden
platform; the steady state after iteration 1 likewise; and every record not compared, counted by its
one-line reason — the ``expressible_note`` kinds and ``from-megatron``'s refusals. The unseen part is
printed as that summary only: no case name, no per-case row (rules are written from calibration data).
"""

from __future__ import annotations

import collections
import json
import re
import statistics
from pathlib import Path

DEFAULT_CASES = Path.home() / ".cache" / "timeline" / "megatron-cases.json"
SETS = ("shared", "calibration", "unseen", "all")


def load_cases(path: Path) -> list[dict] | str:
    """The collected records, or the one line saying where they come from when ``path`` holds none."""
    if not path.exists():
        return (f"--cases {path}: no collected records there; run tools/collect_megatron_cases.py first "
                f"(it writes {DEFAULT_CASES} by default)")
    return json.loads(path.read_text())


def parts(which: str, shared: list[dict], cases: list[dict]) -> list[tuple[str, list[dict], bool]]:
    """(label, records, per-case rows printed) of each part a ``--set`` holds, calibration first."""
    out = []
    if which in ("shared", "calibration", "all"):
        out.append(("calibration: the shared dataset", shared, True))
    if which in ("calibration", "all"):
        out.append(("calibration: collected", [r for r in cases if r["side"] == "calibration"], True))
    if which in ("unseen", "all"):
        out.append(("unseen", [r for r in cases if r["side"] == "unseen"], False))
    return out


def gap_lines(rows: list[dict]) -> list[str]:
    """Per case, reserved − allocated at the reserved peak by what last occupied the free space."""
    out = []
    for r in rows:
        gaps = ", ".join(f"{k} {v / 2**20:,.0f} MiB" for k, v in r["reserved_gap"].items())
        out.append(f"{r['name']:<78} reserved gap: {gaps or '-'}")
    return out


def _steady_cell(r: dict) -> str:
    if r["steady_measured"] is None:
        return f"{'-':>10} {'-':>10}"
    return f"{r['steady_predicted'] / 2**20:>10,.1f} {(r['steady_predicted'] - r['steady_measured']) / 2**20:>+10.1f}"


def table(rows: list[dict]) -> str:
    out = [f"{'case':<78} {'family':<38} {'predicted':>14} {'measured':>14} {'error':>8} {'reserved':>14} "
           f"{'steady MiB':>10} {'vs meas.':>10}"]
    for r in rows:
        out.append(f"{r['name']:<78} {r['family']:<38} {r['predicted']:>14,} {r['measured']:>14,} "
                   f"{r['error_pct']:>+7.2f}% {r['reserved']:>14,} {_steady_cell(r)}")
    out.append("")
    copied = [r for r in rows if r.get("copy_of")]
    rows = [r for r in rows if not r.get("copy_of")]
    for fam in sorted({r["family"] for r in rows}):
        errs = [abs(r["error_pct"]) for r in rows if r["family"] == fam]
        out.append(f"{fam:<38} n={len(errs):>3}  median |error| {statistics.median(errs):6.2f}%  "
                   f"worst {max(errs):6.2f}%")
    for label, keep in (("published world size (gated)", lambda r: "inferred" not in r["family"]),
                        ("all", lambda r: True)):
        errs = [abs(r["error_pct"]) for r in rows if keep(r)]
        if errs:
            out.append(f"{label:<38} n={len(errs):>3}  median |error| {statistics.median(errs):6.2f}%  "
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


def reason(message: str) -> str:
    """A refusal's one line without what is particular to one case (quoted values, numbers)."""
    return re.sub(r"\d+", "N", re.sub(r"'[^']*'", "'…'", message))


def _stats(errs: list[float]) -> str:
    if not errs:
        return "n=  0"
    p90 = statistics.quantiles(errs, n=10, method="inclusive")[-1] if len(errs) > 1 else errs[0]
    return (f"n={len(errs):>4}  median {statistics.median(errs):5.2f}%  p90 {p90:5.2f}%  worst {max(errs):6.2f}%  "
            f"within 1/2/4 %: {sum(e <= 1 for e in errs)}/{sum(e <= 2 for e in errs)}/{sum(e <= 4 for e in errs)}")


def newest(rows: list[dict]) -> list[dict]:
    """The newest record of each case and golden platform."""
    best: dict[tuple, dict] = {}
    for r in rows:
        key = (r["name"], r.get("golden_tag"))
        if key not in best or (r.get("date") or "") > (best[key].get("date") or ""):
            best[key] = r
    return list(best.values())


def summary(label: str, records: list[dict], rows: list[dict], failed: list[tuple[str, str]]) -> list[str]:
    """A part's aggregate lines (no case names)."""
    rows = [r for r in rows if not r.get("copy_of")]
    note_kinds = collections.Counter(kind for r in records if r.get("expressible_note")
                                     for kind in r["expressible_note"].split("; "))
    no_args = sum(1 for r in records if not r.get("model_args") and not r.get("expressible_note"))
    expressible = [r for r in records if r.get("model_args") and not r.get("expressible_note")]
    out = [f"== {label}: {len(records)} records of {len({r['name'] for r in records})} cases; "
           f"{len(expressible)} expressible ({len({r['name'] for r in expressible})} cases), {len(rows)} compared =="]
    for scope, chosen in (("records", rows), ("newest per case and platform", newest(rows))):
        out.append(f"  peak allocated |error| over {scope}:")
        for fam in sorted({r["family"] for r in chosen}):
            out.append(f"    {fam:<38} {_stats([abs(r['error_pct']) for r in chosen if r['family'] == fam])}")
        out.append(f"    {'all':<38} {_stats([abs(r['error_pct']) for r in chosen])}")
    steady = [100.0 * abs(r["steady_predicted"] - r["steady_measured"]) / r["steady_measured"]
              for r in rows if r["steady_measured"]]
    out.append(f"  steady state after iteration 1 |error|: {_stats(steady)}")
    refused = collections.Counter(reason(message) for _name, message in failed)
    out.append(f"  refused by from-megatron: {len(failed)} records ({len({n for n, _ in failed})} cases)")
    out += [f"    {n:>5}  {why}" for why, n in refused.most_common()]
    out.append(f"  not expressible (expressible_note): {len(records) - len(expressible) - no_args} records; by kind:")
    out += [f"    {n:>5}  {kind}" for kind, n in note_kinds.most_common()]
    if no_args:
        out.append(f"  no model_args: {no_args} records")
    return out
