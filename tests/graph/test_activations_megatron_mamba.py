"""``megatron`` profile on a hybrid Mamba model (``graph/families/mamba.py``, ``profiles/megatron_mamba.py``):
the shape of Megatron-LM's ``hybrid_mr_mcore_te`` functional tests (hidden 1024, 16 heads in 8 groups, GeLU MLP
4096, LayerNorm, Mamba-2 with 32 heads of 64, 8 groups, state 128), TP 2 without sequence parallelism, micro-batch
4 × 1024 tokens, pattern ``M*-M``. A Mamba layer's parameters and saved tensors are the sums of the shapes the
cited sources give, to the byte."""

from __future__ import annotations

import pytest
from sources import template_of

from timeline.errors import UserError
from timeline.graph.analytic import AnalyticSource
from timeline.io.runfile import load_run

B, S, TP, H = 4, 1024, 2, 1024
HEADS, HEAD_DIM, GROUPS, STATE, CONV = 32, 64, 8, 128, 4
RUN = f"""[model]
preset = "megatron-gpt"
num_layers = 4
hidden_size = {H}
num_attention_heads = 16
num_key_value_heads = 8
intermediate_size = 4096
hidden_act = "gelu"
norm = "layernorm"
position_embedding = "learned"
linear_bias = true
attention_bias = true
hidden_dropout = 0.1
vocab_size = 50257
max_position_embeddings = {S}
hybrid_override_pattern = "M*-M"
[parallel]
tp = {TP}
sp = false
[training]
micro_batch_size = {B}
seq_len = {S}
num_microbatches = 2
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("mamba") / "run.toml"
    path.write_text(RUN)
    return load_run(path, [])


def test_mamba_layer_parameters(run):
    """in_proj [(2·2048 + 2·8·128 + 32)/2, 1024], conv1d [4096/2, 1, 4] + bias, dt_bias/A_log/D [16],
    the gated norm [1024], out_proj [1024, 2048/2], the fused LayerNorm's weight and bias [1024]."""
    src = AnalyticSource(model=run.model, profile="megatron", framework=run.framework, parallel=run.parallel,
                         training=run.training)
    params = {t.name: t for n in src.nodes(0) if n.layer == 0 for t in n.params}
    shapes = {k.removeprefix("layers.0."): t.shape for k, t in params.items()}
    assert shapes == {"input_layernorm.weight": (H,), "input_layernorm.bias": (H,),
                      "mixer.in_proj.weight": (6176 // TP, H), "mixer.conv1d.weight": (4096 // TP, 1, CONV),
                      "mixer.conv1d.bias": (4096 // TP,), "mixer.dt_bias": (16,), "mixer.A_log": (16,),
                      "mixer.D": (16,), "mixer.norm.weight": (1024,), "mixer.out_proj.weight": (H, 1024)}
    assert sum(t.size_bytes for t in params.values()) == 2 * (2 * H + 3088 * H + 2048 * 4 + 2048 + 3 * 16 + 1024
                                                               + H * 1024)
    assert {n.kind for n in src.nodes(0) if n.layer == 1} == {"norm", "mha"}  # '*': attention only
    assert {n.kind for n in src.nodes(0) if n.layer == 2} == {"norm", "mlp"}  # '-': MLP only


def test_mamba_layer_saves_what_the_sources_say(run):
    """The fused norm (input, fp32 mu and rsigma, output for in_proj's wgrad), the scan's transposed zxBCdt
    [t, 3088] and ungated out_x [t, 1024] with fp32 A and dt_bias [16], the gated norm's input and fp32 rstd
    (4 local groups per row), out_proj's input, the bias-dropout-add's 1-byte mask."""
    t, d_in, d_inner, groups = B * S, 3088, 1024, GROUPS // TP
    norm = 2 * t * H + 4 * t + 4 * t + 2 * t * H
    scan = 2 * t * d_in + 2 * t * d_inner + 4 * 16 + 4 * 16
    gated = 2 * t * d_inner + 4 * groups * t
    expected = norm + scan + gated + 2 * t * d_inner + t * H
    tpl = template_of(run, 0)
    assert tpl.layer_activation_bytes[0] == expected
    assert tpl.layer_activation_bytes[3] == expected
    saved = {st.tensor.name: st for st in tpl.saved if st.layer == 0}
    assert saved["layers.0.mixer.zxbcdt"].tensor.shape == (t, d_in)
    assert "MambaSplitConv1dScanCombinedFn" in saved["layers.0.mixer.scan.out_x"].source


def test_scan_working_set_is_freed_by_the_scan(run):
    """dt and dA_cumsum fp32 [b, 16, 8, 128], CB fp32 [b, 8, 4, 128, 128]: alive only while the scan runs."""
    tpl = template_of(run, 0)
    scan = next(op for op in tpl.forward if op.name == "layers.0.mixer.scan")
    sizes = {a.name.rsplit(".", 1)[1]: a.size_bytes for a in scan.allocs}
    assert sizes["CB"] == 4 * B * 8 * 4 * 128 * 128 and sizes["dt"] == 4 * B * 16 * 8 * 128
    work = ("CB", "dt", "dA_cumsum", "xbc_conv", "states", "final_states")
    assert {f"layers.0.mixer.scan.{k}" for k in work} <= set(scan.frees)
    assert "layers.0.mixer.scan.out_x" not in scan.frees


def test_hybrid_validation_names_the_field(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(RUN.replace('"M*-M"', '"M*-X"'))
    with pytest.raises(UserError, match="hybrid_override_pattern.*'X' is not a layer symbol"):
        load_run(path, [])
    path.write_text(RUN.replace("tp = 2", "tp = 2\ncp = 8"))
    with pytest.raises(UserError, match="parallel.cp"):
        load_run(path, [])


def test_a_hybrid_models_mtp_depths_are_attention_then_mlp(tmp_path):
    """Two MTP depths (Megatron's '…/*-/*-'): each an attention and an MLP layer around enorm, hnorm and eh_proj,
    the layers a GPT model's MTP depth runs; with mtp_repeated_layer (--mtp-use-repeated-layer) the second depth
    holds no parameter of its own and saves what the first saves."""
    path = tmp_path / "run.toml"
    path.write_text(RUN.replace("[parallel]", "mtp_layers = 2\n[parallel]"))
    run = load_run(path, [])
    src = AnalyticSource(model=run.model, profile="megatron", framework=run.framework, parallel=run.parallel,
                         training=run.training)
    inner = {t.name.split(".")[3] for n in src.nodes(0) if n.name == "mtp.0" for t in n.params
             if t.name.startswith("mtp.0.layer.")}
    assert inner == {"input_layernorm", "self_attn", "post_attention_layernorm", "mlp"}
    params = {n.name: sum(t.size_bytes for t in n.params) for n in src.nodes(0) if n.kind == "mtp"}
    assert params["mtp.0"] == params["mtp.1"] > 0
    path.write_text(RUN.replace("[parallel]", "mtp_layers = 2\nmtp_repeated_layer = true\n[parallel]"))
    shared = load_run(path, [])
    src1 = AnalyticSource(model=shared.model, profile="megatron", framework=shared.framework,
                          parallel=shared.parallel, training=shared.training)
    params1 = {n.name: sum(t.size_bytes for t in n.params) for n in src1.nodes(0) if n.kind == "mtp"}
    assert params1 == {"mtp.0": params["mtp.0"], "mtp.1": 0}
    saved = {st.tensor.name: st.tensor.size_bytes for st in template_of(run, 0).saved if st.tensor.name.startswith("mtp.")}
    saved1 = {st.tensor.name: st.tensor.size_bytes for st in template_of(shared, 0).saved
              if st.tensor.name.startswith("mtp.")}
    assert saved1 == saved and any(n.startswith("mtp.1.layer.mlp") for n in saved)
