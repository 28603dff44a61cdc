"""Terminal views read at a glance (issue 14, item 5): 100-column tables and ``--wide``,
``frag.`` at the requested peak, the paper-profile note, plain progress lines, ``selective``
alone, ``--capacity`` with units, replay over capacity, parameter counts with a unit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from timeline.cli import main
from timeline.spec.recompute import parse_recompute

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"
SNAPSHOTS = ROOT.parent / "shared" / "snapshots"
SMALL = ["--set", "model.profile=megatron", "--set", "model.num_layers=4", "--set", "parallel.pp=2",
         "--set", "parallel.layout=[2,2]", "--set", "training.seq_len=512", "--set", "training.num_microbatches=4",
         "--set", "model.n_routed_experts=16", "--set", "parallel.dp=8", "--set", "model.mtp_layers=0"]


def widest(text: str) -> int:
    return max(len(line.rstrip()) for line in text.splitlines())


def simulate(tmp_path: Path, *extra: str) -> int:
    return main(["simulate", str(SHIPPED), "-o", str(tmp_path / "run"), "--force", "--no-progress",
                 "--format", "summary", *extra])


def test_shipped_table_fits_100_columns_and_wide_shows_everything(tmp_path, capsys):
    assert simulate(tmp_path) == 0
    out = capsys.readouterr().out
    assert widest(out) <= 100
    rows = [line.split() for line in out.splitlines() if line.strip()[:2] in ("0 ", "15")]
    assert rows[0][:5] == ["0", "0", "64", "387.81", "0.43"]  # pp rank, device, ×, peak alloc, frag.
    header = "\n".join(out.splitlines()[:5])
    assert "peak" in header and "capacity" not in header and "µbatch" not in header
    assert simulate(tmp_path, "--wide") == 0
    wide = capsys.readouterr().out
    assert widest(wide) > 100 and "capacity" in wide and "µbatch" in wide and "iter" in wide
    row0 = next(line.split() for line in wide.splitlines() if line.split()[:2] == ["0", "0"])
    assert "2,376.9" in row0 and "23.00" in row0 and "80.00" in row0  # reserved peak's own time, act/µbatch, cap


def test_frag_is_the_gap_at_the_requested_peak(tmp_path, capsys):
    from helpers_run import tiny_run

    from timeline.result.build import build_timeline

    tl = build_timeline(tiny_run(pp=2, layers=2))
    for d in range(tl.num_devices):
        pk = tl.peak(d)
        allocated = np.cumsum(tl.memory[d].block_bytes)
        reserved = tl.memory[d].reserved
        i = pk.event_index
        assert pk.fragmentation_bytes == int(reserved[i] - allocated[i]) >= 0
        assert pk.requested_time_us == float(tl.events(d).t_us[i])
    assert simulate(tmp_path) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    d0 = summary["devices"][0]
    assert d0["fragmentation_bytes_at_peak"] == 465_764_352  # 0.43 GiB at 2,232.0 ms, not 2.37 at the reserved peak
    assert d0["peak_reserved_time_us"] != d0["peak_time_us"]


def test_paper_profile_note_explains_the_oom(tmp_path, capsys):
    assert simulate(tmp_path) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.count("note:") == 1 and "note: profile paper counts eager attention" in out
    assert "322.00 GiB of device 0's 387.81 GiB peak" in out
    assert simulate(tmp_path, "--set", "model.profile=megatron") == 0
    assert "note:" not in capsys.readouterr().out


def test_simulate_progress_lines_when_stderr_is_not_a_tty(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("timeline.cli.progress.PLAIN_DELAY_S", 0.0)
    assert main(["simulate", str(SHIPPED), "-o", str(tmp_path / "run"), "--format", "summary", *SMALL]) == 0
    err = capsys.readouterr().err.splitlines()
    assert "simulate: allocator 2/2" in " ".join(err) and all(line.startswith("simulate: ") for line in err)
    assert len(err) < 20


def test_plain_progress_is_throttled():
    from io import StringIO

    from timeline.cli.progress import PlainProgress

    now = [0.0]
    out = StringIO()
    p = PlainProgress("fit", out, interval_s=5.0, delay_s=1.0, clock=lambda: now[0])
    p("a", 0, 10)  # before the delay: nothing
    for i in range(1, 11):
        now[0] = i
        p("a", i, 10)
    assert out.getvalue().splitlines() == ["fit: a 1/10 (1.0 s)", "fit: a 6/10 (6.0 s)", "fit: a 10/10 (10.0 s)"]


def test_selective_alone_is_core_attn_everywhere(tmp_path, write_run, capsys):
    assert parse_recompute("selective") == parse_recompute("selective:core_attn")
    assert simulate(tmp_path, *SMALL, "--recompute", "selective") == 0
    cli = capsys.readouterr().out
    assert "recompute selective:core_attn" in cli
    run = write_run(SHIPPED.read_text().replace('policy = "none"', 'policy = "selective"'))
    assert main(["simulate", str(run), "-o", str(tmp_path / "f"), "--no-progress", "--format", "summary",
                 *SMALL]) == 0
    assert "recompute selective:core_attn" in capsys.readouterr().out
    a = json.loads((tmp_path / "run" / "summary.json").read_text())["devices"]
    b = json.loads((tmp_path / "f" / "summary.json").read_text())["devices"]
    assert [d["peak_requested_bytes"] for d in a] == [d["peak_requested_bytes"] for d in b]


@pytest.mark.parametrize("flags", [["--capacity", "85899345920B"], ["--capacity", "80GiB"], ["--capacity", "80"],
                                   ["--capacity-gib", "80"], ["--capacity", "85.899345920GB"]])
def test_capacity_with_units_on_simulate(tmp_path, capsys, flags):
    assert simulate(tmp_path, *SMALL, *flags) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {d["capacity_bytes"] for d in summary["devices"]} == {85_899_345_920}


def test_capacity_errors_are_one_line(tmp_path, capsys):
    assert simulate(tmp_path, *SMALL, "--capacity", "80 apples") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --capacity '80 apples'") and len(err.splitlines()) == 1
    with pytest.raises(SystemExit) as exc:
        simulate(tmp_path, *SMALL, "--capacity", "80GiB", "--capacity-gib", "80")
    assert exc.value.code == 2


def test_compare_table_fits_and_reports_progress(write_run, capsys, monkeypatch):
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "compare"))
    from recompute_template import recompute_template
    from test_compare_cli import TINY

    monkeypatch.setattr("timeline.cli.compare.templates", lambda: recompute_template)
    monkeypatch.setattr("timeline.cli.progress.PLAIN_DELAY_S", 0.0)
    run = write_run(TINY)
    argv = ["compare", str(run), "--recompute", "none,selective:core_attn+mlp+layernorm,full:uniform:1"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert widest(captured.out) <= 100 and "compare: variants 3/3" in captured.err
    lines = captured.out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("selective:core_attn+"))
    assert lines[first + 1].startswith("  mlp+layernorm ")  # a long name continues on the variant's next row
    assert main([*argv, "--wide", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "TFLOP" in captured.out and captured.err == ""


@pytest.mark.skipif(not SNAPSHOTS.is_dir(), reason=f"{SNAPSHOTS} is absent")
def test_replay_reports_a_start_state_over_capacity(capsys):
    snap = SNAPSHOTS / "MAGMA27_memory_snapshot.pickle"
    assert main(["replay", str(snap), "--capacity-gib", "0.001", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["devices"][0]
    assert d["over_capacity"] and d["capacity_bytes"] == 1_073_741
    assert main(["replay", str(snap), "--capacity", "1073741B"]) == 0
    out = capsys.readouterr().out
    assert "0/0 over" in out and "already at the trace's start (13.21 GiB)" in " ".join(out.split())
    assert main(["replay", str(snap), "--capacity", "80GiB", "--json"]) == 0
    assert not json.loads(capsys.readouterr().out)["devices"][0]["over_capacity"]


def test_static_parameter_counts_carry_a_unit(capsys):
    assert main(["static", str(SHIPPED)]) == 0
    out = capsys.readouterr().out
    assert widest(out) <= 100
    assert "attention 429.65 M params" in out and "682,636,465,152 parameters (682.64 B params)" in out
