"""The published config.json files under tests/data/hf load, count their published parameters
and simulate; a config whose model_type is a label of its own loads by its architectures."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from timeline.cli import main
from timeline.graph.static import model_total_params
from timeline.io.hf_config import read_hf_config
from timeline.io.runfile import load_run
from timeline.spec.presets import PRESETS

DATA = Path(__file__).resolve().parents[1] / "data" / "hf"


def _run(tmp_path: Path, folder: str, profile: str = "megatron", extra: str = "") -> Path:
    path = tmp_path / f"{folder}.toml"
    path.write_text(f'[model]\nhf_config = "{DATA / folder / "config.json"}"\nprofile = "{profile}"\n{extra}')
    return path


# (folder, published total, tolerance): the totals the model cards state, rounded as they are
PUBLISHED = [("llama-3.1-8b", 8.03e9, 0.005), ("qwen3-30b-a3b", 30.5e9, 0.005),
             ("mixtral-8x7b", 46.7e9, 0.005), ("kimi-k2-instruct", 1.03e12, 0.01)]


@pytest.mark.parametrize(("folder", "total", "tol"), PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_parameter_count_is_the_published_total(tmp_path, folder, total, tol):
    run = load_run(_run(tmp_path, folder, profile="paper"))
    assert model_total_params(run) == pytest.approx(total, rel=tol)


def test_deepseek_v3_config_is_the_preset():
    m = read_hf_config(DATA / "deepseek-v3" / "config.json")
    preset = PRESETS["deepseek-v3"]
    # norm_topk_prob is in the published file; the preset leaves it at its default
    assert m.with_(name=preset.name, norm_topk_prob=preset.norm_topk_prob) == preset


def test_kimi_k2_reads_as_deepseek_v3_with_a_note():
    notes: list[str] = []
    m = read_hf_config(DATA / "kimi-k2-instruct" / "config.json", notes)
    assert m.model_type == "deepseek_v3" and m.n_routed_experts == 384 and m.num_attention_heads == 64
    assert m.first_k_dense_replace == 1 and m.mtp_layers == 0 and m.router_bias
    assert notes == ["model_type 'kimi_k2' is read as 'deepseek_v3': its architectures name DeepseekV3ForCausalLM"]


@pytest.mark.parametrize("profile", ["megatron", "paper"])
def test_kimi_k2_simulates(tmp_path, capsys, profile):
    run = _run(tmp_path, "kimi-k2-instruct", profile,
               "[parallel]\npp = 4\ntp = 2\nep = 8\ndp = 8\nlayout = [16, 15, 15, 15]\n"
               "[training]\nnum_microbatches = 4\nseq_len = 1024\niterations = 1\n")
    code = main(["simulate", str(run), "-o", str(tmp_path / "out"), "--format", "summary"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "note:" in captured.err and "kimi_k2" in captured.err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert len(summary["devices"]) == 4 and all(d["peak_reserved_bytes"] > 0 for d in summary["devices"])


def test_unknown_model_type_and_unknown_architecture(tmp_path):
    cfg = json.loads((DATA / "llama-3.1-8b" / "config.json").read_text())
    cfg.update(model_type="mystery", architectures=["MysteryForCausalLM"])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    code = main(["static", str(_run_cfg(tmp_path))])
    assert code == 2


def _run_cfg(tmp_path: Path) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(f'[model]\nhf_config = "{tmp_path / "config.json"}"\n')
    return path


SMALL_KIMI = ["num_hidden_layers=2", "hidden_size=256", "n_routed_experts=8", "moe_intermediate_size=64",
              "intermediate_size=512", "num_attention_heads=4", "q_lora_rank=64", "kv_lora_rank=32",
              "qk_nope_head_dim=16", "qk_rope_head_dim=16", "v_head_dim=16", "vocab_size=1000"]


@pytest.mark.skipif(importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
                    reason="needs the capture extra (torch, transformers)")
def test_kimi_k2_captures_and_the_trace_simulates(tmp_path, capsys):
    trace = tmp_path / "kimi.parquet"
    args = ["capture", "--hf-config", str(DATA / "kimi-k2-instruct" / "config.json"),
            *[a for s in SMALL_KIMI for a in ("--set", s)], "--micro-batch-size", "1", "--seq-len", "64",
            "-o", str(trace)]
    assert main(args) == 0, capsys.readouterr().err
    assert "read as 'deepseek_v3'" in capsys.readouterr().err
    run = tmp_path / "run.toml"
    run.write_text(f'[model]\ntrace = "{trace}"\n[training]\nseq_len = 64\nnum_microbatches = 2\n')
    assert main(["simulate", str(run), "-o", str(tmp_path / "out"), "--format", "summary"]) == 0
