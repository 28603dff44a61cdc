"""Gated delta-net hybrids (Qwen3-Next, Qwen3.5) as vLLM 0.19.0 serves them.

Reader: ``linear_attention`` layers from ``full_attention_interval`` (``transformers_utils/configs/qwen3_next.py``,
``qwen3_5.py``), ``partial_rotary_factor``, ``attn_output_gate``, Qwen3.5's ``mamba_ssm_dtype``. Weights:
``GatedDeltaNetAttention.__init__`` (``layers/mamba/gdn_linear_attn.py``). Cache: ``MambaSpec`` pages of a conv
state and an fp32/bf16 temporal state (``mamba_utils.py``), the attention block raised to hold one state page and
the state padded to it (``models/config.py`` ``HybridAttentionMambaModelConfig``), the groups of
``kv_cache_utils.py`` (a state group holds one block per request)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from serve_runfiles import hf_run_file

from timeline.cli import main
from timeline.io.hf_config import model_from_hf_dict, read_hf_config
from timeline.io.serve_runfile import load_serve_run
from timeline.serve.budget import compute_budget, rope_cache_bytes
from timeline.serve.graph_view import device_params
from timeline.serve.kv import kv_layout, printed_kv_tokens, state_block_size, state_page_bytes
from timeline.spec.engine_versions import vllm_kv_tokens_from_concurrency

HF = Path(__file__).resolve().parents[1] / "data" / "hf"


def _run(tmp_path: Path, folder: str, tp: int = 1, extra: str = "", engine: str = "vllm", version: str = "0.19.0"):
    return hf_run_file(tmp_path / "run.toml", folder, tp=tp, gpu="h100", engine=engine, version=version, extra=extra)


def test_qwen3_next_reads_its_hybrid_layers():
    m = read_hf_config(HF / "qwen3-next-80b-a3b" / "config.json")
    assert m.model_type == "qwen3_next" and m.layer_types[:4] == ("linear_attention",) * 3 + ("full_attention",)
    assert [i for i in range(48) if not m.is_linear_attention(i)] == list(range(3, 48, 4))
    assert (m.attention_output_gate, m.qk_norm, m.shared_expert_gate, m.rotary_dim) == (True, True, True, 64)
    assert m.mamba_ssm_dtype == "" and m.first_k_dense_replace == 0


def test_qwen3_next_parameters_are_the_published_total(tmp_path):
    # the 80B-A3B's published parameter count without the MTP module (vLLM skips ``mtp.`` weights)
    run = load_serve_run(_run(tmp_path, "qwen3-next-80b-a3b"))
    params = device_params(run)
    assert sum(t.numel for t in params) == 79_674_391_296
    by_name = {t.name: t for t in params}
    # in_proj_qkvz 2·16·128 + 2·32·128 rows, in_proj_ba 2·32, conv over q, k, v (2·2048 + 4096), A_log in fp32
    assert by_name["layers.0.linear_attn.in_proj_qkvz.weight"].shape == (12_288, 2048)
    assert by_name["layers.0.linear_attn.in_proj_ba.weight"].shape == (64, 2048)
    assert by_name["layers.0.linear_attn.conv1d.weight"].shape == (8192, 1, 4)
    assert by_name["layers.0.linear_attn.A_log"].dtype == "fp32"
    assert "layers.3.self_attn.g_proj.weight" in by_name and "layers.3.linear_attn.A_log" not in by_name
    tp4 = {t.name: t for t in device_params(load_serve_run(_run(tmp_path, "qwen3-next-80b-a3b", tp=4)))}
    assert tp4["layers.0.linear_attn.in_proj_qkvz.weight"].shape == (3072, 2048)
    assert tp4["layers.0.linear_attn.norm.weight"].shape == (128,)  # RMSNormGated over one head: whole per rank


def test_qwen3_next_state_page_and_attention_block_at_tp4(tmp_path):
    run = load_serve_run(_run(tmp_path, "qwen3-next-80b-a3b", tp=4))
    m = run.model
    # conv state 3 × (2·2048 + 4096)/4 bf16 + temporal state 8 heads × 128 × 128 bf16
    assert state_page_bytes(m, 4, "bf16") == 3 * 2048 * 2 + 8 * 128 * 128 * 2 == 274_432
    # attention: one KV head of 256 per rank, 1,024 B a token: 16 · cdiv(274,432, 16 · 1,024) = 272 tokens
    assert state_block_size(m, 4, 16, 1024, "bf16") == 272
    b = compute_budget(run)
    assert b.block_size == 272 and b.kv_layers == 12 and b.kv_bytes_per_token == 12 * 1024
    layout = b.kv_layout
    assert [g.kind for g in layout.groups] == ["linear_attention"] * 3 + ["full_attention"]
    assert layout.group_size == 12 and layout.page_bytes == 272 * 1024
    # a request holds cdiv(len, 272) blocks of the full group and one block in each state group
    assert layout.max_request_blocks(32_768, 8192) == 121 + 3
    assert layout.request_blocks(1000, 1000) == 4 + 3
    # the 16·64-row RoPE cache: rotary_dim is a quarter of the 256-wide head
    assert rope_cache_bytes(run) == 262_144 * 64 * 2


def test_qwen35_27b_block_and_padding_as_its_logs_print(tmp_path):
    # "Setting attention block size to 784 tokens" and "Padding mamba page size by 0.13%" (calibration log
    # 1CatAI/1Cat-vLLM#237, a 27B hybrid): fp32 temporal state 48 × 128 × 128, conv 3 × 10,240 bf16; attention
    # 4 KV heads × 2 × 256 bf16 = 4,096 B a token
    m = read_hf_config(HF / "qwen3.5-27b" / "config.json", vision=True)
    assert (m.model_type, m.mamba_ssm_dtype, m.num_hidden_layers, m.rotary_dim) == ("qwen3_5_text", "fp32", 64, 64)
    page = state_page_bytes(m, 1, "bf16")
    assert page == 3 * 10_240 * 2 + 48 * 128 * 128 * 4 == 3_207_168
    assert state_block_size(m, 1, 16, 4096, "bf16") == 784
    assert round(100 * (784 * 4096 - page) / page, 2) == 0.13
    assert state_block_size(m, 2, 16, 2048, "bf16") == 784  # tp 2 halves both pages
    assert state_block_size(m, 1, 16, 2048, "bf16") == 1568  # an fp8 attention cache: the state keeps its dtypes


def test_qwen35_27b_groups_match_the_h20_log(tmp_path):
    # vllm-project/vllm#40691 (0.19.0, calibration): "GPU KV cache size: 290,864 tokens", "Maximum concurrency for
    # 32,768 tokens per request: 33.04x" — 1,487 blocks over 4 groups (48 linear layers in 3, 16 full in 1)
    m = read_hf_config(HF / "qwen3.5-27b" / "config.json", vision=True)
    layout = kv_layout(m, range(64), 784, 784 * 4096)
    assert [g.kind for g in layout.groups].count("linear_attention") == 3 and layout.group_size == 16
    need = layout.max_request_blocks(32_768, 16_384)
    assert need == 42 + 3 and round(1487 / need, 2) == 33.04
    assert 1487 // len(layout.groups) * 784 == 290_864


def test_qwen35_tower_refused_unless_the_language_model_is_served_alone(tmp_path, capsys):
    assert main(["serve", str(_run(tmp_path, "qwen3.5-27b")), "-o", str(tmp_path / "a")]) == 2
    assert "limit_mm_per_prompt" in capsys.readouterr().err
    run = _run(tmp_path, "qwen3.5-27b", extra="limit_mm_per_prompt = 0\n")
    assert main(["serve", str(run), "-o", str(tmp_path / "b")]) == 0
    b = compute_budget(load_serve_run(run))
    assert b.block_size == 784 and b.vision_weights_bytes == 0 and b.kv_pool_bytes > 0


def test_gdn_refused_where_not_modelled(tmp_path, capsys):
    assert main(["serve", str(_run(tmp_path, "qwen3-next-80b-a3b", tp=4, engine="sglang", version="0.5.5")),
                 "-o", str(tmp_path / "s")]) == 2
    assert "gated delta-net" in capsys.readouterr().err
    assert main(["serve", str(_run(tmp_path, "qwen3-next-80b-a3b", tp=4, version="0.10.1.1")),
                 "-o", str(tmp_path / "v")]) == 2
    assert "0.10.2" in capsys.readouterr().err
    train = tmp_path / "train.toml"
    train.write_text(f'[model]\nhf_config = "{HF / "qwen3-next-80b-a3b" / "config.json"}"\nprofile = "hf"\n')
    assert main(["simulate", str(train), "-o", str(tmp_path / "t")]) == 2
    assert 'profile = "megatron"' in capsys.readouterr().err  # trained only as Megatron-Core runs it


def test_layer_types_and_interval_are_checked():
    base = json.loads((HF / "qwen3-next-80b-a3b" / "config.json").read_text())
    with pytest.raises(Exception, match="full_attention_interval"):
        model_from_hf_dict({**base, "full_attention_interval": 0})
    with pytest.raises(Exception, match="layer_types"):
        model_from_hf_dict({**base, "layer_types": ["linear_attention"] * 3})
    with pytest.raises(Exception, match="mlp_only_layers"):
        model_from_hf_dict({**base, "mlp_only_layers": [0]})
    m = model_from_hf_dict({**base, "full_attention_interval": 2, "num_hidden_layers": 4})
    assert m.layer_types == ("linear_attention", "full_attention") * 2


def test_printed_tokens_by_version_and_the_align_mode():
    # club-3090 issue 612 (calibration; vLLM 0.24.0, Qwen3.6-35B-A3B, fp8 cache, prefix caching on, max_model_len
    # 131,072): "GPU KV cache size: 567,978 tokens", "Maximum concurrency ... 4.33x". Qwen3.5-MoE's shapes (the
    # config class's defaults) with its fp32 state: 3 × 8,192 bf16 conv + 32 × 128 × 128 fp32 = 2,146,304 B, one fp8
    # KV head pair of 256 = 1,024 B a token → 16 · cdiv(2,146,304, 16,384) = 2,096-token blocks; 30 linear layers in
    # 3 groups, 10 full in 1; "align" holds 2 blocks per state group: cdiv(131,072, 2,096) + 3 · 2 = 69 a request;
    # 299 blocks print int(299 / 69 · 131,072)
    m = model_from_hf_dict({"model_type": "qwen3_5_moe_text", "mamba_ssm_dtype": "float32"})
    assert state_page_bytes(m, 1, "bf16") == 2_146_304 and state_block_size(m, 1, 16, 1024, "bf16") == 2096
    layout = kv_layout(m, range(40), 2096, 2096 * 1024, state_blocks=2)
    assert layout.group_size == 10 and layout.max_request_blocks(131_072, 8192) == 63 + 6
    assert printed_kv_tokens(layout, 299, 131_072, 8192, "0.24.0") == 567_978
    assert round(299 / 69, 2) == 4.33
    # up to 0.20.0 (and a pre-release of 0.20.1) the blocks over the groups
    assert printed_kv_tokens(layout, 299, 131_072, 8192, "0.20.1rc1.dev16") == 299 // 4 * 2096
    assert printed_kv_tokens(layout, 299, 131_072, 8192, "0.20.2rc1.dev129") == 567_978
    assert not vllm_kv_tokens_from_concurrency("0.20.0") and vllm_kv_tokens_from_concurrency("0.20.1")


def test_prefix_caching_is_off_by_default_for_hybrids(tmp_path):
    run = load_serve_run(_run(tmp_path, "qwen3-next-80b-a3b", tp=4))
    assert not run.serving.enable_prefix_caching and compute_budget(run).kv_layout.state_blocks == 1
    on = load_serve_run(_run(tmp_path, "qwen3-next-80b-a3b", tp=4, extra="enable_prefix_caching = true\n"))
    assert compute_budget(on).kv_layout.state_blocks == 2
    assert compute_budget(on).kv_layout.max_request_blocks(32_768, 8192) == 121 + 3 * 2


def test_mtp_drafts_join_the_groups_and_the_states(tmp_path):
    # club-3090 issues 294 and 295 (calibration; Qwen3.6-27B — Qwen3.5-27B's shapes — tp 2, fp8_e5m2 cache, prefix
    # caching on, MTP with 3 drafted tokens, max_model_len 262,144): "GPU KV cache size: 622,408 tokens" and
    # "620,944 tokens" (2.37x). Conv state (3 + 3) × 5,120 fp16 + fp32 state 24 × 128 × 128 = 1,634,304 B; one fp8 KV
    # head pair of 256 = 1,024 B a token → 1,600-token blocks. 16 full layers + the MTP layer = 17 against 48
    # linear ones: groups of 17 (vLLM: "Add 3 padding layers"), 3 state groups holding 2 + 3 blocks a request each:
    # cdiv(262,144, 1,600) + 15 = 179 blocks a request; 425 and 424 blocks print those two counts
    extra = ('limit_mm_per_prompt = 0\nkv_cache_dtype = "fp8_e5m2"\ndtype = "fp16"\nenable_prefix_caching = true\n'
             'max_model_len = 262144\nmax_num_seqs = 2\nspeculative_method = "mtp"\nnum_speculative_tokens = 3\n')
    run = load_serve_run(_run(tmp_path, "qwen3.5-27b", tp=2, extra=extra, version="0.24.0"))
    b = compute_budget(run)
    assert state_page_bytes(run.model, 2, "fp16", 3) == 6 * 5120 * 2 + 24 * 128 * 128 * 4 == 1_634_304
    assert b.block_size == 1600 and b.kv_layers == 17
    layout = b.kv_layout
    assert layout.group_size == 17 and [g.kind for g in layout.groups].count("linear_attention") == 3
    assert [len(g.layers) for g in layout.groups] == [16, 16, 16, 17]  # each state group padded by one: 3 in all
    assert layout.max_request_blocks(262_144, 8192) == 164 + 3 * (2 + 3) == 179
    assert [printed_kv_tokens(layout, n, 262_144, 8192, "0.24.0") for n in (425, 424)] == [622_408, 620_944]
    # club-3090 issues 142 and 642 (calibration, the same launch; 142 on 0.20.2rc1.dev129): "Available KV cache
    # memory: 11.08 GiB" / "11.05 GiB" (two decimals) and "GPU KV cache size: 623,873 tokens" for both. 426 blocks of
    # 1,600 · 1,024 B pages over 17 tensors are the pools from 11.0504 to 11.0764 GiB, which both printed values'
    # rounding intervals meet; 425 or 427 blocks would print 622,408 or 625,337
    page = layout.page_bytes * layout.group_size
    for printed in (11.05, 11.08):
        assert max(426 * page, (printed - 0.005) * 2**30) < min(427 * page, (printed + 0.005) * 2**30)
    assert [printed_kv_tokens(layout, n, 262_144, 8192, "0.20.2rc1.dev129") for n in (425, 427)] == [622_408, 625_337]
    assert printed_kv_tokens(layout, 426, 262_144, 8192, "0.20.2rc1.dev129") == 623_873
    # the drafter's own weights: fc (2·5,120 → 5,120, split by tp), three norms, one full-attention layer with its
    # dense MLP; the embedding and LM head are the target's
    plain = load_serve_run(_run(tmp_path, "qwen3.5-27b", tp=2, extra="limit_mm_per_prompt = 0\n"))
    added = sum(t.numel for t in device_params(run)) - sum(t.numel for t in device_params(plain))
    h, hd = 5120, 256
    attn = h * (24 * 2 * hd) // 2 + 2 * h * (4 * hd) // 2 + (24 * hd) // 2 * h + 2 * hd  # q+gate, k, v, o, q/k norms
    assert added == h * 2 * h // 2 + 3 * h + attn + 3 * h * 17_408 // 2 + 2 * h


def test_mtp_refused_where_not_modelled(tmp_path, capsys):
    bad = 'speculative_method = "mtp"\nnum_speculative_tokens = 0\n'
    assert main(["serve", str(_run(tmp_path, "qwen3-next-80b-a3b", tp=4, extra=bad)), "-o", str(tmp_path / "a")]) == 2
    assert "num_speculative_tokens" in capsys.readouterr().err
    assert main(["serve", str(_run(tmp_path, "qwen3-next-80b-a3b", tp=4, extra="num_speculative_tokens = 2\n")),
                 "-o", str(tmp_path / "b")]) == 2
    assert "speculative_method" in capsys.readouterr().err
    run = tmp_path / "llama.toml"
    run.write_text('[model]\npreset = "llama3-8b"\n[serving]\nengine = "vllm"\nspeculative_method = "mtp"\n'
                   "num_speculative_tokens = 1\n[serving.load]\nnum_requests = 1\n")
    assert main(["serve", str(run), "-o", str(tmp_path / "c")]) == 2
    assert "gated delta-net hybrids" in capsys.readouterr().err


def test_qwen3_next_fp8_cache_with_two_drafted_tokens_as_a_2025_log_prints():
    # vllm-project/vllm#25760 (calibration; Qwen3-Next-80B-A3B-Thinking-FP8, tp 4, qwen3_next_mtp, a September 2025
    # vLLM: the old report): "Available KV cache memory: 1.53 GiB", "Add 3 padding layers", "GPU KV cache size: 61,600
    # tokens". The thread's text gives neither the cache dtype nor the drafted tokens; of bf16 or fp8 caches and groups
    # of 12 or 13, only an fp8 cache (512 B a token at tp 4) with the MTP layer's group of 13 prints 61,600 for any
    # block size, and the state rule gives 560-token blocks for 2 or 3 drafted tokens: conv (3 + 2) × 2,048 bf16 + 8 ×
    # 128 × 128 bf16 = 282,624 B → 16 · cdiv(282,624, 8,192) = 560; 12 full layers + the MTP layer against 36 linear
    # ones: groups of 13 (3 padding layers); 1.53 GiB // (560 · 512) // 13 = 440 blocks → 440 // 4 · 560
    m = read_hf_config(HF / "qwen3-next-80b-a3b" / "config.json")
    assert state_page_bytes(m, 4, "bf16", 2) == 282_624 and state_block_size(m, 4, 16, 512, "bf16", 2) == 560
    assert state_block_size(m, 4, 16, 512, "bf16", 3) == 560 and state_block_size(m, 4, 16, 512, "bf16", 1) == 544
    layout = kv_layout(m, range(49), 560, 560 * 512, state_blocks=3)
    assert layout.group_size == 13 and sum(13 - len(g.layers) for g in layout.groups) == 3
    blocks = int(1.53 * 2**30) // layout.page_bytes // layout.group_size
    assert blocks == 440 and printed_kv_tokens(layout, blocks, 10_000, 8192, "0.11.0") == 61_600
