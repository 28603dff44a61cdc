"""Which Adam Megatron-Core runs (``[framework] optimizer_impl``) and what its step allocates
(timeline.sim.optimizer_step, timeline.profiles.torch_adam): Transformer Engine's and Apex's FusedAdam make
the moments and nothing more; torch's foreach AdamW — Megatron's fallback without either — makes, per parameter
group after the group's states, one ``_foreach_sqrt`` copy of the second moments per main parameter (shard), all
live until the group's update returns (two copies before PyTorch 2.1); under fp16 Megatron's local
``multi_tensor_scale`` copies each main parameter through an fp32 temporary. Bytes from the tiny model's shapes."""

from __future__ import annotations

import numpy as np
import pytest
from helpers_run import tiny_run

from timeline.profiles import LIMITS
from timeline.profiles.torch_adam import foreach_temporaries
from timeline.result.build import build_timeline
from timeline.spec.validate import validate_run


def _step(impl: str, **kw):
    """(timeline, event names, the first and second step spans) of the tiny one-stage run with ``impl``."""
    run = tiny_run(pp=1, layers=2, iterations=2, transformer_impl="local", optimizer_impl=impl, **kw)
    tl = build_timeline(run)
    names = np.array(tl.sim.names, dtype=object)[tl.events(0).tensor]
    steps = [s for s in tl.sim.spans[0] if s.kind == "step"]
    return tl, names, steps


def _groups(tl) -> tuple[int, int]:
    """Elements of the (weight-decayed, not decayed) parameters, from their shapes: Megatron's groups put
    biases and 1-D parameters apart (MC/optimizer/__init__.py: _get_param_groups)."""
    ts = [t for t in tl.sim.devices[0].tensors if t.trainable]
    no_decay = sum(t.numel for t in ts if len(t.shape) == 1 or t.name.endswith(".bias"))
    return sum(t.numel for t in ts) - no_decay, no_decay


@pytest.mark.parametrize("impl", ["te_fused", "apex_fused"])
def test_fused_adam_makes_the_moments_and_nothing_more(impl):
    tl, names, steps = _step(impl)
    ev = tl.events(0)
    decayed, no_decay = _groups(tl)
    moments = np.array([n.startswith("static.moments.") for n in names])
    assert set(ev.t_us[moments]) == {steps[0].start_us} and int(ev.size[moments].sum()) == (decayed + no_decay) * 8
    assert not any(n.startswith("step.") for n in names)


def test_torch_foreach_adamw_copies_the_second_moments_per_group_in_every_step():
    tl, names, steps = _step("torch_foreach")
    ev = tl.events(0)
    decayed, no_decay = _groups(tl)
    sqrt = np.array([n.startswith("step.adam.") and n.endswith(".exp_avg_sq_sqrt") for n in names])
    assert all(n.startswith(("static.", "step.adam.")) or not n.startswith("step.") for n in names)
    # one fp32 copy per main parameter in each of the two steps, made and dropped at the step's start
    made, freed = sqrt & (ev.sign > 0), sqrt & (ev.sign < 0)
    assert int(ev.size[made].sum()) == int(ev.size[freed].sum()) == 2 * (decayed + no_decay) * 4
    assert set(ev.t_us[sqrt]) == {s.start_us for s in steps}
    # a group's copies are live together, the next group's after they are dropped: the most held at once is the
    # larger group's, never both
    live = np.cumsum(np.where(sqrt, ev.sign.astype(np.int64) * ev.size, 0))
    assert int(live.max()) == max(decayed, no_decay) * 4 and int(live[-1]) == 0
    # in the first step each group's states come first, then its update: the second group's moments are made
    # after the first group's copies are dropped
    first = [i for i in range(len(names)) if ev.t_us[i] == steps[0].start_us and
             str(names[i]).startswith(("static.moments.", "step.adam."))]
    kinds = [("m" if str(names[i]).startswith("static.") else "+" if ev.sign[i] > 0 else "-") for i in first]
    runs = [k for j, k in enumerate(kinds) if j == 0 or kinds[j - 1] != k]
    assert runs == ["m", "+", "-", "m", "+", "-"]
    # the second step holds at most what it found plus the decayed group's copy of its second moments
    allocated = np.cumsum(ev.sign.astype(np.int64) * ev.size)
    at = [i for i in np.flatnonzero(ev.t_us == steps[1].start_us) if str(names[i]).startswith("step.")]
    assert int(allocated[at].max()) == int(allocated[at[0] - 1]) + decayed * 4


