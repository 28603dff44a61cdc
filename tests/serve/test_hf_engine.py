"""``engine = "hf"``: the DynamicCache bytes after each generate step equal real Hugging Face
``generate`` on the CPU, to the byte, for small Llama, Qwen3 and DeepSeek-V3 configs (the latent
cache of transformers 5.x). Skipped without the ``capture`` extra (torch, transformers)."""

from __future__ import annotations

import json

import pytest

from timeline.io.hf_config import read_hf_config
from timeline.serve.hf import hf_cache_bytes, hf_timeline
from timeline.spec.serving import Request

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = {
    "llama": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=256),
    "qwen3": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=256),
    "deepseek_v3": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=4, vocab_size=256, kv_lora_rank=16,
                        q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4,
                        num_experts_per_tok=2, first_k_dense_replace=1, n_group=1, topk_group=1),
}


def real_cache_bytes(model, ids, new_tokens: int) -> int:
    out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                         return_dict_in_generate=True, pad_token_id=0)
    cache = out.past_key_values
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


@pytest.mark.parametrize("family", sorted(SMALL))
def test_cache_bytes_equal_real_generate(tmp_path, family):
    cfg = transformers.AutoConfig.for_model(family, **SMALL[family])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg.to_dict()))
    spec = read_hf_config(path)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    batch, prompt = 3, 10
    ids = torch.randint(1, 256, (batch, prompt))
    reqs = tuple(Request(rid=i, arrival_us=0.0, prompt_tokens=prompt, output_tokens=5) for i in range(batch))
    _, rows = hf_timeline(spec, "bf16", reqs, batch, lambda *a: 1.0)
    for n in (1, 2, 5):  # after n new tokens the cache holds prompt + n − 1 positions
        real = real_cache_bytes(model, ids, n)
        assert real == hf_cache_bytes(spec, "bf16", batch, prompt + n - 1) == rows[n - 1][1]


def test_hf_engine_runs_from_the_command_line(tmp_path):
    from pathlib import Path

    from timeline.cli import main

    run = Path(__file__).resolve().parents[2] / "schedules" / "llama3.1-8b-h100-serve.toml"
    out = tmp_path / "hf"
    assert main(["serve", str(run), "--set", "serving.engine=hf", "--set", "serving.max_num_seqs=8",
                 "--set", "serving.load.num_requests=16", "-o", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    dev = summary["devices"][0]
    # two batches of 8 × (1,024 + 127) positions × 131,072 B, plus the last layer's old values during the cat
    assert dev["peak_allocated_bytes"] == dev["budget"]["weights_bytes"] + 8 * 1151 * 131_072 + 8 * 1150 * 2048
    assert summary["requests"]["finished"] == 16
