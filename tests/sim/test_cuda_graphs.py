"""Megatron's per-layer CUDA graphs (``[framework] cuda_graph_impl = "transformer_engine"``): what one captured
layer holds, from its shapes (:mod:`timeline.sim.graph_capture`, :mod:`timeline.profiles.megatron_cuda_graphs`).

The tiny layer: hidden 256, 8 heads, s = 128, b = 1, bf16, TE's unfused attention (PyTorch GEMMs inside the
graph), H800 (compute capability 9.0: PyTorch ≤ 2.11 gives it 32 MiB cuBLAS workspaces)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers_run import tiny_run

from timeline.profiles import LIMITS
from timeline.result.build import build_timeline
from timeline.sim.graph_capture import GRAPH_POOL, TE_WARMUP
from timeline.spec.validate import validate_run

S, B, H = 128, 1, 256
HIDDEN = S * B * H * 2  # a [s, b, h] bf16 tensor: the sample input, a static output, grad output or grad input
MASK = B * S * S  # the sample attention_mask [b, 1, s, s], one byte an element
WORKSPACE = 4096 * 8 * 1024  # CUBLAS_WORKSPACE_CONFIG's default on sm 9.0 (:4096:8)
VERSIONS = {"transformer_engine": "2.9", "megatron_core": "0.16.0", "pytorch": "2.9"}
GRAPHS = {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": "attn", "attention_backend": "unfused"}


def _steady(tl, d: int = 0) -> int:
    """Allocated bytes after iteration 1's step (the capture belongs to iteration 1)."""
    return int(tl.memory[d].block_bytes[tl.event_iterations(d) <= 0].sum())


def _named(tl, d: int, prefix: str) -> list[tuple[int, int, int, str]]:
    ev = tl.events(d)
    return [(int(ev.sign[i]), int(ev.size[i]), int(ev.stream[i]), tl.names[ev.tensor[i]])
            for i in range(len(ev.t_us)) if tl.names[ev.tensor[i]].startswith(prefix)]


def test_one_captured_layer_holds_its_sample_grad_buffers_and_four_cublas_workspaces():
    eager = build_timeline(tiny_run(pp=1, layers=1, attention_backend="unfused", **VERSIONS))
    graphed = build_timeline(tiny_run(pp=1, layers=1, **GRAPHS, **VERSIONS))
    # the sample hidden states and mask, one static grad output (shared), the last graph's static grad input
    # (TE weak-refs the rest), the warm-up's and the capture's forward and backward cuBLAS workspaces
    assert _steady(graphed) - _steady(eager) == HIDDEN + MASK + HIDDEN + HIDDEN + 4 * WORKSPACE
    assert _named(graphed, 0, "cuda_graph.") == [
        (1, HIDDEN, 0, "cuda_graph.sample.layers.0.hidden_states"),
        (1, MASK, 0, "cuda_graph.sample.layers.0.attention_mask"),
        (1, HIDDEN, 0, "cuda_graph.static_grad_output.layers.0")]
    assert _named(graphed, 0, "workspace.torch_cublas_graph") == [
        (1, WORKSPACE, TE_WARMUP, "workspace.torch_cublas_graph_warmup_forward"),
        (1, WORKSPACE, TE_WARMUP, "workspace.torch_cublas_graph_warmup_backward"),
        (1, WORKSPACE, GRAPH_POOL, "workspace.torch_cublas_graph_capture_forward"),
        (1, WORKSPACE, GRAPH_POOL, "workspace.torch_cublas_graph_capture_backward")]


