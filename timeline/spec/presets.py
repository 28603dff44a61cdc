"""Named model presets (``[model] preset = "deepseek-v3"``).

Each entry is a set of Hugging Face config values; sources:
- DeepSeek-V3 / V2: ``deepseek-ai/DeepSeek-V3`` and ``deepseek-ai/DeepSeek-V2`` ``config.json``
  (as digested in the reference ``paper-2502.07846.md`` §1).
- Llama 3: ``meta-llama/Meta-Llama-3-8B``, ``-70B``, ``Llama-3.1-405B`` ``config.json``.
- Mixtral: ``mistralai/Mixtral-8x7B-v0.1``, ``Mixtral-8x22B-v0.1`` ``config.json``.
- GPT-3-style: Korthikanti et al. 2022, Table 3 (LayerNorm, GeLU MLP of 4h, learned
  positions, dropout 0.1, vocabulary 51,200, sequence 2,048).
"""

from __future__ import annotations

from timeline.spec.model import ModelSpec


def _gpt3(name: str, h: int, a: int, layers: int) -> ModelSpec:
    return ModelSpec(name=name, model_type="gpt", hidden_size=h, num_hidden_layers=layers,
                     num_attention_heads=a, intermediate_size=4 * h, vocab_size=51200,
                     max_position_embeddings=2048, norm="layernorm", hidden_act="gelu",
                     position_embedding="learned", attention_bias=True, linear_bias=True,
                     attention_dropout=0.1, hidden_dropout=0.1, tie_word_embeddings=True)


def _llama3(name: str, h: int, layers: int, heads: int, ffn: int) -> ModelSpec:
    return ModelSpec(name=name, model_type="llama", hidden_size=h, num_hidden_layers=layers,
                     num_attention_heads=heads, num_key_value_heads=8, intermediate_size=ffn,
                     vocab_size=128256, max_position_embeddings=131072)


def _mixtral(name: str, h: int, layers: int, heads: int, ffn: int, vocab: int) -> ModelSpec:
    return ModelSpec(name=name, model_type="mixtral", hidden_size=h, num_hidden_layers=layers,
                     num_attention_heads=heads, num_key_value_heads=8, intermediate_size=ffn,
                     vocab_size=vocab, max_position_embeddings=65536, n_routed_experts=8,
                     num_experts_per_tok=2, moe_intermediate_size=ffn)


#: Megatron-LM's GPTModel as its command line builds it when only the sizes are given
#: (``megatron/training/arguments.py``: ``--normalization LayerNorm``, GeLU, ``--position-embedding-type
#: learned_absolute``, biases on, embeddings tied, ``--hidden-dropout`` / ``--attention-dropout`` 0.1);
#: ``timeline from-megatron`` starts from it and states every size
MEGATRON_GPT = ModelSpec(name="megatron-gpt", model_type="gpt", hidden_size=1024, num_hidden_layers=24,
                         num_attention_heads=16, intermediate_size=4096, vocab_size=50257,
                         max_position_embeddings=1024, norm="layernorm", hidden_act="gelu",
                         position_embedding="learned", attention_bias=True, linear_bias=True,
                         attention_dropout=0.1, hidden_dropout=0.1, tie_word_embeddings=True)

PRESETS: dict[str, ModelSpec] = {
    "deepseek-v3": ModelSpec(
        name="deepseek-v3", model_type="deepseek_v3", hidden_size=7168, num_hidden_layers=61,
        num_attention_heads=128, num_key_value_heads=128, intermediate_size=18432, vocab_size=129280,
        max_position_embeddings=163840, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=256, n_shared_experts=1,
        moe_intermediate_size=2048, num_experts_per_tok=8, first_k_dense_replace=3, router_bias=True,
        mtp_layers=1),
    "deepseek-v2": ModelSpec(
        name="deepseek-v2", model_type="deepseek_v2", hidden_size=5120, num_hidden_layers=60,
        num_attention_heads=128, num_key_value_heads=128, intermediate_size=12288, vocab_size=102400,
        max_position_embeddings=163840, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=160, n_shared_experts=2,
        moe_intermediate_size=1536, num_experts_per_tok=6, first_k_dense_replace=1),
    "llama3-8b": _llama3("llama3-8b", 4096, 32, 32, 14336),
    "llama3-70b": _llama3("llama3-70b", 8192, 80, 64, 28672),
    "llama3-405b": _llama3("llama3-405b", 16384, 126, 128, 53248),
    "mixtral-8x7b": _mixtral("mixtral-8x7b", 4096, 32, 32, 14336, 32000),
    "mixtral-8x22b": _mixtral("mixtral-8x22b", 6144, 56, 48, 16384, 32768),
    "gpt3-22b": _gpt3("gpt3-22b", 6144, 64, 48),
    "gpt3-175b": _gpt3("gpt3-175b", 12288, 96, 96),
    "gpt3-530b": _gpt3("gpt3-530b", 20480, 128, 105),
    "gpt3-1t": _gpt3("gpt3-1t", 25600, 160, 128),
    "megatron-gpt": MEGATRON_GPT,
}
