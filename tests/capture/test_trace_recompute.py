"""Full recompute of a captured model: a checkpointed layer keeps exactly its input, its forward
runs again before its backward, and the simulated peak is PyTorch's own under
``torch.utils.checkpoint`` (non-reentrant) per layer or per group of layers."""

from __future__ import annotations

from collections import Counter

import pytest
from sources import template_of

pytest.importorskip("torch")
pytest.importorskip("transformers")

from captures import DSV3, LLAMA, B, S, memtracker_peak  # noqa: E402

from timeline.graph.tensors import Category  # noqa: E402
from timeline.io.runfile import load_run  # noqa: E402
from timeline.result.build import build_timeline  # noqa: E402

FULL = ["recompute.policy=full"]
CASES = [  # (config, fixture, run overrides, the layer groups PyTorch checkpoints)
    (LLAMA, "llama_run", FULL, [[0], [1]]),
    (LLAMA, "llama_run", [*FULL, "recompute.method=block"], [[0]]),
    (DSV3, "dsv3_run", FULL, [[0], [1]]),
    (DSV3, "dsv3_run", [*FULL, "recompute.num_layers=2"], [[0, 1]]),
]


@pytest.mark.parametrize(("config", "fixture"), [(LLAMA, "llama_run"), (DSV3, "dsv3_run")], ids=["llama", "dsv3"])
def test_a_recomputed_layer_keeps_its_input(config, fixture, request):
    """Per layer 2·s·b·h bytes in bf16 (the hidden state entering it), as tools/groundtruth.py measures."""
    t = template_of(load_run(request.getfixturevalue(fixture), FULL), 0)
    for k in (0, 1):
        assert t.layer_activation_bytes[k] == 2 * S * B * config["hidden_size"]
        assert [st.op for st in t.saved if st.layer == k] == [f"checkpoint:full@{k}"]


@pytest.mark.parametrize(("config", "fixture", "overrides", "groups"), CASES,
                         ids=["llama-uniform", "llama-block", "dsv3-uniform", "dsv3-uniform2"])
def test_peak_matches_checkpointed_pytorch(config, fixture, overrides, groups, request):
    run = load_run(request.getfixturevalue(fixture), overrides)
    simulated = build_timeline(run).peak(0).requested_bytes
    # the issue asks for 1 %; the unmodelled remainder is the position ids a checkpoint keeps (< 0.05 %)
    assert simulated == pytest.approx(memtracker_peak(config, groups), rel=1e-3)


def test_recompute_ops_recreate_what_the_backward_frees(llama_run):
    t = template_of(load_run(llama_run, FULL), 0)
    rc = [op for op in t.backward if op.recompute]
    assert rc and all(op.name.endswith(".recompute") for op in rc)
    remade = {x.storage for op in rc for x in op.allocs if x.category == Category.RECOMPUTE}
    assert remade and all(s.endswith("@recompute") for s in remade)
    freers = {s: op for op in t.backward for s in op.frees}
    assert all(not freers[s].recompute for s in remade)  # the layer's backward ops free them
    for phases in ((t.forward, t.backward), (t.forward, t.backward_i, t.backward_w)):
        allocs = Counter(x.storage for ops in phases for op in ops for x in op.allocs)
        frees = Counter(s for ops in phases for op in ops for s in op.frees)
        assert set(allocs.values()) == {1} and frees == allocs
    # each layer's recompute runs just before that layer's backward, the last layer first
    layers = [op.layer for op in t.backward if op.layer is not None]
    first_rc = {k: next(i for i, op in enumerate(t.backward) if op.layer == k and op.recompute) for k in (0, 1)}
    assert first_rc[1] < first_rc[0] and layers.count(1) and layers.count(0)


def test_per_rank_num_layers_under_pp(llama_run):
    run = load_run(llama_run, ["model.num_layers=4", "parallel.pp=2", "model.profile=megatron", *FULL,
                               "recompute.method=block", "recompute.num_layers=[1, 0]"])
    plain = load_run(llama_run, ["model.num_layers=4", "parallel.pp=2", "model.profile=megatron"])
    mine, base = template_of(run, 0).layer_activation_bytes, template_of(plain, 0).layer_activation_bytes
    assert mine[0] == 2 * S * B * LLAMA["hidden_size"] and mine[1] == base[1]
    assert template_of(run, 1).layer_activation_bytes == template_of(plain, 1).layer_activation_bytes
