"""Megatron's combined 1F1B (``--overlap-moe-expert-parallel-comm``): the pair's halves interleave
node by node in ``TransformerModelChunkSchedulePlan.run``'s order, and before a56a0b001d a backward
layer's nodes keep their inputs' gradients and outputs until the pair ends (``combined_1f1b.py``,
``model_chunk_schedule_plan.py``, ``fine_grained_callables.py`` at 23a1dcaf74)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers_run import TINY_MODEL, sim_plan, tiny_run

from timeline.errors import UserError
from timeline.profiles import LIMITS
from timeline.result.build import build_timeline
from timeline.sim.combined import (
    backward_nodes,
    forward_nodes,
    kept_node_io,
    pair_order,
    pair_shifts,
    router_inputs,
)
from timeline.spec.validate import validate_run

MOE = replace(TINY_MODEL, n_routed_experts=4, moe_intermediate_size=256, num_experts_per_tok=2,
              first_k_dense_replace=0, moe_layer_freq=1)
T, H, K = 128, 256, 2  # tokens per micro-batch (b·s, tp = cp = 1), hidden size, top-k


def _run(**kw):
    return tiny_run(model=MOE, layers=2, pp=1, ep=2, dp=2, combined_1f1b=True, num_microbatches=3, **kw)


def _phases(run):
    p = sim_plan(run)
    return p.compiled[0][(0, "F")], p.compiled[0][(0, "B")]


def test_forward_ops_fall_into_megatrons_layer_nodes():
    f, _ = _phases(_run())
    nodes = forward_nodes(f)
    by_op = dict(zip(f.op_names, nodes.keys, strict=True))
    assert by_op["embedding"] == (-1, "pre") and by_op["output.loss"] == (-1, "post")
    # fine_grained_callables.py: attn ends with the residual; post_attn is norm, router, dispatch preprocess
    assert by_op["layers.1.attn_residual"] == (1, "attn")
    assert by_op["layers.1.mlp.dispatch.permute"] == (1, "post_attn")
    assert by_op["layers.1.mlp.dispatch.all_to_all"] == (1, "dispatch")
    # mlp: dispatch postprocess, experts, combine preprocess; combine: the all-to-all back and the bda
    assert by_op["layers.1.mlp.dispatch.sort_chunks"] == (1, "mlp")
    assert by_op["layers.1.mlp.combine.sort_chunks"] == (1, "mlp")
    assert by_op["layers.1.mlp.combine.all_to_all"] == (1, "combine")
    assert by_op["layers.1.mlp_residual"] == (1, "combine")


def test_pair_order_is_transformer_layer_schedule_plan_run():
    f, b = _phases(_run())
    fm = forward_nodes(f)
    order = pair_order(fm, backward_nodes(b, f, fm))
    layer = [("B", (1, "combine")), ("F", (0, "attn")), ("F", (0, "post_attn")), ("B", (1, "mlp")),
             ("F", (0, "dispatch")), ("B", (1, "dispatch")), ("F", (0, "mlp")), ("F", (0, "combine")),
             ("B", (1, "post_attn")), ("B", (1, "attn"))]
    assert order[:2] == [("F", (-1, "pre")), ("B", (-1, "post"))]
    assert order[2:12] == layer
    assert order[-2:] == [("F", (-1, "post")), ("B", (-1, "pre"))]
    early = pair_order(fm, backward_nodes(b, f, fm), early_attn_release=True)
    assert early[2:12] == layer[:6] + [("B", (1, "post_attn")), ("B", (1, "attn")), ("F", (0, "mlp")),
                                       ("F", (0, "combine"))]


def test_pair_shifts_keep_each_half_in_order_and_fill_the_pair():
    f, b = _phases(_run())
    fm = forward_nodes(f)
    scale, sf, sb = pair_shifts(f, fm, b, backward_nodes(b, f, fm), 1000.0)
    fs, fe = f.op_start * scale + sf, f.op_end * scale + sf
    bs, be = b.op_start * scale + sb, b.op_end * scale + sb
    assert np.all(np.diff(fs) >= -1e-9) and np.all(np.diff(bs) >= -1e-9)
    assert max(fe.max(), be.max()) == pytest.approx(1000.0) and min(fs.min(), bs.min()) == pytest.approx(0.0)
    name_f, name_b = list(f.op_names), list(b.op_names)
    # forward layer 0's attention runs after the backward's last-layer combine, before its experts
    assert fs[name_f.index("layers.0.input_layernorm")] == pytest.approx(be[name_b.index("layers.1.mlp.combine.all_to_all")])
    assert fs[name_f.index("layers.0.input_layernorm")] < bs[name_b.index("layers.1.mlp.experts.linear_fc2")]
    # the forward's loss comes after every backward layer, before the backward's embedding
    assert fs[name_f.index("output.loss")] >= be[name_b.index("layers.0.input_layernorm")] - 1e-9
    assert fe[name_f.index("output.loss")] <= bs[name_b.index("embedding")] + 1e-9


def test_kept_node_io_is_each_node_inputs_gradient_and_the_layer_outputs():
    f, b = _phases(_run())
    mask = kept_node_io(f, forward_nodes(f), b)
    kept = {b.tensor_names[t]: int(s) for t, s in zip(b.ev_tensor[mask], b.ev_size[mask], strict=True)}
    hidden, routed = T * H * 2, T * K * H * 2  # bf16 [T, h] and the T·k routed rows
    want = {"embedding.out": hidden, "grad:embedding.out": hidden}
    for layer in (0, 1):
        p = f"layers.{layer}"
        want |= {f"{p}.attn_residual.out": hidden, f"grad:{p}.attn_residual.out": hidden,  # attn out, post_attn in
                 f"grad:{p}.mlp.dispatch.permuted": routed, f"grad:{p}.mlp.dispatch.permuted_probs": T * K * 2,  # bf16: router dtype ""
                 f"grad:{p}.mlp.dispatch.all_to_all.out": routed,  # mlp's input: the dispatched tokens
                 f"grad:{p}.mlp.combine.unsorted": routed,  # combine's input: the expert output
                 f"{p}.output": hidden}
    want["grad:layers.0.output"] = hidden  # layer 1's input; layer 1's own output gradient is post_process's
    assert kept == want


@pytest.mark.parametrize("keeps", [True, False])
def test_node_io_lives_to_the_pairs_end_only_before_a56a0b001d(keeps):
    run = _run(combined_1f1b_keeps_node_io=keeps)
    f, b = _phases(run)
    mask = kept_node_io(f, forward_nodes(f), b)
    names = {b.tensor_names[t] for t in b.ev_tensor[mask] if b.tensor_names[t].startswith("grad:")}
    tl = build_timeline(run)
    spans = tl.sim.spans[0]
    pair_b = next(s for s in spans if s.kind == "B" and s.overlapped and s.iteration == 0)
    pair_f = next(s for s in spans if s.kind == "F" and s.start_us == pair_b.start_us and s.iteration == 0)
    loss = list(f.op_names).index("output.loss")
    at = pair_f.start_us + f.op_start[loss] * pair_f.scale + pair_f.shift[loss]  # the forward half's loss
    expected = sum(int(s) for t, s in zip(b.ev_tensor[mask], b.ev_size[mask], strict=True)
                   if b.tensor_names[t].startswith("grad:"))
    # at the forward half's loss, the backward half's (micro-batch 0) node-input gradients still live
    ev = tl.events(0)
    n = np.array(tl.sim.names)[ev.tensor]
    m = np.isin(n, list(names)) & (ev.microbatch == pair_b.microbatch) & (ev.iteration == 0) & (ev.t_us <= at)
    live = int(np.sum(ev.sign[m].astype(np.int64) * ev.size[m]))
    # without the keeping, only the gradient the backward's embedding (run after the forward's
    # post-process, TransformerModelChunkSchedulePlan.run) still needs: b_grad, [T, h]
    assert live == (expected if keeps else T * H * 2)
    assert expected > 10 * T * H * 2


def test_schedule_pairs_and_validation():
    tl = build_timeline(_run())
    spans = [s for s in tl.sim.spans[0] if s.iteration == 0 and s.kind != "step"]
    assert [f"{s.kind}{s.microbatch}" for s in sorted(spans, key=lambda s: (s.start_us, s.overlapped))] == \
        ["F0", "F1", "B0", "F2", "B1", "B2"]
    assert [s.overlapped for s in spans if s.kind == "B"] == [True, True, False]
    problems = validate_run(tiny_run(pp=2, combined_1f1b=True), LIMITS)
    assert any(k == "schedule.combined_1f1b" for k, _ in problems)
    problems = validate_run(tiny_run(combined_1f1b_keeps_node_io=True), LIMITS)
    assert any(k == "framework.combined_1f1b_keeps_node_io" for k, _ in problems)
    with pytest.raises(UserError):
        from timeline.pipeline import build_schedule
        build_schedule("1f1b", pp=2, vpp=1, num_microbatches=4, combined_1f1b=True)


def test_delayed_weight_gradients_run_at_each_nodes_backward_dw():
    """``--delay-wgrad-compute`` (``TransformerLayerSchedulePlan.run``, core_v0.14.0 … d98e8a64dd): a layer's experts'
    weight gradients run after its mlp node's backward (and, paired, after the forward's dispatch), its attention's
    after its attention backward, and the last layer the backward reaches keeps its attention ones to the chunk's
    end, after every layer, before the embedding's backward. Their inputs and output gradients live until then."""
    f, b = _phases(_run(delay_wgrad_compute=True))
    _, plain = _phases(_run())
    names, plain_names = list(b.op_names), list(plain.op_names)
    assert sorted(names) == sorted(plain_names)  # the same ops, reordered
    fc2w = names.index("layers.1.mlp.experts.linear_fc2.wgrad")
    assert fc2w > names.index("layers.1.mlp.experts.linear_fc1")  # after the experts' input gradients
    assert plain_names.index("layers.1.mlp.experts.linear_fc2.wgrad") < plain_names.index("layers.1.mlp.experts.linear_fc1")
    assert names.index("layers.1.mlp.experts.linear_fc1.wgrad") < names.index("layers.1.mlp.dispatch.all_to_all")
    qkv1 = names.index("layers.1.self_attn.linear_qkv.wgrad")
    assert qkv1 > names.index("layers.1.input_layernorm") and qkv1 < names.index("layers.0.mlp_residual")
    qkv0 = names.index("layers.0.self_attn.linear_qkv.wgrad")
    assert qkv0 > names.index("layers.0.input_layernorm") and qkv0 < names.index("embedding")
    # paired: the mlp node's weight gradients follow the forward's dispatch, the last layer's attention ones come
    # after every forward layer
    fm = forward_nodes(f)
    bm = backward_nodes(b, f, fm, delay_wgrad=True)
    assert bm.keys[fc2w] == (1, "mlp_dw") and bm.keys[qkv0] == (0, "attn_dw")
    order = pair_order(fm, bm, delay_wgrad=True)
    assert order.index(("B", (1, "mlp_dw"))) == order.index(("F", (0, "dispatch"))) + 1
    assert order.index(("B", (1, "attn_dw"))) == order.index(("B", (1, "attn"))) + 1
    assert order.index(("B", (0, "attn_dw"))) == order.index(("F", (-1, "post"))) - 1
    assert pair_shifts(f, fm, b, bm, 1000.0, delay_wgrad=True) is not None
    # the experts' activation (fc2's input) is kept to the deferred fc2 wgrad
    t = build_timeline(_run(delay_wgrad_compute=True))
    assert t.peak(0).allocated_bytes >= build_timeline(_run()).peak(0).allocated_bytes


