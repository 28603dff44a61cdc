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
from timeline.cli.capacity import parse_size  # noqa: E402


@pytest.fixture
def tiny(write_run, monkeypatch):
    monkeypatch.setattr("timeline.cli.fit.templates", lambda: recompute_template)
    return write_run(TINY)


def test_fit_prints_best_and_runner_ups(tiny, capsys):
    assert main(["fit", str(tiny), "--capacity", "60MiB"]) == 0
    out = capsys.readouterr().out
    # Megatron's per-parameter state leaves room at 60 MiB for recomputing one block on the first rank
    assert "best: full:block:1,0" in out and "runner-up: selective:core_attn+mlp" in out and "search space" in out


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


@pytest.mark.parametrize("text, size", [("80GiB", 80 << 30), ("80", 80 << 30), ("81920MiB", 80 << 30),
                                        ("80GB", 80 * 10**9), ("85899345920B", 80 << 30), ("0.5TiB", 512 << 30),
                                        ("80gib", 80 << 30), ("1e3MB", 10**9)])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "0", "0B", "-1GiB", "80 GiBs", "2PiB", "nan", "inf"])
def test_parse_size_refuses(text):
    from timeline.errors import UserError

    with pytest.raises(UserError, match="--capacity"):
        parse_size(text)


def test_capacity_gib_alias_equals_capacity(tiny, capsys):
    assert main(["fit", str(tiny), "--capacity-gib", str(48 / 1024), "--json", "--no-progress"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert main(["fit", str(tiny), "--capacity", str(48 << 20) + "B", "--json", "--no-progress"]) == 0
    b = json.loads(capsys.readouterr().out)
    assert a["capacity_bytes"] == b["capacity_bytes"] == 48 << 20 and a["best"]["policy"] == b["best"]["policy"]


def test_shortfall_matches_headroom(tiny, capsys):
    """The shortfall is reserved beyond capacity: the same number as the table's min headroom."""
    assert main(["fit", str(tiny), "--capacity", "8MiB", "--json", "--no-progress"]) == 1
    doc = json.loads(capsys.readouterr().out)
    short = doc["shortfall"]
    policy = next(c for c in doc["considered"] if c["policy"] == short["policy"] and c["simulated"])
    worst = min(d["headroom_bytes"] for d in policy["devices"])
    assert short["bytes"] == -worst > 0


def test_fit_progress_lines_when_stderr_is_not_a_tty(tiny, capsys, monkeypatch):
    monkeypatch.setattr("timeline.cli.progress.PLAIN_DELAY_S", 0.0)
    assert main(["fit", str(tiny), "--capacity", "60MiB"]) == 0
    err = capsys.readouterr().err
    assert "fit: building the search space" in err and "fit: policies simulated" in err
    assert main(["fit", str(tiny), "--capacity", "60MiB", "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_bad_capacity(tiny, capsys):
    assert main(["fit", str(tiny), "--capacity", "lots"]) == 2
    assert "--capacity 'lots'" in capsys.readouterr().err


def test_help_says_a_bare_capacity_is_gib(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    assert "80 = 80GiB" in " ".join(capsys.readouterr().out.split())
