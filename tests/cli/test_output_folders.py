"""Output folders: ``--force`` replaces only a folder timeline wrote (it holds
``timeline-output.json``), never a foreign folder, never through a symbolic link; a run's
``name`` cannot climb out of ``runs/``; over-long paths are one error line. Nothing outside
a timeline output folder is touched."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
from helpers_run import TINY_RUN_TOML

from timeline.cli import main


def _run(tmp: Path, extra: str = "", name: str = "run.toml") -> str:
    path = tmp / name
    path.write_text(TINY_RUN_TOML.replace('name = "tiny"\n', extra))
    return str(path)


def _simulate(run: str, out: Path | None = None, *flags: str) -> list[str]:
    return ["simulate", run, "--format", "summary", *(["-o", str(out)] if out else []), *flags]


def _foreign(folder: Path) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    files = {"thesis.tex": "years of work", "data.csv": "1,2,3"}
    for name, text in files.items():
        (folder / name).write_text(text)
    return files


def _intact(folder: Path, files: dict[str, str]) -> None:
    assert sorted(os.listdir(folder)) == sorted(files)
    for name, text in files.items():
        assert (folder / name).read_text() == text


def _one_error(capsys, *fragments: str) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def _no_leftovers(parent: Path) -> None:
    assert not [p for p in os.listdir(parent) if ".partial-" in p or ".replaced-" in p]


@pytest.fixture(autouse=True)
def _elsewhere(tmp_path, monkeypatch):
    """Every test runs in its own folder, so a default runs/NAME lands there."""
    monkeypatch.chdir(tmp_path)


def test_force_refuses_a_foreign_folder(tmp_path, capsys):
    victim = tmp_path / "victim"
    files = _foreign(victim)
    assert main(_simulate(_run(tmp_path), victim, "--force")) == 2
    _one_error(capsys, "is not a timeline output folder", "thesis.tex", "remove it yourself")
    _intact(victim, files)
    _no_leftovers(tmp_path)


def test_force_replaces_an_earlier_output_folder_and_only_that(tmp_path, capsys):
    out = tmp_path / "out"
    run = _run(tmp_path)
    assert main(_simulate(run, out)) == 0
    marker = json.loads((out / "timeline-output.json").read_text())
    assert marker == {"schema": "timeline.output/1", "command": "simulate", "version": marker["version"]}
    (out / "stale.txt").write_text("from an earlier run")
    assert main(_simulate(run, out)) == 2  # no --force: refused
    _one_error(capsys, "exists", "--force")
    assert main(_simulate(run, out, "--force")) == 0
    assert sorted(os.listdir(out)) == ["summary.json", "timeline-output.json"]
    _no_leftovers(tmp_path)


def test_an_empty_folder_is_filled(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    assert main(_simulate(_run(tmp_path), out)) == 0
    assert (out / "summary.json").is_file()


@pytest.mark.parametrize("target", ["output", "foreign"])
def test_never_through_a_symlink(tmp_path, capsys, target):
    run = _run(tmp_path)
    real = tmp_path / "real"
    if target == "output":
        assert main(_simulate(run, real)) == 0
        files = {n: (real / n).read_text() for n in os.listdir(real)}
    else:
        files = _foreign(real)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    assert main(_simulate(run, link, "--force")) == 2
    _one_error(capsys, "symbolic link")
    assert link.is_symlink()
    _intact(real, files)


def test_a_marker_that_is_a_link_does_not_count(tmp_path, capsys):
    run = _run(tmp_path)
    good = tmp_path / "good"
    assert main(_simulate(run, good)) == 0
    victim = tmp_path / "victim"
    files = _foreign(victim)
    (victim / "timeline-output.json").symlink_to(good / "timeline-output.json")
    files_with_link = set(files) | {"timeline-output.json"}
    assert main(_simulate(run, victim, "--force")) == 2
    _one_error(capsys, "is not a timeline output folder")
    assert set(os.listdir(victim)) == files_with_link


@pytest.mark.parametrize("name", ["../../victim", "../victim", "/tmp/victim", ".hidden", "a/b", "", "x" * 101])
def test_a_traversing_or_odd_name_is_refused(tmp_path, capsys, monkeypatch, name):
    work = tmp_path / "work" / "deep"
    work.mkdir(parents=True)
    victim = tmp_path / "victim"
    files = _foreign(victim)
    monkeypatch.chdir(work)
    run = _run(work, f"name = {json.dumps(name)}\n")
    assert main(_simulate(run, None, "--force")) == 2
    _one_error(capsys, "name:", "letters, digits")
    _intact(victim, files)
    assert not (work / "runs").exists()


def test_the_default_name_comes_from_the_file_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = _run(tmp_path, name="my run (v2).toml")
    assert main(_simulate(run)) == 0
    assert (tmp_path / "runs" / "my-run--v2-" / "summary.json").is_file()


@pytest.mark.parametrize("where", ["leaf", "middle"])
def test_an_over_long_path_is_one_error_line(tmp_path, capsys, where):
    long = "n" * 300
    out = tmp_path / long if where == "leaf" else tmp_path / long / "out"
    assert main(_simulate(_run(tmp_path), out)) == 2
    _one_error(capsys, "bytes", "shorter")
    assert sorted(os.listdir(tmp_path)) == ["run.toml"]  # nothing half-made


def test_compare_and_replay_refuse_a_foreign_folder_too(tmp_path, capsys):
    victim = tmp_path / "victim"
    files = _foreign(victim)
    run = _run(tmp_path)
    assert main(["compare", run, "--recompute", "none", "-o", str(victim), "--force"]) == 2
    _one_error(capsys, "is not a timeline output folder")
    snapshot = tmp_path / "snap.pickle"
    snapshot.write_bytes(pickle.dumps({"segments": [], "device_traces": [[
        {"action": "segment_alloc", "addr": 1 << 32, "size": 2 << 20, "stream": 0}]]}))
    assert main(["replay", str(snapshot), "-o", str(victim), "--force"]) == 2
    _one_error(capsys, "is not a timeline output folder")
    _intact(victim, files)
    assert main(["replay", str(snapshot), "-o", str(tmp_path / "replayed")]) == 0
    marker = json.loads((tmp_path / "replayed" / "timeline-output.json").read_text())
    assert marker["command"] == "replay"


def test_files_are_replaced_only_with_force_and_never_through_a_link(tmp_path, capsys):
    """plot, schedule --csv (and capture, from-megatron, report, which share the writer) refuse to
    overwrite an existing file without --force, and never write through a link."""
    run = _run(tmp_path)
    out = tmp_path / "out"
    assert main(["simulate", run, "-o", str(out), "--format", "summary,memory"]) == 0
    capsys.readouterr()
    mine = tmp_path / "figure.png"
    mine.write_text("my own figure")
    assert main(["plot", str(out), "-o", str(mine)]) == 2
    _one_error(capsys, "exists", "--force")
    assert mine.read_text() == "my own figure"
    assert main(["plot", str(out), "-o", str(mine), "--force"]) == 0
    assert mine.read_bytes().startswith(b"\x89PNG")
    csv = tmp_path / "schedule.csv"
    csv.write_text("keep")
    assert main(["schedule", run, "--csv", str(csv)]) == 2
    _one_error(capsys, "exists", "--force")
    assert csv.read_text() == "keep"
    assert main(["schedule", run, "--csv", str(csv), "--force"]) == 0
    assert csv.read_text() != "keep"
    link = tmp_path / "link.csv"
    link.symlink_to(mine)
    assert main(["schedule", run, "--csv", str(link), "--force"]) == 2
    _one_error(capsys, "symbolic link")
    assert mine.read_bytes().startswith(b"\x89PNG")
