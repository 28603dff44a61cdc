"""The analytic source hands its forward ops on in the order the families record them, unsorted
(``graph/analytic.py: forward_ops``): that order must be a dataflow order — every tensor an op reads
is made by an op before it, or by none (a parameter, the batch, a received activation). Held on every
family and on the rewrites that touch recorded ops (FP8's in place, MTP on a stage of its own)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers_run import TINY_MODEL, tiny_run
from sources import forward_ops_of

RUNS = {
    "dense": lambda: tiny_run(tp=2, sp=True),
    "moe": lambda: tiny_run(model=replace(TINY_MODEL, n_routed_experts=4, num_experts_per_tok=2,
                                          moe_intermediate_size=64), ep=2),
    "fp8": lambda: tiny_run(tp=2, sp=True, fp8_recipe="tensorwise"),
    "mtp_apart": lambda: tiny_run(model=replace(TINY_MODEL, num_hidden_layers=4, mtp_layers=1), pp=4, tp=2,
                                  sp=True, layout=(2, 2, 0, 0), mtp_stage=2, megatron_core="0.16.0"),
    "legacy": lambda: tiny_run(use_legacy_models=True),
    "hybrid": lambda: tiny_run(model=replace(TINY_MODEL, num_hidden_layers=4, hybrid_override_pattern="M*-M")),
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_recorded_forward_order_is_a_dataflow_order(name):
    run = RUNS[name]()
    chunks = run.parallel.pp * run.parallel.vpp
    for chunk in range(chunks):
        ops = forward_ops_of(run, chunk)
        made_at = {}
        for i, op in enumerate(ops):
            for t in (*op.outputs.values(), *op.extras.values()):
                made_at.setdefault(t.storage, i)
        for i, op in enumerate(ops):
            for slot, t in op.inputs.items():
                assert made_at.get(t.storage, -1) <= i, (name, chunk, op.name, slot, ops[made_at[t.storage]].name)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_chunk_parameters_in_node_order_are_the_graph_s_topological_order(name):
    from sources import source_of

    from timeline.graph.build import build_chunk_graph, graph_params, node_params

    run = RUNS[name]()
    source = source_of(run)
    for chunk in range(run.parallel.pp * run.parallel.vpp):
        nodes = source.nodes(chunk)
        assert node_params(nodes) == graph_params(build_chunk_graph(nodes, chunk))
