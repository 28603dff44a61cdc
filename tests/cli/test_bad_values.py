"""Each bad value class that once passed silently or ended in a traceback is one error line
naming the file and the key, exit 2 (issue: safe, bounded, never a traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers_run import TINY_RUN_TOML

from timeline.cli import main
from timeline.io.runfile import load_run

MOE = """name = "moe"
[model]
preset = "deepseek-v3"
num_hidden_layers = 4
first_k_dense_replace = 1
[parallel]
pp = 2
ep = 8
dp = 8
[training]
seq_len = 256
num_microbatches = 2
"""
HF = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "intermediate_size": 128, "vocab_size": 1000}

# id → (run-file text, --set overrides, extra CLI args, fragments of the one error line)
RUN_CASES = {
    "seq-len-1e12": (TINY_RUN_TOML, ["training.seq_len=1000000000000"], [], ["training.seq_len", "≤"]),
    "micro-batch-1e8": (TINY_RUN_TOML, ["training.micro_batch_size=100000000"], [], ["micro_batch_size", "≤"]),
    "capacity-nan": (TINY_RUN_TOML, ["hardware.capacity_gib=nan"], [], ["hardware.capacity_gib", "finite"]),
    "capacity-inf": (TINY_RUN_TOML, ["hardware.capacity_gib=inf"], [], ["hardware.capacity_gib", "finite"]),
    "tflops-nan": (TINY_RUN_TOML, ["hardware.bf16_tflops=nan"], [], ["hardware.bf16_tflops", "finite"]),
    "iterations-1e5": (TINY_RUN_TOML, ["training.iterations=100000"], [], ["training.iterations", "≤ 1000"]),
    "layers-1e7": (TINY_RUN_TOML, ["model.num_layers=10000000"], [], ["model.num_layers", "≤ 1280"]),
    "topk-beyond-experts": (MOE, ["model.num_experts_per_tok=512"], [], ["num_experts_per_tok", "n_routed_experts=256"]),
    "kv-heads-0": (TINY_RUN_TOML, ["model.num_key_value_heads=0"], [], ["model.num_key_value_heads", "leave the key out"]),
    "dense-beyond-layers": (MOE, ["model.first_k_dense_replace=9"], [], ["first_k_dense_replace", "exceeds"]),
    "full-100-of-2": (TINY_RUN_TOML, ["recompute.policy=full", "recompute.num_layers=100"], [],
                      ["recompute.num_layers", "exceeds the 2 decoder layers"]),
    "full-uniform-0": (TINY_RUN_TOML, [], ["--recompute", "full:uniform:0"], ["recompute.num_layers", "uniform"]),
    "microbatches-1e6": (TINY_RUN_TOML, ["training.num_microbatches=1000000"], [], ["memory events", "--max-events"]),
}

# id → (config changes, fragments)
HF_CASES = {
    "hidden-size-string": ({"hidden_size": "4096"}, ["hidden_size", "expected an integer"]),
    "vocab-size-0": ({"vocab_size": 0}, ["vocab_size", "positive"]),
    "layers-negative": ({"num_hidden_layers": -3}, ["num_hidden_layers", "positive"]),
    "kv-heads-0": ({"num_key_value_heads": 0}, ["num_key_value_heads", "null"]),
    "heads-nan": ({"attention_dropout": float("nan")}, ["attention_dropout", "finite"]),
    # a contradiction between fields: found by the run's validation, named by its key
    "kv-beyond-heads": ({"num_key_value_heads": 8}, ["model.num_key_value_heads", "exceeds"]),
}


def _one_line(capsys, fragments: list[str]) -> None:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in captured.err, captured.err
    for f in fragments:
        assert f in lines[0], (f, lines[0])


# static does not simulate micro-batches, so the micro-batch bound is simulate's alone
PAIRS = [(c, k) for k in RUN_CASES for c in ("static", "simulate")
         if not (c == "static" and "--max-events" in RUN_CASES[k][3])]


@pytest.mark.parametrize(("command", "case"), PAIRS, ids=[f"{c}-{k}" for c, k in PAIRS])
def test_run_file_values(tmp_path, capsys, case, command):
    text, sets, extra, fragments = RUN_CASES[case]
    run = tmp_path / "run.toml"
    run.write_text(text)
    args = [command, str(run), *[a for s in sets for a in ("--set", s)], *extra]
    if command == "simulate":
        args += ["-o", str(tmp_path / "out"), "--format", "summary"]
    assert main(args) == 2
    _one_line(capsys, fragments)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hf_config_values(tmp_path, capsys, case):
    changes, fragments = HF_CASES[case]
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**HF, **changes}))
    run = tmp_path / "run.toml"
    run.write_text(f'[model]\nhf_config = "{cfg}"\nprofile = "hf"\n[training]\nseq_len = 64\n')
    assert main(["static", str(run)]) == 2
    _one_line(capsys, [str(cfg) if case != "kv-beyond-heads" else str(run), *fragments])


def test_hf_null_kv_heads_is_mha(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**HF, "num_key_value_heads": None}))
    run = tmp_path / "run.toml"
    run.write_text(f'[model]\nhf_config = "{cfg}"\nprofile = "hf"\n[training]\nseq_len = 64\n')
    assert main(["static", str(run)]) == 0
    assert load_run(run).model.kv_heads == HF["num_attention_heads"]


def test_a_huge_model_fails_in_one_line_not_in_the_allocator(tmp_path, capsys):
    run = tmp_path / "run.toml"
    run.write_text(TINY_RUN_TOML)
    assert main(["simulate", str(run), "-o", str(tmp_path / "o"), "--format", "summary",
                 "--set", "model.hidden_size=1048576", "--set", "model.intermediate_size=4194304",
                 "--set", "model.vocab_size=16777216"]) == 2
    _one_line(capsys, ["256 TiB", "shard the model"])
    assert main(["simulate", str(run), "-o", str(tmp_path / "o"), "--format", "summary",
                 "--set", "training.seq_len=67108864", "--set", "training.micro_batch_size=65536"]) == 2
    _one_line(capsys, ["alone would take", "TiB", "seq_len"])
    assert not Path(tmp_path / "o").exists()
