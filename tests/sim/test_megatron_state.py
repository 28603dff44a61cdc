"""The megatron profile's static state as Megatron-Core creates it (timeline.sim.megatron_state): each
parameter on its own, then per chunk the param buffer (distributed optimizer) and the grad buffer
with Megatron's padding, each parameter's own storage freed; a main-parameter clone per owned shard
at start, Adam's moments per shard in the first step; the fp32 main-grad copies of each step, live
until the next iteration starts; other profiles keep their flat blocks."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from helpers_run import tiny_run
from test_engine import uniform_template

from timeline.result.build import build_timeline


def _events(tl, d=0):
    ev = tl.events(d)
    names = np.array(tl.sim.names)[ev.tensor]
    return ev, names


def _layout(tensors, dp: int) -> tuple[int, dict[str, int]]:
    """Megatron's buffer of these parameters under the distributed optimizer, from their shapes:
    reverse named_parameters() order (output layer last), 64-element starts, one bucket ending at a
    multiple of lcm(dp, 128); and the elements of each parameter the last DP rank's shard holds."""
    params = [t for t in tensors if t.trainable]
    params = [t for t in params if not t.name.startswith("output_layer")] + \
        [t for t in params if t.name.startswith("output_layer")]
    end, spans = 0, {}
    for t in reversed(params):
        start = -(-end // 64) * 64
        end = start + math.prod(t.shape)
        spans[t.name] = (start, end)
    div = math.lcm(dp, 128)
    padded = -(-end // div) * div
    lo = padded - padded // dp
    owned = {n: min(e, padded) - max(s, lo) for n, (s, e) in spans.items() if e > lo}
    return padded, owned


def test_distributed_optimizer_buffers_shards_and_the_construction_sequence():
    run = tiny_run(pp=1, dp=5, zero=1, iterations=2)
    tl = build_timeline(run, uniform_template)
    dev = tl.sim.devices[0]
    ev, names = _events(tl)
    padded, owned = _layout(dev.tensors, 5)
    assert padded % math.lcm(5, 128) == 0 and padded > sum(t.numel for t in dev.tensors)
    assert (dev.weights_bytes, dev.grads_bytes) == (padded * 2, padded * 4)
    start = ev.t_us == 0
    # each parameter on its own, then the param buffer, the grad buffer, and each parameter's storage freed
    made = [n for n in names[start & (ev.sign > 0)] if n.startswith("static.")]
    params = [t for t in dev.tensors if t.trainable]
    assert made[:len(params)] == [f"static.weights.{t.name}" for t in params]
    assert made[len(params):len(params) + 2] == ["static.param_buffer.chunk0", "static.grad_buffer.chunk0"]
    sizes = dict(zip(names[ev.sign > 0], ev.size[ev.sign > 0], strict=False))
    assert (sizes["static.param_buffer.chunk0"], sizes["static.grad_buffer.chunk0"]) == (padded * 2, padded * 4)
    freed = names[start & (ev.sign < 0)]
    assert sorted(n for n in freed if n.startswith("static.weights.")) == sorted(f"static.weights.{t.name}"
                                                                                 for t in params)
    # one fp32 main parameter per owned shard: the last DP rank owns the last fifth of the (single)
    # bucket, its end padding included
    assert {s.name: s.shard_numel for s in dev.dp_buffers[0].slots if s.shard_numel} == owned
    assert 0 < padded // 5 - sum(owned.values()) < math.lcm(5, 128)
    masters = {n[len("static.master."):]: int(s) for n, s in zip(names, ev.size, strict=True)
               if n.startswith("static.master.")}
    assert masters == {n: k * 4 for n, k in owned.items()}
    # each made through a clone in the model dtype that is dropped
    clones = (names == f"static.master_clone.{next(iter(owned))}")
    assert list(ev.sign[clones]) == [1, -1] and ev.size[clones][0] == next(iter(owned.values())) * 2
    # Adam's two moments per owned shard, in the first step
    first_step = min(s.start_us for s in tl.sim.spans[0] if s.kind == "step")
    moments = np.char.startswith(names.astype(str), "static.moments.")
    assert set(ev.t_us[moments]) == {first_step} and int(ev.size[moments].sum()) == sum(owned.values()) * 8
    assert dev.optimizer_bytes == sum(owned.values()) * 12
    # with fp32 grads the main grads are aliases: nothing per step
    assert not any(n.startswith("step.main_grad.") for n in names)


def test_without_the_distributed_optimizer_weights_stay_per_parameter_and_nothing_is_padded():
    run = tiny_run(pp=1, dp=3, iterations=1)
    tl = build_timeline(run, uniform_template)
    dev = tl.sim.devices[0]
    n = sum(t.numel for t in dev.tensors if t.trainable)
    assert dev.dp_buffers[0].numel == n and dev.grads_bytes == n * 4 and dev.optimizer_bytes == n * 12
    ev, names = _events(tl)
    assert not any(str(x).startswith("static.weights.") for x in names[ev.sign < 0])
    assert "static.param_buffer.chunk0" not in set(names)


def test_main_grad_copies_live_from_each_step_to_the_next_iteration():
    # --grad-reduce-in-bf16: the bf16 grad buffer's shards are copied to fp32 in every step
    run = tiny_run(pp=1, dp=3, zero=1, iterations=2, grad_dtype="bf16")
    tl = build_timeline(run, uniform_template)
    dev = tl.sim.devices[0]
    ev, names = _events(tl)
    owned = {s.name: s.shard_numel for s in dev.dp_buffers[0].slots if s.shard_numel}
    steps = [s for s in tl.sim.spans[0] if s.kind == "step"]
    name = f"step.main_grad.{next(iter(owned))}"
    hit = names == name
    # made at both steps' starts, dropped when the first step ends (the next train_step's zero_grad)
    assert list(zip(ev.t_us[hit], ev.sign[hit], strict=True)) == [(steps[0].start_us, 1), (steps[0].end_us, -1),
                                                                    (steps[1].start_us, 1)]
    assert set(ev.size[hit]) == {next(iter(owned.values())) * 4}
    copies = np.char.startswith(names.astype(str), "step.main_grad.")
    live = int((ev.size[copies] * ev.sign[copies]).sum())
    assert live == sum(owned.values()) * 4 == dev.dp_buffers[0].numel // 3 * 4
    # they precede the first step's moments (prepare_grads runs before the update)
    first_moment = np.flatnonzero(np.char.startswith(names.astype(str), "static.moments."))[0]
    assert np.flatnonzero(copies)[0] < first_moment


def test_a_skipped_step_still_copies_the_main_grads():
    # fp16 with dynamic loss scaling: the first steps overflow and skip the update (optimizer_step = false)
    run = tiny_run(pp=1, dp=1, iterations=1, dtype="fp16", grad_dtype="fp16", optimizer_step=False)
    tl = build_timeline(run, uniform_template)
    ev, names = _events(tl)
    n = sum(t.numel for t in tl.sim.devices[0].tensors if t.trainable)
    copies = np.char.startswith(names.astype(str), "step.main_grad.")
    assert int(ev.size[copies].sum()) == n * 4
    assert not any(str(x).startswith("static.moments.") for x in names)


def test_other_profiles_keep_their_flat_blocks():
    run = replace(tiny_run(pp=1, dp=3, zero=1, iterations=1), profile="paper")
    tl = build_timeline(run, uniform_template)
    _, names = _events(tl)
    assert {"static.weights", "static.grads", "static.master", "static.moments"} <= set(names)
    assert tl.sim.devices[0].dp_buffers == ()


def test_a_rank_builds_its_chunks_in_virtual_stage_order():
    # DualPipe's mirrored ranks hold chunks (0, 1) and (1, 0): Megatron builds both in chunk order, so
    # their static state is the same, event for event
    run = tiny_run(pp=2, layers=4, dp=2, zero=1, iterations=1, schedule="dualpipe", num_microbatches=4)
    tl = build_timeline(run, uniform_template)
    a, b = tl.sim.devices
    assert a.stages == (0, 1) and b.stages == (1, 0)
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors] and a.dp_buffers == b.dp_buffers
    first = [(str(n), int(s)) for n, s, t in zip(_events(tl, 0)[1], tl.events(0).size, tl.events(0).t_us,
                                                   strict=True) if t == 0 and str(n).startswith("static.")]
    second = [(str(n), int(s)) for n, s, t in zip(_events(tl, 1)[1], tl.events(1).size, tl.events(1).t_us,
                                                    strict=True) if t == 0 and str(n).startswith("static.")]
    assert first == second and first[0][0] == "static.weights.embedding.word_embeddings.weight"


def _moment_times(run) -> tuple[int, set[float]]:
    """(bytes, creation times) of the optimizer moments' allocations on device 0 (not the copies a checkpoint
    load holds for a moment, ``ckpt.*``: tests/sim/test_megatron_load.py)."""
    tl = build_timeline(run, uniform_template)
    ev, names = _events(tl)
    keep = np.array([("moments" in str(x) or str(x).endswith(("exp_avg", "exp_avg_sq"))) and
                     not str(x).startswith("ckpt.") for x in names]) & (ev.sign > 0)
    return int(ev.size[keep].sum()), set(ev.t_us[keep].tolist())


def test_a_resumed_run_holds_the_moments_from_the_start():
    """Loading a checkpoint makes the optimizer's states before any step: Megatron's
    sharded_state_dict(is_loading=True) → load_state_dict(state_dict()), torch.optim's load_state_dict."""
    for profile in ("megatron", "paper", "hf"):
        fresh = replace(tiny_run(pp=1, dp=2, zero=1 if profile != "hf" else 0, iterations=1), profile=profile)
        resumed = replace(fresh, training=replace(fresh.training, resumed=True))
        (b_fresh, t_fresh), (b_resumed, t_resumed) = _moment_times(fresh), _moment_times(resumed)
        assert b_fresh == b_resumed > 0, profile
        assert t_resumed == {0.0}, profile
        # Megatron and torch.optim make them inside the first step; the paper counts them from the start
        assert (min(t_fresh) > 0.0) == (profile != "paper"), profile
    # a resumed fp16 run that skips its first steps still holds the loaded moments
    run = tiny_run(pp=1, dp=1, iterations=1, dtype="fp16", grad_dtype="fp16", optimizer_step=False, resumed=True)
    assert _moment_times(run)[0] == 2 * 4 * sum(t.numel for t in build_timeline(run, uniform_template).sim.devices[0].tensors
                                                if t.trainable)


def test_fused_qkv_and_gated_fc1_are_one_parameter_each():
    """TE's linear_qkv and a SwiGLU's linear_fc1 are one Megatron ``Parameter`` each (MC
    transformer/attention.py: SelfAttention, transformer/mlp.py: MLP), so one weight, one fp32 main
    parameter and two moments each: h 256, 8 query heads of 32 and 2 kv heads give linear_qkv
    (256 + 2·2·32) × 256; intermediate 512 gives linear_fc1 2·512 × 256."""
    from helpers_run import TINY_MODEL

    run = tiny_run(pp=1, dp=1, iterations=1, model=replace(TINY_MODEL, num_key_value_heads=2, num_hidden_layers=1))
    tl = build_timeline(run, uniform_template)
    ev, names = _events(tl)
    made = {str(n): int(s) for n, s in zip(names[ev.sign > 0], ev.size[ev.sign > 0], strict=True)}
    qkv, fc1 = (256 + 2 * 2 * 32) * 256, 2 * 512 * 256
    p = "layers.0.self_attn.linear_qkv.weight"
    assert (made[f"static.weights.{p}"], made[f"static.master.{p}"]) == (qkv * 2, qkv * 4)
    assert made[f"static.moments.{p}.exp_avg"] == made[f"static.moments.{p}.exp_avg_sq"] == qkv * 4
    assert made["static.master.layers.0.mlp.linear_fc1.weight"] == fc1 * 4
    assert not any(("q_proj" in n or "gate_proj" in n) and n.startswith("static.") for n in made)
    # the flat total is unchanged: the pieces' bytes, merged
    dev = tl.sim.devices[0]
    n = sum(t.numel for t in dev.tensors if t.trainable)
    assert sum(s for k, s in made.items() if k.startswith(("static.master.", "static.moments."))) == n * 12


def test_the_first_chunks_own_optimizer_makes_its_main_params_and_moments_first():
    """--overlap-param-gather-with-optimizer-step (MC optimizer/__init__.py: get_megatron_optimizer): the first
    chunk's dense parameters are a DistributedOptimizer of their own, first in the ChainedOptimizer, so its
    weight-decay and no-weight-decay groups are made (and stepped) before the other chunk's; one optimizer over
    both chunks makes the weight-decay group of both first. The same shards, the same bytes."""
    def order(flag: bool) -> tuple[list[str], list[str], int]:
        run = tiny_run(pp=2, vpp=2, layers=4, dp=2, zero=1, iterations=1, schedule="interleaved",
                       overlap_param_gather_with_optimizer_step=flag)
        tl = build_timeline(run, uniform_template)
        ev, names = _events(tl)
        made = [str(n) for n, s in zip(names, ev.sign, strict=True) if s > 0]
        masters = [n[len("static.master."):] for n in made if n.startswith("static.master.")]
        moments = [n[len("static.moments."):-len(".exp_avg")] for n in made if n.endswith(".exp_avg")]
        return masters, moments, int(ev.size[np.char.startswith(names.astype(str), "static.")].sum())

    split, split_moments, split_bytes = order(True)
    joint, joint_moments, joint_bytes = order(False)
    assert split_moments == split and joint_moments == joint and split_bytes == joint_bytes
    assert sorted(split) == sorted(joint)

    def no_wd(n: str) -> bool:
        return "layernorm" in n or n.endswith(".bias")

    chunk0 = [n for n in joint if n.startswith(("embedding.", "layers.0."))]
    chunk2 = [n for n in joint if n.startswith("layers.2.")]
    assert chunk0 and chunk2 and any(map(no_wd, chunk0)) and len(chunk0) + len(chunk2) == len(joint)
    assert split == [n for n in chunk0 if not no_wd(n)] + [n for n in chunk0 if no_wd(n)] + \
        [n for n in chunk2 if not no_wd(n)] + [n for n in chunk2 if no_wd(n)]
    assert joint == [n for n in chunk0 + chunk2 if not no_wd(n)] + [n for n in chunk0 + chunk2 if no_wd(n)]
