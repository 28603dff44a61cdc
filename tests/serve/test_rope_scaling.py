"""A config's ``rope_scaling`` as vLLM 0.19.0 reads it: the cos/sin cache covers the scaled positions
(``rotary_embedding/__init__.py`` ``get_rope``: ``LinearScalingRotaryEmbedding`` / ``DynamicNTKScalingRotaryEmbedding``
``max_position · factor``, ``YaRNScalingRotaryEmbedding`` ``original_max_position · factor``) and the derived
``max_model_len`` is the same length (``config/model.py`` ``_get_and_verify_max_len``); ``llama3`` scaling keeps
``max_position_embeddings`` for both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from timeline.io.hf_config import rope_scaled_positions
from timeline.io.serve_runfile import load_serve_run
from timeline.serve.budget import compute_budget, rope_cache_bytes

HF = Path(__file__).resolve().parents[1] / "data" / "hf"


def _run(tmp_path: Path, rope_scaling: dict | None, engine: str = "vllm", max_model_len: int = 0):
    cfg = json.loads((HF / "qwen2.5-7b-instruct" / "config.json").read_text())
    cfg["rope_scaling"] = rope_scaling
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    version = "0.19.0" if engine == "vllm" else "0.4"
    path = tmp_path / "run.toml"
    path.write_text(f'[model]\nhf_config = "{tmp_path / "config.json"}"\n[hardware]\ngpu = "h100"\n'
                    f'[serving]\nengine = "{engine}"\nengine_version = "{version}"\n'
                    + (f"max_model_len = {max_model_len}\n" if max_model_len else "")
                    + "[serving.load]\nnum_requests = 1\n")
    return load_serve_run(path)


@pytest.mark.parametrize(("scaling", "positions"), [
    (None, 0),
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 131072),
    ({"rope_type": "linear", "factor": 2.0}, 65536),
    ({"rope_type": "dynamic", "factor": 2.0}, 65536),
    ({"rope_type": "dynamic", "factor": 2.0, "alpha": 1.0}, 0),  # DynamicNTKAlphaRotaryEmbedding: max_position
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}, 0),
    ({"rope_type": "yarn", "factor": 4.0}, 0),  # no original length: vLLM would fail; the plain length stands
])
def test_rope_scaled_positions(scaling, positions):
    assert rope_scaled_positions({"rope_scaling": scaling}, 32768) == positions


def test_yarn_scales_the_cache_and_the_derived_max_model_len(tmp_path):
    plain, yarn = _run(tmp_path, None), _run(tmp_path, {"type": "yarn", "factor": 4.0,
                                                        "original_max_position_embeddings": 32768})
    head_dim = 3584 // 28
    assert rope_cache_bytes(plain) == 32768 * head_dim * 2 and rope_cache_bytes(yarn) == 131072 * head_dim * 2
    assert (plain.max_model_len, yarn.max_model_len) == (32768, 131072)
    assert compute_budget(yarn).weights_bytes - compute_budget(plain).weights_bytes == (131072 - 32768) * head_dim * 2
    # a given max_model_len stands; SGLang's context length does not read YaRN's factor
    assert _run(tmp_path, {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
                max_model_len=8192).max_model_len == 8192
    assert _run(tmp_path, {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
                engine="sglang").max_model_len == 32768
