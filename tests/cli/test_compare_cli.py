"""``timeline compare``: the JSON document, the table, -o DIR (parquet + plots), and errors.
Runs on the synthetic recompute-aware template (tests/compare/recompute_template.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compare"))
from helpers_run import TINY_RUN_TOML  # noqa: E402
from recompute_template import recompute_template  # noqa: E402

from timeline.cli import main  # noqa: E402

# the synthetic template's bytes alone (no Megatron library workspaces; the distributed optimizer over
# dp = 1: the same bytes as none), one iteration
TINY = TINY_RUN_TOML.replace("[training]", "[framework]\nworkspaces = false\n[training]") + "iterations = 1\nzero = 1\n"


@pytest.fixture
def tiny(write_run, monkeypatch):
    monkeypatch.setattr("timeline.cli.compare.templates", lambda: recompute_template)
    return write_run(TINY)


def test_compare_json(tiny, capsys):
    assert main(["compare", str(tiny), "--recompute", "none,selective:core_attn", "--recompute", "full:block:2,1",
                 "--json", "--workers", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "timeline.compare/1"
    assert [v["name"] for v in doc["variants"]] == ["none", "selective:core_attn", "full:block:2,1"]
    for v in doc["variants"]:
        assert [d["pp_rank"] for d in v["devices"]] == [0, 1]
        assert {"device", "peak_allocated_bytes", "peak_reserved_bytes", "recompute_flops", "recompute_time_us",
                "iteration_time_us", "oom"} <= set(v["devices"][0])
    assert doc["variants"][0]["devices"][0]["recompute_time_us"] == 0.0 < doc["variants"][1]["devices"][0][
        "recompute_time_us"]


def test_compare_table_and_output_dir(tiny, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", str(tiny), "--recompute", "none,full:uniform:1", "-o", str(out),
                 "--set", "hardware.capacity_gib=0.06"]) == 0
    text = capsys.readouterr().out
    assert "full:uniform:1" in text and "OOM" in text and "headroom" in text
    assert {p.name for p in out.iterdir()} == {"compare.parquet", "memory.png", "peaks.png", "timeline-output.json",
                                               "variants.json", "none", "full_uniform_1"}
    import pyarrow.parquet as pq
    table = pq.read_table(out / "compare.parquet")
    assert table.schema.metadata[b"schema"] == b"timeline.compare/1"
    assert table.column("variant").to_pylist() == ["none", "none", "full:uniform:1", "full:uniform:1"]
    assert main(["compare", str(tiny), "--recompute", "none,full:uniform:1", "-o", str(out)]) == 2
    assert "exists" in capsys.readouterr().err


def test_compare_two_run_files(tiny, write_run, capsys):
    other = write_run(TINY.replace('"tiny"', '"tiny-gpipe"') + '[schedule]\nkind = "gpipe"\n', "b.toml")
    assert main(["compare", str(tiny), str(other), "--json", "--workers", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [v["name"] for v in doc["variants"]] == ["tiny", "tiny-gpipe"]


@pytest.mark.parametrize("argv, message", [
    (["--recompute", "none"], "two or more variants"),
    (["--recompute", "none,selective:bogus"], "selective:bogus"),
    (["--recompute", "none,full:block:1,1,1"], "one per pipeline rank"),
    (["--recompute", "none,selective:moe"], "mixture-of-experts"),
])
def test_compare_errors(tiny, capsys, argv, message):
    assert main(["compare", str(tiny), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and "Traceback" not in err
