"""Transformer Engine's attention-softmax rules the graph (which softmax an unfused attention runs) and the persistent
workspaces (the causal mask its torch path caches) both read. This module decides no bytes."""

from __future__ import annotations


def te_softmax_kernel(dtype: str, b: int, heads: int, sq: int, sk: int, *, causal: bool = True) -> bool:
    """Whether TE's FusedScaleMaskSoftmax runs its fused kernel on ``[b, heads, sq, sk]`` scores under the causal
    mask Megatron gives (``NVIDIA/TransformerEngine@v2.2…release_v2.18: softmax.py:
    FusedScaleMaskSoftmax.is_kernel_available``, unchanged over those releases: 16-bit scores,
    16 < sk < 16384, sk % 8 == 0, sq > 1, sq == sk for the causal type, sq % 4 == 0, b·heads % 4 == 0 and sq a
    multiple of ``get_batch_per_block(sk)``: THREADS_PER_BLOCK 128 over min(next power of two ≥ sk, 32)
    threads a warp, two rows a warp up to 128 columns); otherwise it runs torch's softmax. Under a padding mask
    (``causal`` false) sq may differ from sk: the widened ``[b, 1, sq, sk]`` mask passes the kernel's shape
    check."""
    if dtype not in ("bf16", "fp16") or not 16 < sk < 16384 or sk % 8 or sq == 1 or (causal and sq != sk):
        return False
    pow2 = 1 << (sk - 1).bit_length()
    per_block = (128 // min(pow2, 32)) * (2 if pow2 <= 128 else 1)
    return sq % 4 == 0 and (b * heads) % 4 == 0 and sq % per_block == 0
