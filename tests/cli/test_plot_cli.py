"""``timeline plot RUN_DIR``: reads a simulated run directory and writes a readable PNG."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compare"))
from recompute_template import recompute_template  # noqa: E402
from test_compare_cli import TINY  # noqa: E402

from timeline.cli import main  # noqa: E402


def test_plot_run_dir(write_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("timeline.cli.simulate.templates", lambda: recompute_template)
    run_dir = tmp_path / "run"
    assert main(["simulate", str(write_run(TINY)), "-o", str(run_dir), "--format", "summary,memory",
                 "--no-progress"]) == 0
    assert main(["plot", str(run_dir)]) == 0
    assert main(["plot", str(run_dir), "--device", "0", "-o", str(tmp_path / "d0.png")]) == 0
    import matplotlib.image as mpimg
    for png in (run_dir / "memory.png", tmp_path / "d0.png"):
        img = mpimg.imread(png)
        assert img.shape[0] > 200 and img.shape[1] > 600
        assert img[..., :3].std() > 0.05  # not blank


@pytest.mark.parametrize("setup, message", [("missing", "not a directory"), ("empty", "no summary.json")])
def test_plot_errors(tmp_path, capsys, setup, message):
    target = tmp_path / "x"
    if setup == "empty":
        target.mkdir()
    assert main(["plot", str(target)]) == 2
    assert message in capsys.readouterr().err


def test_plot_unknown_device(write_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("timeline.cli.simulate.templates", lambda: recompute_template)
    run_dir = tmp_path / "run"
    main(["simulate", str(write_run(TINY)), "-o", str(run_dir), "--format", "summary,memory", "--no-progress"])
    assert main(["plot", str(run_dir), "--device", "7"]) == 2
    assert "--device 7" in capsys.readouterr().err
