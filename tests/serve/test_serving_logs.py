"""The serving budget against the calibration side of the public startup logs (issue 27).

``tools/compare_serving_logs.py`` builds every record of ``tests/data/serving_logs.json``; these tests
hold the *calibration* records at the errors the tool reaches today, each tolerance stated. The unseen
side is never asserted (it is reported by the tool, not tuned on).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from timeline.errors import SpecError
from timeline.io.serve_runfile import load_serve_run
from timeline.serve.budget import compute_budget
from timeline.spec.engine_versions import vllm_scheduler_defaults

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "tests" / "data" / "hf"


def _tool():
    spec = importlib.util.spec_from_file_location("compare_serving_logs", ROOT / "tools" / "compare_serving_logs.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["compare_serving_logs"] = mod
    spec.loader.exec_module(mod)
    return mod


TOOL = _tool()
RECORDS = {r["id"]: r for r in json.loads(TOOL.LOGS.read_text())["records"]}

#: calibration record → (metric, relative error reached, tolerance) and whether start/refusal agrees
REACHED = {
    "vllm-10517-3090-llama31-8b-20k": [("weights", 0.0, 0.001), ("activation", -0.153, 0.02), ("kv", 0.084, 0.02)],
    "vllm-10517-3090-llama31-8b-29k": [("weights", 0.0, 0.001), ("activation", -0.149, 0.02), ("kv", 0.155, 0.02)],
    "vllm-15815-l40sx2-qwen25-32b": [("weights", -0.006, 0.002), ("activation", 0.199, 0.02), ("kv", -0.008, 0.005)],
    "vllm-myoceane-a100-gpt-oss-20b": [("weights", -0.002, 0.002), ("kv", -0.017, 0.005)],
    "vllm-21348-h100x4-qwen3-235b-fp8": [("kv", 0.294, 0.02)],  # non-torch memory not printed: counted as 0
    "sglang-21348-h100x4-qwen3-235b-fp8": [("kv", 0.125, 0.01)],
}
#: the one calibration start the tool gets wrong today: GPT-OSS-120B's weights on an H100 (64–66 GiB in other
#: public logs against 60.8 predicted) leave it a pool where vLLM 0.11.0 had 1.71 GiB
STARTS_DIFFER = {"vllm-27508-h100-gpt-oss-120b"}


def test_split_follows_its_rule():
    split = json.loads(TOOL.SPLIT.read_text())
    for entry in split["logs"]:
        h = int(hashlib.sha256(b"timeline-serving-v1:" + entry["url"].encode()).hexdigest(), 16)
        assert entry["side"] == ("unseen" if h % 3 == 0 else "calibration"), entry["url"]
    sides = {e["url"]: e["side"] for e in split["logs"]}
    assert len(split["logs"]) >= 40
    for rec in RECORDS.values():
        assert sides[rec["url"]] == rec["side"], rec["id"]
        assert "quotes" not in rec  # numbers and inputs only: no text of the sources is kept


@pytest.mark.parametrize("rid", sorted(REACHED))
def test_calibration_record_errors(rid, tmp_path):
    rec = RECORDS[rid]
    assert rec["side"] == "calibration"
    row = TOOL.compare(rec, tmp_path, before=False)
    assert not row.refused, row.refused
    for metric, reached, tol in REACHED[rid]:
        assert row.errors[metric] == pytest.approx(reached, abs=tol), (metric, row.cells[metric])
    assert row.cells["start"].startswith("ok")


def test_calibration_starts_and_refusals(tmp_path):
    built = [TOOL.compare(r, tmp_path, False) for r in RECORDS.values() if r["side"] == "calibration"]
    compared = [r for r in built if not r.refused]
    assert len(compared) == 7 and len(built) == 14
    differ = {r.rec["id"] for r in compared if not r.cells["start"].startswith("ok")}
    assert differ == STARTS_DIFFER


def _run(tmp_path: Path, config: str, serving: str, tp: int = 1, gpu: str = "h100"):
    path = tmp_path / "r.toml"
    path.write_text(f'[model]\nhf_config = "{HF / config / "config.json"}"\n[parallel]\ntp = {tp}\n'
                    f'[hardware]\ngpu = "{gpu}"\n[serving]\n{serving}\n[serving.load]\nnum_requests = 1\n')
    return load_serve_run(path)


def test_mxfp4_experts_only_with_marlin_padding(tmp_path):
    """GPT-OSS-20B on an A100 (sm 80, Marlin): attention bf16, experts 2880 → 2944 × 3072 padded."""
    run = _run(tmp_path, "gpt-oss-20b", 'engine_version = "0.11.0"', gpu="a100")
    assert run.quant is not None and run.quant.experts_only and run.serving.weight_dtype == "mxfp4"
    b = compute_budget(run)
    # 24 layers × 32 experts × 3 padded matrices of 2944 × 3072 (half a byte each + a byte per 32) + biases,
    # plus the bf16 rest; vLLM 0.19.0 printed 13.72 GiB on an A100
    assert b.weights_bytes / 2**30 == pytest.approx(13.72, rel=0.005)


def test_fp8_blocks_from_the_config(tmp_path):
    run = _run(tmp_path, "qwen3-235b-a22b-fp8", "", tp=4)
    assert run.quant is not None and (run.quant.block_rows, run.quant.group_size) == (128, 128)
    assert run.serving.weight_dtype == "fp8" and run.serving.quant_group_size == 128


def test_contradicting_weight_dtype_is_one_line(tmp_path):
    with pytest.raises(SpecError) as err:
        _run(tmp_path, "qwen3-235b-a22b-fp8", 'weight_dtype = "int4"', tp=4)
    assert "serving.weight_dtype" in str(err.value) and "contradicts the checkpoint's quantization_config" in str(err.value)


def test_scheduler_defaults_by_version():
    # V0 (0.6.4): one max_model_len-token profile step; > 32K turns chunked prefill on (512, 2048 from 0.6.6)
    assert vllm_scheduler_defaults("0.6.4.post1", 20000, 23.58, "h100").max_num_batched_tokens == 20000
    assert vllm_scheduler_defaults("0.6.4.post1", 40000, 79.2, "h100").max_num_batched_tokens == 512
    assert vllm_scheduler_defaults("0.7.3", 40000, 79.2, "h100").max_num_batched_tokens == 2048
    # V1: 8192 / 1024 on an H100, 2048 / 256 on an A100 (0.9+) or a 24 GiB card
    h100 = vllm_scheduler_defaults("0.11.0", 131072, 79.19, "h100")
    assert (h100.max_num_batched_tokens, h100.max_num_seqs) == (8192, 1024)
    a100 = vllm_scheduler_defaults("0.11.0", 131072, 79.19, "a100")
    assert (a100.max_num_batched_tokens, a100.max_num_seqs) == (2048, 256)


def test_old_versions_refused_by_name(tmp_path):
    with pytest.raises(SpecError, match="before 0.6.4"):
        _run(tmp_path, "llama-3.1-8b", 'engine_version = "0.4.1"')
