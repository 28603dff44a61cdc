"""Users' own step functions, end to end through the command line: ``../shared/steps/steps.py`` holds
three ``--step`` functions written as their public scripts run, on the CS336 staff model unmodified
(einops, jaxtyping, a RoPE module every layer shares, ``trunc_normal_`` init). Each is captured with
``timeline capture --step`` and simulated with ``timeline simulate`` after the script's five warm-up
steps; the last iteration's peaks are compared with ``timeline replay``'s model of the real snapshot
(``test_snapshot_steps.real``): allocated within 1 %, reserved within 3 %.

Reads ``../shared/steps`` and ``../shared/snapshots`` at run time; skips when they are absent.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
for _dep in ("einops", "jaxtyping"):  # the staff model's own imports (the test extra installs them)
    pytest.importorskip(_dep, reason=f"../shared/steps' model imports {_dep}")

from test_snapshot_steps import RUN, SNAPSHOTS, real  # noqa: E402

from timeline.cli import main  # noqa: E402

STEPS = Path(__file__).parents[2].parent / "shared" / "steps" / "steps.py"
pytestmark = pytest.mark.skipif(not (STEPS.is_file() and SNAPSHOTS.is_dir()),
                                reason=f"{STEPS} or {SNAPSHOTS} is absent")

#: function → its snapshot; every script runs 5 warm-up steps before the recorded one (steps.py)
CASES = {"wed_medium_128": "Wedsonlin_medium_128_training_memory_snapshot.pickle",
         "wed_medium_512": "Wedsonlin_medium_512_training_memory_snapshot.pickle",
         "magma_small_256": "MAGMA27_memory_snapshot.pickle"}


@pytest.mark.parametrize("func", sorted(CASES))
def test_shared_step_simulates_and_matches_its_snapshot(tmp_path, func, capsys):
    trace = tmp_path / "step.parquet"
    assert main(["capture", "--step", f"{STEPS}:{func}", "-o", str(trace)]) == 0
    (tmp_path / "run.toml").write_text(RUN.format(trace=trace.name, warmup=5))
    assert main(["simulate", str(tmp_path / "run.toml"), "-o", str(tmp_path / "out"), "--no-progress"]) == 0
    printed = capsys.readouterr()
    assert "Traceback" not in printed.err
    dev = json.loads((tmp_path / "out" / "summary.json").read_text())["devices"][0]
    want = real(CASES[func])
    assert dev["peak_iteration"] == 5  # the recorded step, after the warm-up
    assert abs(dev["peak_allocated_bytes"] / want["allocated"] - 1) <= 0.01
    assert abs(dev["peak_reserved_bytes"] / want["reserved"] - 1) <= 0.03
