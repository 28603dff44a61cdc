"""Megatron-FSDP's static events, its all-gather / gradient-bucket plan (timeline.sim.megatron_fsdp) and their events
(timeline.sim.fsdp_windows) on a tiny device: an embedding group and three 512-element decoder layers over dp = 4."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from timeline.graph.fsdp_buffers import fsdp_buffers
from timeline.graph.tensors import param
from timeline.placement.devices import StaticDevice
from timeline.sim.compiled import CompiledPhase
from timeline.sim.engine import Span
from timeline.sim.fsdp_windows import AG_STREAM, action_events, iteration_events, requested, stream_of
from timeline.sim.megatron_fsdp import fsdp_events, fsdp_plan
from timeline.spec.framework import FrameworkSpec
from timeline.spec.run import ParallelSpec, TrainingSpec

EMB = param("embedding.word_embeddings.weight", (1000, 8), module="embedding", dtype="bf16")
FN = param("final_norm.weight", (8,), module="head", dtype="bf16")
L = [param(f"layers.{i}.mlp.linear_fc1.weight", (64, 8), module="mlp", dtype="bf16") for i in range(3)]
TR = TrainingSpec(zero=1)  # bf16 weights, fp32 grads and main weights
PACKAGE = FrameworkSpec(fsdp_sharding="optim_grads_params")
CUSTOM = replace(PACKAGE, megatron_fsdp_package=False)


def _device(strategy: str = "optim_grads_params") -> StaticDevice:
    tensors = (EMB, *L, FN)
    bufs = fsdp_buffers([(0, tensors)], strategy=strategy, bucket_size=None, tr=TR, par=ParallelSpec(dp=4),
                        expert_rule="routed")
    return StaticDevice(device=0, pp_rank=0, stages=(0,), represents=4, layers=(0, 1, 2), params_by_module={},
                        weights_bytes=0, grads_bytes=0, optimizer_bytes=0, tensors=tensors, dp_buffers=bufs)


def _phase(names: list[str]) -> CompiledPhase:
    """Ops of 10 µs each, back to back, no memory events of their own."""
    n = len(names)
    empty = np.zeros(0)
    return CompiledPhase(duration_us=10.0 * n, op_names=tuple(names), op_streams=("compute",) * n,
                         op_layers=(-1,) * n, op_recompute=(False,) * n, op_flops=np.zeros(n),
                         op_start=np.arange(n) * 10.0, op_end=np.arange(n) * 10.0 + 10.0, ev_offset=empty,
                         ev_sign=np.zeros(0, dtype=np.int8), ev_size=np.zeros(0, dtype=np.int64),
                         ev_cat=np.zeros(0, dtype=np.int8), ev_tensor=np.zeros(0, dtype=np.int32),
                         ev_op=np.zeros(0, dtype=np.int32), tensor_names=())


FORWARD = _phase(["embedding", "layers.0.mlp.linear_fc1", "layers.1.mlp.linear_fc1", "layers.2.mlp.linear_fc1",
                  "final_norm", "output.output_layer", "output.loss"])
BACKWARD = _phase(["output.loss", "output.output_layer", "output.output_layer.wgrad", "final_norm",
                   "layers.2.mlp.linear_fc1", "layers.1.mlp.linear_fc1", "layers.0.mlp.linear_fc1", "embedding"])


def _span(kind: str, start: float, end: float, iteration: int = 0) -> Span:
    return Span(rank=0, position=0, iteration=iteration, stage=0, kind=kind, microbatch=0, start_us=start,
                end_us=end)


def _held(events) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in events:
        out[e[3]] = out.get(e[3], 0) + e[1] * e[2]
    return {k: v for k, v in out.items() if v}


def _max_live(events) -> int:
    live = peak = 0
    for _, sign, size, _ in events:
        live += sign * size
        peak = max(peak, live)
    return peak


def test_optim_grads_params_holds_shards_and_no_gathered_group_as_static_state():
    held: dict[str, int] = {}
    for _, name, size, _, sign in fsdp_events(TR, _device()):
        held[name] = held.get(name, 0) + sign * size
    live = {k: v for k, v in held.items() if v}
    # embedding + final norm: 8000 + 8 → 8064 (lcm(4, 128)): bf16 shard 2016·2, fp32 main shard of real elements
    assert live["static.param_buffer.0.chunk0.rest"] == 2016 * 2
    assert live["static.master.0.chunk0.rest"] == (8008 - 6048) * 4
    # each layer 512 elements → 512: shard 128; the last rank's main shard 128 fp32
    assert live["static.param_buffer.1.chunk0.layers.0"] == 128 * 2
    assert live["static.grad_buffer.fsdp"] == (2016 + 3 * 128) * 4
    # the gathers are per iteration now (fsdp_windows), the parameters' own storages and init buckets gone
    assert not any(k.startswith(("static.weights.", "fsdp.")) for k in live)


def test_the_plan_budgets_follow_the_version():
    package = fsdp_plan(TR, _device(), PACKAGE, None)
    custom = fsdp_plan(TR, _device(), CUSTOM, None)
    assert package is not None and custom is not None
    (c,) = package.chunks
    assert [(g.unit, g.elements, g.weight_bytes, g.grad_bytes) for g in c.groups] == [
        ("", 8064, 8064 * 2, 8064 * 4)] + [(f"layers.{i}", 512, 512 * 2, 512 * 4) for i in range(3)]
    assert c.groups[0].modules == ("embedding.word_embeddings", "final_norm")
    # the package: max(1e9, 2 × 512) elements, half of it ahead; custom_fsdp: 2 × the mean unit, counting the request
    assert (c.prefetch_elements, c.queue_elements, c.prefetch_counts_requested) == (500_000_000, 10**9, False)
    (k,) = custom.chunks
    assert (k.prefetch_elements, k.queue_elements, k.prefetch_counts_requested) == (1024, 1024, True)
    assert (package.step_prefetch, package.released_after_step) == (True, False)
    released = fsdp_plan(TR, _device(), replace(PACKAGE, log_params_norm=True), None)
    assert released is not None and released.released_after_step
    assert not custom.step_prefetch and not replace(CUSTOM, log_params_norm=True).megatron_fsdp_package
    assert fsdp_plan(TR, _device("no_shard"), replace(PACKAGE, fsdp_sharding="no_shard"), None) is None


def test_a_request_prefetches_all_the_package_budget_allows_and_custom_fsdp_one_unit():
    (c,) = fsdp_plan(TR, _device(), PACKAGE, None).chunks
    (k,) = fsdp_plan(TR, _device(), CUSTOM, None).chunks
    assert requested(c, 1, 1) == [1, 2, 3]
    assert requested(c, 0, 1) == [0, 1, 2, 3]
    assert requested(c, 3, -1) == [3, 2, 1, 0]
    assert requested(k, 1, 1) == [1, 2]  # 512 + 512 reaches 2 × 512
    assert requested(k, 0, 1) == [0]  # the embedding group alone is past it
    assert requested(k, 3, -1) == [3, 2]


def test_a_forward_gathers_every_unit_at_the_embedding_and_releases_each_after_it_runs():
    plan = fsdp_plan(TR, _device(), PACKAGE, None)
    ev = action_events(plan, _span("F", 100.0, 170.0), FORWARD)
    unit = 512 * 2
    assert [(t, s) for t, s, _, _ in ev] == [(100.0, 1)] * 3 + [(120.0, -1), (130.0, -1), (140.0, -1)]
    assert _max_live(ev) == 3 * unit and not _held(ev)
    assert all(stream_of(name) == AG_STREAM for *_, name in ev)
    custom = action_events(fsdp_plan(TR, _device(), CUSTOM, None), _span("F", 100.0, 170.0), FORWARD)
    assert _max_live(custom) == 2 * unit  # the unit and the next


def test_a_backward_gathers_in_reverse_and_queues_every_grad_bucket_until_its_end():
    plan = fsdp_plan(TR, _device(), PACKAGE, None)
    ev = action_events(plan, _span("B", 0.0, 80.0), BACKWARD)
    grads = [e for e in ev if e[3].startswith("fsdp.grad_bucket.")]
    assert all(stream_of(e[3]) == 0 for e in grads)
    # the non-unit group's bucket from the final norm's first gradient (the tied embedding waits for its own
    # backward); each unit's at its first op, all drained at the end (1B-element queue)
    assert [(t, s, size) for t, s, size, _ in grads] == [
        (30.0, 1, 8064 * 4), (40.0, 1, 2048), (50.0, 1, 2048), (60.0, 1, 2048),
        (80.0, -1, 2048), (80.0, -1, 2048), (80.0, -1, 2048), (80.0, -1, 8064 * 4)]
    assert not _held(ev)
    # custom_fsdp: the queue (2 × 512 elements) pops only while it holds more than that: with three units, never
    custom = action_events(fsdp_plan(TR, _device(), CUSTOM, None), _span("B", 0.0, 80.0), BACKWARD)
    frees = [(t, name) for t, s, _, name in custom if s < 0 and name.startswith("fsdp.grad_bucket.chunk0.layers")]
    assert frees == [(80.0, "fsdp.grad_bucket.chunk0.layers.2"), (80.0, "fsdp.grad_bucket.chunk0.layers.1"),
                     (80.0, "fsdp.grad_bucket.chunk0.layers.0")]


def _iterations():
    return [_span("F", 0.0, 70.0), _span("B", 70.0, 150.0), _span("step", 150.0, 160.0),
            _span("F", 160.0, 230.0, 1), _span("B", 230.0, 310.0, 1), _span("step", 310.0, 320.0, 1)]


def _after_first_step(plan) -> dict[str, int]:
    spans = _iterations()
    return _held([e for e, a in iteration_events(plan, spans) if spans[a].iteration <= 0])


def test_what_the_step_leaves_gathered_follows_the_version_and_log_params_norm():
    rest = 8064 * 2
    # custom_fsdp: start_param_sync gathers bucket 0 alone (Megatron-LM 194b2be238)
    assert _after_first_step(fsdp_plan(TR, _device(), CUSTOM, None)) == {"fsdp.gathered.chunk0.rest": rest}
    # the package: bucket 0 and everything its prefetch reaches
    assert sum(_after_first_step(fsdp_plan(TR, _device(), PACKAGE, None)).values()) == rest + 3 * 512 * 2
    # … released by calc_params_l2_norm's stop_communication under --log-params-norm (af28b5a559 on)
    assert _after_first_step(fsdp_plan(TR, _device(), replace(PACKAGE, log_params_norm=True), None)) == {}
    # within an iteration the non-unit group is gathered from its first action to its step
    spans = _iterations()
    ev = [(e, a) for e, a in iteration_events(fsdp_plan(TR, _device(), replace(PACKAGE, log_params_norm=True),
                                                          None), spans) if e[3] == "fsdp.gathered.chunk0.rest"]
    assert [(e[0], e[1]) for e, _ in ev][:2] == [(0.0, 1), (150.0, -1)]


def test_megatron_fsdp_needs_the_distributed_optimizer():
    from helpers_run import tiny_run

    from timeline.profiles import LIMITS
    from timeline.spec.validate import validate_run

    base = tiny_run()
    run = replace(base, framework=FrameworkSpec(fsdp_sharding="optim_grads_params"),
                  training=replace(base.training, zero=0))
    assert [k for k, _ in validate_run(run, LIMITS)] == ["framework.fsdp_sharding"]
    assert validate_run(replace(run, training=replace(base.training, zero=1)), LIMITS) == []
    # Muon: Megatron-LM rejects it under Megatron-FSDP; the precision-aware optimizer's masters: not modelled
    for training in (replace(base.training, zero=1, optimizer="muon", muon_layer_wise=True),
                     replace(base.training, zero=1, precision_aware=True)):
        assert "framework.fsdp_sharding" in [k for k, _ in validate_run(replace(run, training=training), LIMITS)]
    assert validate_run(replace(run, training=replace(base.training, zero=1, optimizer="sgd")), LIMITS) == []
    # CUDA graphs of a Megatron-FSDP job: not modelled
    graphed = replace(run, training=replace(base.training, zero=1),
                      framework=replace(run.framework, cuda_graph_impl="transformer_engine"))
    assert "framework.cuda_graph_impl" in [k for k, _ in validate_run(graphed, LIMITS)]


def test_the_all_gather_stream_is_no_other_modules_stream_nor_a_private_pool():
    """Its cached blocks go back to CUDA with empty_cache like any ordinary stream's (a CUDA graph's pool's do not)."""
    from timeline.sim.graph_capture import GRAPH_POOL, TE_WARMUP
    from timeline.sim.memory import PRIVATE_POOLS

    assert AG_STREAM not in (0, GRAPH_POOL, TE_WARMUP) and AG_STREAM not in PRIVATE_POOLS


