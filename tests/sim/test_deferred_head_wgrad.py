"""Megatron's deferred embedding weight gradient (``--defer-embedding-wgrad-compute``,
timeline.sim.expand.head_wgrad_kept): the stage holding the output layer keeps each deferred
micro-batch's output-layer input and logits gradient until the schedule's last backward, the first
``wgrad_deferral_limit`` micro-batches of an iteration (all at 0); under sequence parallelism the drain
gathers into two more GlobalMemoryBuffer tensors ``[s·b, h]``. Bytes from shapes: the tiny model's
vocabulary 1024 over tp, hidden 256, 128 tokens of one sequence, bf16."""

from __future__ import annotations

import numpy as np
from helpers_run import tiny_run

from timeline.result.build import build_timeline

HELD = ("grad:output.output_layer.out", "final_norm.out")


def _frees(tl, d: int) -> dict[str, list[tuple[int, float]]]:
    """(micro-batch, time) of each free of the held tensors on device ``d``, in the first iteration."""
    ev = tl.events(d)
    names = np.array(tl.sim.names)[ev.tensor]
    out: dict[str, list[tuple[int, float]]] = {n: [] for n in HELD}
    for n, mb, t, sign, it in zip(names, ev.microbatch, ev.t_us, ev.sign, ev.iteration, strict=True):
        if str(n) in out and sign < 0 and it == 0:
            out[str(n)].append((int(mb), float(t)))
    return out


def _last_end(tl, d: int) -> float:
    return max(s.end_us for s in tl.sim.spans[d] if s.kind not in ("init", "step") and s.iteration == 0)


def test_the_first_limit_micro_batches_hold_their_input_and_logits_gradient_until_the_flush():
    plain = build_timeline(tiny_run(pp=2, tp=2, sp=False, dp=1))
    for limit in (0, 2):
        tl = build_timeline(tiny_run(pp=2, tp=2, sp=False, dp=1, defer_embedding_wgrad=True,
                                     wgrad_deferral_limit=limit))
        flush = _last_end(tl, 1)
        deferred = 4 if limit == 0 else limit
        for name, frees in _frees(tl, 1).items():
            at_flush = [mb for mb, t in frees if t == flush]
            # the deferred micro-batches' frees wait for the flush (actions of the rank's last backward)
            assert at_flush == list(range(deferred)), (limit, name)
            assert all(t < flush for mb, t in frees if mb >= deferred), (limit, name)
        # what the flush still holds just before it: the deferred pairs, logits gradient [128, 1024/2] and
        # the output layer's input [128, 256] (no SP: whole), bf16
        held = deferred * (128 * 512 + 128 * 256) * 2
        assert tl.peak(1).allocated_bytes > plain.peak(1).allocated_bytes
        assert tl.peak(0).allocated_bytes == plain.peak(0).allocated_bytes  # the first stage holds no head
        ev = tl.events(1)
        names = np.array(tl.sim.names)[ev.tensor]
        before = (ev.t_us < flush) & (ev.iteration == 0) & np.isin(names, HELD)
        live = int(np.sum(ev.sign[before].astype(np.int64) * ev.size[before]))
        assert live == held, limit


def test_sequence_parallel_drain_gathers_into_two_more_global_buffers():
    def drains(limit: int, mbs: int = 4) -> dict[str, int]:
        tl = build_timeline(tiny_run(pp=2, tp=2, sp=True, dp=1, defer_embedding_wgrad=True,
                                     wgrad_deferral_limit=limit, num_microbatches=mbs))
        ev = tl.events(1)
        names = np.array(tl.sim.names)[ev.tensor]
        return {str(n): int(s) for n, s, g in zip(names, ev.size, ev.sign, strict=True)
                if str(n).startswith("workspace.global_memory_buffer_mpu_") and g > 0}
    size = 128 * 256 * 2  # [s·b, h] gathered, bf16
    assert drains(0) == {"workspace.global_memory_buffer_mpu_0": size, "workspace.global_memory_buffer_mpu_1": size}
    assert drains(1) == {"workspace.global_memory_buffer_mpu_0": size}  # one held pair: no second gather
    assert drains(0, mbs=1) == {"workspace.global_memory_buffer_mpu_0": size}
