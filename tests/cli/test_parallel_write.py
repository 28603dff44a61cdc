"""Writing outputs in two processes: the split, the same bytes as one process, errors from the
child raised in the parent."""

from __future__ import annotations

import os

import pytest

from timeline.cli import parallel
from timeline.cli.parallel import split, write_in_two
from timeline.exporters import DEFAULT_FORMATS


def test_split_puts_the_snapshot_beside_everything_else():
    child, parent = split(list(DEFAULT_FORMATS))
    assert "snapshot" in child and "trace" in parent
    assert sorted(child + parent) == sorted(DEFAULT_FORMATS)
    assert child == [f for f in DEFAULT_FORMATS if f in child]  # the order given
    cost = [sum(parallel.COST[f] for f in group) for group in (child, parent)]
    assert abs(cost[0] - cost[1]) <= 1
    assert split(["summary"]) == (["summary"], [])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_both_groups_are_written_and_a_child_error_comes_back(tmp_path, monkeypatch):
    monkeypatch.setattr(parallel, "parallel_enabled", lambda formats: True)

    def write_one(fmt: str) -> None:
        (tmp_path / fmt).write_text(f"{fmt} by {os.getpid()}")

    write_in_two(list(DEFAULT_FORMATS), write_one)
    writers = {(tmp_path / f).read_text().split(" by ")[1] for f in DEFAULT_FORMATS}
    assert len(writers) == 2 and str(os.getpid()) in writers

    def failing(fmt: str) -> None:
        if fmt == "snapshot":  # the child's format
            raise OSError(28, "No space left on device", str(tmp_path / "snapshot.pickle"))

    with pytest.raises(OSError, match="No space left") as info:
        write_in_two(list(DEFAULT_FORMATS), failing)
    assert info.value.filename == str(tmp_path / "snapshot.pickle")


def test_one_process_when_asked(monkeypatch):
    monkeypatch.setenv("TIMELINE_WRITE_PROCESSES", "1")
    assert not parallel.parallel_enabled(list(DEFAULT_FORMATS))
    seen: list[tuple[str, int]] = []
    write_in_two(["summary", "trace"], lambda fmt: seen.append((fmt, os.getpid())))
    assert seen == [("summary", os.getpid()), ("trace", os.getpid())]


def test_two_processes_write_the_bytes_of_one(tmp_path, monkeypatch):
    from test_simulate_cli import SHIPPED, SMALL

    from timeline.cli import main

    def run(out, processes: str) -> None:
        monkeypatch.setenv("TIMELINE_WRITE_PROCESSES", processes)
        assert main(["simulate", str(SHIPPED), "-o", str(out), "--no-progress", *SMALL]) == 0

    run(tmp_path / "one", "1")
    run(tmp_path / "two", "2")
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "two").iterdir()) and "snapshot.pickle" in names
    for name in names:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
