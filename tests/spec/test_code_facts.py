"""What a family's modelling code does that its config does not say lives on ModelSpec (derived
from ``model_type``), not as lists of model types inside a profile."""

from __future__ import annotations

import pytest

from timeline.io.hf_config import SUPPORTED, model_from_hf_dict
from timeline.spec.model import CODE_FACTS, ModelSpec
from timeline.spec.presets import PRESETS

SHAPES = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128,
          "intermediate_size": 128}


def test_every_family_named_is_one_the_reader_knows():
    assert {t for types in CODE_FACTS.values() for t in types} <= set(SUPPORTED)


@pytest.mark.parametrize(("model_type", "score", "cast"), [
    ("deepseek_v3", "sigmoid", False), ("llama", "sigmoid", False), ("mixtral", "softmax", False),
    ("qwen2_moe", "softmax", True), ("qwen3_moe", "softmax", True), ("gpt_oss", "topk_softmax", False),
])
def test_router_facts_follow_the_family(model_type, score, cast):
    m = model_from_hf_dict({"model_type": model_type, **SHAPES})
    assert (m.router_score, m.router_weights_cast) == (score, cast)


def test_gpt2_and_gpt_oss_code_facts():
    gpt2 = model_from_hf_dict({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 128})
    assert gpt2.fused_qkv and gpt2.residual_dropout and not gpt2.rope_half_width
    oss = ModelSpec(model_type="gpt_oss")
    assert oss.rope_half_width and oss.norm_output_fp32 and not oss.fused_qkv
    assert PRESETS["mixtral-8x7b"].router_score == "softmax"  # a preset's family carries its facts too
    assert not ModelSpec().fused_qkv and ModelSpec().router_score == "sigmoid"  # today's defaults
