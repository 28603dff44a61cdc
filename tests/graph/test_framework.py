"""One framework object per profile (its parameter rules and saved-tensor table, each fact once),
and the op builders reading their local widths off the parameter TensorDefs."""

from __future__ import annotations

from dataclasses import fields, replace

from helpers_run import tiny_run

from timeline.graph.analytic import forward_ops
from timeline.graph.build import chunk_layers, chunk_nodes
from timeline.graph.context import BuildCtx
from timeline.graph.families.moe import local_widths
from timeline.graph.framework import FRAMEWORKS, framework
from timeline.graph.profiles import Profile
from timeline.graph.saved import SavedTable
from timeline.spec.presets import PRESETS
from timeline.spec.profiles import PROFILES

SMALL_MOE = replace(PRESETS["deepseek-v3"], name="tiny-moe", hidden_size=64, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=8, intermediate_size=128, vocab_size=500,
                    q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                    n_routed_experts=16, moe_intermediate_size=32, first_k_dense_replace=1, mtp_layers=1)


def test_every_profile_has_one_framework():
    assert set(FRAMEWORKS) == set(PROFILES)
    for name, fw in FRAMEWORKS.items():
        assert fw.name == fw.params.name == fw.saved.name == name
        assert framework(name) is fw


def test_no_fact_in_both_tables():
    params = {f.name for f in fields(Profile)} - {"name"}
    saved = {f.name for f in fields(SavedTable)} - {"name"}
    assert not params & saved


def test_context_reads_the_runs_framework():
    run = tiny_run(model=SMALL_MOE, profile="paper", pp=1, tp=2, ep=2, sp=True, seq_len=64)
    ctx = BuildCtx.from_run(run)
    assert ctx.framework is FRAMEWORKS["paper"]
    assert ctx.profile is ctx.framework.params and ctx.table is ctx.framework.saved


def test_moe_widths_come_from_the_parameters():
    """Shared experts: TP-split under megatron, replicated under the paper (one rule, in the profile)."""
    for profile, shared in (("megatron", SMALL_MOE.shared_ffn // 2), ("paper", SMALL_MOE.shared_ffn)):
        run = tiny_run(model=SMALL_MOE, profile=profile, pp=1, tp=2, ep=4, etp=2, sp=True, seq_len=64)
        nodes = chunk_nodes(BuildCtx.from_run(run), chunk_layers(run.parallel, run.model.num_hidden_layers), 0)
        params = {t.name: t for n in nodes for t in n.params}
        local = local_widths(params, "layers.1.mlp")
        assert (local.experts, local.expert_ffn, local.shared_ffn) == (4, 16, shared)
        ops = {op.name: op for op in forward_ops(run, 0)}
        fc1 = ops["layers.1.mlp.shared_experts.linear_fc1"].outputs["y"]
        assert fc1.shape[1] == 2 * shared  # SwiGLU's fused gate and up


def test_mtp_modules_follow_the_parameter_graph():
    for profile, n in (("megatron", 1), ("hf", 0)):
        run = tiny_run(model=SMALL_MOE, profile=profile, pp=1, seq_len=64)
        names = {op.name for op in forward_ops(run, 0)}
        assert any(x.startswith("mtp.0.") for x in names) == bool(n)
