"""torch ``scaled_dot_product_attention`` as CUDA runs it (a table with ``attention = "sdpa"``: the ``hf``
profile), one device, no mask: which kernel runs, what its autograd node keeps and what its backward
allocates besides dq, dk and dv.

Which kernel: ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp: select_sdp_backend`` takes the
first eligible backend of ``priority_order``. cuDNN attention comes first where
``check_prefer_cudnn_attention`` holds: compute capability 9.0 or 10.0 (pytorch/pytorch#162073, for 2.9)
and 10.3 (pytorch/pytorch#170800, merged 2025-12-31, before the 2.11 branch cut), with the bundled cuDNN
above 9.15.0 (the seq-len fix of pytorch/pytorch#169849) — which the wheels bundle from PyTorch 2.11
(huggingface/transformers#48163, closing comment: "What changes at 2.11 is the bundled cuDNN crossing the
threshold"); earlier versions are taken as flash first. cuDNN is eligible (``check_cudnn_tensor_shapes``)
for 16-bit inputs whose head dims are multiples of 8 and at most 128, or 256 on compute capability 9.0
with cuDNN ≥ 9.10; it takes GQA's k/v at kv-head width. Flash (``check_flash_attention_*``): equal head
dims ≤ 256, 16-bit, GQA at kv-head width. Otherwise the memory-efficient kernel, whose log-sum-exp is
padded to 32 queries, with k/v expanded to every head (HF ``repeat_kv``). The recorded H200 snapshots
(``traces/groundtruth-h200``, torch 2.11.0+cu130) run cuDNN for all four models.

What the forward keeps: q, k, v, the output and the log-sum-exp (fp32, ``[b, h, s]``) in every kernel;
cuDNN (``attention.cu: _cudnn_attention_forward``) a philox seed and offset (one int64 each), flash
(``flash_api.cpp: mha_fwd``) its ``rng_state`` (2 × uint64) and an unused scalar, efficient a seed and an
offset. cuDNN and flash write the output in the query's memory layout (``MHA.cpp:
alloc_with_matching_layout``; flash works on the (b, s, h, d) transposes), the efficient kernel (b, s, h, d).

What the backward allocates besides dq, dk and dv, freed when it returns (backward scratch):

- cuDNN: one workspace (``MHA.cpp: run_cudnn_SDP_bprop``: ``allocate(mha_graph.get_workspace_size())``)
  holding the frontend's fp32 dQ accumulator ``[b, h, s_q, d_qk]`` and the fp32 ``softmax_sum`` (rowsum
  of dO·O) ``[b, h, s_q]`` (NVIDIA/cudnn-frontend@v1.8.0…v1.23.0 ``include/cudnn_frontend/node/
  scaled_dot_product_flash_attention.h: CompositeSDPABackwardNode``, ``dQ_accum_size``,
  ``softmax_sum_size``, ``get_fe_workspace_size_node``; no dP workspace from cuDNN 9.0), and with fewer
  K/V heads than query heads ``dK_fullhead``/``dV_fullhead`` ``[b, h_q, s_kv, d]`` in the query's dtype,
  summed over each group (virtual tensors the backend keeps in that workspace: the snapshots'
  workspaces are exactly this sum plus 256 bytes of the backend's own, which is not modelled);
- flash (``flash_api.cpp: mha_bwd``, PyTorch's vendored flash-attention 2): ``softmax_d`` fp32
  ``[b, h, s_q rounded to 128]``, ``dq_accum`` fp32 ``[b, s_q rounded, h, d rounded to 32 (≤ 128) or
  64]``, and for GQA ``dk_expanded``/``dv_expanded`` ``[b, s_k, h, d]`` in q's dtype;
- efficient: none modelled.
"""

from __future__ import annotations

from timeline.graph.ir import Builder
from timeline.graph.tensors import DTYPE_BYTES, TensorDef
from timeline.profiles.megatron_workspaces import version_tuple

#: compute capabilities where PyTorch prefers cuDNN attention (sdp_utils.cpp: check_prefer_cudnn_attention)
CUDNN_FIRST_SMS = (90, 100, 103)
#: the first PyTorch whose wheels bundle a cuDNN above check_prefer_cudnn_attention's 9.15.0 threshold
CUDNN_FIRST_PYTORCH = (2, 11)

CUDNN, FLASH, EFFICIENT = "cudnn", "flash", "efficient"


