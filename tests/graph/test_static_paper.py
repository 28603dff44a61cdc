"""Static memory against arXiv 2502.07846, to the byte (reference vectors T1–T8, T11)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sources import devices_of, source_of

from timeline.io.runfile import load_run

SHIPPED = Path(__file__).resolve().parents[2] / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"


def devices(*overrides):
    return devices_of(load_run(SHIPPED, list(overrides)))


def test_t1_t2_moe_stage_weights_by_module():
    d = devices()[1]  # pipeline rank 1 holds 4 MoE layers (L4–L7)
    assert d.layers == (4, 5, 6, 7)
    assert d.weights_bytes == 12_500_729_856  # T1
    by = d.params_by_module
    assert by["moe"] * 2 == 11_641_290_752  # T2 MoE
    assert by["attention"] * 2 == 859_308_032  # T2 MLA
    assert by["norm"] * 2 == 131_072  # T2 RMSNorm
    assert (by["attention"] + by["norm"]) * 2 == 859_439_104  # T2 non-MoE


@pytest.mark.parametrize(("zero", "expected"), [(0, 87_505_108_992), (1, 43_430_264_832),
                                                (2, 21_392_842_752), (3, 10_374_131_712)])
def test_t3_t6_zero_totals(zero, expected):
    d = devices(f"training.zero={zero}")[1]
    assert d.total_bytes == expected


def test_t3_parts():
    d = devices("training.zero=0")[1]
    assert (d.weights_bytes, d.grads_bytes, d.optimizer_bytes) == (12_500_729_856, 25_001_459_712,
                                                                    50_002_919_424)
    d = devices("training.zero=3")[1]
    assert (d.weights_bytes, d.grads_bytes, d.optimizer_bytes) == (1_482_018_816, 2_964_037_632,
                                                                    5_928_075_264)


def test_t7_t8_unsharded_stages():
    ds = devices("parallel.tp=1", "parallel.ep=1", "parallel.etp=1", "model.mtp_layers=0")
    for r in range(1, 15):
        assert ds[r].weights_bytes == 92_058_288_128  # T7: the paper's "86 GB"
    assert ds[0].weights_bytes == 28_368_830_464  # T8 stage 0
    assert ds[15].weights_bytes == 24_867_930_112  # T8 stage 15


def test_t11_total_params_paper_without_mtp():
    assert source_of(load_run(SHIPPED, ["model.mtp_layers=0"])).total_params() == 671_026_397_184
    # MTP adds the module DeepSeek's README_WEIGHTS.md calls "11.5B unique"
    assert source_of(load_run(SHIPPED)).total_params() == 671_026_397_184 + 11_610_067_968


def test_megatron_true_count():
    """Every real parameter: the final norm counts (7,168); the router's fp32 score-correction
    bias is a buffer, not a parameter (Megatron ``expert_bias``)."""
    run = load_run(SHIPPED, ["model.profile=megatron", "model.mtp_layers=0"])
    assert source_of(run).total_params() == 671_026_404_352
    d = devices_of(run)[1]
    assert d.buffers == 4 * 256  # one [256] fp32 bias per MoE layer


def test_megatron_splits_w_qr():
    """Megatron splits the RoPE part of the query up-projection over TP (reference §4)."""
    d = devices("model.profile=megatron")[1]
    assert d.params_by_module["attention"] == 404_488_192
    # its shared expert is TP-split too: 32 routed experts + half a shared expert per layer
    expert = 3 * 7168 * 2048
    assert d.params_by_module["moe"] == 4 * (32 * expert + expert // 2 + 256 * 7168)


def test_megatron_mtp_stage_builds_embedding():
    d = devices("model.profile=megatron")[15]
    vocab_rows = 129280 // 2  # 129,280 is already a multiple of 128·tp
    assert d.params_by_module["head"] == vocab_rows * 7168
    mtp = d.params_by_module["mtp"]
    paper_mtp = devices()[15].params_by_module["mtp"]
    assert mtp > paper_mtp and mtp - vocab_rows * 7168 < paper_mtp  # embedding copy counted, TP splits


def test_hf_builds_no_mtp_modules():
    """transformers' DeepseekV3ForCausalLM builds no MTP layers, so the hf profile holds none."""
    common = ["parallel.pp=1", "parallel.tp=1", "parallel.ep=1", "parallel.etp=1", "parallel.dp=1",
              "parallel.layout=[61]", "training.zero=0"]
    hf = devices_of(load_run(SHIPPED, ["model.profile=hf", *common]))[0]
    paper = devices_of(load_run(SHIPPED, common))[0]
    assert hf.params_by_module["mtp"] == 0 and paper.params_by_module["mtp"] == 11_610_067_968
