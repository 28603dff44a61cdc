"""A Megatron model chunk keeps the hidden state its last forward received, and the gradient its
backward gave it, until its next forward (``TransformerBlock.set_input_tensor``): the last
micro-batch's pair stays through the optimizer step, so a receiving chunk's steady state holds two
boundary tensors; the schedule's ``input_tensor_grad`` holds each sent gradient until the rank's
next backward returns. Other profiles free both with their last backward use."""

from __future__ import annotations

import numpy as np
from helpers_run import tiny_run

from timeline.result.build import build_timeline
from timeline.sim.plan import boundary_bytes

KEPT = ("input", "grad:input")


def _kept(tl, d: int, upto_iteration: int | None = 0) -> int:
    """Requested bytes of the received inputs and their gradients live on device ``d`` after
    iteration ``upto_iteration``'s events (None: after every event)."""
    ev = tl.events(d)
    names = np.array(tl.sim.names)[ev.tensor]
    m = np.isin(names, KEPT)
    if upto_iteration is not None:
        m &= ev.iteration <= upto_iteration
    return int(np.sum(ev.sign[m].astype(np.int64) * ev.size[m]))


def _boundary(run) -> int:
    return boundary_bytes(run.training, run.parallel, run.model.hidden_size)


def test_1f1b_last_stage_keeps_its_last_input_and_gradient_through_the_step():
    run = tiny_run(pp=2)
    tl = build_timeline(run)
    b = _boundary(run)
    assert b == 1 * 128 * 256 * 2
    assert _kept(tl, 1) == 2 * b  # after iteration 1's step: the last micro-batch's pair
    assert _kept(tl, 1, None) == 2 * b  # after the last iteration: for good
    assert _kept(tl, 0) == 0  # the first stage receives nothing
    # iteration 2's first forward frees them, after it made its own receive buffer
    ev = tl.events(1)
    names = np.array(tl.sim.names)[ev.tensor]
    spans = tl.sim.spans[1]
    first_f = min((i for i, s in enumerate(spans) if s.kind == "F" and s.iteration == 1),
                  key=lambda i: spans[i].start_us)
    moved = np.flatnonzero((ev.action == first_f) & (ev.sign < 0) & np.isin(names, KEPT))
    assert sorted(names[moved]) == sorted(KEPT)
    assert (ev.microbatch[moved] == run.training.num_microbatches - 1).all()
    assert (ev.size[moved] == b).all() and (ev.t_us[moved] == spans[first_f].start_us).all()
    recv = np.flatnonzero((ev.action == first_f) & (ev.sign > 0) & (names == "input"))
    assert recv.size == 1 and recv[0] < moved.min()


def test_interleaved_each_receiving_chunk_keeps_a_pair():
    run = tiny_run(pp=2, vpp=2, layers=4, schedule="interleaved")
    tl = build_timeline(run)
    b = _boundary(run)
    assert _kept(tl, 1) == 2 * 2 * b  # stages 1 and 3 both receive
    assert _kept(tl, 0) == 2 * b  # stage 2 receives, stage 0 does not


def test_steady_state_grows_by_the_kept_pairs_only_under_megatron():
    megatron = build_timeline(tiny_run(pp=2))
    paper = build_timeline(tiny_run(pp=2, profile="paper"))
    assert _kept(paper, 1) == 0 and _kept(paper, 1, None) == 0
    assert _kept(megatron, 1) == 2 * _boundary(tiny_run(pp=2))


def test_1f1b_sent_gradient_lives_until_the_next_backward_returns():
    run = tiny_run(pp=2)
    tl = build_timeline(run)
    ev = tl.events(1)
    names = np.array(tl.sim.names)[ev.tensor]
    spans = tl.sim.spans[1]
    backward = {(s.iteration, s.microbatch): i for i, s in enumerate(spans) if s.kind == "B"}
    for it in range(run.training.iterations):
        for mb in range(run.training.num_microbatches - 1):
            free = np.flatnonzero((ev.sign < 0) & (names == "grad:input") & (ev.microbatch == mb)
                                  & (ev.iteration == it))
            nxt = backward[(it, mb + 1)]
            assert free.size == 1 and ev.action[free[0]] == nxt and ev.t_us[free[0]] == spans[nxt].end_us
            assert ev.size[free[0]] == _boundary(run)