def test_the_capture_allocates_in_the_private_pool_and_a_replay_allocates_nothing():
    tl = build_timeline(tiny_run(pp=1, layers=1, **GRAPHS, **VERSIONS))
    ev = tl.events(0)
    pool = [tl.names[ev.tensor[i]] for i in np.flatnonzero((ev.stream == GRAPH_POOL) & (ev.sign > 0))]
    # the s² scores and probabilities of the captured attention, its static output and the grad of its input
    scores = S * S * 8 * B * 2
    sizes = {tl.names[ev.tensor[i]]: int(ev.size[i]) for i in np.flatnonzero(ev.stream == GRAPH_POOL)}
    assert sizes["cuda_graph:layers.0.self_attn.core_attn.scores"] == scores
    assert sizes["cuda_graph:layers.0.self_attn.core_attn.softmax"] == scores
    assert sizes["cuda_graph:layers.0.attn_residual.out"] == HIDDEN
    assert sizes["cuda_graph:grad:embedding.out"] == HIDDEN
    # TE's fused softmax writes the scores' gradient into the probabilities': no gradient of the scores
    assert "cuda_graph:grad:layers.0.self_attn.core_attn.scores" not in pool
    # in training the attention part allocates nothing; the eager MLP still does
    replayed = {tl.names[ev.tensor[i]] for i in np.flatnonzero((ev.sign > 0) & (ev.action >= 0))}
    assert not [n for n in replayed if n.startswith("layers.0.self_attn") or n.startswith("grad:layers.0.self_attn")]
    assert any(n.startswith("layers.0.mlp") for n in replayed)
    # the pool keeps its blocks after the capture: reserved, only the capture-stream workspaces and the last
    # grad input allocated
    live = [(s.size, [(b[1], b[3]) for b in s.blocks]) for s in tl.memory[0].end_segments if s.stream == GRAPH_POOL]
    allocated = sorted(size for _, blocks in live for size, state in blocks if state == "active_allocated")
    assert allocated == [HIDDEN, WORKSPACE, WORKSPACE]
    assert sum(size for size, _ in live) > sum(allocated)


def test_without_buffer_reuse_every_graph_keeps_its_inputs_outputs_and_gradients():
    """TE 2.5: Megatron passes no _reuse_graph_input_output_buffers, so the graph keeps its static output
    and grad input too (and its own grad output, one graph here)."""
    old = {"transformer_engine": "2.5", "megatron_core": "0.14.0rc2", "pytorch": "2.8"}
    eager = build_timeline(tiny_run(pp=1, layers=1, attention_backend="unfused", **old))
    graphed = build_timeline(tiny_run(pp=1, layers=1, **GRAPHS, **old))
    assert _steady(graphed) - _steady(eager) == HIDDEN + MASK + 3 * HIDDEN + 4 * WORKSPACE


@pytest.mark.parametrize("megatron_core,made,dropped,last", [("0.16.0", 2, 0, (1, 0)), ("0.15.0rc8", 4, 2, (4, 3))])
def test_pipelined_graphs_share_the_samples_of_finished_backwards(megatron_core, made, dropped, last):
    """pp 2, 4 micro-batches, rank 0: capture order F0 F1 B0 F2 B1 F3 B2 B3 (one warm-up forward), so two
    samples serve the four graphs. From Megatron-LM 94b47593f9 (core 0.16) Megatron makes just those two; before,
    it made four and TE's reorganisation dropped the two it replaced."""
    tl = build_timeline(tiny_run(pp=2, **GRAPHS, **(VERSIONS | {"megatron_core": megatron_core})))
    events = _named(tl, 0, "cuda_graph.sample.layers.0.hidden_states")
    assert [e[0] for e in events].count(1) == made and [e[0] for e in events].count(-1) == dropped
    signs = [e[0] for e in _named(tl, 1, "cuda_graph.sample.layers.1.hidden_states")]
    assert (signs.count(1), signs.count(-1)) == last  # F0 B0 F1 B1 …: one sample serves the last rank


def test_without_pipeline_parallelism_one_micro_batch_is_captured():
    tl = build_timeline(tiny_run(pp=1, layers=1, num_microbatches=4, **GRAPHS, **VERSIONS))
    ev = tl.events(0)
    captured = {int(ev.microbatch[i]) for i in np.flatnonzero(ev.stream == GRAPH_POOL) if ev.microbatch[i] >= 0}
    assert captured == {0}


