"""The README's worked DuckDB queries run on a simulated run directory and agree with summary.json."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from timeline.cli import main

duckdb = pytest.importorskip("duckdb")
ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"
SMALL = ["--set", "model.profile=megatron", "--set", "model.num_layers=4", "--set", "parallel.pp=2",
         "--set", "parallel.layout=[2,2]", "--set", "training.seq_len=512", "--set", "training.num_microbatches=4",
         "--set", "model.n_routed_experts=16", "--set", "parallel.dp=8", "--set", "model.mtp_layers=0"]


def readme_queries() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("### Worked queries", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sql\n(.*?)```", section, flags=re.S)


def test_readme_queries(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert main(["simulate", str(SHIPPED), "-o", str(out), "--no-progress", "--format",
                 "summary,memory,events,ops,devices", *SMALL]) == 0
    summary = json.loads((out / "summary.json").read_text())
    monkeypatch.chdir(out)
    peaks, lived, busy = (duckdb.sql(q).fetchall() for q in readme_queries())
    it1 = {d["device"]: next(p for p in d["per_iteration"] if p["iteration"] == 1) for d in summary["devices"]}
    assert [(r[0], r[1]) for r in peaks] == [(d["device"], d["pp_rank"]) for d in summary["devices"]]
    for device, _, peak_gib, cap_gib in peaks:
        assert peak_gib == it1[device]["peak_reserved_bytes"] / 2**30 and cap_gib == 80.0
    assert len(lived) == 3 and all(r[2] > 0 and r[3] > 0 for r in lived)
    assert lived == sorted(lived, key=lambda r: -r[2])
    phases = {(r[0], r[1]): set() for r in busy}
    for device, iteration, phase, ms in busy:
        phases[(device, iteration)].add(phase)
        assert ms > 0
    assert sorted(phases) == [(d["device"], i) for d in summary["devices"] for i in (0, 1)]
    assert all({"F", "B", "step"} <= p for p in phases.values())
