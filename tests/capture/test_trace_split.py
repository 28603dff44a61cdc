"""Input- and weight-gradient split of a captured backward: under ZB-H1 a traced model's W runs
the dW GEMMs, keeps only GEMM inputs past I, and every storage is still made and freed once."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from sources import template_of

pytest.importorskip("torch")
pytest.importorskip("transformers")

from timeline.graph.trace.split import GEMMS, weight_grad_ops  # noqa: E402
from timeline.io.runfile import load_run  # noqa: E402
from timeline.result.build import build_timeline  # noqa: E402

ZB = ["model.profile=megatron", "parallel.pp=2", "training.num_microbatches=4", "schedule.kind=zb-h1"]


def base(name: str) -> str:
    return name.removeprefix("aten.").split(".")[0]


def test_weight_gradient_ops_are_the_dw_gemms(llama_run):
    """Llama: 7 projections per layer and the head; norms and the embedding stay with I."""
    trace = load_run(llama_run).trace
    w = [trace.ops[i] for i in weight_grad_ops(trace)]
    assert sum(base(o.name) == "mm" for o in w) == 2 * 7 + 1
    assert {base(o.name) for o in w} == {"mm", "t", "add_"}


def test_moe_expert_weights_split_too(dsv3_run):
    trace = load_run(dsv3_run).trace
    assert sum(base(trace.ops[i].name) == "_grouped_mm" for i in weight_grad_ops(trace)) == 2


@pytest.mark.parametrize("fixture", ["llama_run", "dsv3_run"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_zb_h1_w_runs_gemms_and_keeps_only_their_inputs(fixture, recompute, request):
    run = load_run(request.getfixturevalue(fixture), [*ZB, f"recompute.policy={recompute}"])
    trace = run.trace
    gemm_inputs = {s for i in weight_grad_ops(trace) if base(trace.ops[i].name) in GEMMS for s in trace.ops[i].inputs}
    for c in (0, 1):
        t = template_of(run, c)
        assert sum(op.flops for op in t.backward_w) > 0
        for phases in ((t.forward, t.backward_i, t.backward_w), (t.forward, t.backward)):
            allocs = Counter(x.storage for ops in phases for op in ops for x in op.allocs)
            frees = Counter(s for ops in phases for op in ops for s in op.frees)
            assert set(allocs.values()) == {1} and frees == allocs
        activations = {x.storage for op in (*t.forward, *(o for o in t.backward_i if o.recompute)) for x in op.allocs}
        past_i = [s for op in t.backward_w for s in op.frees if s in activations]
        assert past_i
        for name in past_i:  # <module>:<op>#<id>[@recompute]: the captured storage id
            assert int(re.search(r"#(\d+)(@recompute)?$", name).group(1)) in gemm_inputs, name
    spans = [s for d in (0, 1) for s in build_timeline(run).sim.spans[d] if s.kind == "W"]
    assert spans and all(s.end_us > s.start_us for s in spans)
