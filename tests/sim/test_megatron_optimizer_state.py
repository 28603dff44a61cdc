"""How the optimizer's state comes into being in the megatron profile's static events
(timeline.sim.megatron_state): TE's FusedAdam under the precision-aware optimizer (moments, their scales, the
int16 remainders or a master with its fp32 fill), and the states of SGD and Muon in the first step."""

from __future__ import annotations

from timeline.sim.megatron_state import fused_adam_states
from timeline.spec.run import TrainingSpec

ORDER = [("w", 1000, (("exp_avg", 2), ("exp_avg_sq", 4)))]


def test_fused_adam_makes_moments_scales_and_int16_remainders_in_the_first_step():
    tr = TrainingSpec(zero=1, precision_aware=True, master_remainders=True, moment_dtype="bf16")
    assert fused_adam_states(tr, ORDER) == [
        ("first_step", "static.moments.w.exp_avg", 2000, 2, 1),
        ("first_step", "static.state_scale.w.exp_avg", 4, 2, 1),  # bf16: a [1] fp32 scale
        ("first_step", "static.moments.w.exp_avg_sq", 4000, 2, 1),  # fp32: none
        ("first_step", "static.master.w", 2000, 2, 1)]


def test_an_fp16_master_is_filled_from_an_fp32_copy_of_a_clone():
    tr = TrainingSpec(zero=1, precision_aware=True, master_dtype="fp16")
    events = fused_adam_states(tr, ORDER)[3:]
    assert [(n.split(".")[1], b, sign) for _, n, b, _, sign in events] == [
        ("master", 2000, 1), ("master_clone", 2000, 1), ("master_fp32", 4000, 1), ("master_clone", 2000, -1),
        ("state_scale", 4, 1), ("master_fp32", 4000, -1)]
