"""DeepSeek-V3.2's sparse attention as vLLM 0.19.0 serves it (timeline/serve/dsa.py): the indexer's weights, its
cache beside the MLA latent, the FlashMLA sparse backend's 64-token blocks and the buffers both reserve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from serve_runfiles import hf_run_file

from timeline.cli import main
from timeline.io.hf_config import read_hf_config
from timeline.io.serve_runfile import load_serve_run
from timeline.serve import dsa
from timeline.serve.budget import compute_budget, profile_transients
from timeline.serve.graph_view import device_params

HF = Path(__file__).resolve().parents[1] / "data" / "hf"
MNBT = 8192  # max_num_batched_tokens, the default


def _run(tmp_path: Path, folder: str = "deepseek-v3.2-exp", extra: str = "", engine: str = "vllm",
         version: str = "0.19.0"):
    return hf_run_file(tmp_path / f"{folder}.toml", folder, tp=8, gpu="h200", engine=engine, version=version,
                       extra=extra)


def test_the_config_reads_its_indexer():
    m = read_hf_config(HF / "deepseek-v3.2-exp" / "config.json")
    assert (m.model_type, m.index_n_heads, m.index_head_dim, m.index_topk) == ("deepseek_v32", 64, 128, 2048)
    assert m.is_mla and m.router_bias


def test_indexer_weights_are_replicated_and_weights_proj_stays_bf16(tmp_path):
    """Per layer: wq_b 8,192 × 1,536 and wk 128 × 7,168 in fp8 with a fp32 scale per 128 × 128 block, the k_norm
    LayerNorm (bf16 weight and bias) and weights_proj 64 × 7,168 in bf16 — on every TP rank."""
    v32, v3 = load_serve_run(_run(tmp_path)), load_serve_run(_run(tmp_path, "deepseek-v3"))
    names = {p.name for p in device_params(v32)} - {p.name for p in device_params(v3)}
    assert len(names) == 61 * 5
    per_layer = (8192 * 1536 + 64 * 12 * 4) + (128 * 7168 + 56 * 4) + 2 * 128 * 2 + 64 * 7168 * 2
    extra = 61 * per_layer + MNBT * 2048 * 4 + MNBT * 16 * 576 * 2  # + topk_indices_buffer + q_concat workspace
    assert compute_budget(v32).weights_bytes - compute_budget(v3).weights_bytes == extra


@pytest.mark.parametrize(("dtype", "per_layer", "workspace"), [
    ("auto", 576 * 2 + 132, MNBT * 16 * 576 * 2),
    ("fp8_ds_mla", 656 + 132, MNBT * 16 * 576 * 2 + 5 * 163_840 * 576 * 2),  # the bf16 prefill workspace too
    ("fp8", 656 + 132, MNBT * 16 * 576 * 2 + 5 * 163_840 * 576 * 2),  # the sparse backend's alias
])
def test_the_cache_holds_the_indexer_keys_in_64_token_blocks(tmp_path, dtype, per_layer, workspace):
    run = load_serve_run(_run(tmp_path, extra=f'kv_cache_dtype = "{dtype}"\n'))
    b = compute_budget(run)
    assert (b.kv_bytes_per_token, b.block_size) == (61 * per_layer, 64)
    assert b.num_kv_blocks == b.kv_pool_bytes // (64 * 61 * per_layer)
    assert dsa.sparse_backend_workspace(run) == workspace


def test_the_profile_grows_the_workspace_and_reserves_the_logits(tmp_path):
    """The indexer asks for 40 · 163,840 rows of 128 fp8 and 4 uint8 (825 MiB); the fused MoE's request decides if
    larger; the growth over the sparse backend's reservation (in the weights) is the profile's; every layer's
    indexer allocates 512 MiB once."""
    run = load_serve_run(_run(tmp_path))
    assert dsa.indexer_workspace(run) == 40 * 163_840 * (128 + 4) == 825 * 2**20
    plan = profile_transients(run)
    sizes = dict(zip(plan.names, [s for s, j in plan.plan if j < 0], strict=True))
    held = dsa.sparse_backend_workspace(run)
    assert sizes["workspace_manager.growth"] >= dsa.indexer_workspace(run) - held
    reserves = [n for n in plan.names if n.endswith("indexer.logits_reserve")]
    assert len(reserves) == 61 and all(sizes[n] == 512 * 2**20 for n in reserves)


def test_other_engines_versions_and_training_are_refused(tmp_path, capsys):
    for engine, version in (("sglang", "0.4"), ("vllm", "0.11.0")):
        assert main(["serve", str(_run(tmp_path, engine=engine, version=version)), "--out", str(tmp_path / "o")]) == 2
        assert 'engine_version = "0.19.0"' in capsys.readouterr().err
    train = tmp_path / "train.toml"
    train.write_text(f'[model]\nhf_config = "{HF / "deepseek-v3.2-exp" / "config.json"}"\nprofile = "megatron"\n')
    assert main(["static", str(train)]) == 2
    assert "model.index_n_heads" in capsys.readouterr().err


def test_an_indexer_needs_mla_with_a_compressed_query(tmp_path, capsys):
    cfg = json.loads((HF / "deepseek-v3.2-exp" / "config.json").read_text())
    cfg["q_lora_rank"] = None
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "config.json").write_text(json.dumps(cfg))
    run = tmp_path / "r.toml"
    run.write_text(_run(tmp_path).read_text().replace(str(HF / "deepseek-v3.2-exp"), str(tmp_path / "x")))
    assert main(["serve", str(run), "--out", str(tmp_path / "o")]) == 2
    assert "q_lora_rank" in capsys.readouterr().err
