"""Hugging Face configs of every supported family map onto the same ModelSpec fields."""

from __future__ import annotations

import pytest

from timeline.errors import UserError
from timeline.io.hf_config import model_from_hf_dict
from timeline.spec.presets import PRESETS

V3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
      "num_key_value_heads": 128, "intermediate_size": 18432, "vocab_size": 129280, "q_lora_rank": 1536,
      "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
      "n_routed_experts": 256, "n_shared_experts": 1, "moe_intermediate_size": 2048, "num_experts_per_tok": 8,
      "first_k_dense_replace": 3, "moe_layer_freq": 1, "topk_method": "noaux_tc",
      "num_nextn_predict_layers": 1, "max_position_embeddings": 163840, "tie_word_embeddings": False,
      "rope_scaling": {"factor": 40}}


def test_deepseek_v3_config_equals_preset():
    m = model_from_hf_dict(V3, name="deepseek-v3")
    assert m == PRESETS["deepseek-v3"]


def test_mixtral_and_qwen_moe_keys():
    mix = model_from_hf_dict({"model_type": "mixtral", "hidden_size": 4096, "num_local_experts": 8,
                              "num_experts_per_tok": 2, "intermediate_size": 14336})
    assert mix.n_routed_experts == 8 and mix.is_moe_layer(0)
    qwen = model_from_hf_dict({"model_type": "qwen2_moe", "num_experts": 60, "moe_intermediate_size": 1408,
                               "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1})
    assert qwen.n_routed_experts == 60 and qwen.shared_ffn == 5632 and qwen.shared_expert_gate
    assert qwen.attention_bias  # Qwen2's modelling code puts biases on q, k, v
    # Qwen2MoeDecoderLayer: dense where layer_idx is in mlp_only_layers or (idx + 1) % decoder_sparse_step != 0
    only = model_from_hf_dict({"model_type": "qwen2_moe", "num_hidden_layers": 6, "num_experts": 4,
                               "moe_intermediate_size": 64, "decoder_sparse_step": 2, "mlp_only_layers": [3]})
    assert [only.is_moe_layer(i) for i in range(6)] == [False, True, False, False, False, True]
    step = model_from_hf_dict({"model_type": "qwen2_moe", "num_hidden_layers": 6, "num_experts": 4,
                               "moe_intermediate_size": 64, "decoder_sparse_step": 2})
    assert [step.is_moe_layer(i) for i in range(6)] == [False, True, False, True, False, True]
    assert step.mlp_layer_types == () and step.first_k_dense_replace == 1


def test_gpt2_names():
    m = model_from_hf_dict({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
                            "n_positions": 1024, "activation_function": "gelu_new"})
    assert (m.hidden_size, m.num_hidden_layers, m.intermediate_size) == (768, 12, 3072)
    assert m.norm == "layernorm" and m.position_embedding == "learned" and m.tie_word_embeddings
    assert m.hidden_act == "gelu_new" and not m.gated_mlp  # NewGELUActivation (spec/hf_activations.py)


def test_qwen3_head_dim_and_qk_norm():
    m = model_from_hf_dict({"model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 16,
                            "head_dim": 128})
    assert m.attn_head_dim == 128 and m.qk_norm


def test_unsupported_family():
    with pytest.raises(UserError, match="model_type 'bert' is not supported"):
        model_from_hf_dict({"model_type": "bert"})


def test_an_unknown_causal_lm_reads_as_a_llama_decoder_unless_its_config_says_more():
    """A model_type this reader does not know, whose architectures name a causal LM: read as LlamaForCausalLM's
    dense decoder layers from its standard keys, with a note — never refused for want of a table entry — unless a
    key names a structure those layers lack (experts, state-space or linear-attention layers, another tower)."""
    from timeline.io.hf_config import family

    cfg = {"model_type": "zeta3", "architectures": ["Zeta3ForCausalLM"], "hidden_size": 1024,
           "num_attention_heads": 16, "num_key_value_heads": 4, "num_hidden_layers": 4, "intermediate_size": 2816,
           "vocab_size": 32000, "sliding_window": None, "use_sliding_window": False,
           "layer_types": ["full_attention"] * 4}
    fam, note = family(cfg)
    assert fam == "llama" and note is not None and "read as a Llama-style decoder" in note
    m = model_from_hf_dict(cfg)
    assert (m.hidden_size, m.num_hidden_layers, m.num_key_value_heads, m.intermediate_size) == (1024, 4, 4, 2816)
    for key, value, what in (("num_local_experts", 8, "experts"), ("mamba_d_state", 16, "Mamba"),
                             ("layer_types", ["linear_attention", "full_attention"], "per-layer kinds"),
                             ("sliding_window", 4096, "a sliding window"), ("kv_lora_rank", 512, "latent")):
        with pytest.raises(UserError, match=f"its config has '{key}' \\({what}"):
            family(cfg | {key: value})
    # not a causal language model: refused as before
    with pytest.raises(UserError, match="model_type 'zeta3' is not supported and no class in architectures"):
        family(cfg | {"architectures": ["Zeta3ForMaskedLM"]})
