"""Megatron-LM's fine-grained activation offloading (``[offload]``): the groups a chunk's ops form
(:mod:`timeline.graph.offload`) and when each saved tensor is freed and reloaded (:mod:`timeline.sim.offload`),
against the rules of ``fine_grained_activation_offload.py`` read at f5b2ec0130."""

from __future__ import annotations

import collections
import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from timeline.graph.source import model_source
from timeline.io.runfile import run_from_data
from timeline.result.build import build_timeline
from timeline.spec.run import OffloadSpec
from timeline.spec.validate import offload_problems as _problems


#: a small DeepSeek-shaped job: MLA, every layer MoE (grouped GEMM, alltoall), unfused attention, the
#: calibration job's recompute modules; two layers per pipeline rank
def offload_problems(run) -> list[tuple[str, str]]:
    return _problems(run.offload, run.model, run.framework, run.recompute, run.schedule, profile=run.profile,
                     traced=run.trace is not None)


RUN = """
name = "tiny-offload"
[model]
preset = "megatron-gpt"
num_layers = 4
hidden_size = 256
num_attention_heads = 8
intermediate_size = 512
hidden_act = "silu"
num_key_value_heads = 8
head_dim = 32
norm = "rmsnorm"
position_embedding = "rope"
linear_bias = false
tie_word_embeddings = false
hidden_dropout = 0.0
attention_dropout = 0.0
max_position_embeddings = 1024
vocab_size = 1024
kv_lora_rank = 64
q_lora_rank = 128
qk_nope_head_dim = 32
qk_rope_head_dim = 16
v_head_dim = 32
n_routed_experts = 8
moe_intermediate_size = 256
num_experts_per_tok = 2
n_shared_experts = 1
shared_expert_intermediate_size = 256
first_k_dense_replace = 0
[parallel]
pp = 2
ep = 2
dp = 2
[training]
seq_len = 1024
num_microbatches = 4
iterations = 2
zero = 1
[recompute]
policy = "selective"
modules = ["layernorm", "mla_up_proj", "moe_act"]
[offload]
modules = ["attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act"]
min_elements = 65536
[hardware]
gpu = "h100"
[framework]
attention_backend = "unfused"
moe_grouped_gemm = true
moe_token_dispatcher = "alltoall"
"""
ALL = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")


def _run(text: str = RUN):
    return run_from_data(tomllib.loads(text), Path("tiny-offload.toml"))


def _groups(run, chunk: int = 1):
    t = model_source(run).template(chunk)
    return t, [(g.name, g.layer) for g in t.offload]


def test_each_layer_forms_the_groups_megatron_wraps_in_their_contexts():
    t, groups = _groups(_run())
    assert groups == [(name, layer) for layer in (2, 3) for name in ALL]
    by = {(g.name, g.layer): g for g in t.offload}
    f = [op.name for op in t.forward]
    # committed where the modules call group_commit: the input norm's after the attention's residual add, the
    # pre-MLP norm's after the MLP's, the activation's after fc2 (transformer_layer.py, moe/experts.py)
    assert f[by["attn_norm", 2].commit] == "layers.2.attn_residual"
    assert f[by["mlp_norm", 2].commit] == "layers.2.mlp_residual"
    assert f[by["moe_act", 2].commit] == "layers.2.mlp.experts.linear_fc2"
    assert f[by["qkv_linear", 2].start] == "layers.2.self_attn.linear_q_down_proj"
    assert f[by["qkv_linear", 2].commit] == "layers.2.self_attn.rope"  # MLA applies RoPE inside the projection
    assert f[by["core_attn", 2].commit] == "layers.2.self_attn.core_attn.pv"


def test_what_each_group_offloads():
    t, _ = _groups(_run())
    items = {g.name: [(it.storage.split("layers.2.", 1)[-1], "copy" if it.copy else "move", it.tag)
                      for it in g.items] for g in t.offload if g.layer == 2}
    assert items["attn_norm"] == [("input", "move", 0)]  # the chunk's input, the layer's residual
    # the softmax is saved by two autograd nodes (the softmax and the probabilities' bmm): two tags, two host
    # copies and two reloads (tensor_push per save); query, key and value are re-created by the MLA up-projection's
    # recompute, so their reloads are copies beside the recomputed ones
    assert items["core_attn"] == [("self_attn.core_attn.softmax", "move", 0), ("self_attn.core_attn.softmax", "copy", 1),
                                  ("self_attn.k", "copy", 0), ("self_attn.q", "copy", 0), ("self_attn.v", "copy", 0)]
    # the input norm's output is discarded by its recompute but saved by both down projections: one copy each
    assert items["qkv_linear"] == [("input_layernorm.out", "copy", 0), ("input_layernorm.out", "copy", 1),
                                   ("self_attn.linear_kv_down_proj.out", "move", 0),
                                   ("self_attn.linear_q_down_proj.out", "move", 0)]
    assert items["expert_fc1"] == [("mlp.dispatch.received", "move", 0)]
    assert items["moe_act"] == [("mlp.experts.linear_fc1.out", "move", 0)]


