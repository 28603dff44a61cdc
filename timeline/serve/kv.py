"""KV-cache bytes per token, per layer, as each engine lays its cache out.

* MHA/GQA (vLLM ``vllm/v1/kv_cache_interface.py`` ``FullAttentionSpec.real_page_size_bytes`` =
  ``block_size · num_kv_heads · (head_size + head_size_v) · dtype_size``, with ``num_kv_heads`` from
  ``vllm/config/model.py`` ``ModelConfig.get_num_kv_heads`` = ``max(1, total_num_kv_heads // tp)``:
  a rank holds at least one head, so heads are replicated when tp > h_kv). SGLang
  ``model_runner.py`` ``profile_max_num_token``: ``get_num_kv_heads(tp) · head_dim · 2 · element_size``.
* MLA (DeepSeek-V2/V3): one latent per token, ``kv_lora_rank + qk_rope_head_dim`` elements, not
  split by TP (vLLM ``MLAAttentionSpec.real_page_size_bytes`` with ``num_kv_heads = 1``; SGLang's MLA
  ``cell_size``). vLLM's ``fp8_ds_mla`` layout is 656 bytes per token (``MLAAttentionSpec``: 512 fp8
  latent + 4 fp32 scales + 64 bf16 rope dims, ``flashmla_sparse.py``).
* fp8 caches store one byte per element (``get_dtype_size(torch.float8_e4m3fn)``).
"""

from __future__ import annotations

from timeline.spec.model import ModelSpec

#: vLLM ``MLAAttentionSpec.real_page_size_bytes``: ``block_size * 656`` for ``fp8_ds_mla``
FP8_DS_MLA_BYTES_PER_TOKEN = 656
_BYTES = {"auto": 0, "bf16": 2, "fp16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def kv_element_bytes(kv_cache_dtype: str, model_dtype: str) -> int:
    """Bytes per cache element: ``auto`` is the model dtype (vLLM ``STR_DTYPE_TO_TORCH_DTYPE``)."""
    return _BYTES[kv_cache_dtype] or _BYTES[model_dtype]


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """vLLM ``ModelConfig.get_num_kv_heads``: ``max(1, total_num_kv_heads // tp)``; 1 for MLA."""
    if model.is_mla:
        return 1
    return max(1, model.kv_heads // tp)


def kv_bytes_per_token_layer(model: ModelSpec, tp: int, kv_cache_dtype: str, model_dtype: str) -> int:
    """KV bytes one token takes in one attention layer on one tensor-parallel rank."""
    if model.is_mla:
        if kv_cache_dtype == "fp8_ds_mla":
            return FP8_DS_MLA_BYTES_PER_TOKEN
        return (model.kv_lora_rank + model.qk_rope_head_dim) * kv_element_bytes(kv_cache_dtype, model_dtype)
    head = model.attn_head_dim
    return kv_heads_per_rank(model, tp) * 2 * head * kv_element_bytes(kv_cache_dtype, model_dtype)


def kv_layers(model: ModelSpec) -> int:
    """Attention layers holding a cache: the decoder layers (vLLM registers no cache for DeepSeek's
    MTP module unless speculative decoding loads it as a draft model)."""
    return model.num_hidden_layers


def kv_bytes_per_token(model: ModelSpec, tp: int, kv_cache_dtype: str, model_dtype: str) -> int:
    """KV bytes per token over every layer a device holds."""
    return kv_layers(model) * kv_bytes_per_token_layer(model, tp, kv_cache_dtype, model_dtype)
