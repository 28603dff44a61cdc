"""TE's unfused attention softmax (``--attention-backend unfused``): where FusedScaleMaskSoftmax runs its fused
kernel, the kernel's backward writes the scores' gradient into the probabilities' gradient (TE csrc
``extensions/softmax.cpp``, v1.11 … release_v2.18), so no ``[b, heads, s, s]`` gradient of the scores is made."""

from __future__ import annotations

import numpy as np
import pytest
from helpers_run import tiny_run

from timeline.result.build import build_timeline
from timeline.spec.te_softmax import te_softmax_kernel

SCORES = "grad:layers.0.self_attn.core_attn.scores"
PROBS = "grad:layers.0.self_attn.core_attn.softmax"


def _grads(seq_len: int = 128, **framework) -> dict[str, int]:
    """Bytes of each attention gradient allocated in one tiny layer's first backward."""
    tl = build_timeline(tiny_run(pp=1, layers=1, seq_len=seq_len, attention_backend="unfused", **framework))
    ev = tl.events(0)
    out: dict[str, int] = {}
    for i in np.flatnonzero(ev.sign > 0):
        name = tl.names[ev.tensor[i]]
        if name in (SCORES, PROBS):
            out.setdefault(name, int(ev.size[i]))
    return out


def test_the_fused_kernel_computes_the_scores_gradient_in_place():
    # [b = 1, heads = 8, 128, 128] bf16
    assert _grads(transformer_engine="2.9") == {PROBS: 8 * 128 * 128 * 2}


@pytest.mark.parametrize("why,kwargs", [
    ("TE main after release_v2.18 allocates it fresh (0c8cf2c03)", {"transformer_engine": "2.19"}),
    ("Megatron's own FusedScaleMaskSoftmax (Apex kernels, not read)", {"transformer_impl": "local"}),
])
def test_elsewhere_the_scores_gradient_is_its_own_tensor(why, kwargs):
    seq = kwargs.pop("seq_len", 128)
    grads = _grads(seq, **kwargs)
    assert grads[SCORES] == grads[PROBS] == 8 * seq * seq * 2, why


def test_off_the_kernel_te_runs_torch_s_softmax_in_fp32():
    """sk % 8 != 0: FusedScaleMaskSoftmax.forward_torch_softmax (TE v1.11 … v2.18, softmax_in_fp32 by default) —
    the fp32 copy of the scores and torch's fp32 softmax, whose gradients are fp32; the bf16 scores' gradient comes
    from the copy's (ToCopyBackward); the causal masked_fill_'s backward makes a second fp32 gradient (scratch)."""
    seq, elems = 100, 8 * 100 * 100
    tl = build_timeline(tiny_run(pp=1, layers=1, seq_len=seq, attention_backend="unfused"))
    ev = tl.events(0)
    made: dict[str, int] = {}
    for i in np.flatnonzero(ev.sign > 0):
        name = tl.names[ev.tensor[i]]
        if name.removeprefix("grad:").startswith("layers.0.self_attn.core_attn.s"):
            made.setdefault(name, int(ev.size[i]))
    prefix = "layers.0.self_attn.core_attn"
    expected = {f"{prefix}.scores": 2 * elems, f"{prefix}.softmax_in": 4 * elems, f"{prefix}.softmax": 4 * elems,
                f"{prefix}.softmax_cast": 2 * elems, f"grad:{prefix}.softmax_cast": 2 * elems,
                f"grad:{prefix}.softmax": 4 * elems, f"grad:{prefix}.softmax_in": 4 * elems,
                f"grad:{prefix}.scores": 2 * elems, f"{prefix}.softmax_op.backward_scratch.x": 4 * elems}
    assert made == expected


def test_the_kernel_takes_the_shapes_te_accepts():
    assert te_softmax_kernel("bf16", 4, 16, 4096, 4096)
    assert not te_softmax_kernel("fp32", 4, 16, 4096, 4096)  # 16-bit scores only
    assert not te_softmax_kernel("bf16", 4, 16, 16384, 16384)  # 16 < sk < 16384
    assert not te_softmax_kernel("bf16", 4, 16, 100, 100)  # sk % 8
    assert not te_softmax_kernel("bf16", 1, 6, 128, 128)  # b·heads % 4
    assert not te_softmax_kernel("bf16", 4, 16, 2048, 4096)  # causal: sq == sk
    assert te_softmax_kernel("bf16", 1, 4, 64, 64)  # 128 / 32 threads · 2 rows a warp: 8 rows a block
    assert not te_softmax_kernel("bf16", 1, 4, 36, 40)  # sq ≠ sk


def test_off_the_kernel_te_caches_one_causal_mask_per_process():
    """_get_default_causal_mask (softmax.py, v1.2 … v2.18): the torch path's bool [s, s] upper-triangular mask,
    cached by shape for the process's life; none where the kernel takes the scores."""
    from timeline.profiles.megatron_workspaces import te_causal_mask_bytes

    off = tiny_run(pp=1, layers=1, seq_len=100, attention_backend="unfused")
    on = tiny_run(pp=1, layers=1, seq_len=128, attention_backend="unfused")
    assert te_causal_mask_bytes(off.framework, off.model, off.training, off.parallel) == 100 * 100
    assert te_causal_mask_bytes(on.framework, on.model, on.training, on.parallel) == 0
