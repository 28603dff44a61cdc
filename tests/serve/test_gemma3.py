"""Gemma-3 as its published configs describe it and vLLM 0.19.0 serves it.

Config (transformers 5.24 ``models/gemma3/configuration_gemma3.py``): ``Gemma3TextConfig``'s defaults stand for
the keys a sparse ``text_config`` leaves out (gemma-3-27b-it gives no ``vocab_size``: 262,208); without
``layer_types`` a layer slides unless ``i + 1`` is a multiple of ``sliding_window_pattern`` (6).
vLLM (``models/gemma3.py``): ``Gemma3Attention`` adds ``q_norm``/``k_norm`` (``head_dim`` each) to Gemma-2's
layer and calls ``get_rope`` twice — the sliding layers with ``rope_local_base_freq`` unscaled, the full layers
with the config's ``rope_scaling`` (``LinearScalingRotaryEmbedding``: ``max_position · factor`` rows) — and
``config/model.py`` ``_get_and_verify_max_len`` skips ``rope_scaling`` for a ``model_type`` holding "gemma3".
KV groups as ``kv_cache_utils.py`` ``_get_kv_cache_groups_uniform_page_size`` forms them (tests/serve/
test_kv_groups.py holds the rule itself)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from timeline.cli import main
from timeline.io.hf_config import model_from_hf_dict, read_hf_config, rope_scaled_positions
from timeline.io.serve_runfile import load_serve_run
from timeline.serve.budget import compute_budget, rope_cache_bytes
from timeline.serve.graph_view import device_params
from timeline.serve.transients import requested_peak
from timeline.serve.vision import built, encoder_profile, images_profiled, vision_weight_bytes

HF = Path(__file__).resolve().parents[1] / "data" / "hf"

# google/gemma-3-1b-it: 262,144 × 1,152 tied embeddings; per layer q 1,152 → 4 × 256, k and v → 1 × 256, o back,
# the gated GeLU MLP 3 × 1,152 × 6,912, four 1,152-wide norms and q/k norms of 256; the final norm
GEMMA3_1B = 262_144 * 1152 + 26 * (1152 * 1024 * 2 + 2 * 1152 * 256 + 3 * 1152 * 6912 + 4 * 1152 + 2 * 256) + 1152


def _serve(tmp_path: Path, folder: str, tp: int = 1, extra: str = "", cfg: dict | None = None):
    path = HF / folder / "config.json"
    if cfg is not None:
        path = tmp_path / "config.json"
        path.write_text(json.dumps(cfg))
    run = tmp_path / "run.toml"
    run.write_text(f'[model]\nhf_config = "{path}"\n[parallel]\ntp = {tp}\n[hardware]\ngpu = "h100"\n'
                   f'[serving]\nengine = "vllm"\nengine_version = "0.19.0"\n{extra}[serving.load]\nnum_requests = 1\n')
    return run


def test_gemma3_1b_reads_its_pattern_norms_and_window():
    m = read_hf_config(HF / "gemma-3-1b-it" / "config.json")
    assert (m.model_type, m.qk_norm, m.sandwich_norms, m.gated_mlp, m.tie_word_embeddings) == \
        ("gemma3_text", True, True, True, True)
    assert (m.sliding_window, m.attn_logit_softcapping, m.final_logit_softcapping) == (512, 0.0, 0.0)
    assert [i for i in range(26) if not m.is_sliding(i)] == [5, 11, 17, 23]
    assert m.local_rope and m.rope_scaled_positions == 0


def test_gemma3_27b_text_config_takes_the_class_defaults():
    m = read_hf_config(HF / "gemma-3-27b-it" / "config.json", vision=True)
    assert (m.model_type, m.vocab_size, m.max_position_embeddings, m.hidden_act) == \
        ("gemma3_text", 262_208, 131_072, "gelu_pytorch_tanh")
    assert (m.head_dim, m.num_key_value_heads, m.sliding_window) == (128, 16, 1024)
    assert [i for i in range(62) if not m.is_sliding(i)] == list(range(5, 62, 6))
    assert m.rope_scaled_positions == 131_072 * 8  # the global layers' linear ×8 table


def test_gemma3_12b_non_embedding_parameters_are_the_reports(tmp_path):
    """The Gemma 3 technical report (Table 1): 12B — 10,759M non-embedding parameters; 27B — 25,600M."""
    for folder, total in (("gemma-3-12b-it", 10_759e6), ("gemma-3-27b-it", 25_600e6)):
        run = load_serve_run(_serve(tmp_path, folder))
        m = run.model
        non_embedding = sum(p.numel for p in device_params(run)) - m.vocab_size * m.hidden_size
        assert non_embedding == pytest.approx(total, abs=0.5e6)


def test_a_pattern_and_transformers5_rope_parameters():
    cfg = json.loads((HF / "gemma-3-1b-it" / "config.json").read_text())
    cfg["sliding_window_pattern"] = 2
    m = model_from_hf_dict(cfg)
    assert [m.is_sliding(i) for i in range(4)] == [True, False, True, False]
    cfg["sliding_window"] = None  # Gemma3Attention passes None: every layer attends fully
    assert not any(model_from_hf_dict(cfg).is_sliding(i) for i in range(26))
    v5 = {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    assert rope_scaled_positions({"rope_parameters": v5}, 32_768) == 131_072


def test_gemma3_1b_weights_are_its_shapes_and_two_rope_tables(tmp_path):
    run = load_serve_run(_serve(tmp_path, "gemma-3-1b-it"))
    params = device_params(run)
    assert sum(p.numel for p in params) == GEMMA3_1B == 999_885_952
    # the local (10,000) and global (1,000,000) tables: two get_rope instances of 32,768 × 256 in bf16
    assert rope_cache_bytes(run) == 2 * 32_768 * 256 * 2
    assert compute_budget(run).weights_bytes == GEMMA3_1B * 2 + 2 * 32_768 * 256 * 2


def test_gemma3_1b_kv_is_six_sliding_groups_and_one_full_of_four(tmp_path):
    b = compute_budget(load_serve_run(_serve(tmp_path, "gemma-3-1b-it")))
    layout = b.kv_layout
    assert layout.group_size == 4 and [g.kind for g in layout.groups] == ["sliding_attention"] * 6 + ["full_attention"]
    assert [len(g.layers) for g in layout.groups] == [4, 4, 4, 4, 3, 3, 4]  # 22 sliding layers, i::6
    assert layout.page_bytes == 16 * 1 * 2 * 256 * 2  # 16 tokens, one kv head, k and v of 256, bf16
    assert b.num_kv_blocks == b.kv_pool_bytes // layout.page_bytes // 4


def test_gemma3_27b_language_model_alone_at_tp2(tmp_path):
    run = load_serve_run(_serve(tmp_path, "gemma-3-27b-it", tp=2, extra="limit_mm_per_prompt = 0\n"))
    assert run.max_model_len == 131_072  # not the ×8 scaled length: _get_and_verify_max_len skips gemma3
    # tied vocab-parallel embedding split in two, every matrix split in two, norms whole on each rank
    per_rank = 262_208 * 5376 // 2 + 62 * ((5376 * 4096 * 2 + 2 * 5376 * 2048 + 3 * 5376 * 21504) // 2
                                           + 4 * 5376 + 2 * 128) + 5376
    assert sum(p.numel for p in device_params(run)) == per_rank
    assert rope_cache_bytes(run) == (131_072 * 8 + 131_072) * 128 * 2  # 256 MiB global + 32 MiB local
    b = compute_budget(run)
    assert b.kv_layout.group_size == 10 and len(b.kv_layout.groups) == 7  # 52 sliding / 10 → 6, one full
    assert b.kv_layout.page_bytes == 16 * 8 * 2 * 128 * 2


# SigLIP so400m as Gemma-3 ships it (1,152 wide, 27 layers, MLP 4,304, 896-pixel images of 14-pixel patches: 4,096
# patches): the biased convolution, the position table, per layer biased qkv / out_proj / fc1 / fc2 and two
# LayerNorms, post_layernorm — 416,866,032 parameters, the Gemma 3 report's "417M" vision encoder — and the projector's
# RMSNorm and 1,152 × 5,376 matrix
SIGLIP_LAYER = (3 * 1152 * 1152 + 3 * 1152) + (1152 * 1152 + 1152) + (4304 * 1152 + 4304) + (1152 * 4304 + 1152) + 4 * 1152
SIGLIP = 1152 * 3 * 14 * 14 + 1152 + 4096 * 1152 + 27 * SIGLIP_LAYER + 2 * 1152
PROJECTOR = 1152 + 1152 * 5376


def test_siglip_tower_weights_are_its_shapes(tmp_path):
    assert SIGLIP == 416_866_032
    run = load_serve_run(_serve(tmp_path, "gemma-3-27b-it"))
    assert vision_weight_bytes(run) == (SIGLIP + PROJECTOR) * 2 + 4096 * 8  # bf16, int64 position_ids
    tp2 = load_serve_run(_serve(tmp_path, "gemma-3-27b-it", tp=2))
    split = 27 * (3 * 1152 * 1152 + 3 * 1152 + 1152 * 1152 + 4304 * 1152 + 4304 + 1152 * 4304) // 2
    assert vision_weight_bytes(tp2) == (SIGLIP - split + PROJECTOR) * 2 + 4096 * 8
    alone = load_serve_run(_serve(tmp_path, "gemma-3-27b-it", extra="limit_mm_per_prompt = 0\n"))
    assert vision_weight_bytes(alone) == 0


@pytest.mark.parametrize(("version", "extra", "images"), [
    ("0.19.0", "", 8192 // 256), ("0.13.0", "", 8192 // 256),  # embeddings, floor
    ("0.12.0", "", 8192 // 260), ("0.11.0", "", 8192 // 260),  # the placeholder's 260 tokens
    ("0.10.0", "", 8192 // 256), ("0.9.2", "", -(-8192 // 256)),  # embeddings; cdiv up to 0.9
    ("0.9.2", "max_num_seqs = 4\nlimit_mm_per_prompt = 3\n", 4 * 3),  # the decoder's seqs × images a prompt
    ("0.19.0", "max_num_seqs = 4\nlimit_mm_per_prompt = 3\n", 4 * 3),
    ("0.19.0", "max_model_len = 600\nmax_num_seqs = 4\n", 4 * (600 // 256)),  # from 0.10.1: what a prompt fits
    ("0.9.2", "max_model_len = 600\nmax_num_seqs = 4\n", 32),  # up to 0.10.0: the limit alone (999)
])
def test_the_encoder_budget_as_each_version_counts_it(tmp_path, version, extra, images):
    """An image is its 256 embeddings, or (0.10.1 … 0.12) its placeholder, 260 tokens with the two ``"\\n\\n"``,
    ``<start_of_image>`` and ``<end_of_image>`` around them; the dummy images are the encoder budget over one,
    against the decoder's requests × images per prompt (engine_versions.vllm_encoder_budget_rule)."""
    text = _serve(tmp_path, "gemma-3-27b-it", extra=extra).read_text().replace('"0.19.0"', f'"{version}"')
    (tmp_path / "v.toml").write_text(text)
    run = load_serve_run(tmp_path / "v.toml")
    assert images_profiled(run, built(run)) == images


