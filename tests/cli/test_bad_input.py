"""Every command's user errors: exit code 2, one ``error:`` line naming the flag, key or path,
no traceback, and no output left behind (review findings A1–A9, B1–B6, B8, D5)."""

from __future__ import annotations

import importlib.util
import json
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers_run import TINY_RUN_TOML

from timeline.cli import main

TINY = TINY_RUN_TOML
HF = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "intermediate_size": 128, "vocab_size": 1000}
NO_TYPE = {k: v for k, v in HF.items() if k != "model_type"}
UNWRITABLE = "/proc/timeline-test/x"  # creating anything under /proc fails, even as root
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None or
                                 importlib.util.find_spec("transformers") is None,
                                 reason="needs the capture extra (torch, transformers)")


def _run_file(tmp: Path, text: str = TINY) -> str:
    path = tmp / "run.toml"
    path.write_text(text)
    return str(path)


def _snapshot(tmp: Path) -> str:
    base = 1 << 32
    snap = {"segments": [], "device_traces": [[
        {"action": "segment_alloc", "addr": base, "size": 2 << 20, "stream": 0},
        {"action": "alloc", "addr": base, "size": 100, "stream": 0}]]}
    path = tmp / "tiny.pickle"
    path.write_bytes(pickle.dumps(snap))
    return str(path)


def _file(tmp: Path, name: str = "existing") -> str:
    (tmp / name).write_text("keep me")
    return str(tmp / name)


def _binary(tmp: Path, name: str) -> str:
    (tmp / name).write_bytes(bytes(range(256)) * 4)
    return str(tmp / name)


def _json(tmp: Path, name: str, obj: dict) -> str:
    (tmp / name).write_text(json.dumps(obj))
    return str(tmp / name)


def _plot_dir(tmp: Path, summary: str = '{"schema": "timeline.summary/1", "devices": []}',
              memory: bytes | None = None) -> str:
    run_dir = tmp / "rundir"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(summary)
    if memory is not None:
        (run_dir / "memory.parquet").write_bytes(memory)
    return str(run_dir)


def _hf_run(tmp: Path, cfg: dict | None) -> str:
    folder = tmp / "cfg"
    folder.mkdir()
    if cfg is not None:
        (folder / "config.json").write_text(json.dumps(cfg))
    target = "cfg/config.json" if cfg is not None else "cfg"
    return _run_file(tmp, f'[model]\nhf_config = "{target}"\n')


def _capture(tmp: Path, *extra: str) -> list[str]:
    return ["capture", "--preset", "llama3-8b", "-o", str(tmp / "x.parquet"), *extra]


SIMULATE_OUT = ["--no-progress", "--format", "summary"]
COMPARE = ["--recompute", "none,full:uniform:1"]