@pytest.mark.parametrize("override,key", [
    ({"mtp_layers": 1}, "model.mtp_layers"),
    ({"expandable_segments": True}, "allocator.expandable_segments"),
    ({"transformer_impl": "local"}, "framework.cuda_graph_impl"),
])
def test_what_the_graphs_cannot_be_modelled_with_is_refused_by_key(override, key):
    from dataclasses import replace

    from helpers_run import TINY_MODEL
    # before MTP graphs (0.15.0rc6) and before expandable segments were allowed with NCCL_GRAPH_REGISTER=0 (0.16)
    versions = VERSIONS | ({"megatron_core": "0.15.0rc5"} if "mtp_layers" in override or
                           "expandable_segments" in override else {})
    run = tiny_run(pp=1, layers=1, **GRAPHS, **versions, **{k: v for k, v in override.items() if k != "mtp_layers"},
                   **({"model": replace(TINY_MODEL, num_hidden_layers=1, mtp_layers=1)}
                      if "mtp_layers" in override else {}))
    assert key in {k for k, _ in validate_run(run, LIMITS)}


def test_a_whole_moe_layer_in_a_graph_is_refused():
    from dataclasses import replace

    from helpers_run import TINY_MODEL
    moe = replace(TINY_MODEL, num_hidden_layers=1, n_routed_experts=4, num_experts_per_tok=2,
                  moe_intermediate_size=128)
    problems = dict(validate_run(tiny_run(pp=1, model=moe, **(GRAPHS | {"cuda_graph_scope": "full"}), **VERSIONS),
                                 LIMITS))
    assert "drop-and-pad routing" in problems["framework.cuda_graph_scope"]
    assert "framework.cuda_graph_scope" not in dict(validate_run(tiny_run(pp=1, model=moe, **GRAPHS, **VERSIONS),
                                                                 LIMITS))


def test_warm_up_iterations_run_eagerly_then_the_capture_precedes_that_iteration():
    """``--cuda-graph-warmup-steps 2`` (Megatron-Core 0.15.0rc6 on): iterations 1 and 2 run as without graphs — the
    attention's tensors are allocated in the general pool — and the capture's events come at iteration 3's first
    action, after which the attention allocates nothing. The iterations before are the eager run's, event for
    event."""
    eager = build_timeline(tiny_run(pp=1, layers=1, attention_backend="unfused", iterations=4, **VERSIONS))
    tl = build_timeline(tiny_run(pp=1, layers=1, iterations=4, cuda_graph_warmup_steps=2, **GRAPHS, **VERSIONS))
    ev, its = tl.events(0), tl.event_iterations(0)
    names = [tl.names[t] for t in ev.tensor]
    attn = {i for i, n in enumerate(names) if n.startswith("layers.0.self_attn") and ev.sign[i] > 0}
    assert {int(its[i]) for i in attn} == {0, 1}  # eager in the warm-up iterations only
    capture = [i for i, n in enumerate(names) if n.startswith("cuda_graph")]
    assert capture and {int(its[i]) for i in capture} == {2}
    first_action_of_3 = min(float(ev.t_us[i]) for i in range(len(names)) if its[i] == 2 and ev.action[i] >= 0)
    assert all(float(ev.t_us[i]) <= first_action_of_3 for i in capture)
    e_ev, e_its = eager.events(0), eager.event_iterations(0)
    before = [(int(ev.sign[i]), int(ev.size[i]), names[i]) for i in range(len(names)) if its[i] < 2
              and ev.action[i] >= 0]
    eager_before = [(int(e_ev.sign[i]), int(e_ev.size[i]), eager.names[e_ev.tensor[i]]) for i in range(len(e_ev.t_us))
                    if e_its[i] < 2 and e_ev.action[i] >= 0]
    assert before == eager_before
    # with no simulated iteration past the warm-up the run never captures
    short = build_timeline(tiny_run(pp=1, layers=1, iterations=2, cuda_graph_warmup_steps=2, **GRAPHS, **VERSIONS))
    assert not [t for t in short.events(0).tensor if short.names[t].startswith("cuda_graph")]


# -- per-module graphs of MoE layers (Megatron-Core 0.16+: --cuda-graph-scope attn moe_router moe_preprocess) --
E, K, FFN = 4, 2, 128  # the tiny MoE: routed experts, top-k, expert and shared-expert width
ROUTER_SCOPE = GRAPHS | {"cuda_graph_scope": "attn moe_router moe_preprocess"}


