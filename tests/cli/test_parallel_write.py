"""Writing outputs in two processes: the queue's order, both processes writing, the same bytes
as one process, errors from the child raised in the parent."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from timeline.cli import parallel
from timeline.cli.parallel import queue_order, write_in_two
from timeline.exporters import DEFAULT_FORMATS


def test_the_queue_hands_out_the_costliest_first():
    assert queue_order(list(DEFAULT_FORMATS)) == ["trace", "snapshot", "events", "memory", "ops", "summary",
                                                  "devices"]
    assert queue_order(["summary", "perfetto", "unknown", "trace"]) == ["perfetto", "trace", "summary", "unknown"]


def _wait_for_the_other(folder: Path) -> None:
    """Hold the first format out of the queue until the other process has taken one (both then
    write, whichever of them took the first)."""
    deadline = time.monotonic() + 30
    while not any(p.name.startswith("took-") and p.name != f"took-{os.getpid()}" for p in folder.iterdir()):
        assert time.monotonic() < deadline, "the other process took nothing"
        time.sleep(0.01)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_both_processes_write_and_a_child_error_comes_back(tmp_path, monkeypatch):
    monkeypatch.setattr(parallel, "parallel_enabled", lambda formats: True)
    parent = os.getpid()

    def write_one(fmt: str) -> None:
        (tmp_path / f"took-{os.getpid()}").touch()
        if fmt == "trace":  # the first format out of the queue
            _wait_for_the_other(tmp_path)
        (tmp_path / fmt).write_text(f"{fmt} by {os.getpid()}")

    write_in_two(list(DEFAULT_FORMATS), write_one)
    writers = {(tmp_path / f).read_text().split(" by ")[1] for f in DEFAULT_FORMATS}
    assert len(writers) == 2 and str(parent) in writers

    for p in tmp_path.iterdir():
        p.unlink()

    def failing(fmt: str) -> None:
        (tmp_path / f"took-{os.getpid()}").touch()
        if fmt == "trace":
            _wait_for_the_other(tmp_path)
        if os.getpid() != parent:  # the child fails on the first format it takes
            raise OSError(28, "No space left on device", str(tmp_path / f"{fmt}.out"))
        time.sleep(0.05)  # the parent writes on: the child's error comes back at the end

    with pytest.raises(OSError, match="No space left") as info:
        write_in_two(list(DEFAULT_FORMATS), failing)
    assert info.value.filename in {str(tmp_path / f"{f}.out") for f in ("trace", "snapshot")}


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