def test_delayed_weight_gradients_need_the_combined_schedule():
    problems = dict(validate_run(tiny_run(delay_wgrad_compute=True), LIMITS))
    assert "overlap-moe-expert-parallel-comm" in problems["framework.delay_wgrad_compute"]


def test_from_megatron_maps_delay_wgrad_compute_with_the_overlap_only():
    from timeline.io.megatron_args import from_mapping
    from timeline.io.megatron_write import convert

    args = {"--num-layers": 2, "--hidden-size": 64, "--num-attention-heads": 4, "--seq-length": 128,
            "--max-position-embeddings": 128, "--micro-batch-size": 1, "--global-batch-size": 8, "--bf16": True,
            "--vocab-size": 1000, "--num-experts": 4, "--moe-router-topk": 2, "--moe-grouped-gemm": True,
            "--moe-token-dispatcher-type": "alltoall", "--expert-model-parallel-size": 2,
            "--delay-wgrad-compute": True}
    conv = convert(from_mapping(args | {"--overlap-moe-expert-parallel-comm": True}), world_size=2,
                   megatron_core="0.16.0")
    assert conv.sections["framework"]["delay_wgrad_compute"] is True
    with pytest.raises(UserError, match="^--delay-wgrad-compute without --overlap-moe-expert-parallel-comm"):
        convert(from_mapping(args), world_size=2, megatron_core="0.16.0")
    with pytest.raises(UserError, match="^--use-megatron-fsdp with --delay-wgrad-compute"):
        convert(from_mapping(args | {"--use-megatron-fsdp": True, "--use-distributed-optimizer": True}),
                world_size=2, megatron_core="0.16.0")