def test_siglip_encoder_profile_peaks_in_the_mlp(tmp_path):
    """32 images of 4,096 patches (131,072 tokens) at tp 1: the fp32 dummy batch, the convolution's output (kept by
    the encoder), the previous layer's output, the attention block's output, ``layer_norm2``, ``fc1`` and GeLU's
    output — the peak of every layer after the first."""
    run = load_serve_run(_serve(tmp_path, "gemma-3-27b-it"))
    plan, kept = encoder_profile(run)
    t = 32 * 4096
    pixels, unit, inner = 32 * 3 * 896 * 896 * 4, t * 1152 * 2, t * 4304 * 2
    assert requested_peak(plan.plan, plan.sizes) == pixels + 4 * unit + 2 * inner
    assert [plan.sizes[plan.live[k]] for k in kept] == [pixels, 32 * 256 * 5376 * 2]


def test_hf_training_and_other_engines_are_refused_by_name(tmp_path, capsys):
    sglang = _serve(tmp_path, "gemma-3-27b-it", tp=2).read_text().replace('engine = "vllm"', 'engine = "sglang"')
    (tmp_path / "s.toml").write_text(sglang.replace('engine_version = "0.19.0"', 'engine_version = "0.4"'))
    assert main(["serve", str(tmp_path / "s.toml"), "--out", str(tmp_path / "o")]) == 2
    assert "vision-language" in capsys.readouterr().err and not (tmp_path / "o").exists()
    run = tmp_path / "train.toml"
    run.write_text(f'[model]\nhf_config = "{HF / "gemma-3-1b-it" / "config.json"}"\nprofile = "hf"\n')
    assert main(["static", str(run)]) == 2
    assert 'profile = "megatron"' in capsys.readouterr().err
    run.write_text(f'[model]\nhf_config = "{HF / "gemma-3-1b-it" / "config.json"}"\nprofile = "megatron"\n')
    assert main(["static", str(run)]) == 0


