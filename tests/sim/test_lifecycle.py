"""Static state appears when the profile creates it; ZeRO buffers follow DeepSpeed outside
Megatron (reduce bucket from the first backward, per-action parameter gathers under ZeRO-3)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from sources import state_bytes_of
from test_engine import small_run, uniform_template

from timeline.graph.megatron_param import megatron_params
from timeline.result.build import build_timeline
from timeline.sim.static_state import largest_layer_bytes


def names_of(tl, d, cat=None):
    ev = tl.events(d)
    return {tl.sim.names[i] for i in ev.tensor[ev.sign > 0]}


def test_megatron_moments_created_at_first_step():
    run = small_run()
    tl = build_timeline(run, uniform_template)
    ev = tl.events(0)
    idx = {tl.sim.names[t]: i for i, t in enumerate(ev.tensor) if ev.sign[i] > 0 and
           tl.sim.names[t].startswith("static.")}
    weights = [i for n, i in idx.items() if n.startswith("static.weights.")]
    masters = [i for n, i in idx.items() if n.startswith("static.master.")]
    moments = [i for n, i in idx.items() if n.startswith("static.moments")]
    assert all(ev.t_us[i] == 0 for i in weights + masters)
    first_step = min(s.start_us for s in tl.sim.spans[0] if s.kind == "step")
    assert moments and all(ev.t_us[i] == first_step for i in moments)
    dev = tl.sim.devices[0]
    w, g, o = state_bytes_of(run, dev.tensors)
    # without the distributed optimizer the buffer has no padding: the flat rule's bytes, each weight on
    # its own (never freed) and one grad buffer for the chunk
    assert sum(ev.size[i] for i in weights) == w and ev.size[idx["static.grad_buffer.chunk0"]] == g
    assert not any(tl.sim.names[t].startswith("static.weights.") for t in ev.tensor[ev.sign < 0])
    assert sum(ev.size[i] for i in masters + moments) == o
    # one master clone and two moments per Megatron parameter (Megatron's order; q/k/v one linear_qkv)
    params = megatron_params([t for t in dev.tensors if t.trainable])
    assert len(params) < sum(t.trainable for t in dev.tensors)
    assert len(weights) == len(masters) == len(moments) // 2 == len(params)
    assert "zero3.gathered_params" not in names_of(tl, 0) and "dp.reduce_bucket" not in names_of(tl, 0)


def test_paper_zero3_gathers_per_action_and_keeps_a_reduce_bucket():
    base = small_run()
    run = replace(base, profile="paper", training=replace(base.training, zero=3),
                  parallel=replace(base.parallel, dp=4))
    tl = build_timeline(run, uniform_template)
    dev = tl.sim.devices[1]
    ev = tl.events(1)
    names = np.array(tl.sim.names)[ev.tensor]
    gathers = ev.size[(names == "zero3.gathered_params") & (ev.sign > 0)]
    actions = sum(1 for s in tl.sim.spans[1] if s.kind != "step")
    assert len(gathers) == actions
    layer = largest_layer_bytes(dev, "bf16")
    assert (gathers == layer + min(50_000_000 * 2, layer)).all()
    bucket = ev.size[(names == "dp.reduce_bucket") & (ev.sign > 0)]
    assert len(bucket) == 1 and bucket[0] == min(500_000_000, sum(t.numel for t in dev.tensors)) * 4