@pytest.mark.parametrize("keeps", [True, False])
def test_alltoall_probs_keep_each_moe_layers_router_input_and_its_gradient_past_the_step(keeps):
    """``MoEAlltoAllTokenDispatcher.dispatch_preprocess``'s ``self.probs = probs`` keeps the router's autograd
    graph, whose leaf is the ``post_attn`` node's detached input (the attention output, bf16 [T, h]) with the
    ``.grad`` its backward left: after the iteration both live on per MoE layer, through the optimizer step,
    until the layer's next forward stores new probabilities."""
    run = _run(combined_1f1b_keeps_node_io=keeps, iterations=2)
    f, _ = _phases(run)
    held = router_inputs(f, forward_nodes(f))
    assert {layer: name for layer, (name, _) in held.items()} == {0: "layers.0.attn_residual.out",
                                                                  1: "layers.1.attn_residual.out"}
    assert all(f.op_names[op] == f"layers.{layer}.mlp.dispatch.permute" for layer, (_, op) in held.items())
    tl = build_timeline(run)
    ev = tl.events(0)
    names = np.array(tl.sim.names)[ev.tensor]
    spans = tl.sim.spans[0]
    step = next(s for s in spans if s.kind == "step" and s.iteration == 0)
    last = run.training.num_microbatches - 1
    hidden = T * H * 2  # bf16 [T, h]: the attention output and its gradient, from the shapes
    nxt = next(s for s in spans if s.kind == "F" and s.iteration == 1 and s.microbatch == 0)
    for layer in (0, 1):
        for name in (f"layers.{layer}.attn_residual.out", f"grad:layers.{layer}.attn_residual.out"):
            m = (names == name) & (ev.microbatch == last) & (ev.iteration <= 1)
            alloc = m & (ev.sign > 0) & (ev.iteration == 0)
            free = m & (ev.sign < 0)
            assert int(ev.size[alloc].sum()) == hidden
            # freed only where the next iteration's first forward reaches the layer's dispatch preprocess
            assert free.sum() == 1 and float(ev.t_us[free][0]) > step.end_us
            op = held[layer][1]
            assert float(ev.t_us[free][0]) == pytest.approx(nxt.start_us + f.op_start[op] * nxt.scale)
    # after the step, 2 MoE layers x (input + gradient) of the last micro-batch still live
    live = (np.isin(names, [f"{g}layers.{k}.attn_residual.out" for g in ("", "grad:") for k in (0, 1)])
            & (ev.iteration <= 0) & (ev.t_us <= step.end_us))
    assert int(np.sum(ev.sign[live].astype(np.int64) * ev.size[live])) == 2 * 2 * hidden
    # a dense first layer (first_k_dense_replace = 1) has no router: only the MoE layer's input is held
    dense = tiny_run(model=replace(MOE, first_k_dense_replace=1), layers=2, pp=1, ep=2, dp=2, combined_1f1b=True,
                     num_microbatches=3, combined_1f1b_keeps_node_io=keeps, iterations=2)
    f_dense, _ = _phases(dense)
    assert {layer: name for layer, (name, _) in router_inputs(f_dense, forward_nodes(f_dense)).items()} == {
        1: "layers.1.attn_residual.out"}
    # plain 1F1B runs the whole layer in one autograd graph: no detached leaf for the probs to keep
    plain = build_timeline(tiny_run(model=MOE, layers=2, pp=1, ep=2, dp=2, num_microbatches=3, iterations=2))
    ev = plain.events(0)
    names = np.array(plain.sim.names)[ev.tensor]
    m = np.isin(names, ["layers.1.attn_residual.out", "grad:layers.1.attn_residual.out"]) & (ev.microbatch == last)
    assert set(ev.iteration[m & (ev.sign < 0)].tolist()) == {0, 1}
    assert int(np.sum(ev.sign[m & (ev.iteration == 0)].astype(np.int64) * ev.size[m & (ev.iteration == 0)])) == 0
