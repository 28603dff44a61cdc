"""One profile object per framework (its parameter rules, saved-tensor rules, op structure,
lifecycle and limits, each fact once), and the op builders reading their local widths off the
parameter TensorDefs."""

from __future__ import annotations

from dataclasses import fields, replace

from helpers_run import tiny_run
from sources import ctx_of, forward_ops_of

from timeline.graph.build import chunk_layers, chunk_nodes
from timeline.graph.families.moe import local_widths
from timeline.profiles import PROFILES, profile
from timeline.profiles.base import Lifecycle, Limits, ParamRules, SaveRules, Structure
from timeline.spec.model import ModelSpec
from timeline.spec.presets import PRESETS

SMALL_MOE = replace(PRESETS["deepseek-v3"], name="tiny-moe", hidden_size=64, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=8, intermediate_size=128, vocab_size=500,
                    q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                    n_routed_experts=16, moe_intermediate_size=32, first_k_dense_replace=1, mtp_layers=1)


def test_every_profile_is_registered_once():
    assert list(PROFILES) == ["megatron", "paper", "hf"]  # megatron, the default, first
    for name, p in PROFILES.items():
        assert p.name == p.saved.name == name
        assert profile(name) is p


def test_no_fact_in_two_tables():
    groups = [{f.name for f in fields(t)} - {"name"} for t in (ParamRules, SaveRules, Structure, Lifecycle, Limits)]
    for i, a in enumerate(groups):
        for b in groups[i + 1:]:
            assert not a & b


def test_structure_holds_no_model_family():
    """Architecture facts are the model's (ModelSpec), not lists of model types in a profile."""
    # cp_comm is the run's per-layer list of TE context-parallel exchanges (Megatron's --cp-comm-type), no model type
    for p in PROFILES.values():
        assert not any(isinstance(getattr(p.structure, f.name), tuple) for f in fields(Structure) if f.name != "cp_comm")
        assert set(p.structure.cp_comm) <= {"p2p", "a2a", "a2a+p2p"}
    facts = ("fused_qkv", "residual_dropout", "router_score", "router_weights_cast", "rope_half_width",
             "norm_output_fp32")
    assert not {f.name for f in fields(ModelSpec)} & set(facts)  # derived: outputs list every field


def test_context_reads_the_runs_profile():
    run = tiny_run(model=SMALL_MOE, profile="paper", pp=1, tp=2, ep=2, sp=True, seq_len=64)
    ctx = ctx_of(run)
    assert ctx.rules is PROFILES["paper"]
    assert ctx.profile is ctx.rules.params and ctx.structure is ctx.rules.structure and ctx.saved is ctx.rules.saved


def test_moe_widths_come_from_the_parameters():
    """Shared experts: TP-split under megatron, replicated under the paper (one rule, in the profile)."""
    for name, shared in (("megatron", SMALL_MOE.shared_ffn // 2), ("paper", SMALL_MOE.shared_ffn)):
        run = tiny_run(model=SMALL_MOE, profile=name, pp=1, tp=2, ep=4, etp=2, sp=True, seq_len=64)
        nodes = chunk_nodes(ctx_of(run), chunk_layers(run.parallel, run.model.num_hidden_layers), 0)
        params = {t.name: t for n in nodes for t in n.params}
        local = local_widths(params, "layers.1.mlp")
        assert (local.experts, local.expert_ffn, local.shared_ffn) == (4, 16, shared)
        ops = {op.name: op for op in forward_ops_of(run, 0)}
        fc1 = ops["layers.1.mlp.shared_experts.linear_fc1"].outputs["y"]
        assert fc1.shape[1] == 2 * shared  # SwiGLU's fused gate and up


def test_mtp_modules_follow_the_parameter_graph():
    for name, n in (("megatron", 1), ("hf", 0)):
        run = tiny_run(model=SMALL_MOE, profile=name, pp=1, seq_len=64)
        names = {op.name for op in forward_ops_of(run, 0)}
        assert any(x.startswith("mtp.0.") for x in names) == bool(n)
