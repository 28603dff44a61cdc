"""Ctrl-C stops every phase of a simulate — load/validate, the work estimate and the op graph,
the schedule, the simulation, the allocator pass and each exporter — with exit 130, the one line
``interrupted``, and no output folder or partial file left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers_run import TINY_RUN_TOML

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"

#: phase → (module, function) that starts it; the wrapper sends SIGINT to its own process as
#: the function is entered, so the interrupt lands inside that phase
PHASES = {
    "load": ("timeline.cli.common", "load_run"),
    "estimate": ("timeline.cli.common", "estimate_work"),
    "graph": ("timeline.graph.source", "model_source"),
    "schedule": ("timeline.sim.plan", "build_schedule"),
    "simulate": ("timeline.sim.timing", "run_schedule"),
    "allocate": ("timeline.result.build", "run_allocator"),
    **{f"export-{name}": (f"timeline.exporters.{module}", "write") for name, module in (
        ("summary", "summary"), ("memory", "memory_parquet"), ("events", "events_parquet"),
        ("ops", "ops_parquet"), ("trace", "chrome_trace"), ("snapshot", "memviz_snapshot"))},
}

WRAPPER = """
import importlib, os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell's background job starts with it ignored
module, name = sys.argv[1], sys.argv[2]
mod = importlib.import_module(module)
original = getattr(mod, name)
def interrupted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    return original(*args, **kwargs)
setattr(mod, name, interrupted)
from timeline.cli import main
sys.exit(main(sys.argv[3:]))
"""



def _leftovers(folder: Path, expected: set[str]) -> set[str]:
    return set(os.listdir(folder)) - expected


@pytest.mark.parametrize("phase", list(PHASES))
def test_sigint_in_each_phase(tmp_path, phase):
    run = tmp_path / "run.toml"
    run.write_text(TINY_RUN_TOML)
    module, name = PHASES[phase]
    proc = subprocess.run([sys.executable, "-c", WRAPPER, module, name, "simulate", str(run), "-o",
                           str(tmp_path / "out"), "--no-progress"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 130, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.strip().splitlines() == ["interrupted"], proc.stderr[-2000:]
    assert _leftovers(tmp_path, {"run.toml"}) == set()


@pytest.mark.parametrize("delay_s", [1.5, 3.0, 4.5])
def test_sigint_from_outside_stops_a_long_run_within_2_s(tmp_path, delay_s):
    """The shipped DeepSeek-V3 run (several seconds on 2 cores): Ctrl-C at three moments."""
    # a shell's background job (CI run with `&`) inherits SIGINT ignored, which Python keeps: restore the
    # default disposition for the child, as an interactive terminal gives it
    proc = subprocess.Popen([sys.executable, "-m", "timeline.cli", "simulate", str(SHIPPED), "-o",
                             str(tmp_path / "out"), "--no-progress"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(delay_s)
    if proc.poll() is not None:
        pytest.skip("the run finished before the interrupt (a fast machine)")
    sent = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    took = time.perf_counter() - sent
    if proc.returncode == 0 or (proc.returncode == -signal.SIGINT and not err.strip()):
        # a loaded machine: the run ended between poll() and the signal's delivery (exit 0), or the
        # signal landed in the interpreter's finalisation, after main() returned, where Python has
        # put SIGINT's default action back: either way the run had finished and its output is whole
        assert {"summary.json", "timeline-output.json", "trace.json"} <= set(os.listdir(tmp_path / "out"))
        return
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err
    assert took < 2.0, took
    left = _leftovers(tmp_path, set())
    if left == {"out"}:  # on a loaded machine the signal can come after the folder was renamed into place:
        # then it is the whole output (it only appears complete), never a partial one
        assert {"summary.json", "timeline-output.json", "trace.json"} <= set(os.listdir(tmp_path / "out"))
    else:
        assert left == set()
