"""The same checks on the real op templates (llama3-8b, 4 layers, pp=2, 4 micro-batches, seq
16384 so that activations matter): saved activations none ≥ selective ≥ full and recompute time
the reverse on every device; simulated recompute time equals the templates' static cost (the
roofline of the recompute ops), at least their FLOPs over the throughput; fit's answer fits.

``selective:core_attn`` alone stands outside the ordering under the ``megatron`` profile: with fused
attention (no s² tensors to drop) Megatron's checkpoint (MC transformer/attention.py
``_checkpointed_attention_forward``) keeps query, key and the value *view*, hence the whole fused QKV
output, in place of the value copy and the output it would otherwise keep, and can hold more."""

from __future__ import annotations

import pytest
from sources import statics_of

from timeline.cli.fit import fit_run as fit
from timeline.cli.variants import policy_variants
from timeline.compare.metrics import simulate_variants
from timeline.graph.source import model_source
from timeline.io.runfile import load_run
from timeline.sim.cost import CostModel
from timeline.spec.recompute import parse_recompute

RUN = """
name = "llama-small"
[model]
preset = "llama3-8b"
num_hidden_layers = 4
[parallel]
pp = 2
[training]
seq_len = 16384
num_microbatches = 4
iterations = 1
"""
POLICIES = ["none", "selective:core_attn+layernorm+mlp", "full:uniform:1", "full:block:2,2", "selective:core_attn"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("real") / "run.toml"
    path.write_text(RUN)
    return load_run(path, [])


def test_real_ordering_and_cost(run):
    results = simulate_variants(policy_variants(run, [",".join(POLICIES)]), model_source, workers=1)
    st, per_us = statics_of(run), CostModel.of(run.hardware, run.parallel).flops_per_us
    for chain in (results[:3], results[:2] + results[3:4]):
        for d in range(run.parallel.pp):
            acts = [r.devices[d].peak_activation_bytes for r in chain]
            times = [r.devices[d].recompute_time_us for r in chain]
            assert acts == sorted(acts, reverse=True) and acts[0] > acts[-1]
            assert times == sorted(times) and times[0] == 0.0 < times[-1]
    assert all(dev.recompute_time_us > 0.0 for dev in results[4].devices)
    for res in results:
        static = st.candidate(parse_recompute(res.recompute))
        for d, dev in enumerate(res.devices):
            assert dev.recompute_time_us == pytest.approx(static.recompute_time_us[d], rel=1e-9)
            assert dev.recompute_flops == pytest.approx(static.recompute_flops[d], rel=1e-9)
            assert dev.recompute_time_us >= dev.recompute_flops / per_us * (1 - 1e-9)


def test_real_fit_fits(run):
    full = simulate_variants(policy_variants(run, ["full:uniform:1"]), model_source, workers=1)[0]
    cap = (max(d.peak_reserved_bytes for d in full.devices) + (1 << 20)) / 2**30  # full fits, none does not
    res = fit(run, model_source, capacity_gib=cap, alternatives=1)
    assert res.best is not None and res.best.result.fits and res.best.candidate.name != "none"
    assert not res.outcomes[0].fits  # none, simulated at this capacity
    assert res.best.candidate.cost <= statics_of(run).candidate(
        parse_recompute("full:uniform:1")).cost