def test_tensors_below_the_minimum_stay():
    run = _run()
    small = replace(run, offload=replace(run.offload, min_elements=300_000))
    t, _ = _groups(small)
    kept = {it.storage for g in t.offload for it in g.items}
    # q: 1024 tokens × 8 heads × 48 = 393,216 elements; k as many; v: 1024 × 8 × 32 = 262,144
    assert "layers.2.self_attn.q" in kept and "layers.2.self_attn.v" not in kept


def test_core_attn_recomputed_has_no_group_and_no_modules_no_groups():
    run = _run()
    rc = replace(run.recompute, modules=("core_attn", "layernorm"))
    assert "core_attn" not in {n for n, _ in _groups(replace(run, recompute=rc))[1]}
    assert _groups(replace(run, offload=OffloadSpec()))[1] == []


def _reloads(tl) -> dict[tuple[int, int], int]:
    """(device, iteration) → reload allocations."""
    out: collections.Counter = collections.Counter()
    for d in range(tl.num_devices):
        ev, its = tl.events(d), tl.event_iterations(d)
        for i in np.flatnonzero(ev.sign > 0):
            if ev.op[i] >= 0 and tl.names[ev.op[i]] == "offload.reload":
                out[(tl.devices[d].pp_rank, int(its[i]))] += 1
    return dict(out)


def test_which_groups_offload_in_each_iteration():
    tl = build_timeline(_run())
    per_layer = 14  # attn_norm 1, qkv_linear 4, core_attn 5, attn_proj 1, mlp_norm 1, expert_fc1 1, moe_act 1
    # the warm-up iteration offloads every group of both layers of all four micro-batches
    assert _reloads(tl)[(0, 0)] == _reloads(tl)[(1, 0)] == 2 * per_layer * 4
    # from the second on, the last group of each name stays where the chunk's backward comes next
    # (should_bulk_offload): on the last rank every micro-batch's (1F1B runs its backward right after), on the
    # first rank the first micro-batch's, also the post-warm-up callback's pick (the first backward chunk)
    assert _reloads(tl)[(1, 1)] == per_layer * 4
    assert _reloads(tl)[(0, 1)] == 2 * per_layer * 4 - per_layer


def test_the_later_post_warmup_rules():
    """Megatron-LM 69c486825c's post_warmup_callback, after the margin's keeps. ``fraction`` 0.5 keeps the last
    ⌊n/2⌋ of each chunk's groups still offloading: the first rank's first micro-batch (its layer 1 kept by the
    margin) keeps layer 0's last 3 of 7 (mlp_norm, expert_fc1, moe_act), offloading the 11 items of its first four;
    the other three keep layer 1's 7 of 14; the last rank alike. ``delta_bytes`` keeps groups in backward order until pp_rank · delta is kept: on the last rank one
    byte keeps one more group, the first micro-batch's layer-2 attn_norm (1 item)."""
    run = _run()
    half = build_timeline(replace(run, offload=replace(run.offload, fraction=0.5)))
    assert _reloads(half)[(0, 1)] == 11 + 3 * 14
    assert _reloads(half)[(1, 1)] == 11 + 3 * 14
    delta = build_timeline(replace(run, offload=replace(run.offload, delta_bytes=1)))
    assert _reloads(delta)[(1, 1)] == 4 * 14 - 1
    assert _reloads(delta)[(0, 1)] == 2 * 14 * 4 - 14  # pp rank 0 keeps 0 · delta


def test_offloading_lowers_the_peak_and_leaves_nothing_after_the_step():
    run = _run()
    off, on = build_timeline(replace(run, offload=OffloadSpec())), build_timeline(run)
    for d in range(on.num_devices):
        assert on.peak(d).allocated_bytes < off.peak(d).allocated_bytes
        ev_on, ev_off = on.events(d), off.events(d)
        assert int(np.sum(ev_on.size * ev_on.sign)) == int(np.sum(ev_off.size * ev_off.sign))


