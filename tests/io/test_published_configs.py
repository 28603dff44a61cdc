"""The published config.json files under tests/data/hf load, count their published parameters
and simulate; a config whose model_type is a label of its own loads by its architectures."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from sources import forward_ops_of, source_of

from timeline.cli import main
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
    assert source_of(run).total_params() == pytest.approx(total, rel=tol)


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


def test_unknown_model_type_and_unknown_architecture(tmp_path, capsys):
    """An unknown causal LM with nothing beyond Llama's keys reads as Llama's decoder, said in a note; one whose
    config names experts is refused, naming the key."""
    cfg = json.loads((DATA / "llama-3.1-8b" / "config.json").read_text())
    cfg.update(model_type="mystery", architectures=["MysteryForCausalLM"])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["static", str(_run_cfg(tmp_path))]) == 0
    assert "model_type 'mystery' (architectures: MysteryForCausalLM) is not one this reader knows: read as a " \
        "Llama-style decoder" in capsys.readouterr().err
    cfg.update(num_local_experts=8, num_experts_per_tok=2)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["static", str(_run_cfg(tmp_path))]) == 2
    assert "its config has 'num_local_experts' (experts (a mixture of experts))" in capsys.readouterr().err


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


# gpt-oss model card (OpenAI, arXiv 2508.10925, Table 1): 116.83B and 20.91B total parameters; hf
# counts the final norm (2,880) the paper profile leaves out, so both round to the card's figures
GPT_OSS = [("gpt-oss-20b", 20_914_757_184, 20.91), ("gpt-oss-120b", 116_829_156_672, 116.83)]


@pytest.mark.parametrize(("folder", "exact", "card"), GPT_OSS, ids=[g[0] for g in GPT_OSS])
def test_gpt_oss_counts_the_model_card_total(tmp_path, folder, exact, card):
    for profile in ("hf", "megatron"):
        assert source_of(load_run(_run(tmp_path, folder, profile=profile))).total_params() == exact
    assert round(exact / 1e9, 2) == card


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs the capture extra (transformers)")
@pytest.mark.parametrize(("folder", "exact"), [(g[0], g[1]) for g in GPT_OSS], ids=[g[0] for g in GPT_OSS])
def test_gpt_oss_count_is_transformers_count(folder, exact):
    """transformers' own GptOssForCausalLM (on the meta device: no memory) has exactly these parameters."""
    import torch
    from transformers import AutoModelForCausalLM, GptOssConfig

    cfg = json.loads((DATA / folder / "config.json").read_text())
    cfg.pop("model_type")
    cfg.pop("quantization_config")  # the MXFP4 loader needs a GPU; the parameters are the same
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(GptOssConfig(**cfg))
    assert sum(p.numel() for p in model.parameters()) == exact


def test_gpt_oss_reads_its_family_with_a_quantization_note():
    notes: list[str] = []
    m = read_hf_config(DATA / "gpt-oss-120b" / "config.json", notes)
    assert (m.model_type, m.n_routed_experts, m.num_experts_per_tok, m.moe_intermediate_size) == ("gpt_oss", 128, 4, 2880)
    assert m.attention_sinks and m.attention_out_bias and m.router_logit_bias and m.expert_linear_bias
    assert (m.swiglu_limit, m.swiglu_alpha, m.glu_linear_offset, m.sliding_window) == (7.0, 1.702, 1.0, 128)
    assert [m.is_sliding(i) for i in range(4)] == [True, False, True, False] and len(m.layer_types) == 36
    assert notes == ["quantization_config (mxfp4) is ignored: training memory holds the weights in [training] dtype"]