def test_torch_before_2_1_adds_eps_out_of_place():
    tl, names, _ = _step("torch_foreach", pytorch="2.0.1")
    ev = tl.events(0)
    decayed, no_decay = _groups(tl)
    denom = np.array([str(n).endswith(".denom") for n in names])
    assert int(ev.size[denom & (ev.sign > 0)].sum()) == 2 * (decayed + no_decay) * 4
    sqrt = np.array([str(n).startswith("step.adam.") for n in names])
    live = np.cumsum(np.where(sqrt, ev.sign.astype(np.int64) * ev.size, 0))
    assert int(live.max()) == max(decayed, no_decay) * 8  # exp_avg_sq_sqrt and denom together


def test_the_rule_itself():
    assert foreach_temporaries([("a", 3), ("b", 5)], 4, "2.11") == (("a.exp_avg_sq_sqrt", 12), ("b.exp_avg_sq_sqrt", 20))
    assert foreach_temporaries([("a", 3)], 4, "2.0") == (("a.exp_avg_sq_sqrt", 12), ("a.denom", 12))


def test_under_the_distributed_optimizer_the_copy_is_of_this_rank_s_shards():
    tl, names, _ = _step("torch_foreach", dp=4, zero=1)
    ev = tl.events(0)
    owned = sum(s.shard_numel for b in tl.sim.devices[0].dp_buffers for s in b.slots)
    sqrt = np.array([str(n).startswith("step.adam.") for n in names]) & (ev.sign > 0)
    assert 0 < owned < sum(_groups(tl)) and int(ev.size[sqrt].sum()) == 2 * owned * 4


def test_fp16_copies_each_main_parameter_through_an_fp32_temporary():
    tl, names, _ = _step("torch_foreach", dtype="fp16", grad_dtype="fp32")
    ev = tl.events(0)
    copy = np.array([str(n).startswith("step.main_param_copy.") for n in names])
    assert int(ev.size[copy & (ev.sign > 0)].sum()) == 2 * sum(_groups(tl)) * 4
    live = np.cumsum(np.where(copy, ev.sign.astype(np.int64) * ev.size, 0))
    largest = max(t.numel for t in tl.sim.devices[0].tensors if t.trainable)
    assert int(live.max()) == largest * 4  # one at a time
    tl, names, _ = _step("torch_foreach")  # bf16: a plain copy_
    assert not any(str(n).startswith("step.main_param_copy.") for n in names)


def test_without_transformer_engine_its_layers_and_optimizer_are_errors():
    problems = validate_run(tiny_run(optimizer_impl="torch_foreach"), LIMITS)
    assert [k for k, _ in problems] == ["framework.optimizer_impl"] and "transformer_impl" in problems[0][1]
    problems = validate_run(tiny_run(optimizer_impl="apex_fused", transformer_impl="local", zero=1, dp=2,
                                     precision_aware=True), LIMITS)
    assert [k for k, _ in problems] == ["framework.optimizer_impl"] and "FusedAdam" in problems[0][1]
    assert validate_run(tiny_run(optimizer_impl="torch_foreach", transformer_impl="local"), LIMITS) == []
    # only the megatron profile reads it
    assert [k for k, _ in validate_run(tiny_run(profile="hf", optimizer_impl="torch_foreach"), LIMITS)] == \
        ["framework.optimizer_impl"]


@pytest.mark.parametrize("level", [1, 2])
def test_empty_unused_memory_level_releases_the_cache_around_the_step(level):
    """``--empty-unused-memory-level`` (training.py: train_step): torch.cuda.empty_cache() after the forward-backward
    (1) and after the step too (2) — every cached segment without a live block goes back to the device there; the
    allocated bytes are the run's without it, event for event."""
    base, _, _ = _step("te_fused")
    tl, names, steps = _step("te_fused", empty_unused_memory_level=level)
    assert (names == "step.empty_cache").sum() == 2 * level * len(steps)  # a 0-byte alloc and free per marker
    a, b = base.memory[0], tl.memory[0]
    kept = names != "step.empty_cache"
    assert np.array_equal(np.cumsum(a.block_bytes), np.cumsum(b.block_bytes[kept]))  # allocated unchanged
    ev = tl.events(0)
    marks = np.flatnonzero((names == "step.empty_cache") & (ev.sign > 0))
    released = {int(i): sum(size for j, act, _, size, _, _ in b.segment_events if j == i and act == "segment_free")
                for i in marks}
    for i in marks:  # each marker's segment frees are the whole drop of reserved there
        assert b.reserved[i] == b.reserved[i - 1] - released[int(i)]
    assert released[int(marks[0])] > 0  # after the first backward the cache holds free segments
    assert not any(act == "segment_free" for _, act, _, _, _, _ in a.segment_events)  # never without the flag
    assert tl.peak(0).reserved_bytes <= base.peak(0).reserved_bytes