def test_moved_tensors_are_freed_at_the_commit_and_allocated_again():
    tl = build_timeline(_run())
    d = next(d for d in range(tl.num_devices) if tl.devices[d].pp_rank == 1)
    ev = tl.events(d)
    name = tl.names.index("layers.2.self_attn.core_attn.softmax")
    rows = [(float(ev.t_us[i]), int(ev.sign[i]), tl.names[ev.op[i]] if ev.op[i] >= 0 else None)
            for i in np.flatnonzero((ev.tensor == name) & (ev.microbatch == 0) & (ev.iteration == 0))]
    # made by the softmax, dropped after the group's commit (the probabilities' bmm), reloaded, freed by its backward
    assert [(s, op) for _, s, op in rows] == [(1, "layers.2.self_attn.core_attn.softmax_op"),
                                               (-1, "layers.2.self_attn.core_attn.pv"), (1, "offload.reload"),
                                               (-1, "layers.2.self_attn.core_attn.softmax_op")]
    assert [t for t, _, _ in rows] == sorted(t for t, _, _ in rows)


@pytest.mark.parametrize("edit,needle", [
    ({"modules": ["attn_proj"]}, '"attn_proj" without "core_attn"'),
])
def test_megatron_refusals(edit, needle):
    run = _run()
    bad = replace(run, offload=replace(run.offload, **{k: tuple(v) for k, v in edit.items()}))
    assert any(needle in msg for _, msg in offload_problems(bad))


def test_what_the_model_does_not_cover_is_named():
    run = _run()
    full = replace(run, recompute=replace(run.recompute, policy="full"))
    assert any("full recompute" in msg for _, msg in offload_problems(full))
    zb = replace(run, schedule=replace(run.schedule, kind="zb-h1"), parallel=replace(run.parallel, vpp=1))
    assert any("not one of Megatron-LM's" in msg for _, msg in offload_problems(zb))
    assert any("profile" in msg for _, msg in offload_problems(replace(run, profile="paper")))


def test_an_mtp_layer_offloads_like_a_decoder_layer():
    """The MTP module's transformer_layer is a TransformerLayer (multi_token_prediction.py): its groups too."""
    run = _run(RUN.replace("first_k_dense_replace = 0", "first_k_dense_replace = 0\nmtp_layers = 1"))
    _, groups = _groups(run)
    assert groups[-len(ALL):] == [(name, 4) for name in ALL]


def test_a_fused_input_norm_saves_inside_the_qkv_group():
    """With TE's LayerNormLinear the input norm is the QKV projection's (input_layernorm is an IdentityOp: no
    attn_norm group), so the layer input it saves is the qkv group's, freed after the attention's residual add."""
    from helpers_run import tiny_run

    run = replace(tiny_run(pp=1, layers=1, seq_len=1024), offload=OffloadSpec(modules=ALL[:5], min_elements=1))
    t, groups = _groups(run, chunk=0)
    assert groups == [("qkv_linear", 0), ("core_attn", 0), ("attn_proj", 0)]  # the dense MLP's norm is fused too
    qkv = t.offload[0]
    assert t.forward[qkv.start].name == "layers.0.input_layernorm"
    layer_input = next(it for it in qkv.items if t.forward[it.free_after].name == "layers.0.attn_residual")
    assert not layer_input.copy


def test_the_table_title_says_what_is_offloaded():
    from timeline.cli.simulate import table_title

    title = table_title(build_timeline(_run()))
    assert "offload attn_norm+qkv_linear+core_attn+attn_proj+mlp_norm+expert_fc1+moe_act, caching" in title


def test_a_plan_around_an_offloading_run_bounds_and_simulates_what_it_derives(tmp_path):
    """``timeline plan`` keeps ``[offload]``: its bound step checks a candidate's offloading as ``derive`` does
    (a schedule Megatron lacks, or full recompute, is invalid there too), and a candidate with one micro-batch,
    whose received input the schedule frees only in the next iteration, simulates."""
    from timeline.cli import main

    run_file = tmp_path / "tiny-offload.toml"
    run_file.write_text(RUN)
    assert main(["plan", str(run_file), "--world-size", "4", "-o", str(tmp_path / "plan")]) == 0
    assert (tmp_path / "plan" / "best" / "01.toml").exists()


def test_one_micro_batch_on_two_chunks_pairs_every_free():
    """pp 1 with two chunks and one micro-batch: the chunk's received input is freed by the next iteration's
    forward (the schedule's reference), so its reload is a copy and the original counts until then."""
    run = _run(RUN.replace("pp = 2", "pp = 1\nvpp = 2").replace("ep = 2", "ep = 1").replace("dp = 2", "dp = 4")
               .replace("num_microbatches = 4", "num_microbatches = 1")
               .replace("[hardware]", '[schedule]\nkind = "interleaved"\n[hardware]'))
    on, off = build_timeline(run).events(0), build_timeline(replace(run, offload=OffloadSpec())).events(0)
    assert int(np.sum(on.size * on.sign)) == int(np.sum(off.size * off.sign))  # the same bytes left at the end
