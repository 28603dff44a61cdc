"""Simulator mechanics on a synthetic uniform template (one op per phase): in-flight
micro-batches per rank, the 1F1B iteration time, accounting identities, determinism."""

from __future__ import annotations

import numpy as np
import pytest
from helpers_run import tiny_run
from sources import template_source

from timeline.graph.ops import ChunkTemplate, Op
from timeline.graph.tensors import CATEGORIES, Category, TensorDef
from timeline.result.build import build_timeline
from timeline.spec.run import RunSpec

SAVED = 3 << 20  # bytes one micro-batch leaves saved per chunk
FLOPS = 1e9


def tensor(name: str, size: int, cat: Category) -> TensorDef:
    return TensorDef(name=name, shape=(size,), dtype="uint8", category=cat, module="x", storage=name)


def _uniform_template(run: RunSpec, chunk: int, pp_rank: int | None = None) -> ChunkTemplate:
    fwd = (Op(name="f", module="m", layer=chunk, flops=FLOPS,
              allocs=(tensor("x", SAVED, Category.ACTIVATIONS), tensor("t", 1 << 20, Category.TEMPORARY)),
              frees=("t",)),)
    bi = (Op(name="bi", module="m", layer=chunk, flops=FLOPS, allocs=(tensor("g", 1 << 20, Category.TEMPORARY),),
             frees=("g", "x")),)
    bw = (Op(name="bw", module="m", layer=chunk, flops=FLOPS),)
    return ChunkTemplate(chunk=chunk, forward=fwd, backward_i=bi, backward_w=bw, layer_activation_bytes={chunk: SAVED})


uniform_template = template_source(_uniform_template)


def small_run(pp=4, m=8, kind="1f1b", allocator="ideal", **hw) -> RunSpec:
    """The tiny run with this file's defaults: pp = 4, 8 micro-batches, the ideal allocator."""
    return tiny_run(pp=pp, num_microbatches=m, schedule=kind, allocator=allocator, **hw)


@pytest.mark.parametrize("m", [4, 8, 12])
def test_1f1b_holds_p_minus_r_microbatches(m):
    run = small_run(m=m)
    tl = build_timeline(run, uniform_template)
    for r in range(4):
        act = tl.series(r).by_category["activations"].max()
        assert act == min(4 - r, m) * SAVED


def test_gpipe_holds_all_microbatches():
    tl = build_timeline(small_run(m=6, kind="gpipe"), uniform_template)
    assert tl.series(0).by_category["activations"].max() == 6 * SAVED


def test_1f1b_iteration_time_free_communication():
    run = small_run(pp=4, m=8, latency_us=0.0, network_gbps=1e15)
    tl = build_timeline(run, uniform_template)
    t_f = FLOPS / (run.hardware.bf16_tflops * 1e6 * run.hardware.efficiency)
    t_b = 2 * t_f  # I + W
    spans = [s for row in tl.sim.spans for s in row if s.iteration == 0 and s.kind != "step"]
    assert max(s.end_us for s in spans) == pytest.approx((8 + 4 - 1) * (t_f + t_b), rel=1e-9)


@pytest.mark.parametrize("allocator", ["ideal", "caching"])
def test_accounting_identities(allocator):
    tl = build_timeline(small_run(allocator=allocator), uniform_template)
    for d in range(tl.num_devices):
        s = tl.series(d)
        total = sum(s.by_category[c] for c in CATEGORIES)
        np.testing.assert_array_equal(total, s.requested)
        assert (s.allocated >= s.requested).all() and (s.reserved >= s.allocated).all()
        if allocator == "ideal":
            np.testing.assert_array_equal(s.allocated, s.requested)
        # every tensor freed exactly once, except the static state that lives to the end
        ev = tl.events(d)
        fi = tl.free_index(d)
        allocs = np.flatnonzero(ev.sign > 0)
        never = [tl.sim.names[ev.tensor[i]] for i in allocs if fi[i] < 0]
        assert all(n.startswith(("static.", "workspace.")) for n in never)  # persistent by design
        assert (ev.sign < 0).sum() == len(allocs) - len(never)


def test_deterministic():
    a = build_timeline(small_run(), uniform_template)
    b = build_timeline(small_run(), uniform_template)
    for d in range(a.num_devices):
        for k in ("t_us", "sign", "size", "tensor"):
            np.testing.assert_array_equal(getattr(a.events(d), k), getattr(b.events(d), k))
