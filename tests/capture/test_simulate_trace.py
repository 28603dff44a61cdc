"""A captured model simulated on one device reproduces PyTorch's own measured peak; repeated layers
add exactly their captured bytes; under 1F1B a trace shows the analytic path's (p − r) in-flight."""

from __future__ import annotations

import json

import pytest
from sources import template_of

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from captures import DSV3, LLAMA, memtracker_peak  # noqa: E402

from timeline.io.runfile import load_run  # noqa: E402
from timeline.result.build import build_timeline  # noqa: E402


def sim_peak(run_file, *overrides: str) -> int:
    run = load_run(run_file, list(overrides))
    return build_timeline(run).peak(0).requested_bytes


@pytest.mark.parametrize(("config", "fixture"), [(LLAMA, "llama_run"), (DSV3, "dsv3_run")], ids=["llama", "dsv3"])
def test_peak_matches_memtracker(config, fixture, request):
    measured = memtracker_peak(config)
    simulated = sim_peak(request.getfixturevalue(fixture))
    assert simulated == pytest.approx(measured, rel=0.01)


def test_one_more_layer_adds_its_captured_bytes(llama_run):
    run3 = load_run(llama_run, ["model.num_layers=3"])
    t = template_of(run3, 0)
    params = sum(p.nbytes for p in run3.trace.params if p.layer == 1)  # bf16 weights, bf16 grads
    added = sim_peak(llama_run, "model.num_layers=3") - sim_peak(llama_run)
    assert t.layer_activation_bytes[2] == t.layer_activation_bytes[1]
    assert added == t.layer_activation_bytes[2] + 2 * params


def test_1f1b_pp4_holds_p_minus_r_microbatches(llama_run):
    run = load_run(llama_run, ["model.num_layers=8", "parallel.pp=4", "model.profile=megatron",
                               "training.num_microbatches=8", "training.iterations=2",
                               "training.optimizer_step=true"])
    tl = build_timeline(run)
    for r in range(4):
        per_microbatch = template_of(run, r).activation_bytes
        assert tl.series(r).by_category["activations"].max() == (4 - r) * per_microbatch


def test_static_json_reports_trace_layers(llama_run, capsys):
    from timeline.cli import main

    assert main(["static", str(llama_run), "--set", "model.num_layers=4", "--json"]) == 0
    dev = json.loads(capsys.readouterr().out)["devices"][0]
    layers = {e["layer"]: e["bytes"] for e in dev["layer_activation_bytes"]}
    assert sorted(layers) == [-1, 0, 1, 2, 3] and len({layers[k] for k in range(4)}) == 1
