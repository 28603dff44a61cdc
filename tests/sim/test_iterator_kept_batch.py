"""Megatron-LM from 5e4fc931ba (``[framework] rerun_keeps_batch``): ``pretrain_gpt.py: get_batch``
writes the batch's ``.cuda()`` copies into the dict ``RerunDataIterator`` saved, and
``RerunDataIterator.advance`` drops the saved micro-batches only when the next ``train_step``
begins. A last stage (pp > 1) keeps each micro-batch's ``labels`` (int64), ``loss_mask`` (fp32) and
bool ``attention_mask`` through the optimizer step; ``tokens`` and ``position_ids`` are set to None
there (``get_batch_on_this_tp_rank``). Only TP rank 0 fetches: at tp > 1 the logged (last) rank keeps none."""

from __future__ import annotations

import numpy as np
from helpers_run import tiny_run

from timeline.result.build import build_timeline

B, S, MB = 1, 128, 4
#: per micro-batch on a last stage: labels int64 [b, s] + loss_mask fp32 [b, s] + attention_mask bool [b, 1, s, s]
LAST = B * S * 8 + B * S * 4 + B * S * S
#: on a first stage: tokens and position_ids int64 [b, s] + the mask
FIRST = 2 * B * S * 8 + B * S * S


def _saved(tl, d: int, upto_iteration: int | None = 0) -> int:
    """Bytes of ``batch.saved.*`` live on device ``d`` after iteration ``upto_iteration``'s events."""
    ev = tl.events(d)
    names = np.array(tl.sim.names)[ev.tensor]
    m = np.char.startswith(names.astype(str), "batch.saved.")
    if upto_iteration is not None:
        m &= ev.iteration <= upto_iteration
    return int(np.sum(ev.sign[m].astype(np.int64) * ev.size[m]))


def _run(**kw):
    return tiny_run(pp=2, dataloader_batch="mask", **kw)


def test_last_stage_keeps_every_micro_batch_through_the_step():
    tl = build_timeline(_run(rerun_keeps_batch=True))
    assert LAST == 17_920
    assert _saved(tl, 1) == MB * LAST  # after iteration 1's step
    assert _saved(tl, 0) == MB * FIRST
    assert _saved(tl, 1, None) == MB * LAST  # the last iteration's stay for good
    # iteration 2's first action frees iteration 1's, after iteration 1's optimizer step
    ev, spans = tl.events(1), tl.sim.spans[1]
    names = np.array(tl.sim.names)[ev.tensor].astype(str)
    first = min((i for i, s in enumerate(spans) if s.iteration == 1 and s.kind not in ("init", "step")),
                key=lambda i: spans[i].start_us)
    step_end = max(s.end_us for s in spans if s.kind == "step" and s.iteration == 0)
    freed = (ev.sign < 0) & np.char.startswith(names, "batch.saved.") & (ev.iteration == 1)
    assert int(ev.size[freed].sum()) == MB * LAST
    assert (ev.action[freed] == first).all()
    assert (ev.t_us[freed] == max(spans[first].start_us, step_end)).all()


def test_without_the_switch_nothing_is_saved_and_every_field_lives_through_its_forward():
    tl = build_timeline(_run())
    assert _saved(tl, 1, None) == 0 and _saved(tl, 0, None) == 0
    names = set(np.array(tl.sim.names)[tl.events(1).tensor].astype(str))
    assert {"batch.tokens", "batch.labels", "batch.attention_mask"} <= names


def test_tp_above_one_keeps_nothing_on_the_logged_rank():
    tl = build_timeline(_run(rerun_keeps_batch=True, tp=2))
    assert all(_saved(tl, d, None) == 0 for d in range(len(tl.sim.spans)))
