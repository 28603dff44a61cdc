"""``timeline schedule``: the terminal drawing, CSV out, and CSV schedules read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from timeline.cli import main

SHIPPED = Path(__file__).resolve().parents[2] / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"
SMALL = ["--set", "parallel.pp=4", "--set", "parallel.layout=[16,16,16,13]", "--set", "training.num_microbatches=6"]


def test_draws_ranks_by_time(capsys):
    assert main(["schedule", str(SHIPPED), *SMALL]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("1f1b: pp=4 chunks=4 micro-batches=6")
    rows = [line for line in out if line.startswith("rank ")][:4]  # the first window of steps
    assert max(map(len, out)) <= 100 and "(in windows of" in out[1]
    assert rows[0].split("|")[1].split()[:4] == ["0F0", "0F1", "0F2", "0F3"]  # warm-up: p - r - 1 = 3, then 1F1B
    assert rows[3].split("|")[1].split()[3:5] == ["3F0", "3B0"]


def test_windows_cover_every_step_once(capsys):
    assert main(["schedule", str(SHIPPED), *SMALL]) == 0
    out = capsys.readouterr().out.splitlines()
    steps = [int(t) for line in out if line.startswith("step ") for t in line.split("|")[1].split()]
    assert steps == list(range(27))  # 1F1B, pp=4, 6 micro-batches: (m + p − 1)·3 steps
    rank0 = [c for line in out if line.startswith("rank 0 ") for c in line.split("|")[1].split()]
    assert len(rank0) == 27 and rank0.count("0B5") == 1


def test_steps_window_is_half_open(capsys):
    assert main(["schedule", str(SHIPPED), *SMALL, "--steps", "3:6"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "[3:6]" in out[0]
    assert out[1].split("|")[1].split() == ["3", "4", "5"]
    rank3 = next(line for line in out if line.startswith("rank 3 "))
    assert rank3.split("|")[1].split() == ["3F0", "3B0", "-"]
    assert main(["schedule", str(SHIPPED), *SMALL, "--steps", "20:"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split("|")[1].split() == [str(t) for t in range(20, 27)]


def test_schedule_of_pp16_fits_100_columns(capsys):
    assert main(["schedule", str(SHIPPED)]) == 0
    assert max(map(len, capsys.readouterr().out.splitlines())) <= 100


def test_bad_steps_window(capsys):
    for bad in ("5:5", "x:3", "7", "-1:3"):
        try:
            main(["schedule", str(SHIPPED), *SMALL, "--steps", bad])
        except SystemExit as exc:
            assert exc.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "--steps" in err and len(err.splitlines()) == 1


def test_csv_logic_error_names_the_csv_file(tmp_path, capsys):
    csv = tmp_path / "short.csv"
    csv.write_text("0F0,0B0\n1F0\n")  # rank 1 never runs its backward
    args = [str(SHIPPED), "--set", "parallel.pp=2", "--set", "parallel.layout=[31,30]", "--set",
            "training.num_microbatches=1", "--set", "schedule.kind=csv", "--set", f'schedule.csv="{csv}"']
    for command in (["schedule"], ["simulate", "--format", "summary", "-o", str(tmp_path / "o")]):
        assert main([*command, *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {csv}: ") and "1B0" in err and len(err.splitlines()) == 1, err


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


def test_help_lists_every_schedule_kind(capsys):
    """``schedule --help`` reads the one table of kinds."""
    from timeline.spec.schedule_rules import kinds_help

    with pytest.raises(SystemExit):
        main(["schedule", "--help"])
    out = capsys.readouterr().out
    assert all(line in out.splitlines() for line in kinds_help().splitlines())
