"""``timeline simulate``: the run directory, its schemas, determinism and safe re-runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from timeline.cli import main
from timeline.graph.tensors import CATEGORIES

SHIPPED = Path(__file__).resolve().parents[2] / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"
SMALL = ["--set", "model.profile=megatron", "--set", "model.num_layers=4", "--set", "parallel.pp=2",
         "--set", "parallel.layout=[2,2]", "--set", "training.seq_len=512", "--set", "training.num_microbatches=4",
         "--set", "model.n_routed_experts=16", "--set", "parallel.dp=8", "--set", "model.mtp_layers=0"]
FORMATS = ["--format", "summary,memory,events,ops"]


def simulate(out: Path, *extra: str) -> int:
    return main(["simulate", str(SHIPPED), "-o", str(out), "--no-progress", *FORMATS, *SMALL, *extra])


def test_run_directory_and_schemas(tmp_path, capsys):
    import pyarrow.parquet as pq

    out = tmp_path / "run"
    assert simulate(out) == 0
    table = capsys.readouterr().out
    assert "alloc" in table and "reserved" in table and "frag." in table and "wrote" in table
    assert sorted(p.name for p in out.iterdir()) == ["events.parquet", "memory.parquet", "ops.parquet",
                                                     "summary.json", "timeline-output.json"]
    assert json.loads((out / "timeline-output.json").read_text())["command"] == "simulate"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["schema"] == "timeline.summary/1" and summary["run"]["parallel"]["pp"] == 2
    assert len(summary["devices"]) == 2
    d = summary["devices"][0]
    for key in ("device", "pp_rank", "stages", "represents", "peak_requested_bytes", "peak_allocated_bytes",
                "peak_reserved_bytes", "peak_time_us", "peak_breakdown_bytes", "activation_bytes_per_microbatch",
                "iteration_time_us", "fragmentation_bytes_at_peak", "oom"):
        assert key in d
    assert set(d["peak_breakdown_bytes"]) == set(CATEGORIES)
    assert sum(d["peak_breakdown_bytes"].values()) == d["peak_requested_bytes"]
    mem = pq.read_table(out / "memory.parquet")
    assert mem.schema.metadata[b"schema"] == b"timeline.memory/2"
    cols = mem.to_pydict()
    for i in range(0, mem.num_rows, max(1, mem.num_rows // 50)):
        assert sum(cols[c][i] for c in CATEGORIES) == cols["requested_bytes"][i]
    rows0 = [i for i, dev in enumerate(cols["device"]) if dev == 0]
    assert max(cols["requested_bytes"][i] for i in rows0) == d["peak_requested_bytes"]
    assert max(cols["reserved_bytes"][i] for i in rows0) == d["peak_reserved_bytes"]
    ops = pq.read_table(out / "ops.parquet")
    assert {"device", "stream", "name", "t_start_us", "t_end_us", "phase", "microbatch", "stage",
            "layer"} <= set(ops.column_names)
    ev = pq.read_table(out / "events.parquet")
    assert ev.schema.metadata[b"schema"] == b"timeline.events/2" and summary["num_events"] == ev.num_rows


def test_same_run_twice_gives_identical_bytes(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert simulate(a) == 0 and simulate(b) == 0
    for f in a.iterdir():
        assert f.read_bytes() == (b / f.name).read_bytes(), f.name


def test_existing_directory_needs_force(tmp_path, capsys):
    out = tmp_path / "run"
    assert simulate(out) == 0
    capsys.readouterr()
    assert simulate(out) == 2
    assert "--force" in capsys.readouterr().err
    assert simulate(out, "--force") == 0


def test_interrupted_run_leaves_no_complete_looking_directory(tmp_path, monkeypatch):
    import timeline.exporters.ops_parquet as ops_parquet

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ops_parquet, "write", boom)
    out = tmp_path / "run"
    assert simulate(out) == 130
    assert not out.exists()
    assert not any(p.name.startswith(".run.partial") for p in tmp_path.iterdir())


def test_oom_is_reported_with_time_and_request(tmp_path, capsys):
    out = tmp_path / "run"
    assert simulate(out, "--set", "hardware.capacity_gib=6") == 0
    summary = json.loads((out / "summary.json").read_text())
    oom = summary["devices"][0]["oom"]
    assert oom is not None and oom["request_bytes"] > 0 and oom["t_us"] >= 0
    assert oom["capacity_bytes"] == 6 * 2**30
    assert summary["devices"][0]["peak_reserved_bytes"] > 6 * 2**30  # the run continued past capacity
    assert "OOM" in capsys.readouterr().out


@pytest.mark.parametrize(("extra", "fragment"), [
    (["--set", "schedule.kind=dualpipe", "--set", "parallel.pp=3", "--set", "parallel.layout=[2,1,1]"],
     "even pp"),
    (["--format", "pdf"], "--format"),
])
def test_bad_input(tmp_path, capsys, extra, fragment):
    out = tmp_path / "run"
    assert main(["simulate", str(SHIPPED), "-o", str(out), "--no-progress", *SMALL, *extra]) == 2
    assert fragment in capsys.readouterr().err
    assert not out.exists()


def test_outputs_do_not_depend_on_where_the_run_file_lies(tmp_path, monkeypatch):
    """Paths in a run file (hf_config, schedule.csv) are kept as written: the same run folder
    copied elsewhere and simulated from another working directory gives identical bytes."""
    import shutil

    first = tmp_path / "first"
    (first / "cfg").mkdir(parents=True)
    (first / "cfg" / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000}))
    run = first / "run.toml"
    run.write_text('name = "paths"\n[model]\nhf_config = "cfg/config.json"\n[parallel]\npp = 2\n'
                   '[training]\nseq_len = 128\nnum_microbatches = 4\n[schedule]\nkind = "csv"\ncsv = "sched.csv"\n')
    assert main(["schedule", str(run), "--set", "schedule.kind=1f1b", "--set", 'schedule.csv=""',
                 "--csv", str(first / "sched.csv")]) == 0
    second = tmp_path / "elsewhere" / "second"
    shutil.copytree(first, second)
    monkeypatch.chdir(first)
    assert main(["simulate", "run.toml", "-o", str(tmp_path / "a"), "--no-progress", "--format", "summary"]) == 0
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", str(second / "run.toml"), "-o", str(tmp_path / "b"), "--no-progress",
                 "--format", "summary"]) == 0
    a, b = (tmp_path / "a" / "summary.json").read_bytes(), (tmp_path / "b" / "summary.json").read_bytes()
    assert a == b
    run_doc = json.loads(a)["run"]
    assert run_doc["model_source"] == "hf_config:cfg/config.json" and run_doc["schedule"]["csv"] == "sched.csv"
    assert str(tmp_path).encode() not in a


def test_recompute_flag_is_validated_and_applied(tmp_path):
    out = tmp_path / "run"
    assert simulate(out, "--recompute", "selective:core_attn") == 0
    summary = json.loads((out / "summary.json").read_text())
    rc = summary["run"]["recompute"]
    assert rc["policy"] == "selective" and rc["modules"] == ["core_attn"]
