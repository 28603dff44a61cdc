"""Per-device comparison metrics on the synthetic recompute-aware template: activations ordered
none ≥ selective ≥ full and recompute time the reverse on every device; recompute time is the
recomputed FLOPs over the cost model's throughput; worker processes change nothing."""

from __future__ import annotations

import pytest
from recompute_template import LAYER_FLOPS, MODULES, recompute_template, tiny_run

from timeline.cli.variants import policy_variants
from timeline.compare.metrics import simulate_variants
from timeline.compare.report import SCHEMA, compare_columns, compare_dict
from timeline.sim.cost import CostModel

POLICIES = "none,selective:core_attn,selective:core_attn+mlp,full:uniform:1,full:block:2,2"


@pytest.fixture(scope="module")
def results():
    return simulate_variants(policy_variants(tiny_run(), [POLICIES]), recompute_template, workers=1)


def test_names_follow_the_grammar(results):
    assert [r.name for r in results] == POLICIES.split(",")[:4] + ["full:block:2,2"]


def test_activations_fall_and_recompute_rises_from_none_to_full(results):
    none, sel1, sel2, full_u, full_b = results
    for order in ([none, sel1, sel2, full_u], [none, sel1, sel2, full_b]):
        for d in range(len(none.devices)):
            acts = [r.devices[d].peak_activation_bytes for r in order]
            times = [r.devices[d].recompute_time_us for r in order]
            assert acts == sorted(acts, reverse=True) and acts[0] > acts[-1]
            assert times == sorted(times) and times[0] == 0.0 < times[-1]
            assert [r.devices[d].peak_reserved_bytes for r in order][0] >= order[-1].devices[d].peak_reserved_bytes


def test_recompute_time_is_flops_over_throughput_for_a_single_layer():
    run = tiny_run(pp=2, layers_per_rank=1)
    (res,) = simulate_variants(policy_variants(run, ["full:uniform:1"]), recompute_template, workers=1)
    per_us = CostModel.of(run.hardware, run.parallel).flops_per_us
    for d in res.devices:
        assert d.recompute_flops == run.training.num_microbatches * LAYER_FLOPS  # per iteration
        assert d.recompute_time_us == pytest.approx(d.recompute_flops / per_us, rel=1e-12)


def test_selective_recomputes_only_its_modules(results):
    core = dict((m, f) for m, _, f in MODULES)["core_attn"]
    for d in results[1].devices:
        assert d.recompute_flops == 4 * 2 * core  # micro-batches × layers per rank × module FLOPs


def test_processes_give_the_same_results(results):
    again = simulate_variants(policy_variants(tiny_run(), [POLICIES]), recompute_template, workers=2)
    assert [r.devices for r in again] == [r.devices for r in results]


def test_report_json_and_columns(results):
    doc = compare_dict(results)
    assert doc["schema"] == SCHEMA and [v["name"] for v in doc["variants"]] == [r.name for r in results]
    dev = doc["variants"][0]["devices"][0]
    for key, kind in (("device", int), ("pp_rank", int), ("peak_allocated_bytes", int), ("peak_reserved_bytes", int),
                      ("recompute_flops", float), ("recompute_time_us", float), ("iteration_time_us", float),
                      ("oom", bool)):
        assert type(dev[key]) is kind, key
    cols = compare_columns(results)
    assert len(cols["variant"]) == len(cols["peak_reserved_bytes"]) == 2 * len(results)
    assert cols["oom"].dtype == bool and cols["recompute_flops"].dtype.kind == "f"