def _moe(**kw):
    from dataclasses import replace

    from helpers_run import TINY_MODEL
    return replace(TINY_MODEL, n_routed_experts=E, num_experts_per_tok=K, moe_intermediate_size=FFN,
                   n_shared_experts=1, **kw)


def _captured(tl, d: int = 0) -> set[str]:
    ev = tl.events(d)
    return {tl.names[ev.tensor[i]].removeprefix("cuda_graph:") for i in np.flatnonzero((ev.stream == GRAPH_POOL)
                                                                                      & (ev.sign > 0))}


def test_a_router_graph_holds_attention_router_shared_experts_and_the_permutation_only():
    """``TransformerLayer._te_cuda_graph_capture`` / ``MoELayer.forward``'s early return (Megatron-LM 4e85d74ae9):
    the graph runs the attention, the pre-MLP norm, the shared experts, the router and — with moe_preprocess —
    the alltoall dispatcher's first permutation; the all-to-all, the experts and the combine run eagerly from its
    outputs after each replay."""
    tl = build_timeline(tiny_run(pp=1, model=_moe(num_hidden_layers=1), **ROUTER_SCOPE, **VERSIONS))
    captured = _captured(tl)
    p = "layers.0.mlp"
    for inside in ("layers.0.self_attn.core_attn.scores", f"{p}.router.logits", f"{p}.dispatch.permuted",
                   f"{p}.shared_experts.linear_fc1.out", "layers.0.pre_mlp_layernorm.out"):
        assert inside in captured, inside
    assert not [n for n in captured if ".experts." in n or ".combine." in n or "all_to_all" in n
                or "shared_add" in n or "layers.0.output" in n]
    # without moe_preprocess the permutation runs eagerly after the replay
    no_pre = build_timeline(tiny_run(pp=1, model=_moe(num_hidden_layers=1),
                                     **(GRAPHS | {"cuda_graph_scope": "attn moe_router"}), **VERSIONS))
    assert f"{p}.dispatch.permuted" not in _captured(no_pre) and f"{p}.router.logits" in _captured(no_pre)
    ev = no_pre.events(0)
    replayed = {no_pre.names[ev.tensor[i]] for i in np.flatnonzero((ev.sign > 0) & (ev.action >= 0))}
    assert f"{p}.dispatch.permuted" in replayed and f"{p}.router.logits" not in replayed


def test_a_router_graph_makes_one_static_grad_output_per_differentiable_output():
    """TE ``_make_graphed_callables``: ``torch.empty_like`` of each static output that requires grad — the
    permuted tokens ``[s·b·k, h]`` (bf16), their probabilities ``[s·b·k]`` (fp32 router dtype), the shared
    experts' output and the residual ``[s·b, h]`` — once for every graph of that signature under
    ``_reuse_graph_input_output_buffers``."""
    tl = build_timeline(tiny_run(pp=1, model=_moe(num_hidden_layers=2), moe_router_dtype="fp32", **ROUTER_SCOPE,
                                 **VERSIONS))
    made = sorted(size for sign, size, _, _ in _named(tl, 0, "cuda_graph.static_grad_output.") if sign > 0)
    assert made == sorted([S * K * 4, HIDDEN, HIDDEN, S * K * H * 2])
    assert {name.split(".")[3] for *_, name in _named(tl, 0, "cuda_graph.static_grad_output.")} == {"1"}


def test_a_dense_layer_under_attn_and_mlp_is_one_whole_layer_graph():
    scoped = build_timeline(tiny_run(pp=1, layers=1, **(GRAPHS | {"cuda_graph_scope": "attn mlp"}), **VERSIONS))
    whole = build_timeline(tiny_run(pp=1, layers=1, **(GRAPHS | {"cuda_graph_scope": "full"}), **VERSIONS))
    assert _captured(scoped) == _captured(whole)
    assert _steady(scoped) == _steady(whole)


