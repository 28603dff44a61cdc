"""A CSV schedule is read with its run file (``io``), into the spec, like a captured trace: the run
carries its rows (``RunSpec.csv_rows``) through every command, variant and simulation."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from timeline.errors import UserError
from timeline.io.csv_schedule import read_csv
from timeline.io.runfile import load_run

SCHEDULES = Path(__file__).resolve().parents[2] / "schedules"


def test_the_rows_ride_on_the_run():
    run = load_run(SCHEDULES / "llama3-8b-csv.toml")
    assert run.csv_rows == tuple(tuple(r) for r in read_csv(SCHEDULES / "llama3-8b-1f1b-pp4.csv"))
    assert replace(run, name="other").csv_rows == run.csv_rows  # variants keep them
    assert load_run(SCHEDULES / "deepseek-v3-pp16-tp2-ep8.toml").csv_rows is None


def test_a_relative_path_is_read_beside_the_run_file(tmp_path, monkeypatch):
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "two.csv").write_text("0F0,0B0\n0F0,0B0\n")
    (folder / "run.toml").write_text('[model]\npreset = "llama3-8b"\n[parallel]\npp = 2\n'
                                     '[training]\nnum_microbatches = 1\n[schedule]\nkind = "csv"\ncsv = "two.csv"\n')
    monkeypatch.chdir(tmp_path)
    assert load_run(Path("runs") / "run.toml").csv_rows == (("0F0", "0B0"), ("0F0", "0B0"))
    (folder / "two.csv").unlink()
    with pytest.raises(UserError, match="two.csv: cannot read the schedule"):
        load_run(folder / "run.toml")
