"""Make a CPU fake-tensor run save what a GPU run saves (groundtruth.md §3).

- training dropout goes through ``torch.native_dropout`` (the fused CUDA kernel's bool mask,
  1 byte per element) instead of the CPU path's input-dtype mask;
- ``scaled_dot_product_attention`` calls the flash kernel's aten op (no mask, equal q/k/v head
  dims ≤ 256, 16-bit; with ``enable_gqa`` the k/v stay at kv-head width, as CUDA's flash takes
  GQA natively) or else the memory-efficient kernel's (k/v expanded for GQA) — their meta kernels
  give the exact shapes, and autograd saves q, k, v, out, logsumexp and the RNG seed/offset as on
  a GPU — never the CPU math fallback, which saves fp32 s² scores;
- ``transformers.masking_utils.find_packed_sequence_indices`` returns ``None`` (position ids are an
  ``arange``), so transformers passes ``is_causal=True`` instead of an explicit (b,1,s,s) mask.

Only for fake tensors: the flash/efficient ops have no CPU kernels. This module does not record.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from types import ModuleType

import torch
import torch.nn.functional as F

_SDPA = F.scaled_dot_product_attention
_DROPOUT = F.dropout
_FLASH_DTYPES = (torch.float16, torch.bfloat16)


def gpu_dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    # ``inplace`` stays for F.dropout's signature (nn.Dropout passes it positionally); the CUDA kernel
    # saves the same mask either way, so the in-place form is recorded as the out-of-place one
    if not training or p == 0.0:
        return input
    return torch.native_dropout(input, p, True)[0]


def gpu_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
             dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
             enable_gqa: bool = False) -> torch.Tensor:
    """SDPA as CUDA dispatches it: flash when it can, else the memory-efficient kernel."""
    hq, hk = query.shape[-3], key.shape[-3]
    d_qk, d_v = query.shape[-1], value.shape[-1]
    flash_ok = attn_mask is None and d_qk == d_v <= 256 and query.dtype in _FLASH_DTYPES
    if hq != hk and not (enable_gqa and flash_ok):
        rep = hq // hk
        key, value = key.repeat_interleave(rep, dim=-3), value.repeat_interleave(rep, dim=-3)
    if flash_ok:
        return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal,
                                                                  False, scale=scale)[0]
    bias = attn_mask
    if bias is not None and bias.dtype == torch.bool:
        bias = torch.zeros_like(bias, dtype=query.dtype).masked_fill_(~bias, float("-inf"))
    need_grad = query.requires_grad or key.requires_grad or value.requires_grad
    return torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, bias, need_grad, dropout_p,
                                                                  is_causal, scale=scale)[0]


@contextlib.contextmanager
def unpacked_batches() -> Iterator[None]:
    """Only transformers' packed-sequence detection (a fake-tensor artefact, not a kernel choice)."""
    with _patched([]):
        yield


@contextlib.contextmanager
def gpu_kernels() -> Iterator[None]:
    """Patch dropout, SDPA and transformers' packed-sequence detection while active."""
    with _patched([(F, "dropout", gpu_dropout), (F, "scaled_dot_product_attention", gpu_sdpa)]):
        yield


@contextlib.contextmanager
def _patched(patches: list[tuple[object, str, object]]) -> Iterator[None]:
    try:
        mu: ModuleType | None = importlib.import_module("transformers.masking_utils")
    except ImportError:  # plain torch modules need no transformers patch
        mu = None
    if mu is not None and hasattr(mu, "find_packed_sequence_indices"):
        patches.append((mu, "find_packed_sequence_indices", lambda *a, **k: None))
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    try:
        for obj, name, fn in patches:
            setattr(obj, name, fn)
        yield
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)