def test_the_mtp_layer_is_graphed_like_a_decoder_layer_from_core_0_15_0rc6():
    """``TECudaGraphHelper`` (c173615753 on) appends each MTP block's ``mtp_model_layer`` to its chunk's callables
    (``callables_is_mtp``): its attention is captured, with a sample of its own."""
    from dataclasses import replace

    from helpers_run import TINY_MODEL
    model = replace(TINY_MODEL, num_hidden_layers=1, mtp_layers=1)
    tl = build_timeline(tiny_run(pp=1, model=model, **GRAPHS, **VERSIONS))
    assert "mtp.0.layer.self_attn.core_attn.scores" in _captured(tl)
    assert _named(tl, 0, "cuda_graph.sample.layers.1.hidden_states")


@pytest.mark.parametrize("scope,model,rc,needle", [
    ("attn moe_preprocess", "moe", None, "moe_preprocess needs moe_router"),
    ("moe moe_router", "moe", None, "both moe and moe_router"),
    ("attn moe_router", "dense", None, "MoE modules for a dense model"),
    ("attn mlp moe_router", "moe", None, "every layer is an MoE layer"),
    ("attn bogus", "moe", None, "give \"full\""),
    ("attn moe_router", "moe", ("moe",), "moe with a moe_router graph"),
    ("attn moe_router", "moe", ("shared_experts",), "recomputed module inside the graphed part"),
    ("moe_router moe_preprocess", "moe", ("layernorm",), "recomputed module inside the graphed part"),
])
def test_megatrons_scope_checks_and_what_is_not_modelled_are_refused_by_key(scope, model, rc, needle):
    from helpers_run import TINY_MODEL

    from timeline.spec.run import RecomputeSpec
    m = _moe(num_hidden_layers=1) if model == "moe" else TINY_MODEL
    kw = {"recompute": RecomputeSpec(policy="selective", modules=rc)} if rc else {}
    problems = validate_run(tiny_run(pp=1, layers=1 if model == "dense" else None, model=m,
                                     **(GRAPHS | {"cuda_graph_scope": scope}), **VERSIONS, **kw), LIMITS)
    assert any(needle in msg for _, msg in problems), problems
    # the experts' activation may be recomputed: it runs eagerly after the replay
    ok = tiny_run(pp=1, model=_moe(num_hidden_layers=1), **ROUTER_SCOPE, **VERSIONS,
                  recompute=RecomputeSpec(policy="selective", modules=("moe_act",)))
    assert validate_run(ok, LIMITS) == []


def test_a_router_graph_without_the_alltoall_preprocess_turns_the_pre_mlp_norm_recompute_off():
    """``transformer_layer.py: can_recompute_pre_mlp_layernorm_for_cudagraph`` (4e85d74ae9): the router graph returns
    the pre-MLP norm's output as a static output, so Megatron drops that norm's recompute (a warning) and keeps the
    input norm's (fused into TE's LayerNormLinear here), which runs eagerly outside a graph without attn (the
    Megatron-MoE-ModelZoo Qwen3 H100 recipe: ``moe_router
    moe_preprocess`` on the flex dispatcher with ``--recompute-modules moe_act layernorm``)."""
    from timeline.graph.source import model_source
    from timeline.spec.run import RecomputeSpec

    def backward_names(r) -> set[str]:
        t = model_source(r).template(0, pp_rank=0)
        return {op.name for op in (t.backward or t.backward_i + t.backward_w)}
    rc = RecomputeSpec(policy="selective", modules=("layernorm", "moe_act"))
    run = tiny_run(pp=1, model=_moe(num_hidden_layers=1), **(GRAPHS | {"cuda_graph_scope": "moe_router"}),
                   **VERSIONS, recompute=rc)
    assert validate_run(run, LIMITS) == []
    names = backward_names(run)
    assert "layers.0.pre_mlp_layernorm.recompute" not in names and "layers.0.mlp.experts.act.recompute" in names
    eager = tiny_run(pp=1, model=_moe(num_hidden_layers=1), **VERSIONS, recompute=rc)
    assert "layers.0.pre_mlp_layernorm.recompute" in backward_names(eager)


