"""Megatron's legacy GPT model (``framework.use_legacy_models``) against the Megatron-Core layer of the same
transformer_impl it is modelled from: exact saved bytes of one tiny layer (profiles/megatron_legacy.py)."""

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


def _saved_te(model, *, legacy: bool, tp: int = 1) -> dict[str, int]:
    """Every saved tensor of a one-layer model on one stage under transformer_impl = transformer_engine."""
    run = tiny_run(pp=1, layers=1, model=model, tp=tp, micro_batch_size=B, seq_len=S, use_legacy_models=legacy)
    return {st.tensor.name: st.tensor.size_bytes for st in template_of(run, 0).saved}


def test_te_transformer_layer_is_the_core_te_layer_and_the_final_norm_the_legacy_one():
    """Under transformer_engine the legacy model builds TE's TransformerLayer (LayerNormLinear q/k/v, TE's
    attention, LayerNormMLP): Core's TE layer tensor for tensor. Its final norm is utils.py get_norm's: under
    RMSNorm the torch ops (an fp32 copy of the input, the 16-bit normalised tensor, rsigma), under LayerNorm
    apex's fused norm (the same bytes as TE's)."""
    for tp in (1, 2):
        core, legacy = _saved_te(TINY_MODEL, legacy=False, tp=tp), _saved_te(TINY_MODEL, legacy=True, tp=tp)
        # the layer's output is the final norm's input: TE's norm keeps it, the torch-op norm its fp32 copy
        layer_core = {k: v for k, v in core.items() if k.startswith("layers.") and k != "layers.0.output"}
        assert {k: v for k, v in legacy.items() if k.startswith("layers.")} == layer_core
        assert not any(k.endswith((".upcast.out", ".normed", ".act.silu")) for k in layer_core)
        assert core["layers.0.output"] == ROWS * H * 2
        assert legacy["final_norm.upcast.out"] == ROWS * H * 4
        assert legacy["final_norm.normed"] == ROWS * H * 2
        assert legacy["final_norm.rsigma"] == core["final_norm.rsigma"] == ROWS * 4
        assert "final_norm.upcast.out" not in core
        assert sum(legacy.values()) - sum(core.values()) == ROWS * H * (4 + 2 - 2)
    gpt = replace(TINY_MODEL, norm="layernorm", hidden_act="gelu", linear_bias=True, attention_bias=True,
                  position_embedding="learned")
    assert _saved_te(gpt, legacy=True) == _saved_te(gpt, legacy=False)


def test_validation_names_what_the_legacy_model_lacks():
    assert validate_run(tiny_run(pp=1, layers=1, use_legacy_models=True), LIMITS) == []  # TE's TransformerLayer
    problems = validate_run(tiny_run(pp=1, layers=1, transformer_impl="local", use_legacy_models=True, cp=2), LIMITS)
    assert any("context parallelism" in m for k, m in problems if k == "framework.use_legacy_models")


