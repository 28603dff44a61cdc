"""Megatron's three cross-entropy paths (``[framework] cross_entropy_fusion``), as the loss op of the
last stage allocates and keeps them.

- ``none`` (``tensor_parallel/cross_entropy.py``): the fp32 softmax numerators ``[rows, V/tp]`` kept
  for backward, whose in-place backward returns the gradient the engine casts to bf16;
- ``native`` (``fusions/fused_cross_entropy.py`` under ``jit_fuser = torch.compile``): the same saved
  tensors, and a backward whose compiled kernel scatters into a fresh fp32 copy of the softmax beside
  the bf16 gradient it returns;
- ``te`` (TE ``parallel_cross_entropy``): the gradient written into the bf16 logits, which are kept.
"""

from __future__ import annotations

from helpers_run import tiny_run

from timeline.result.build import build_timeline

ROWS, VOCAB = 128, 1024  # seq 128 × micro-batch 1; the tiny model's vocabulary, tp = 1


def _loss_tensors(fusion: str) -> dict[str, list[tuple[int, int]]]:
    """(sign, bytes) of each alloc (+1) and free (−1) of the first micro-batch's loss tensors, by name."""
    tl = build_timeline(tiny_run(cross_entropy_fusion=fusion, iterations=1))
    ev = tl.events(0)
    out: dict[str, list[tuple[int, int]]] = {}
    for t, size, sign, mb in zip(ev.tensor, ev.size, ev.sign, ev.microbatch, strict=True):
        name = tl.names[t]
        if mb == 0 and name.startswith("output.loss"):
            out.setdefault(name, []).append((int(sign), int(size)))
    return out


def test_native_keeps_the_unfused_tensors_and_its_compiled_backward_copies_the_softmax():
    none, native = _loss_tensors("none"), _loss_tensors("native")
    softmax = ROWS * VOCAB * 4
    assert none["output.loss.exp_logits"] == native["output.loss.exp_logits"] == [(1, softmax), (-1, softmax)]
    assert "output.loss.backward_scratch.exp_logits" not in none
    assert native["output.loss.backward_scratch.exp_logits"] == [(1, softmax), (-1, softmax)]


def _requested_in_loss_backward(fusion: str) -> int:
    """Requested bytes once the loss backward of the only micro-batch has made all its tensors."""
    import numpy as np

    tl = build_timeline(tiny_run(cross_entropy_fusion=fusion, iterations=1, num_microbatches=1))
    ev = tl.events(0)
    requested = np.cumsum(ev.sign.astype(np.int64) * ev.size)
    last = "output.loss.backward_scratch.exp_logits" if fusion == "native" else "grad:output.output_layer.out"
    i = max(k for k, t in enumerate(ev.tensor) if tl.names[t] == last and ev.sign[k] > 0)
    return int(requested[i])


def test_native_backward_holds_one_fp32_softmax_more_than_the_unfused_one():
    assert _requested_in_loss_backward("native") - _requested_in_loss_backward("none") == ROWS * VOCAB * 4


def _logits_live_in_loss_backward(fusion: str) -> bool:
    """Whether the bf16 logits ([rows, V] of the only micro-batch) are still allocated when the loss
    backward makes its first tensor."""
    tl = build_timeline(tiny_run(cross_entropy_fusion=fusion, iterations=1, num_microbatches=1))
    ev = tl.events(0)
    names = [tl.names[t] for t in ev.tensor]
    logits = "output.output_layer.out"
    freed = max(k for k, n in enumerate(names) if n == logits and ev.sign[k] < 0)
    grad = min(k for k, n in enumerate(names) if n == f"grad:{logits}" and ev.sign[k] > 0)
    return freed > grad


def test_te_keeps_only_the_bf16_logits():
    te = _loss_tensors("te")
    assert not any(name.startswith("output.loss.") for name in te)
    # TE writes the gradient into the logits and keeps them; the unfused loss lets them go after its forward
    assert _logits_live_in_loss_backward("te") and not _logits_live_in_loss_backward("none")