def test_expandable_segments_with_graphs_from_core_0_16():
    """``TECudaGraphHelper.__init__`` from 2b343d739f (core_v0.16.0) takes expandable segments when
    ``NCCL_GRAPH_REGISTER=0`` (from-megatron checks the environment): the graphs' pool then maps its segments too,
    and a replay still allocates nothing."""
    run = tiny_run(pp=1, layers=1, expandable_segments=True, **GRAPHS, **VERSIONS)
    assert validate_run(run, LIMITS) == []
    tl, plain = build_timeline(run), build_timeline(tiny_run(pp=1, layers=1, **GRAPHS, **VERSIONS))
    assert _steady(tl) == _steady(plain)  # the same tensors; only the segments differ


def test_router_graphs_run_under_combined_1f1b_and_whole_layer_graphs_do_not():
    """With ``--overlap-moe-expert-parallel-comm`` Megatron captures the graphs in the same schedule-table order and
    replays the attention and router part in the attn node (``transformer_layer.py: _te_cuda_graph_replay``'s EP-overlap
    return); ``transformer_config.py`` refuses a whole-layer, MLP or MoE graph with it (4e85d74ae9)."""
    from dataclasses import replace

    from helpers_run import TINY_MODEL
    moe = replace(TINY_MODEL, n_routed_experts=4, moe_intermediate_size=256, num_experts_per_tok=2,
                  n_shared_experts=1, first_k_dense_replace=1)
    kw = {"model": moe, "layers": 3, "pp": 1, "ep": 2, "dp": 2, "combined_1f1b": True, "num_microbatches": 3}
    run = tiny_run(**kw, **ROUTER_SCOPE, **VERSIONS)
    assert validate_run(run, LIMITS) == []
    tl = build_timeline(run)
    assert "layers.1.mlp.router.logits" in _captured(tl) and "layers.2.self_attn.core_attn.scores" in _captured(tl)
    ev = tl.events(0)
    replayed = {tl.names[ev.tensor[i]] for i in np.flatnonzero((ev.sign > 0) & (ev.action >= 0))}
    assert "layers.1.mlp.router.logits" not in replayed and "layers.1.mlp.experts.linear_fc1.out" in replayed
    for scope in ("full", "attn mlp moe_router"):
        problems = validate_run(tiny_run(**kw, **(GRAPHS | {"cuda_graph_scope": scope}), **VERSIONS), LIMITS)
        assert any(k == "framework.cuda_graph_scope" and "combined 1F1B" in m for k, m in problems), problems


@pytest.mark.parametrize(("versions", "router_torch"), [
    ({"transformer_engine": "2.10", "megatron_core": "0.16.0", "pytorch": "2.9"}, True),
    ({"transformer_engine": "2.9", "megatron_core": "0.16.0", "pytorch": "2.9"}, False),
    ({"transformer_engine": "2.10", "megatron_core": "0.17.0", "pytorch": "2.9"}, False),
])
def test_a_router_graph_of_torch_router_gemms_makes_the_four_cublas_workspaces(versions, router_torch):
    """``RouterGatingLinearFunction`` runs ``torch.mm`` forward and backward where TE's ``general_gemm`` import fails
    (TE ≥ 2.10 before Megatron-LM d3528a2130, so Megatron-Core < 0.17): inside a ``moe_router`` graph its GEMMs
    make the warm-up's and the capture's forward and backward PyTorch cuBLAS workspaces, as unfused attention's do —
    on the device graphing an MoE layer only (fused attention: the graphs' other GEMMs are TE's)."""
    fused = ROUTER_SCOPE | {"attention_backend": "fused"}
    tl = build_timeline(tiny_run(pp=2, model=_moe(num_hidden_layers=2, first_k_dense_replace=1), **fused,
                                 **versions))
    dense, moe = (_named(tl, d, "workspace.torch_cublas_graph") for d in range(2))
    assert dense == []  # layer 0 is dense: its graph holds TE GEMMs alone
    assert [(sign, size, name.rsplit("_graph_", 1)[1]) for sign, size, _, name in moe] == (
        [(1, WORKSPACE, w) for w in ("warmup_forward", "warmup_backward", "capture_forward", "capture_backward")]
        if router_torch else [])
