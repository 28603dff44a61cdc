"""``timeline replay``: exit codes, the table and the timeline.replay/1 JSON."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from timeline.cli import main

SNAPSHOTS = Path(__file__).parents[2].parent / "shared" / "snapshots"
needs_snapshots = pytest.mark.skipif(not SNAPSHOTS.is_dir(), reason=f"{SNAPSHOTS} is absent")
KEYS = {"device", "allocator_settings", "allocs", "alloc_address_matches", "cache_allocs",
        "cache_alloc_address_matches", "segment_allocs", "segment_alloc_matches",
        "peak_reserved_bytes_real", "peak_reserved_bytes_model"}


def _tiny(tmp_path: Path) -> Path:
    base = 1 << 32
    snap = {
        "segments": [{"device": 0, "address": base, "total_size": 2 << 20, "stream": 0, "segment_type": "small",
                      "blocks": [{"address": base, "size": 512, "requested_size": 100, "state": "active_allocated"},
                                 {"address": base + 512, "size": (2 << 20) - 512, "requested_size": 0,
                                  "state": "inactive"}]}],
        "device_traces": [[
            {"action": "segment_alloc", "addr": base, "size": 2 << 20, "stream": 0},
            {"action": "alloc", "addr": base, "size": 100, "stream": 0},
            {"action": "alloc", "addr": base + 512, "size": 700, "stream": 0},
            {"action": "free_requested", "addr": base + 512, "size": 700, "stream": 0},
            {"action": "free_completed", "addr": base + 512, "size": 700, "stream": 0},
        ]],
    }
    path = tmp_path / "tiny.pickle"
    path.write_bytes(pickle.dumps(snap))
    return path


def test_json_schema_on_a_tiny_snapshot(tmp_path, capsys):
    assert main(["replay", str(_tiny(tmp_path)), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "timeline.replay/1"
    (dev,) = doc["devices"]
    assert KEYS <= set(dev)
    assert (dev["allocs"], dev["alloc_address_matches"], dev["segment_allocs"], dev["segment_alloc_matches"]) == (2, 2, 1, 1)
    assert dev["peak_reserved_bytes_real"] == dev["peak_reserved_bytes_model"] == 2 << 20


def test_table_output(tmp_path, capsys):
    assert main(["replay", str(_tiny(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "tiny.pickle" in out and "2/2" in out


def test_flags_override_settings(tmp_path, capsys):
    args = ["replay", str(_tiny(tmp_path)), "--json", "--max-split-size-mb", "64", "--expandable-segments", "false",
            "--roundup-power2-divisions", "1MB:4,>:8"]
    assert main(args) == 0
    settings = json.loads(capsys.readouterr().out)["devices"][0]["allocator_settings"]
    assert settings["max_split_size"] == 64 << 20 and settings["roundup_power2_divisions"]["1"] == 4


@pytest.mark.parametrize("extra", [[], ["--max-split-size-mb", "10"], ["--capacity-gib", "-1"]])
def test_bad_input_exits_2(tmp_path, capsys, extra):
    target = tmp_path / "missing.pickle" if not extra else _tiny(tmp_path)
    assert main(["replay", str(target), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_hostile_pickle_exits_2(tmp_path, capsys):
    path = tmp_path / "evil.pickle"
    path.write_bytes(b"cos\nsystem\n(S'echo hi'\ntR.")
    assert main(["replay", str(path)]) == 2
    assert "refusing" in capsys.readouterr().err


@needs_snapshots
def test_real_expandable_snapshot_json(capsys):
    assert main(["replay", str(SNAPSHOTS / "Constructor-Sun_memory_snapshot.pickle"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [d["device"] for d in doc["devices"]] == [0, 1, 2]
    for d in doc["devices"]:
        assert d["alloc_address_matches"] == d["allocs"] and d["segment_alloc_matches"] == d["segment_allocs"]
        assert d["allocator_settings"]["expandable_segments"] is True


@needs_snapshots
def test_output_dir_writes_the_replayed_run(tmp_path, capsys):
    """-o DIR: memory.parquet follows the model's reserved and allocated bytes; events.parquet
    holds every model alloc and free (plus the blocks live at the trace start)."""
    import pyarrow.parquet as pq

    snap = SNAPSHOTS / "kkaitlyn111_memory_files_memory_ctx128_fullstep_.pickle"
    out = tmp_path / "run"
    assert main(["replay", str(snap), "--json", "-o", str(out)]) == 0
    dev = json.loads(capsys.readouterr().out)["devices"][0]
    mem = pq.read_table(out / "memory.parquet")
    assert mem.schema.metadata[b"schema"] == b"timeline.memory/2"
    assert max(mem.column("reserved_bytes").to_pylist()) == dev["peak_reserved_bytes_model"]
    assert max(mem.column("allocated_bytes").to_pylist()) == dev["peak_allocated_bytes_model"]
    ev = pq.read_table(out / "events.parquet")
    kinds = ev.column("kind").to_pylist()
    assert kinds.count("alloc") >= dev["allocs"]
    # again into the same folder needs --force
    assert main(["replay", str(snap), "-o", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["replay", str(snap), "-o", str(out), "--force"]) == 0


def test_unlimited_split_and_rounding_override(tmp_path, capsys):
    args = ["replay", str(_tiny(tmp_path)), "--json", "--max-split-size-mb", "0", "--max-non-split-rounding-mb", "0",
            "--roundup-power2-divisions", "[1MB:2,>:4]"]
    assert main(args) == 0
    settings = json.loads(capsys.readouterr().out)["devices"][0]["allocator_settings"]
    assert settings["max_split_size"] == -1 and settings["max_non_split_rounding_size"] == 0
    assert settings["roundup_power2_divisions"]["1"] == 2 and settings["roundup_power2_divisions"]["2"] == 4


def test_replaying_an_over_capacity_run_counts_each_oom_once(tmp_path, capsys):
    """A timeline snapshot goes on past capacity: each OOM is an ``oom`` entry followed by the same
    request's ``alloc``; the replay counts it once, as the simulation did."""
    run = Path(__file__).parents[2] / "schedules" / "llama3-8b-csv.toml"
    out = tmp_path / "out"
    assert main(["simulate", str(run), "-o", str(out), "--capacity", "30GiB", "--format", "summary,snapshot",
                 "--no-progress"]) == 0
    capsys.readouterr()
    ooms = [d["num_ooms"] for d in json.loads((out / "summary.json").read_text())["devices"]]
    assert ooms[0] > 0  # the first stage runs out of memory at 30 GiB (the case exercises OOMs)
    assert main(["replay", str(out / "snapshot.pickle"), "--json"]) == 0
    devices = json.loads(capsys.readouterr().out)["devices"]
    assert [(d["ooms_real"], d["ooms_model"], d["oom_matches"]) for d in devices] == [(n, n, n) for n in ooms]
