"""Megatron's legacy GPT model (``framework.use_legacy_models``) against the local Megatron-Core layer it
is modelled from: exact saved bytes of one tiny layer (profiles/megatron_legacy.py)."""

from __future__ import annotations

from dataclasses import replace

from helpers_run import TINY_MODEL, tiny_run
from sources import template_of

from timeline.profiles import LIMITS
from timeline.spec.validate import validate_run

B, S = 2, 128
ROWS = B * S
H, FFN = TINY_MODEL.hidden_size, TINY_MODEL.intermediate_size
NORMS = ("layers.0.input_layernorm", "layers.0.post_attention_layernorm")


def _saved(model, *, legacy: bool, tp: int = 1) -> dict[str, int]:
    run = tiny_run(pp=1, layers=1, model=model, tp=tp, micro_batch_size=B, seq_len=S, transformer_impl="local",
                   use_legacy_models=legacy)
    return {st.tensor.name: st.tensor.size_bytes for st in template_of(run, 0).saved if st.layer == 0}


def test_layernorm_gelu_layer_saves_what_the_local_core_layer_saves():
    """LayerNorm (apex MixedFusedLayerNorm), bias-GeLU fusion, the unfused CoreAttention: the legacy
    layer of a GPT-3-style model is the local Core layer tensor for tensor."""
    gpt = replace(TINY_MODEL, norm="layernorm", hidden_act="gelu", linear_bias=True, attention_bias=True,
                  position_embedding="learned")
    for tp in (1, 2):
        core, legacy = _saved(gpt, legacy=False, tp=tp), _saved(gpt, legacy=True, tp=tp)
        assert legacy == core
        assert legacy["layers.0.self_attn.core_attn.softmax"] == B * (TINY_MODEL.num_attention_heads // tp) * S * S * 2


def test_rmsnorm_and_swiglu_run_as_torch_ops():
    """rms_norm.py RMSNorm: the fp32 copy of the input (4 B) and the 16-bit normalised tensor (2 B) replace
    the 16-bit input (2 B), rsigma as before; ParallelMLP's swiglu: silu(gate) [rows, ffn] is kept beside
    the fc1 output."""
    core, legacy = _saved(TINY_MODEL, legacy=False), _saved(TINY_MODEL, legacy=True)
    for n in NORMS:
        assert legacy[f"{n}.upcast.out"] == ROWS * H * 4
        assert legacy[f"{n}.normed"] == ROWS * H * 2
        assert legacy[f"{n}.rsigma"] == core[f"{n}.rsigma"] == ROWS * 4
        assert f"{n}.upcast.out" not in core and f"{n}.normed" not in core
    assert legacy["layers.0.mlp.act.silu"] == ROWS * FFN * 2
    assert legacy["layers.0.mlp.linear_fc1.out"] == core["layers.0.mlp.linear_fc1.out"] == ROWS * 2 * FFN * 2
    extra = len(NORMS) * ROWS * H * (4 + 2 - 2) + ROWS * FFN * 2
    assert sum(legacy.values()) - sum(core.values()) == extra


def test_validation_names_what_the_legacy_model_lacks():
    run = tiny_run(pp=1, layers=1, use_legacy_models=True)  # transformer_impl left at transformer_engine
    problems = validate_run(run, LIMITS)
    assert [k for k, _ in problems] == ["framework.use_legacy_models"]
    assert "transformer_impl" in problems[0][1]
    moe = replace(TINY_MODEL, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=128)
    problems = validate_run(tiny_run(pp=1, layers=1, model=moe, transformer_impl="local", use_legacy_models=True),
                            LIMITS)
    assert any("MoE" in m for k, m in problems if k == "framework.use_legacy_models")
