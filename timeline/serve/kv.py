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
* DeepSeek-V3.2's lightning indexer (vLLM 0.19.0 ``models/deepseek_v2.py`` ``Indexer``): a second cache per layer,
  ``DeepseekV32IndexerCache`` — an ``MLAAttentionSpec`` of one uint8 head of ``index_head_dim +
  index_head_dim // 128 · 4`` bytes (fp8 keys with an fp32 scale per 128), 132 for DeepSeek-V3.2. Every layer holds
  both, one spec type, so ``get_kv_cache_groups`` puts all in one group whose block is every layer's pages summed
  (``UniformTypeKVCacheSpecs``): the same as one cache of the two sizes' sum per layer.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from timeline.spec.engine_versions import vllm_kv_tokens_from_concurrency
from timeline.spec.model import ModelSpec

#: vLLM ``MLAAttentionSpec.real_page_size_bytes``: ``block_size * 656`` for ``fp8_ds_mla``
FP8_DS_MLA_BYTES_PER_TOKEN = 656
_BYTES = {"auto": 0, "fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def kv_element_bytes(kv_cache_dtype: str, model_dtype: str) -> int:
    """Bytes per cache element: ``auto`` is the model dtype (vLLM ``STR_DTYPE_TO_TORCH_DTYPE``)."""
    return _BYTES[kv_cache_dtype] or _BYTES[model_dtype]


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """vLLM ``ModelConfig.get_num_kv_heads``: ``max(1, total_num_kv_heads // tp)``; 1 for MLA."""
    if model.is_mla:
        return 1
    return max(1, model.kv_heads // tp)


#: ``Indexer.quant_block_size``: one fp32 scale per this many fp8 key elements in the indexer's cache
INDEXER_QUANT_BLOCK = 128


def indexer_bytes_per_token(model: ModelSpec) -> int:
    """Bytes of DeepSeek-V3.2's indexer cache per token per layer (module docstring); 0 without an indexer."""
    if not model.index_n_heads:
        return 0
    return model.index_head_dim + model.index_head_dim // INDEXER_QUANT_BLOCK * 4


def ds_mla_cache(model: ModelSpec, kv_cache_dtype: str) -> bool:
    """Whether the latent cache is vLLM's ``fp8_ds_mla`` layout: asked for by name, or as ``"fp8"`` by a model with
    DeepSeek-V3.2's indexer, whose FlashMLA sparse backend takes "fp8" as its alias
    (``FlashMLASparseBackend.supported_kv_cache_dtypes``)."""
    return kv_cache_dtype == "fp8_ds_mla" or (bool(model.index_n_heads) and kv_cache_dtype == "fp8")


def kv_bytes_per_token_layer(model: ModelSpec, tp: int, kv_cache_dtype: str, model_dtype: str) -> int:
    """KV bytes one token takes in one attention layer on one tensor-parallel rank."""
    if model.is_mla:
        if ds_mla_cache(model, kv_cache_dtype):
            return FP8_DS_MLA_BYTES_PER_TOKEN + indexer_bytes_per_token(model)
        latent = (model.kv_lora_rank + model.qk_rope_head_dim) * kv_element_bytes(kv_cache_dtype, model_dtype)
        return latent + indexer_bytes_per_token(model)
    head = model.attn_head_dim
    return kv_heads_per_rank(model, tp) * 2 * head * kv_element_bytes(kv_cache_dtype, model_dtype)


def kv_layers(model: ModelSpec) -> int:
    """Attention layers holding a cache: the decoder layers (vLLM registers no cache for DeepSeek's
    MTP module unless speculative decoding loads it as a draft model)."""
    return model.num_hidden_layers


def kv_bytes_per_token(model: ModelSpec, tp: int, kv_cache_dtype: str, model_dtype: str) -> int:
    """KV bytes per token over every layer a device holds."""
    return kv_layers(model) * kv_bytes_per_token_layer(model, tp, kv_cache_dtype, model_dtype)


# --- KV cache groups: full and sliding-window layers (vLLM's hybrid KV cache manager) -----------------
#
# Read at vllm-project/vllm 001cabc (``vllm/v1/kv_cache_interface.py``, ``vllm/v1/core/kv_cache_utils.py``)
# and ``vllm/v1/core/single_type_kv_cache_manager.py`` (``SlidingWindowManager``):
#
# * a sliding layer's spec is ``SlidingWindowSpec``, a full layer's ``FullAttentionSpec``
#   (``vllm/model_executor/layers/attention/attention.py`` ``Attention.get_kv_cache_spec``: a layer built
#   with ``sliding_window`` reports the sliding spec; GPT-OSS passes it on its sliding layers); both have the
#   page ``block_size · num_kv_heads · 2 · head_size · dtype_size`` (``AttentionSpec.real_page_size_bytes``).
# * ``get_kv_cache_groups``: one spec for every layer → one group of all layers
#   (``_get_kv_cache_groups_uniform_spec``); full and sliding layers with one page size →
#   ``_get_kv_cache_groups_uniform_page_size``: layers of a type, in order; ``group_size`` = the fewest
#   layers of a type, or the most when most < 1.5 × fewest; each type splits into
#   ``cdiv(len, group_size)`` groups, group i taking ``layers[i::num_groups]`` (the last padded).
# * ``get_kv_cache_config_from_groups``: ``group_size`` tensors of ``page · num_blocks`` bytes, tensor i
#   shared by layer i of every group; ``num_blocks = available // page // group_size`` (``get_num_blocks``).
#   Every group allocates its blocks from that one pool, a block per group per ``block_size`` tokens.
# * a sliding group frees the blocks that leave the window (``remove_skipped_blocks`` with
#   ``get_num_skipped_tokens = max(0, num_computed_tokens − sliding_window + 1)``: the first
#   ``skipped // block_size`` blocks become the null block), so a request holds
#   ``cdiv(tokens, block_size) − skipped // block_size`` blocks in it.
# * a request's most blocks (``max_memory_usage_bytes`` / page, summed over the groups as
#   ``_max_memory_usage_bytes_from_groups`` and ``get_max_concurrency_for_kv_cache_config`` do):
#   full ``cdiv(max_model_len, block_size)``; sliding
#   ``cdiv(min(sliding_window − 1 + max_num_batched_tokens, max_model_len), block_size) + 1``.


@dataclass(frozen=True, slots=True)
class KVGroup:
    """One KV cache group: layers sharing one block table."""

    kind: str  # "full_attention" | "sliding_attention" | "linear_attention" (a recurrent state: one block a request)
    layers: tuple[int, ...]  # decoder layers (fewer than the group size when padded)
    sliding_window: int = 0  # tokens a sliding layer attends over; 0 for full attention


@dataclass(frozen=True, slots=True)
class KVLayout:
    """How one device's cache is laid out: its groups, tensors and page."""

    groups: tuple[KVGroup, ...]
    group_size: int  # layers per group = KV tensors on the device (each shared by one layer per group)
    page_bytes: int  # one layer's block: block_size · bytes per token per layer
    block_size: int
    state_blocks: int = 1  # blocks a recurrent-state group holds per request (mamba_cache_mode "none" 1, "align" 2)

    @property
    def hybrid(self) -> bool:
        """More than one group, or sliding layers: the layout the hybrid KV cache manager builds."""
        return len(self.groups) > 1 or any(g.sliding_window for g in self.groups)

    @property
    def full_groups(self) -> int:
        return sum(g.kind == "full_attention" for g in self.groups)

    @property
    def state_groups(self) -> int:
        """Groups of recurrent layers (gated delta-net): vLLM's ``MambaSpec`` holds ``state_blocks`` blocks per
        request whatever its length (``max_memory_usage_bytes``: one page under ``mamba_cache_mode`` "none", two
        under "align", the mode prefix caching turns on)."""
        return sum(g.kind == "linear_attention" for g in self.groups)

    @property
    def sliding_windows(self) -> tuple[int, ...]:
        """The window of every sliding group, one entry per group."""
        return tuple(g.sliding_window for g in self.groups if g.sliding_window)

    def request_blocks(self, tokens: int, computed: int) -> int:
        """Blocks one request holds over every group with ``tokens`` slots allocated and ``computed``
        tokens computed (sliding groups have freed what left the window)."""
        blocks = -(-tokens // self.block_size)
        skipped = sum(max(0, computed - w + 1) // self.block_size for w in self.sliding_windows)
        return (len(self.groups) - self.state_groups) * blocks - skipped + self.state_groups * self.state_blocks

    def max_request_blocks(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """vLLM's bound on one request's blocks at ``max_model_len`` (summed ``max_memory_usage_bytes``)."""
        bs = self.block_size
        full = self.full_groups * -(-max_model_len // bs) + self.state_groups * self.state_blocks
        return full + sum(-(-min(w - 1 + max_num_batched_tokens, max_model_len) // bs) + 1
                          for w in self.sliding_windows)

    def longest_context(self, num_blocks: int, max_model_len: int, max_num_batched_tokens: int) -> int:
        """vLLM ``_estimate_max_model_len_from_groups``: the longest length (≤ ``max_model_len``) whose
        bound fits the pool, by binary search; 0 if one token does not."""
        lo, hi, best = 1, max_model_len, 0
        while lo <= hi:
            mid = (lo + hi) // 2
            if self.max_request_blocks(mid, max_num_batched_tokens) <= num_blocks:
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        return best

    def project(self, held: Collection[int]) -> KVLayout:
        """The layout on a worker holding decoder layers ``held`` (pipeline stage): vLLM
        ``_project_kv_cache_groups_to_worker`` keeps every group, with the worker's layers of it, and
        the worker's ``group_size`` is its largest projected group (``get_kv_cache_config_from_groups``)."""
        groups = tuple(KVGroup(g.kind, tuple(x for x in g.layers if x in held), g.sliding_window)
                       for g in self.groups)
        return KVLayout(groups=groups, group_size=max(len(g.layers) for g in groups), page_bytes=self.page_bytes,
                        block_size=self.block_size, state_blocks=self.state_blocks)

    def tensor_names(self) -> list[str]:
        """One name per KV tensor: the layers sharing it (``KVCacheTensor.shared_by``)."""
        return ["+".join(str(g.layers[i]) for g in self.groups if i < len(g.layers))
                for i in range(self.group_size)]


def kv_layout(model: ModelSpec, layers: Sequence[int], block_size: int, page_bytes: int,
              hybrid_manager: bool = True, state_blocks: int = 1) -> KVLayout:
    """vLLM ``get_kv_cache_groups`` over the decoder ``layers`` a device holds (all of them at pp = 1).
    Without the hybrid manager (MLA models and non-sliding ones are uniform anyway) every layer is one
    full-attention group (``unify_hybrid_kv_cache_specs``); gated delta-net layers are ``MambaSpec`` layers, a
    type of their own (their page padded to the attention page: :func:`state_page`)."""
    by_kind: dict[tuple[str, int], list[int]] = {}
    for layer in layers:
        sliding = hybrid_manager and model.is_sliding(layer)
        key = ("sliding_attention", model.sliding_window) if sliding else ("full_attention", 0)
        if model.is_linear_attention(layer):  # a MambaSpec of its own: another type whatever the manager
            key = ("linear_attention", 0)
        by_kind.setdefault(key, []).append(layer)
    if len(by_kind) <= 1:
        (kind, window), members = next(iter(by_kind.items())) if by_kind else (("full_attention", 0), [])
        return KVLayout(groups=(KVGroup(kind, tuple(members), window),), group_size=len(members),
                        page_bytes=page_bytes, block_size=block_size, state_blocks=state_blocks)
    counts = [len(v) for v in by_kind.values()]
    size = max(counts) if max(counts) < min(counts) * 1.5 else min(counts)
    groups: list[KVGroup] = []
    for (kind, window), members in by_kind.items():
        n = -(-len(members) // size)
        groups.extend(KVGroup(kind, tuple(members[i::n]), window) for i in range(n))
    return KVLayout(groups=tuple(groups), group_size=size, page_bytes=page_bytes, block_size=block_size,
                    state_blocks=state_blocks)


# --- Gated delta-net layers: a recurrent state per request (vLLM's MambaSpec) -----------------------------------
#
# Read at vLLM 0.19.0: ``model_executor/layers/mamba/mamba_utils.py`` ``MambaStateShapeCalculator.
# gated_delta_net_state_shape`` — a conv state ``(conv_kernel − 1 + num_spec, conv_dim / tp)`` with ``conv_dim =
# 2·key_heads·key_dim + value_heads·value_dim`` and a temporal state ``(value_heads / tp, value_dim, key_dim)``;
# ``MambaStateDtypeCalculator._mamba_state_dtype`` — the conv state in ``mamba_cache_dtype`` ("auto": the model
# dtype, not the attention cache's dtype), the temporal state in ``mamba_ssm_cache_dtype`` ("auto": the conv
# state's; Qwen3.5 configs set it from their ``mamba_ssm_dtype``, ``Qwen3_5ForConditionalGenerationConfig``);
# ``v1/kv_cache_interface.py`` ``MambaSpec.page_size_bytes`` = the two states' bytes (or ``page_size_padded``);
# ``model_executor/models/config.py`` ``HybridAttentionMambaModelConfig.verify_and_update_config`` — without
# prefix caching (a hybrid model's default: ``ModelConfig.is_prefix_caching_supported`` is false for
# ``attn_type == "hybrid"``) the attention block is the least multiple of 16 tokens whose page holds the state,
# ``16 · cdiv(state_page, 16 · attention_page_of_one_token)``, raised over a smaller ``block_size`` (even one the
# user set), and the state page padded to that attention page. Speculative decoding (``num_spec`` drafted tokens:
# ``gated_delta_net_state_shape``'s ``num_spec``, ``MambaSpec.num_speculative_blocks``) adds ``num_spec`` conv rows
# and ``num_spec`` blocks a request to every state group; the MTP drafter's full-attention layers join the
# attention layers' groups (``kv_cache_utils.py`` "Add N padding layers" when the groups come out uneven).

#: ``kernel_block_alignment_size`` for non-MLA attention in ``HybridAttentionMambaModelConfig``
STATE_BLOCK_ALIGNMENT = 16


def state_page_bytes(model: ModelSpec, tp: int, model_dtype: str, num_spec: int = 0) -> int:
    """One gated delta-net layer's recurrent state per request on one tensor-parallel rank, unpadded; speculative
    decoding's ``num_spec`` drafted tokens add as many conv-state rows."""
    if not model.has_linear_attention:
        return 0
    kd = model.linear_num_key_heads * model.linear_key_head_dim
    conv_dim = 2 * kd + model.linear_num_value_heads * model.linear_value_head_dim
    conv = (model.linear_conv_kernel_dim - 1 + num_spec) * (conv_dim // tp) * _BYTES[model_dtype]
    state_dtype = model.mamba_ssm_dtype or model_dtype
    temporal = (model.linear_num_value_heads // tp) * model.linear_value_head_dim * model.linear_key_head_dim \
        * _BYTES[state_dtype]
    return conv + temporal


def printed_kv_tokens(layout: KVLayout, num_blocks: int, max_model_len: int, max_num_batched_tokens: int,
                      version: str) -> int:
    """The tokens vLLM ``version`` prints as "GPU KV cache size" for ``num_blocks`` blocks
    (:func:`~timeline.spec.engine_versions.vllm_kv_tokens_from_concurrency`)."""
    if vllm_kv_tokens_from_concurrency(version):
        return int(num_blocks / layout.max_request_blocks(max_model_len, max_num_batched_tokens) * max_model_len)
    return num_blocks // len(layout.groups) * layout.block_size


def state_block_size(model: ModelSpec, tp: int, block_size: int, per_token_layer: int, model_dtype: str,
                     num_spec: int = 0) -> int:
    """The attention block size a hybrid model runs: ``block_size`` raised to hold one state page."""
    page = state_page_bytes(model, tp, model_dtype, num_spec)
    if not page:
        return block_size
    a = STATE_BLOCK_ALIGNMENT
    return max(block_size, a * -(-page // (a * per_token_layer)))
