"""DeepSeek-V3.2's sparse attention (DSA) in vLLM 0.19.0: the buffers its indexer and its FlashMLA sparse backend
hold, as the engine allocates them.

Read at vLLM 0.19.0: ``models/deepseek_v2.py`` (``DeepseekV2Model.__init__``: a ``topk_indices_buffer`` of
``max_num_batched_tokens × index_topk`` int32, built with the model; ``Indexer``), ``v1/attention/backends/mla/
flashmla_sparse.py`` (``FlashMLASparseImpl.__init__`` reserves its workspace when it is built — ``q_concat`` of
``max_num_batched_tokens × heads × (kv_lora_rank + qk_rope_head_dim)`` bf16, and with the ``fp8_ds_mla`` cache a
bf16 prefill workspace of ``5 · max_model_len`` rows of 576, ``get_prefill_workspace_size``;
``get_supported_kernel_block_sizes`` = [64]), ``v1/attention/backends/mla/indexer.py``
(``get_max_prefill_buffer_size`` = ``40 · max_model_len``), ``model_executor/layers/sparse_attn_indexer.py``
(without attention metadata, the profile run, ``sparse_attn_indexer`` asks the workspace for ``(40 · max_model_len,
index_head_dim)`` fp8 and ``(40 · max_model_len, 4)`` uint8 at once) and ``v1/worker/workspace.py``
(``WorkspaceManager``: one buffer per micro-batch, each request's parts rounded up to 256 bytes and summed; a larger
request frees the buffer and allocates the larger one — the fused-MoE modular kernel asks the same manager).
"""

from __future__ import annotations

from timeline.serve.dp import attention_tp
from timeline.serve.kv import ds_mla_cache
from timeline.spec.serving import ServeRunSpec

#: ``get_prefill_workspace_size``: rows of the FlashMLA sparse prefill workspace per ``max_model_len``
PREFILL_WORKSPACE_ROWS = 5
#: ``get_max_prefill_buffer_size``: indexer key rows reserved per ``max_model_len``
INDEXER_PREFILL_ROWS = 40
#: ``FlashMLASparseBackend.get_supported_kernel_block_sizes``
SPARSE_BLOCK = 64


def _aligned(n: int) -> int:
    return -(-n // 256) * 256


def topk_buffer_bytes(run: ServeRunSpec) -> int:
    """``topk_indices_buffer``: ``max_num_batched_tokens × index_topk`` int32, one per worker."""
    return run.serving.max_num_batched_tokens * run.model.index_topk * 4


def sparse_backend_workspace(run: ServeRunSpec) -> int:
    """What ``FlashMLASparseImpl.__init__`` asks the workspace for when the model is built (module docstring)."""
    m = run.model
    heads = m.num_attention_heads // attention_tp(run)
    latent = m.kv_lora_rank + m.qk_rope_head_dim
    parts = [run.serving.max_num_batched_tokens * heads * latent * 2]
    if ds_mla_cache(m, run.serving.kv_cache_dtype):
        parts.append(PREFILL_WORKSPACE_ROWS * run.max_model_len * latent * 2)
    return sum(_aligned(p) for p in parts)


def indexer_workspace(run: ServeRunSpec) -> int:
    """What the indexer asks the workspace for in the profile run (module docstring)."""
    rows = INDEXER_PREFILL_ROWS * run.max_model_len
    return _aligned(rows * run.model.index_head_dim) + _aligned(rows * 4)


def block_size(run: ServeRunSpec) -> int:
    """The KV block the sparse backend runs: the configured one when it is a multiple of 64, else 64
    (``AttentionBackend.get_preferred_block_size``: the smallest supported kernel block size)."""
    bs = run.serving.block_size
    return bs if bs % SPARSE_BLOCK == 0 else SPARSE_BLOCK