def backend(b: Builder, qk_dim: int, v_dim: int) -> str:
    """The kernel CUDA SDPA runs for this attention on the run's device and PyTorch (module docstring)."""
    half = b.dims.dtype in ("bf16", "fp16")
    sm, torch = b.ctx.sm, b.ctx.pytorch
    if half and sm in CUDNN_FIRST_SMS and torch and version_tuple(torch) >= CUDNN_FIRST_PYTORCH:
        limit = 256 if sm == 90 else 128
        if qk_dim % 8 == 0 and v_dim % 8 == 0 and max(qk_dim, v_dim) <= limit:
            return CUDNN
    if half and qk_dim == v_dim <= 256:
        return FLASH
    return EFFICIENT


def output_like_query(b: Builder, qk_dim: int, v_dim: int) -> bool:
    """Whether the kernel's output takes the query's memory layout (cuDNN, flash), so a
    ``transpose(1, 2).contiguous()`` of it copies when the query was not (b, s, h, d)."""
    return backend(b, qk_dim, v_dim) in (CUDNN, FLASH)


def forward(b: Builder, name: str, q: TensorDef, k: TensorDef, v: TensorDef, ctx: TensorDef, layer: int,
            heads: int, qk_dim: int, v_dim: int, tags: frozenset[str]) -> TensorDef:
    """The attention op (rule ``flash_attn``) of the chosen kernel, with its kept extras and its
    backward's scratch; returns ``ctx``."""
    d = b.dims
    kind = backend(b, qk_dim, v_dim)
    rows = q.shape[0]
    if kind == EFFICIENT and k.shape[1] < heads * qk_dim:
        ke, ve = b.tensor(f"{name}.k_expanded", (rows, heads * qk_dim)), b.tensor(f"{name}.v_expanded",
                                                                                    (rows, heads * v_dim))
        b.op(f"{name}.repeat_kv", "copy", layer, {"k": k, "v": v}, {"k": ke, "v": ve}, tags=tags)
        k, v = ke, ve
    seq = -(-d.s_local // 32) * 32 if kind == EFFICIENT else d.s_local
    extras = {"lse": b.tensor(f"{name}.softmax_lse", (d.b, heads, seq), "fp32")}
    rng = (("rng_state", 2), ("rng_unused", 1)) if kind == FLASH else (("philox_seed", 1), ("philox_offset", 1))
    for slot, n in rng:
        extras[slot] = b.tensor(f"{name}.{slot}", (n,), "int64")
    scratch = _scratch(b, name, kind, heads, k.shape[1] // qk_dim, qk_dim, v_dim)
    f = 2.0 * d.b * heads * d.s_local * d.s * (qk_dim + v_dim)
    b.op(name, "flash_attn", layer, {"q": q, "k": k, "v": v}, {"y": ctx}, extras=extras, flops=f, tags=tags,
         scratch=scratch)
    return ctx


def _round(x: int, m: int) -> int:
    return -(-x // m) * m


def _scratch(b: Builder, name: str, kind: str, heads: int, kv_heads: int, qk_dim: int,
             v_dim: int) -> dict[str, TensorDef]:
    """The backward-only tensors of one SDPA call, in the order the kernel allocates them."""
    d = b.dims
    sq = sk = d.s_local
    if kind == CUDNN:
        size = 4 * d.b * heads * sq * qk_dim + 4 * d.b * heads * sq  # dQ_accum, softmax_sum (fp32)
        if kv_heads < heads:  # dK_fullhead, dV_fullhead in the query's dtype
            size += DTYPE_BYTES[d.dtype] * d.b * heads * sk * (qk_dim + v_dim)
        return {"workspace": b.tensor(f"{name}.bwd.cudnn_workspace", (size,), "uint8")}
    if kind != FLASH:
        return {}
    sq_r = _round(sq, 128)
    out = {"softmax_d": b.tensor(f"{name}.bwd.softmax_d", (d.b, heads, sq_r), "fp32"),
           "dq_accum": b.tensor(f"{name}.bwd.dq_accum", (d.b, sq_r, heads, _round(qk_dim, 32 if qk_dim <= 128 else 64)),
                                "fp32")}
    if kv_heads < heads:
        out["dk_expanded"] = b.tensor(f"{name}.bwd.dk_expanded", (d.b, sk, heads, qk_dim))
        out["dv_expanded"] = b.tensor(f"{name}.bwd.dv_expanded", (d.b, sk, heads, v_dim))
    return out
