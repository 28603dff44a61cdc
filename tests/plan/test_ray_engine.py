"""``--engine ray`` (a local Ray cluster of 2 workers) writes the same plan.parquet, byte for byte,
as ``--engine local``. Skipped where Ray is not installed (it is the optional extra ``ray``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from timeline.cli import main

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason="Ray is not installed (pip install 'timeline[ray]')")
TINY = Path(__file__).with_name("tiny_moe.toml")
SPACE = """[space]
"parallel.tp" = [1, 2]
"parallel.pp" = [2, 4]
"parallel.cp" = [1]
"parallel.ep" = [2]
"parallel.etp" = [1]
"parallel.vpp" = [1]
"training.micro_batch_size" = [1, 2]
"schedule.kind" = ["1f1b"]
"recompute" = ["none", "selective:moe_act", "full:uniform:1"]
"""


def test_ray_and_local_write_identical_plans(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    (tmp_path / "space.toml").write_text(SPACE)
    outs = []
    for engine in ("local", "ray"):
        out = tmp_path / engine
        assert main(["plan", str(TINY), "--world-size", "8", "--space", str(tmp_path / "space.toml"),
                     "--top", "3", "--engine", engine, "--workers", "2", "-o", str(out)]) == 0
        outs.append(out)
    assert (outs[0] / "plan.parquet").read_bytes() == (outs[1] / "plan.parquet").read_bytes()
    for name in ("01.toml", "02.toml", "03.toml"):
        assert (outs[0] / "best" / name).read_text() == (outs[1] / "best" / name).read_text()


DSV3_SPACE = """[space]
"parallel.tp" = [1, 2]
"parallel.pp" = [8, 16]
"parallel.cp" = [1]
"parallel.ep" = [8, 16, 32]
"parallel.etp" = [1]
"parallel.vpp" = [1, 2]
"training.micro_batch_size" = [1]
"schedule.kind" = ["1f1b", "dualpipe"]
"recompute" = ["none", "full:uniform:1"]
"""


def test_ray_and_local_agree_on_deepseek_v3_256_gpus(tmp_path, monkeypatch):
    """Issue 16's CI case: DeepSeek-V3 on 256 GPUs, 96 candidates (about 40 s for both engines:
    the time bound stops the search after a few simulations)."""
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    run = Path(__file__).resolve().parents[2] / "schedules" / "deepseek-v3-2048.toml"
    (tmp_path / "space.toml").write_text(DSV3_SPACE)
    outs = []
    for engine in ("local", "ray"):
        out = tmp_path / engine
        assert main(["plan", str(run), "--world-size", "256", "--global-batch-size", "1024", "--space",
                     str(tmp_path / "space.toml"), "--top", "3", "--engine", engine, "--workers", "2",
                     "-o", str(out)]) in (0, 1)
        outs.append(out)
    assert (outs[0] / "plan.parquet").read_bytes() == (outs[1] / "plan.parquet").read_bytes()