def test_gpt_oss_layer_types_must_cover_the_layers(tmp_path, capsys):
    run = _run(tmp_path, "gpt-oss-20b", extra="num_hidden_layers = 2\n")
    assert main(["static", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "layer_types: 24 entries for num_hidden_layers=2" in err


@pytest.mark.parametrize("folder", ["gpt-oss-20b", "gpt-oss-120b"])
@pytest.mark.parametrize("profile", ["hf", "megatron"])
def test_gpt_oss_simulates(tmp_path, capsys, folder, profile):
    parallel = "" if profile == "hf" else "[parallel]\npp = 4\ntp = 2\nep = 8\ndp = 8\n"
    run = _run(tmp_path, folder, profile, f"{parallel}[training]\nseq_len = 1024\nnum_microbatches = 4\n"
                                          "iterations = 1\n")
    code = main(["simulate", str(run), "-o", str(tmp_path / "out"), "--format", "summary"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "quantization_config (mxfp4) is ignored" in captured.err
    devices = json.loads((tmp_path / "out" / "summary.json").read_text())["devices"]
    total = dict(GPT_OSS_EXACT)[folder]
    if profile == "hf":  # one device holding the whole model in bf16
        assert len(devices) == 1 and devices[0]["static_bytes"]["weights"] == 2 * total
    else:
        assert len(devices) == 4 and all(d["peak_reserved_bytes"] > d["static_bytes"]["weights"] for d in devices)
    if (folder, profile) == ("gpt-oss-20b", "megatron"):
        # pp rank 1: 6 layers of, per TP 2 / EP 8 device, attention 13,276,512 (q/k/v/o weights and q/k/v
        # biases halved, o bias 2,880, 32 sinks), norms 5,760, router 92,192, 4 experts × 12,447,360
        # (gate/up/down weights halved by expert-TP, gate/up biases 1,440 each, down bias 2,880)
        assert devices[1]["static_bytes"]["weights"] == 2 * 6 * (13_276_512 + 5_760 + 92_192 + 4 * 12_447_360)


GPT_OSS_EXACT = [(g[0], g[1]) for g in GPT_OSS]


SMALL_GPT_OSS = ["num_hidden_layers=2", 'layer_types=["sliding_attention","full_attention"]', "hidden_size=256",
                 "num_local_experts=4", "intermediate_size=128", "vocab_size=1000", "num_attention_heads=4",
                 "num_key_value_heads=2", "pad_token_id=0", "eos_token_id=1"]


@pytest.mark.skipif(importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
                    reason="needs the capture extra (torch, transformers)")
def test_gpt_oss_captures_with_eager_attention(tmp_path, capsys):
    """GPT-OSS has no SDPA path: capture builds it with eager attention (its default), and the trace keeps
    what the hf profile models, to the byte: at b = 1 the loss keeps the padded (1, s + 1) int64 labels whole
    (their shifted slice is already contiguous), which the model counts too."""
    trace = tmp_path / "gpt-oss.parquet"
    args = ["capture", "--hf-config", str(DATA / "gpt-oss-20b" / "config.json"),
            *[a for s in SMALL_GPT_OSS for a in ("--set", s)], "--micro-batch-size", "1", "--seq-len", "64",
            "-o", str(trace)]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "2,882,348 saved bytes" in captured.out + captured.err
    cfg = json.loads((DATA / "gpt-oss-20b" / "config.json").read_text())
    cfg.update({k: json.loads(v) for k, v in (s.split("=", 1) for s in SMALL_GPT_OSS)})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "run.toml").write_text('[model]\nhf_config = "config.json"\nprofile = "hf"\n[training]\n'
                                       "seq_len = 64\nmicro_batch_size = 1\n")
    assert main(["static", str(tmp_path / "run.toml"), "--json"]) == 0
    dev = json.loads(capsys.readouterr().out)["devices"][0]
    assert dev["activation_bytes_per_microbatch"] == 2_882_348


def test_layer_types_of_other_families_are_not_read(tmp_path):
    """A Qwen/Mistral config saved by recent transformers lists layer_types and a window: they stay
    unread (full attention, as before), so shrinking num_hidden_layers in the run file still works."""
    cfg = json.loads((DATA / "llama-3.1-8b" / "config.json").read_text())
    cfg.update(layer_types=["full_attention"] * cfg["num_hidden_layers"], sliding_window=4096)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    path = tmp_path / "run.toml"
    path.write_text(f'[model]\nhf_config = "{tmp_path / "config.json"}"\nnum_hidden_layers = 2\n')
    run = load_run(path)
    assert run.model.layer_types == () and run.model.sliding_window == 0


def test_opt_125m_reads_its_family(tmp_path):
    """facebook/opt-125m: pre-norm LayerNorms, biased q/k/v/out and fc1/fc2, ReLU, learned positions, tied
    head. The count is transformers' OPTForCausalLM (125,239,296), OPTLearnedPositionalEmbedding's two offset
    rows included."""
    m = read_hf_config(DATA / "opt-125m" / "config.json")
    assert (m.model_type, m.norm, m.hidden_act, m.gated_mlp, m.position_embedding) == ("opt", "layernorm", "relu",
                                                                                        False, "learned")
    assert m.intermediate_size == 3072 and m.tie_word_embeddings and m.attention_bias and m.linear_bias
    assert source_of(load_run(_run(tmp_path, "opt-125m", profile="hf"))).total_params() == 125_239_296


def test_opt_with_a_projected_embedding_is_refused(tmp_path, capsys):
    cfg = json.loads((DATA / "opt-125m" / "config.json").read_text())
    cfg.update(word_embed_proj_dim=512, do_layer_norm_before=False)  # opt-350m's shape
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    run = tmp_path / "r.toml"
    run.write_text(f'[model]\nhf_config = "{tmp_path / "config.json"}"\n')
    assert main(["static", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "word_embed_proj_dim other than hidden_size" in err


# (folder, family read, exact count from the published shapes): Gemma's gated GeLU MLP has three matrices and a
# tied head (8,537,680,896: embeddings 256,000 × 3,072 + 28 × (4 × 3,072 × 4,096 + 3 × 3,072 × 24,576 + 2 × 3,072)
# + 3,072, the final norm counted by the hf profile); Phi-4 is Llama-shaped with an untied head; Granite ties its head
ROUND4 = [("gemma-7b", "gemma", 256_000 * 3072 + 28 * (4 * 3072 * 4096 + 3 * 3072 * 24576 + 2 * 3072) + 3072),
          ("phi-4", "phi3", 2 * 100_352 * 5120 + 40 * (5120 * (5120 + 2 * 1280) + 5120 * 5120
                                                       + 3 * 5120 * 17920 + 2 * 5120) + 5120),
          ("granite-3.1-2b-instruct", "granite", 49_155 * 2048 + 40 * (2 * 2048 * 2048 + 2 * 2048 * 512
                                                                       + 3 * 2048 * 8192 + 2 * 2048) + 2048)]


@pytest.mark.parametrize(("folder", "family", "exact"), ROUND4, ids=[r[0] for r in ROUND4])
def test_round4_families_count_their_shapes(tmp_path, folder, family, exact):
    assert read_hf_config(DATA / folder / "config.json").model_type == family
    run = load_run(_run(tmp_path, folder, profile="hf"))
    assert source_of(run).total_params() == exact


def test_gemma2_slides_on_even_layers():
    m = read_hf_config(DATA / "gemma-2-9b-it" / "config.json")
    assert m.sliding_window == 4096 and len(m.layer_types) == 42 and m.gated_mlp and m.tie_word_embeddings
    assert [m.is_sliding(i) for i in range(4)] == [True, False, True, False]


def test_phi2_counts_its_shapes_and_runs_its_layer_in_parallel(tmp_path):
    """Phi-2 (microsoft/phi-2, 2,779,683,840 parameters as transformers counts them): LayerNorms with biases,
    biased q/k/v, dense, fc1/fc2 and lm_head, untied; one input norm feeds attention and the MLP, whose outputs
    and the layer input are summed (``PhiDecoderLayer.forward``)."""
    m = read_hf_config(DATA / "phi-2" / "config.json")
    assert (m.model_type, m.norm, m.gated_mlp, m.parallel_residual, m.head_bias) == ("phi", "layernorm", False,
                                                                                   True, True)
    per_layer = (2560 * 7680 + 7680) + (2560 * 2560 + 2560) + (2560 * 10240 + 10240) + (10240 * 2560 + 2560) + 2 * 2560
    exact = 51_200 * 2560 + 32 * per_layer + 2 * 2560 + 51_200 * 2560 + 51_200
    run = load_run(_run(tmp_path, "phi-2"))
    assert source_of(run).total_params() == exact == 2_779_683_840
    ops = {op.name: op for op in forward_ops_of(run, 0)}
    ln = ops["layers.0.input_layernorm"].outputs["y"]
    assert ops["layers.0.mlp.linear_fc1"].inputs["x"] is ln
    assert not any("post_attention_layernorm" in name for name in ops)
    total = ops["layers.0.parallel_sum"]  # resid_pdrop 0.1: both sub-blocks through their dropout
    assert (total.inputs["x"].name, total.inputs["residual"].name) == ("layers.0.self_attn.dropout.out",
                                                                       "layers.0.mlp.dropout.out")
    assert ops["layers.0.mlp_residual"].inputs["residual"] is ops["layers.0.input_layernorm"].inputs["x"]


def test_phi_under_the_hf_profile_is_refused_by_name(tmp_path, capsys):
    assert main(["static", str(_run(tmp_path, "phi-2", profile="hf"))]) == 2
    err = capsys.readouterr().err
    assert "partial-rotary attention" in err and 'profile = "megatron"' in err


def test_glm45_air_reads_its_family_and_counts_its_shapes(tmp_path):
    """GLM-4.5-Air (``glm4_moe``): 46 layers of grouped-query attention (96 heads of 128, 8 key/value heads, q/k/v
    biases, RoPE on half of each head), one dense layer (10,944 wide), then 45 MoE layers of 128 routed experts
    (1,408 wide) and one shared expert under a sigmoid router with an fp32 correction bias; untied head. Trainable
    parameters as transformers builds them (the MTP layer is not part of Glm4MoeForCausalLM): 106.85B, the model
    card's "106B total"."""
    m = read_hf_config(DATA / "glm-4.5-air" / "config.json")
    assert (m.model_type, m.first_k_dense_replace, m.n_shared_experts, m.mtp_layers) == ("glm4_moe", 1, 1, 1)
    assert m.router_bias and m.attention_bias and not m.qk_norm and m.partial_rotary_factor == 0.5
    h, v = 4096, 151_552
    attention = h * 96 * 128 + 2 * h * 8 * 128 + (96 * 128 + 2 * 8 * 128) + 96 * 128 * h + 2 * h
    moe = 128 * 3 * h * 1408 + 3 * h * 1408 + 128 * h
    exact = 2 * v * h + h + 46 * attention + 3 * h * 10944 + 45 * moe
    assert exact == 106_852_245_504
    assert source_of(load_run(_run(tmp_path, "glm-4.5-air", profile="hf"))).total_params() == exact


def test_glm45_air_serves_with_vllm_s_fp32_router(tmp_path):
    """vLLM builds GLM-4.5's router in fp32 (``Glm4MoE.gate``: ``nn.Linear(..., dtype=torch.float32)``); its KV
    cache holds 2 of the 8 key/value heads per rank at tp 4: 46 layers × 2 × 2 × 128 × 2 bytes a token."""
    from timeline.io.serve_runfile import load_serve_run
    from timeline.serve.budget import compute_budget
    from timeline.serve.graph_view import device_params

    path = tmp_path / "glm.toml"
    path.write_text(f'[model]\nhf_config = "{DATA / "glm-4.5-air" / "config.json"}"\n[parallel]\ntp = 4\n'
                    '[hardware]\ngpu = "h100"\n[serving]\nengine_version = "0.19.0"\nmax_model_len = 32768\n'
                    '[serving.load]\nnum_requests = 1\n')
    run = load_serve_run(path)
    gate = [t for t in device_params(run) if t.name == "layers.1.mlp.gate.weight"]
    assert [(t.shape, t.dtype) for t in gate] == [((128, 4096), "fp32")]
    assert compute_budget(run).kv_bytes_per_token == 46 * 2 * 2 * 128 * 2


def test_minimax_m2_reads_its_family_and_serves(tmp_path):
    """MiniMax-M2 (``minimax_m2``): 62 layers, each a sparse MoE of 256 experts 1,536 wide (8 a token, sigmoid
    router with an fp32 correction bias, no shared expert) under GQA attention (48 heads of 128, 8 key/value heads)
    with q/k RMSNorms over the whole projection and RoPE on 64 of each head's 128 dims; untied head. 228.69B
    parameters, the card's 229B (its MTP modules are not part of the causal-LM model). vLLM: fp32 router, the
    q_norm weight split with the heads (MiniMaxText01RMSNormTP), 62 × 2 × 1 × 128 × 2 KV bytes a token at tp 8."""
    from timeline.io.serve_runfile import load_serve_run
    from timeline.serve.budget import compute_budget
    from timeline.serve.graph_view import device_params

    m = read_hf_config(DATA / "minimax-m2" / "config.json")
    assert (m.moe_intermediate_size, m.partial_rotary_factor, m.mtp_layers) == (1536, 0.5, 0)
    assert m.qk_norm and m.qk_norm_full and m.router_bias and all(m.is_moe_layer(i) for i in range(62))
    h, v = 3072, 200_064
    attention = h * 48 * 128 + 2 * h * 8 * 128 + 48 * 128 * h + 2 * h + 48 * 128 + 8 * 128
    moe = 256 * 3 * h * 1536 + 256 * h
    exact = 2 * v * h + h + 62 * (attention + moe)
    assert exact == 228_689_748_992
    assert source_of(load_run(_run(tmp_path, "minimax-m2", profile="hf"))).total_params() == exact
    path = tmp_path / "serve.toml"
    path.write_text(f'[model]\nhf_config = "{DATA / "minimax-m2" / "config.json"}"\n[parallel]\ntp = 8\n'
                    '[hardware]\ngpu = "h200"\n[serving]\nengine_version = "0.19.0"\nmax_model_len = 65536\n'
                    '[serving.load]\nnum_requests = 1\n')
    run = load_serve_run(path)
    held = {t.name: (t.shape, t.dtype) for t in device_params(run)}
    assert held["layers.0.self_attn.q_norm.weight"] == ((768,), "bf16")
    assert held["layers.0.mlp.gate.weight"] == ((256, 3072), "fp32")
    assert compute_budget(run).kv_bytes_per_token == 62 * 2 * 1 * 128 * 2


def test_ernie45_moe_reads_its_layer_kinds_and_serves(tmp_path):
    """ERNIE-4.5-21B-A3B (``ernie4_5_moe``): layer 0 dense (12,288 wide), layers 1 … 27 MoE (moe_layer_start_index 1,
    end 27, interval 1) of 64 experts 1,536 wide, 6 a token, and 2 shared experts; softmax router with an fp32
    correction bias; tied embeddings: 21,825,436,160 parameters (the card's 21B total). vLLM builds the router in
    fp32 (``Ernie4_5_MoeMoE.gate``)."""
    from timeline.io.serve_runfile import load_serve_run
    from timeline.serve.graph_view import device_params

    m = read_hf_config(DATA / "ernie-4.5-21b-a3b" / "config.json")
    assert m.mlp_layer_types == ("dense",) + ("moe",) * 27 and m.router_score == "softmax" and m.router_bias
    assert (m.n_routed_experts, m.num_experts_per_tok, m.n_shared_experts, m.mtp_layers) == (64, 6, 2, 0)
    h, v = 2560, 103_424
    attention = h * 20 * 128 + 2 * h * 4 * 128 + 20 * 128 * h + 2 * h
    moe = 64 * 3 * h * 1536 + 3 * h * 2 * 1536 + 64 * h
    exact = v * h + h + 28 * attention + 3 * h * 12288 + 27 * moe
    assert exact == 21_825_436_160
    assert source_of(load_run(_run(tmp_path, "ernie-4.5-21b-a3b", profile="hf"))).total_params() == exact
    path = tmp_path / "serve.toml"
    path.write_text(f'[model]\nhf_config = "{DATA / "ernie-4.5-21b-a3b" / "config.json"}"\n[hardware]\ngpu = "h100"\n'
                    '[serving]\nengine_version = "0.19.0"\nmax_model_len = 32768\n[serving.load]\nnum_requests = 1\n')
    held = {t.name: (t.shape, t.dtype) for t in device_params(load_serve_run(path))}
    assert held["layers.1.mlp.gate.weight"] == ((64, 2560), "fp32") and "layers.0.mlp.gate.weight" not in held