# id -> (argv from tmp_path, fragments the error line names)
CASES: dict[str, tuple[Callable[[Path], list[str]], list[str]]] = {
    "A1-simulate": (lambda t: ["simulate", _run_file(t), "-o", UNWRITABLE, *SIMULATE_OUT], ["-o", UNWRITABLE]),
    "A1-compare": (lambda t: ["compare", _run_file(t), *COMPARE, "-o", UNWRITABLE], ["-o", UNWRITABLE]),
    "A1-replay": (lambda t: ["replay", _snapshot(t), "-o", UNWRITABLE], ["-o", UNWRITABLE]),
    "A2-simulate": (lambda t: ["simulate", _run_file(t), "-o", _file(t), "--force", *SIMULATE_OUT],
                    ["existing", "not a folder"]),
    "A2-compare": (lambda t: ["compare", _run_file(t), *COMPARE, "-o", _file(t), "--force"],
                   ["existing", "not a folder"]),
    "A2-replay": (lambda t: ["replay", _snapshot(t), "-o", _file(t), "--force"], ["existing", "not a folder"]),
    "D9-replay-exists": (lambda t: ["replay", _snapshot(t), "-o", str(t)], ["not a timeline output folder", "remove it yourself"]),
    "A3-plot-proc": (lambda t: ["plot", _plot_dir(t), "-o", UNWRITABLE + ".png"], ["-o", UNWRITABLE]),
    "A3-plot-folder": (lambda t: ["plot", _plot_dir(t), "-o", str(t)], ["-o", "folder"]),
    "A4-bad-summary": (lambda t: ["plot", _plot_dir(t, summary="{not json")], ["summary.json", "JSON"]),
    "A4-bad-memory": (lambda t: ["plot", _plot_dir(t, memory=b"garbage" * 20)], ["memory.parquet"]),
    "A5-hf-config-folder": (lambda t: ["static", _hf_run(t, None)], ["model.hf_config", "folder"]),
    "A6-binary-run-file": (lambda t: ["static", _binary(t, "bin.toml")], ["bin.toml", "not a text file"]),
    "A7-capture-bad-value": (lambda t: _capture(t, "--set", "num_hidden_layers=abc"),
                             ["config", "num_hidden_layers"]),
    "A8-capture-negative-seq": (lambda t: _capture(t, "--seq-len", "-1"), ["--seq-len"]),
    "A8-capture-zero-batch": (lambda t: _capture(t, "--micro-batch-size", "0"), ["--micro-batch-size"]),
    "A9-capture-proc": (lambda t: ["capture", "--preset", "llama3-8b", "-o", UNWRITABLE + ".parquet"],
                        ["-o", UNWRITABLE]),
    "A9-capture-folder": (lambda t: ["capture", "--preset", "llama3-8b", "-o", str(t)], ["-o", "folder"]),
    "B1-static-per-rank": (lambda t: ["static", _run_file(t), "--recompute", "full:uniform:1,2,3"],
                           ["recompute.num_layers", "--recompute full:uniform:1,2,3"]),
    "B1-static-moe-act": (lambda t: ["static", _run_file(t), "--recompute", "selective:moe_act"],
                          ["moe_act", "--recompute selective:moe_act"]),
    "B1-static-grammar": (lambda t: ["static", _run_file(t), "--recompute", "sometimes"], ["--recompute"]),
    "F6-simulate-recompute": (lambda t: ["simulate", _run_file(t), "--recompute", "selective:moe_act",
                                         "-o", str(t / "out"), *SIMULATE_OUT], ["moe_act", "--recompute"]),
    "B2-capture-zero-seq": (lambda t: _capture(t, "--seq-len", "0"), ["--seq-len"]),
    "B3-capture-unknown-key": (lambda t: _capture(t, "--set", "nonsense_key=1"), ["--set nonsense_key"]),
    "B3-capture-not-key-value": (lambda t: _capture(t, "--set", "nonsense"), ["--set", "KEY=VALUE"]),
    "B4-capture-no-model-type": (lambda t: ["capture", "--hf-config", _json(t, "cfg.json", NO_TYPE),
                                            "-o", str(t / "x.parquet")], ["--hf-config", "model_type"]),
    "B4-run-no-shapes": (lambda t: ["static", _hf_run(t, {"model_type": "llama", "vocab_size": 1000})],
                         ["model.hf_config", "hidden_size", "num_hidden_layers"]),
    "B5-replay-rounding": (lambda t: ["replay", _snapshot(t), "--max-non-split-rounding-mb", "-5"],
                           ["--max-non-split-rounding-mb"]),
    "F4-replay-split-negative": (lambda t: ["replay", _snapshot(t), "--max-split-size-mb", "-5"],
                                 ["--max-split-size-mb"]),
    "F4-replay-split-small": (lambda t: ["replay", _snapshot(t), "--max-split-size-mb", "10"],
                              ["--max-split-size-mb 10", "20 MB"]),
    "F4-replay-divisions": (lambda t: ["replay", _snapshot(t), "--roundup-power2-divisions", "3"],
                            ["--roundup-power2-divisions", "power of two"]),
    "B6-simulate-no-format": (lambda t: ["simulate", _run_file(t), "--format", "", "-o", str(t / "out")],
                              ["--format", "at least one"]),
    "B6-fit-alternatives": (lambda t: ["fit", _run_file(t), "--alternatives", "-1"], ["--alternatives"]),
    "B6-compare-workers-zero": (lambda t: ["compare", _run_file(t), *COMPARE, "--workers", "0"], ["--workers"]),
    "B6-compare-workers-negative": (lambda t: ["compare", _run_file(t), *COMPARE, "--workers", "-2"],
                                    ["--workers"]),
    "B6-simulate-max-samples": (lambda t: ["simulate", _run_file(t), "--max-samples", "-1"], ["--max-samples"]),
    "B8-fit-capacity": (lambda t: ["fit", _run_file(t), "--set", "hardware.non_pytorch_gib=79",
                                   "--capacity", "10GiB"], ["hardware.non_pytorch_gib", "--capacity 10GiB"]),
    "D5-empty-run-file": (lambda t: ["static", _run_file(t, "")], ["model", "missing [model]"]),
    "D5-tp-list": (lambda t: ["static", _run_file(t), "--set", "parallel.tp=[2]"], ["parallel.tp"]),
    # a GPU no preset holds: each field its rules read, named (tests/spec/test_unknown_gpu.py)
    "gpu-no-preset": (lambda t: ["simulate", _run_file(t), "--set", "hardware.gpu=my-gpu"],
                      ["hardware.gpu", "'my-gpu' is no preset", "sms = ", "interconnect = "]),
}
def _tree(root: Path) -> dict[Path, bytes | None]:
    """Every path under ``root`` with its bytes (None for a folder)."""
    return {p: p.read_bytes() if p.is_file() else None for p in root.rglob("*")}


#: cases that get past argparse into torch/transformers
TORCH = {"A7-capture-bad-value", "A9-capture-proc", "A9-capture-folder", "B3-capture-unknown-key",
         "B3-capture-not-key-value", "B4-capture-no-model-type"}


@pytest.mark.parametrize("case", [pytest.param(k, marks=needs_torch) if k in TORCH else k for k in CASES])
def test_one_error_line_exit_2_nothing_left(case, tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # a default output folder (runs/…) would land here
    make, fragments = CASES[case]
    argv = make(tmp_path)
    before = _tree(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    captured = capsys.readouterr()
    assert code == 2, captured
    assert "Traceback" not in captured.err and captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert _tree(tmp_path) == before, "the command left or changed files"


def test_parser_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["simulate"])
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "RUN.toml" in lines[0]
