"""``timeline schedule``: the terminal drawing, CSV out, and CSV schedules read back."""

from __future__ import annotations

from pathlib import Path

from timeline.cli import main

SHIPPED = Path(__file__).resolve().parents[2] / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"
SMALL = ["--set", "parallel.pp=4", "--set", "parallel.layout=[16,16,16,13]", "--set", "training.num_microbatches=6"]


def test_draws_ranks_by_time(capsys):
    assert main(["schedule", str(SHIPPED), *SMALL]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("1f1b: pp=4 chunks=4 micro-batches=6")
    rows = [line for line in out if line.startswith("rank ")]
    assert len(rows) == 4
    assert rows[0].split("|")[1].split()[:4] == ["0F0", "0F1", "0F2", "0F3"]  # warm-up: p - r - 1 = 3, then 1F1B
    assert rows[3].split("|")[1].split()[3:5] == ["3F0", "3B0"]


def test_csv_round_trip(tmp_path, write_run, capsys):
    csv = tmp_path / "my.csv"
    assert main(["schedule", str(SHIPPED), *SMALL, "--set", "schedule.kind=gpipe", "--csv", str(csv)]) == 0
    rows = csv.read_text().splitlines()
    assert len(rows) == 4 and rows[0].split(",")[:2] == ["0F0", "0F1"]
    assert main(["schedule", str(SHIPPED), *SMALL, "--set", "schedule.kind=csv", "--set",
                 f'schedule.csv="{csv}"']) == 0
    assert "csv: pp=4" in capsys.readouterr().out


def test_invalid_csv_names_rank_position_and_reason(tmp_path, capsys):
    csv = tmp_path / "bad.csv"
    csv.write_text("0F0,0B0\n1B0,1F0\n2F0,2B0\n3F0,3B0\n")
    code = main(["schedule", str(SHIPPED), *SMALL, "--set", "training.num_microbatches=1", "--set",
                 "schedule.kind=csv", "--set", f'schedule.csv="{csv}"'])
    err = capsys.readouterr().err
    assert code == 2 and "rank 1" in err and "position 0" in err and "before" in err.lower()
    csv.write_text("0F0,0X0\n")
    assert main(["schedule", str(SHIPPED), *SMALL, "--set", "schedule.kind=csv", "--set",
                 f'schedule.csv="{csv}"']) == 2
    assert "unknown action" in capsys.readouterr().err
