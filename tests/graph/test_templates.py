"""Template invariants: every storage allocated once and freed exactly once across F + I + W (and
F + B), frees follow allocations, categories as DESIGN §4 states, forward saved bytes equal the
layer accounting, and ``hf`` fails in one place with a clear message."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from sources import template_of

from timeline.io.runfile import load_run
from timeline.spec.recompute import parse_recompute

# the shipped run (not via conftest: other test folders have a conftest module too)
SHIPPED = Path(__file__).resolve().parents[2] / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"

CASES = [
    ([], "none", 1), ([], "full:uniform:1", 1), ([], "none", 0), ([], "none", 15),
    (['model.profile="megatron"'], "none", 0), (['model.profile="megatron"'], "none", 15),
    (['model.profile="megatron"'], "selective:core_attn+mla_up_proj+layernorm+moe_act+shared_experts", 1),
    (['model.profile="megatron"'], "selective:moe+layernorm", 1),
    (['model.profile="megatron"'], "selective:mlp", 0),
    (['model.profile="megatron"'], "full:uniform:2", 1),
    (['model.profile="megatron"', "parallel.cp=2", "parallel.etp=2"], "full:block:1", 1),
    (['model.profile="megatron"', "parallel.tp=1", "parallel.sp=false"], "none", 1),
]


def check_lifetimes(phases):
    live: set[str] = set()
    allocated: set[str] = set()
    for ops in phases:
        for op in ops:
            for t in op.allocs:
                assert t.storage not in allocated, f"{t.storage} allocated twice ({op.name})"
                allocated.add(t.storage)
                live.add(t.storage)
            for s in op.frees:
                assert s in live, f"{op.name} frees {s}, which is not live"
                live.remove(s)
    assert not live, f"never freed: {sorted(live)[:5]}"
    return allocated


@pytest.mark.parametrize(("overrides", "rc", "chunk"), CASES)
def test_storages_allocated_and_freed_once(overrides, rc, chunk):
    run = replace(load_run(SHIPPED, overrides), recompute=parse_recompute(rc))
    t = template_of(run, chunk)
    a = check_lifetimes([t.forward, t.backward_i, t.backward_w])
    b = check_lifetimes([t.forward, t.backward])
    assert a == b
    names = [o.name for o in (*t.forward,)]
    assert len(names) == len(set(names))
    # what the forward leaves alive is exactly the saved tensors, and their bytes the layer accounting
    freed = {s for o in t.forward for s in o.frees}
    left = [a for o in t.forward for a in o.allocs if a.storage not in freed]
    assert all(x.category == "activations" for x in left)
    assert sum(x.size_bytes for x in left) == t.activation_bytes == sum(st.tensor.size_bytes for st in t.saved)
    freer = {s: o.kind for o in t.forward for s in o.frees}
    for o in t.forward:
        for x in o.allocs:
            assert x.category in ("activations", "temporary", "comm")
            if x.category == "comm":  # made by a collective, or the GEMM output a reduce-scatter consumes
                assert o.kind in ("collective", "p2p") or freer[x.storage] == "collective"
        if o.kind == "collective":
            assert o.stream in ("tp", "ep")
    for o in (*t.backward_i, *t.backward_w):
        assert all(x.category != "activations" for x in o.allocs)
        assert o.recompute == o.name.endswith(".recompute")
        if not o.recompute:
            assert all(x.category != "recompute" for x in o.allocs)
    assert not any(o.recompute for o in t.backward_w)


def test_weight_gradient_keeps_gemm_inputs():
    t = template_of(load_run(SHIPPED, ['model.profile="megatron"']), 1)
    freed_by_w = {s for o in t.backward_w for s in o.frees}
    assert "layers.4.mlp.dispatch.received" in freed_by_w  # expert GEMM input, read only by W
    assert "layers.4.self_attn.core_attn.softmax_lse" not in freed_by_w
    assert all(o.flops > 0 for o in t.backward_w)


def test_flops_gemm():
    t = template_of(load_run(SHIPPED, ['model.profile="megatron"']), 1)
    fc2 = next(o for o in t.forward if o.name == "layers.4.mlp.experts.linear_fc2")
    assert fc2.flops == 2.0 * 16384 * 2048 * 7168
    w = next(o for o in t.backward_w if o.name == "layers.4.mlp.experts.linear_fc2.wgrad")
    assert w.flops == fc2.flops


def test_hf_profile_has_activations(write_run):
    """hf builds templates (its numbers are checked against autograd in test_activations_hf.py)."""
    run = load_run(write_run('[model]\npreset = "deepseek-v3"\nprofile = "hf"\nnum_hidden_layers = 2\nfirst_k_dense_replace = 1\n'), [])
    t = template_of(run, 0)
    assert t.activation_bytes > 0 and not any(st.tensor.name.startswith("mtp.") for st in t.saved)