def test_embedding_gemma_is_refused(tmp_path, capsys):
    cfg = json.loads((HF / "gemma-3-1b-it" / "config.json").read_text())
    cfg["use_bidirectional_attention"] = True
    assert main(["serve", str(_serve(tmp_path, "", cfg=cfg)), "--out", str(tmp_path / "o")]) == 2
    assert "use_bidirectional_attention" in capsys.readouterr().err


@pytest.mark.parametrize(("version", "groups", "size"), [("0.19.0", 7, 4), ("0.9.1", 7, 4), ("0.9.0", 1, 26),
                                                         ("0.8.5", 1, 26), ("0.6.6", 1, 26)])
def test_sliding_groups_from_the_hybrid_manager_only(tmp_path, version, groups, size):
    """vLLM V1 from 0.9.1 keeps Gemma-3's sliding layers in groups of their own; 0.9.0 and 0.8.5 unify every spec
    to full attention (``unify_hybrid_kv_cache_specs``), and V0 holds the whole context in every layer."""
    text = _serve(tmp_path, "gemma-3-1b-it").read_text()
    (tmp_path / "v.toml").write_text(text.replace('"0.19.0"', f'"{version}"'))
    layout = compute_budget(load_serve_run(tmp_path / "v.toml")).kv_layout
    assert (len(layout.groups), layout.group_size) == (groups, size)
    assert layout.hybrid == (groups > 1)
