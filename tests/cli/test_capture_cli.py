"""``timeline capture`` and ``timeline static`` on the shipped traces."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from timeline.cli import main

ROOT = Path(__file__).resolve().parents[2]
RUN = """[model]
trace = "{trace}"
num_layers = {layers}
[training]
micro_batch_size = 1
seq_len = 4096
"""


def static_layers(tmp_path, trace: str, layers: int, capsys) -> dict[int, int]:
    run = tmp_path / "run.toml"
    run.write_text(RUN.format(trace=ROOT / "traces" / trace, layers=layers))
    assert main(["static", str(run), "--json"]) == 0
    dev = json.loads(capsys.readouterr().out)["devices"][0]
    return {e["layer"]: e["bytes"] for e in dev["layer_activation_bytes"]}


def test_llama3_8b_layer_matches_groundtruth(tmp_path, capsys):
    """groundtruth.md §5: a Llama-3-8B-shape layer at s 4096, b 1 saves 822,640,664 B (49.03 sbh)."""
    layers = static_layers(tmp_path, "llama3-8b-layer.parquet", 32, capsys)
    assert all(layers[k] == 822_640_664 for k in range(32))


def test_deepseek_v3_moe_layer_matches_groundtruth(tmp_path, capsys):
    """groundtruth.md §5: a DeepSeek-V3-shape MoE layer saves 3,010,806,800 B (102.55 sbh)."""
    layers = static_layers(tmp_path, "deepseek-v3-moe-layer.parquet", 61, capsys)
    assert layers[60] == pytest.approx(3_010_806_800, rel=1e-3)


def test_capture_needs_torch(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)
    assert main(["capture", "--preset", "llama3-8b", "-o", str(tmp_path / "x.parquet")]) == 2
    assert "pip install -e '.[capture]'" in capsys.readouterr().err


def test_capture_writes_a_trace(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1,
                               "num_attention_heads": 2, "intermediate_size": 128, "vocab_size": 100}))
    out = tmp_path / "t.parquet"
    assert main(["capture", "--hf-config", str(cfg), "--micro-batch-size", "2", "--seq-len", "16",
                 "-o", str(out)]) == 0
    assert "1 decoder layers" in capsys.readouterr().err
    from timeline.io.trace_file import read_trace_provenance

    prov = read_trace_provenance(out)
    assert (prov["micro_batch_size"], prov["seq_len"], prov["hidden_size"]) == (2, 16, 64)


def test_capture_module_errors_clearly(tmp_path, capsys):
    pytest.importorskip("torch")
    assert main(["capture", "--module", "no_such_module_xyz:build", "-o", str(tmp_path / "x.parquet")]) == 2
    assert "no_such_module_xyz" in capsys.readouterr().err
