"""``timeline fit``: the best policy and runner-ups, JSON, nothing-fits, bad capacities."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compare"))
from recompute_template import recompute_template  # noqa: E402
from test_compare_cli import TINY  # noqa: E402

from timeline.cli import main  # noqa: E402
from timeline.cli.fit import parse_capacity  # noqa: E402


@pytest.fixture
def tiny(write_run, monkeypatch):
    monkeypatch.setattr("timeline.cli.fit.templates", lambda: recompute_template)
    return write_run(TINY)


def test_fit_prints_best_and_runner_ups(tiny, capsys):
    assert main(["fit", str(tiny), "--capacity", "60MiB"]) == 0
    out = capsys.readouterr().out
    assert "best: selective:core_attn+mlp" in out and "runner-up" in out and "search space" in out


def test_fit_json(tiny, capsys):
    assert main(["fit", str(tiny), "--capacity", "48MiB", "--json", "--alternatives", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "timeline.fit/1" and doc["capacity_bytes"] == 48 << 20
    assert doc["best"]["policy"] != "none" and doc["best"]["fits"] and len(doc["alternatives"]) == 1
    assert doc["alternatives"][0]["recompute_time_us"] >= doc["best"]["recompute_time_us"]
    assert doc["shortfall"] is None and any(not c["simulated"] for c in doc["considered"])


def test_fit_nothing_fits(tiny, capsys):
    assert main(["fit", str(tiny), "--capacity", "8MiB"]) == 1
    out = capsys.readouterr().out
    assert "nothing fits" in out and "device" in out


@pytest.mark.parametrize("text, gib", [("80GiB", 80.0), ("80", 80.0), ("81920MiB", 80.0), ("80GB", 80e9 / 2**30)])
def test_parse_capacity(text, gib):
    assert parse_capacity(text) == pytest.approx(gib)


def test_bad_capacity(tiny, capsys):
    assert main(["fit", str(tiny), "--capacity", "lots"]) == 2
    assert "--capacity 'lots'" in capsys.readouterr().err


def test_help_says_a_bare_capacity_is_gib(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    assert "80 = 80GiB" in " ".join(capsys.readouterr().out.split())
