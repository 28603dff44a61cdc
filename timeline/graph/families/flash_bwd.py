"""What a flash-attn 2 backward allocates beside the dq, dk, dv it returns, as Transformer Engine's
FlashAttention backend calls it (the ``megatron`` profile's ``attention_backend = "flash"``).

TE (``NVIDIA/TransformerEngine@release_v2.6:transformer_engine/pytorch/attention/dot_product_attention/
backends.py: FlashAttention.forward``) calls flash-attn 2's ``flash_attn_func`` on bshd copies
(``deterministic=self.deterministic`` from flash-attn 2.4.1; ``dot_product_attention.py:
DotProductAttention.__init__`` sets it from ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` or
``torch.are_deterministic_algorithms_enabled()``); flash-attn 3 runs only on sm90 with the separate
``flash_attn_3`` package installed (``utils.py: get_attention_backend``), which is not modelled here.
TE 2.6 takes flash-attn 2.1.1 … 2.8.1, from 2.7.3 on Blackwell (``utils.py: FlashAttentionUtils``).
``flash_attn/flash_attn_interface.py: FlashAttnFunc.backward`` (Dao-AILab/flash-attention@v2.7.4.post1)
allocates ``dq, dk, dv = torch.empty_like(q/k/v)`` and calls ``csrc/flash_attn/flash_api.cpp: mha_bwd``,
which allocates, all freed when it returns:

- ``softmax_d``: fp32 ``[b, h, s_q_rounded]``;
- ``dq_accum``: fp32 ``[b, s_q_rounded, h, d_rounded]`` (``loop = true`` always), or under
  ``deterministic`` ``torch::zeros({nsplits, …})`` with ``nsplits = ceil(SMs / (b·h))``
  (``multiProcessorCount``);
- with fewer K/V heads than query heads (GQA), ``dk_expanded`` and ``dv_expanded``
  ``[b, s_k, h, d]`` in q's dtype, summed into dk and dv over each group (``at::sum_out``).

``s_q_rounded`` is ``s_q`` rounded up to 128; ``d_rounded`` is ``d`` rounded up to 32 for ``d ≤ 192``,
else 256 (v2.6.0 … v2.7.4; v2.8 rounds ``d > 128`` to 64, before v2.6 every ``d`` to 32: the same for
``d ≤ 128`` in every 2.4 … 2.8 release). Head dims that are not
a multiple of 8 (padded by the Python wrapper) are not modelled.

The legacy model's ``FlashSelfAttention`` (``--use-flash-attn`` under ``--use-legacy-models
--transformer-impl local``: ``megatron/legacy/model/transformer.py`` at 60166922d3) calls
``flash_attn_varlen_func`` (flash-attn 2; ``flash_attn_unpadded_func``, flash-attn 1, is not modelled) on the
``(b·s)`` rows with ``cu_seqlens`` of equal lengths and no ``deterministic`` argument; its ``mha_varlen_bwd``
(``csrc/flash_attn/flash_api.cpp``, v2.7.4.post1) allocates ``softmax_d`` fp32 ``[h, total_q + 128·b]`` and
``dq_accum`` fp32 ``[total_q + 128·b, h, d_rounded]`` (``Structure.flash_varlen``), and under GQA
``dk_expanded`` / ``dv_expanded`` ``[total_k, h, d]``.

Under context parallelism (``context_parallel.py: AttnFuncWithCPAndKVP2P.backward``, release_v2.6)
the ring backward allocates ``dq = torch.empty_like(q)`` and two ``p2p_comm_buffers`` of
``torch.empty((2, *kv.shape))`` (K/V and their gradient travel together), then per ring step
``dq_ = torch.empty_like(q_)``, ``dkv_ = torch.empty_like(kv_)`` and one ``_flash_attn_backward``
(its ``mha_bwd`` workspaces above). Causal steps see half the queries or half the keys except the
last one (``i == cp_size - 1``, the rank's own chunk: all local queries against all local keys), which
is therefore the largest, and its tensors with its ``mha_bwd`` workspaces stand for the ring's peak
(``dq_`` is dropped at the start of each step; the previous step's ``dkv_`` only when the new one is
assigned, an overlap of one ``dkv_`` before ``mha_bwd`` runs that is not modelled).
"""

from __future__ import annotations

from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef


def _round(x: int, m: int) -> int:
    return -(-x // m) * m


def head_dim_rounded(d: int) -> int:
    """``mha_bwd``'s ``head_size_rounded``: ``d`` rounded up to 32 for ``d ≤ 192``, else 256."""
    return _round(d, 32) if d <= 192 else 256


def nsplits(sms: int, b: int, heads: int) -> int:
    """The deterministic backward's dq accumulator splits: ``ceil(SMs / (b·h))``."""
    return -(-sms // (b * heads))


def scratch(b: Builder, name: str, q: TensorDef, k: TensorDef, v: TensorDef, heads: int,
            head_dim: int) -> dict[str, TensorDef]:
    """The backward-only tensors of one TE FlashAttention call on ``q`` ``[rows, heads·d]`` and
    ``k``/``v`` ``[rows, kv_heads·d]`` (the local chunk's rows), in the order they are allocated."""
    d = b.dims
    out: dict[str, TensorDef] = {}
    sq = sk = d.s_local
    if d.cp > 1:  # the ring's buffers, then the last step's dq_ and dkv_
        kv = (k.shape[0], k.shape[1] + v.shape[1])
        out["dkv_p2p0"] = b.tensor(f"{name}.bwd.p2p_buffer0", (2 * kv[0], kv[1]))
        out["dkv_p2p1"] = b.tensor(f"{name}.bwd.p2p_buffer1", (2 * kv[0], kv[1]))
        out["dq_step"] = b.tensor(f"{name}.bwd.dq_step", q.shape, q.dtype)
        out["dkv_step"] = b.tensor(f"{name}.bwd.dkv_step", kv, k.dtype)
    # mha_varlen_bwd: softmax_d [h, total_q + 128·b] and dq_accum [total_q + 128·b, h, d_rounded], the same bytes as
    # b rows of s_q + 128 each; mha_bwd: s_q rounded up to 128
    sq_r = sq + 128 if b.table.flash_varlen else _round(sq, 128)
    out["softmax_d"] = b.tensor(f"{name}.bwd.softmax_d", (d.b, heads, sq_r), "fp32")
    acc: tuple[int, ...] = (d.b, sq_r, heads, head_dim_rounded(head_dim))
    if b.table.flash_bwd == "fa2_deterministic":
        if b.ctx.sms <= 0:
            raise ValueError("flash-attn's deterministic backward needs the device's SM count (BuildCtx.sms)")
        acc = (nsplits(b.ctx.sms, d.b, heads), *acc)
    out["dq_accum"] = b.tensor(f"{name}.bwd.dq_accum", acc, "fp32")
    if k.shape[1] < heads * head_dim:  # GQA: gradients at full head count, summed per group
        out["dk_expanded"] = b.tensor(f"{name}.bwd.dk_expanded", (d.b, sk, heads, head_dim), q.dtype)
        out["dv_expanded"] = b.tensor(f"{name}.bwd.dv_expanded", (d.b, sk, heads, head_dim), q.dtype)
    return out