def test_sgd_keeps_one_momentum_per_owned_shard_made_in_the_first_step():
    """The optimizer's parameters are Megatron-FSDP's main-weight shards (no clone): SGD's momentum_buffer per
    owned shard (timeline.graph.optim_state.main_params over the FSDP buffers' slots) in the first step, Adam's two
    moments likewise; the fp32 main weights are the buffers' own either way."""
    from helpers_run import tiny_run

    from timeline.result.build import build_timeline
    from timeline.sim.optimizer_step import step_transients

    def device(**over):
        run = tiny_run(layers=2, dp=4, zero=1, fsdp_sharding="optim_grads_params", **over)
        dev = build_timeline(run).sim.devices[0]
        made = [(n, b) for n, b, sign, _, first in step_transients(run.training, dev, "routed") if first and sign > 0]
        return dev, made

    adam, adam_made = device()
    sgd, sgd_made = device(optimizer="sgd", sgd_momentum=0.9)
    no_momentum, none_made = device(optimizer="sgd", sgd_momentum=0.0)
    owned = sum(s.shard_numel for b in adam.dp_buffers for s in b.slots)
    assert owned and (adam.optimizer_bytes, sgd.optimizer_bytes, no_momentum.optimizer_bytes) == (
        owned * 12, owned * 8, owned * 4)  # fp32 main weights, then 2, 1 or 0 fp32 states
    assert sum(b for _, b in sgd_made) == owned * 4 and all(n.endswith(".momentum_buffer") for n, _ in sgd_made)
    assert sum(b for _, b in adam_made) == owned * 8 and none_made == []


def test_a_run_keeps_the_steps_gathers_unless_log_params_norm_releases_them():
    """End to end (2 layers, pp = 1, dp = 4): after iteration 1, what the step's start_param_sync gathered — the
    embedding group and both units, whole — is held unless --log-params-norm; the gathers use their own stream."""
    from helpers_run import tiny_run

    from timeline.result.build import build_timeline

    def steady(**over) -> tuple[int, object]:
        tl = build_timeline(tiny_run(layers=2, dp=4, zero=1, fsdp_sharding="optim_grads_params", **over))
        ev, its = tl.events(0), tl.event_iterations(0)
        sel = its <= 0
        return int((ev.size[sel] * ev.sign[sel]).sum()), tl

    kept, tl = steady()
    released, _ = steady(log_params_norm=True)
    bufs = tl.sim.devices[0].dp_buffers
    assert kept - released == sum(b.numel for b in bufs) * 2  # bf16, every group gathered whole
    ev = tl.events(0)
    gathers = np.array([tl.names[t].startswith(("fsdp.unit.", "fsdp.gathered.")) for t in ev.tensor])
    assert gathers.any() and (ev.stream[gathers] == AG_STREAM).all() and not ev.stream[~gathers].any()