def test_switch_mlp_saves_the_router_indices_and_each_experts_rows():
    """transformer.py SwitchMLP under SP (tp 2): the router's sigmoid [T, E], both int64 index vectors of
    route[arange, max_ind], per expert the int64 [n, 1] indices, its gathered rows and its fc1 / GeLU outputs
    (n = Tg / E of the Tg = T·tp gathered rows: sinkhorn balances), and the two factors of each product with
    max_prob: the reduced output, the reduced bias rows divided by tp, and max_prob [T, 1]."""
    experts, tp = 4, 2
    gpt = replace(TINY_MODEL, norm="layernorm", hidden_act="gelu", linear_bias=True, attention_bias=True,
                  position_embedding="learned", n_routed_experts=experts, num_experts_per_tok=1,
                  moe_intermediate_size=FFN)
    run = tiny_run(pp=1, layers=1, model=gpt, tp=tp, sp=True, etp=tp, micro_batch_size=B, seq_len=S,
                   transformer_impl="local", use_legacy_models=True)
    assert validate_run(run, LIMITS) == []
    saved = {st.tensor.name: st.tensor.size_bytes for st in template_of(run, 0).saved if st.layer == 0}
    t = ROWS // tp
    n = ROWS // experts  # of the Tg = ROWS gathered rows
    p = "layers.0.mlp"
    assert saved[f"{p}.router.sigmoid"] == t * experts * 2
    assert saved[f"{p}.router.max_ind"] == saved[f"{p}.router.arange"] == t * 8
    assert saved[f"{p}.router.max_prob"] == t * 2
    assert saved[f"{p}.out_total.reduced"] == saved[f"{p}.bias_total.div"] == t * H * 2
    for e in range(experts):
        assert saved[f"{p}.experts.{e}.local_indices"] == n * 8
        assert saved[f"{p}.experts.{e}.hidden"] == n * H * 2
        assert saved[f"{p}.experts.{e}.linear_fc1.out"] == saved[f"{p}.experts.{e}.act.out"] == n * FFN // tp * 2
    mlp = {k: v for k, v in saved.items() if k.startswith(f"{p}.")}
    assert sum(mlp.values()) == (t * experts * 2 + 2 * t * 8 + t * 2 + 2 * t * H * 2
                                 + experts * (n * 8 + n * H * 2 + 2 * n * FFN // tp * 2))


def test_validation_names_what_the_switch_mlp_does_not_build():
    moe = replace(TINY_MODEL, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=128)
    problems = dict(validate_run(tiny_run(pp=1, layers=1, model=moe, transformer_impl="local",
                                          use_legacy_models=True), LIMITS))
    assert "set num_experts_per_tok = 1" in problems["model.num_experts_per_tok"]
    assert f"set moe_intermediate_size = {FFN}" in problems["model.moe_intermediate_size"]
    te = replace(moe, num_experts_per_tok=1, moe_intermediate_size=FFN)
    problems = dict(validate_run(tiny_run(pp=1, layers=1, model=te, use_legacy_models=True), LIMITS))
    assert "dense MLP" in problems["framework.use_legacy_models"]


def test_flash_self_attention_keeps_bshd_copies_and_its_varlen_backward_rows():
    """--use-flash-attn (legacy_flash_attn): q, k, v rearranged to contiguous bshd copies the varlen kernel keeps
    with its bshd output, softmax_lse [h, b·s] fp32 and the rng state, in place of the s² softmax; its backward
    (mha_varlen_bwd) allocates softmax_d [h, b·s + 128·b] and dq_accum [b·s + 128·b, h, d_rounded] fp32."""
    heads, d = TINY_MODEL.num_attention_heads, TINY_MODEL.hidden_size // TINY_MODEL.num_attention_heads
    run = tiny_run(pp=1, layers=1, model=TINY_MODEL, micro_batch_size=B, seq_len=S, transformer_impl="local",
                   use_legacy_models=True, legacy_flash_attn=True)
    tpl = template_of(run, 0)
    saved = {st.tensor.name: st.tensor.size_bytes for st in tpl.saved if st.layer == 0}
    core = "layers.0.self_attn.core_attn"
    for x in ("q", "k", "v"):
        assert saved[f"{core}.to_bshd.{x}"] == ROWS * heads * d * 2
    assert saved[f"{core}.out_bshd"] == ROWS * heads * d * 2
    assert saved[f"{core}.softmax_lse"] == B * heads * S * 4
    assert f"{core}.softmax" not in saved
    bwd = {t.name: t.size_bytes for op in tpl.backward_i if op.name.startswith(core) for t in op.allocs}
    assert bwd[f"{core}.backward_scratch.softmax_d"] == heads * (ROWS + 128 * B) * 4
    assert bwd[f"{core}.backward_scratch.dq_accum"] == (ROWS + 128 * B) * heads * 32 * -(-d // 32) * 4
    assert validate_run(run, LIMITS) == []
    for bad in (dict(use_legacy_models=False), dict(transformer_impl="transformer_engine")):
        wrong = tiny_run(pp=1, layers=1, model=TINY_MODEL, micro_batch_size=B, seq_len=S,
                         **{"transformer_impl": "local", "use_legacy_models": True, "legacy_flash_attn": True, **bad})
        assert any(p[0] == "framework.legacy_flash_attn" for p in validate_run(wrong, LIMITS)), bad
