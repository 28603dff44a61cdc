"""Vision-language checkpoints under vLLM: Mistral-Small-3.1 (``Mistral3ForConditionalGeneration``, a Pixtral
tower and projector beside a Mistral language model), read as ``vllm/model_executor/models/pixtral.py`` and
``mistral3.py`` build it at 0.19.0 (:mod:`timeline.serve.vision`)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from timeline.cli import main
from timeline.errors import SpecError
from timeline.io.serve_runfile import load_serve_run
from timeline.serve.budget import compute_budget, profile_transients
from timeline.serve.vision import encoder_profile, images_profiled, vision_weight_bytes

HF = Path(__file__).resolve().parents[1] / "data" / "hf"
BASE, W8A8 = HF / "mistral-small-3.1-24b-instruct", HF / "mistral-small-3.1-24b-instruct-w8a8"

D, FFN, T, LAYERS = 1024, 4096, 5120, 24
TOWER_SHARDED = LAYERS * (4 * D * D + 3 * D * FFN)  # qkv, o_proj, gate_up, down_proj
TOWER_WHOLE = D * 3 * 14 * 14 + D + LAYERS * 2 * D + D + D * 4 * D  # conv, ln_pre, block norms, projector norm, merger
PROJECTOR = T * D + T * T  # linear_1, linear_2 (multimodal_projector_bias false)
INV_FREQ = 110 * 110 * 64 * 4  # PixtralRotaryEmbedding's fp32 buffer: 110² positions × head_dim


def _run(tmp_path: Path, config: Path, serving: str = "", tp: int = 1):
    path = tmp_path / f"r{tp}.toml"
    path.write_text(f'[model]\nhf_config = "{config / "config.json"}"\n[parallel]\ntp = {tp}\n[hardware]\n'
                    f'gpu = "h100"\ncapacity_gib = 79.19\n[serving]\nengine = "vllm"\nengine_version = "0.19.0"\n'
                    f'gpu_memory_utilization = 0.95\nmax_model_len = 8192\n{serving}\n'
                    '[serving.load]\nnum_requests = 1\n')
    return load_serve_run(path)


def test_the_tower_and_projector_weights_by_rank(tmp_path):
    one, two = _run(tmp_path, BASE), _run(tmp_path, BASE, tp=2)
    assert one.vision is not None and one.model.hidden_size == T and one.model.num_hidden_layers == 40
    assert vision_weight_bytes(one) == (TOWER_SHARDED + TOWER_WHOLE + PROJECTOR) * 2 + INV_FREQ
    # tp 2: the parallel linears halve; linear_2's row-parallel split halves its input columns
    assert vision_weight_bytes(two) == (TOWER_SHARDED // 2 + TOWER_WHOLE + PROJECTOR // 2) * 2 + INV_FREQ


def test_ignored_vision_modules_stay_in_the_model_dtype(tmp_path):
    run = _run(tmp_path, W8A8)
    assert run.quant is not None and run.quant.int8_activations
    assert vision_weight_bytes(run) == vision_weight_bytes(_run(tmp_path, BASE))
    quantized = replace(run, quant=replace(run.quant, not_converted=("language_model.lm_head",)))
    # quantized tower linears: int8 weights plus an fp32 scale per output row
    rows = LAYERS * (3 * D + D + 2 * FFN + D) + T + T
    assert vision_weight_bytes(quantized) == (TOWER_WHOLE * 2 + INV_FREQ + TOWER_SHARDED + PROJECTOR + rows * 4)


def test_images_the_encoder_profile_runs(tmp_path):
    run = _run(tmp_path, BASE)
    v = run.vision
    assert (v.image_embeddings, v.image_placeholder_tokens, v.patches) == (55 * 55, 56 * 55, 110 * 110)
    # vLLM 0.19.0 budgets an image by its 3,025 embeddings (get_num_embeds), 0.12.0 by its 3,080 placeholder tokens
    assert images_profiled(run, v) == 8192 // 3025 == 2
    wide = replace(run, serving=replace(run.serving, max_num_batched_tokens=16384))
    assert images_profiled(wide, v) == 16384 // 3025 == 5
    wider = replace(run, serving=replace(run.serving, max_num_batched_tokens=18200))
    assert images_profiled(wider, v) == 18200 // 3025 == 6
    assert images_profiled(replace(wider, serving=replace(wider.serving, engine_version="0.12.0")), v) == \
        18200 // 3080 == 5
    short = replace(run, serving=replace(run.serving, max_num_batched_tokens=2048))
    assert images_profiled(short, v) == 1  # the budget is at least one image


def test_the_encoder_profile_holds_one_dense_mask(tmp_path):
    run = _run(tmp_path, BASE)
    plan, kept = encoder_profile(run)
    s = 2 * 110 * 110
    assert plan.sizes[plan.names.index("vision.attention_mask")] == s * s * 2
    assert kept == ["vision.pixel_values", "projector.linear_2"]
    assert plan.sizes[plan.names.index("projector.linear_2")] == 2 * 55 * 55 * T * 2
    st = profile_transients(run)
    assert "embedding.out" not in st.names  # the dummy step reads the runner's inputs_embeds: no lookup
    live = peak = 0
    sizes, at = [], ""
    for size, j in st.plan:
        if j < 0:
            sizes.append(size)
            live += size
            if live > peak:
                peak, at = live, st.names[len(sizes) - 1]
        else:
            live -= sizes[j]
    assert at.startswith("vision.layers.") and peak == st.requested_peak_bytes


def test_language_model_only(tmp_path):
    both = compute_budget(_run(tmp_path, BASE))
    text = compute_budget(_run(tmp_path, BASE, "limit_mm_per_prompt = 0"))
    assert both.weights_bytes - text.weights_bytes == vision_weight_bytes(_run(tmp_path, BASE)) == \
        both.vision_weights_bytes and text.vision_weights_bytes == 0
    assert text.activation_peak_bytes < both.activation_peak_bytes


def test_other_engines_and_training_are_refused(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(f'[model]\nhf_config = "{BASE / "config.json"}"\n[hardware]\ngpu = "h100"\n'
                    '[serving]\nengine = "sglang"\n[serving.load]\nnum_requests = 1\n')
    with pytest.raises(SpecError) as err:
        load_serve_run(path)
    assert "vision-language checkpoint" in str(err.value) and "V1 engine" in str(err.value)
    run = tmp_path / "t.toml"
    run.write_text(f'[model]\nhf_config = "{BASE / "config.json"}"\n')
    assert main(["static", str(run)]) == 2
    assert "training memory of its vision tower is not modelled" in capsys.readouterr().err


def test_an_unmodelled_vision_family_is_named(tmp_path):
    cfg = json.loads((BASE / "config.json").read_text())
    cfg.update(architectures=["Qwen2_5_VLForConditionalGeneration"], model_type="qwen2_5_vl")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecError) as err:
        _run(tmp_path, tmp_path)
    assert "Qwen2_5_VLForConditionalGeneration is not modelled" in str(err.value)
