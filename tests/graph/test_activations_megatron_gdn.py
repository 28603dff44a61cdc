"""``megatron`` profile on Megatron-Core's gated delta net in training (``graph/families/gdn.py: train_forward``,
``profiles/megatron_gdn.py``), and ``from-megatron`` on ``--experimental-attention-variant gated_delta_net``:
hidden 1024, GDN with 4 key heads of 64 and 8 value heads of 128, conv kernel 4, TP 2 without sequence
parallelism, micro-batch 2 × 512 tokens, pattern ``--linear-attention-freq 4`` (three GDN layers, then
attention). A GDN layer's parameters and saved tensors are the sums of the shapes the cited sources give, to the
byte."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sources import template_of

from timeline.errors import UserError
from timeline.graph.analytic import AnalyticSource
from timeline.io.megatron_args import from_mapping
from timeline.io.megatron_write import convert
from timeline.io.runfile import load_run

B, S, TP, H = 2, 512, 2, 1024
NK, NV, KD, VD, CONV = 4, 8, 64, 128, 4
RUN = f"""[model]
preset = "megatron-gpt"
num_layers = 4
hidden_size = {H}
num_attention_heads = 8
num_key_value_heads = 8
intermediate_size = 2816
hidden_act = "silu"
norm = "rmsnorm"
position_embedding = "rope"
linear_bias = false
attention_bias = false
hidden_dropout = 0.0
attention_dropout = 0.0
vocab_size = 32000
max_position_embeddings = {S}
layer_types = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
linear_conv_kernel_dim = {CONV}
linear_key_head_dim = {KD}
linear_value_head_dim = {VD}
linear_num_key_heads = {NK}
linear_num_value_heads = {NV}
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
    path = tmp_path_factory.mktemp("gdn") / "run.toml"
    path.write_text(RUN)
    return load_run(path, [])


def test_gdn_layer_parameters(run):
    """in_proj [(2·256 + 2·1024 + 2·8)/2, 1024] (q, k, v, gate, beta, alpha), conv1d [(2·256 + 1024)/2, 1, 4]
    without bias, dt_bias and A_log [8/2], out_norm over one value head [128], out_proj [1024, 1024/2]."""
    src = AnalyticSource(model=run.model, profile="megatron", framework=run.framework, parallel=run.parallel,
                         training=run.training)
    params = {t.name: t for n in src.nodes(0) if n.layer == 0 and n.kind in ("norm", "gdn") for t in n.params}
    shapes = {k.removeprefix("layers.0."): t.shape for k, t in params.items()}
    k, v = NK * KD, NV * VD
    assert {k_: s for k_, s in shapes.items() if "linear_attn" in k_ or k_.startswith("input_")} == {
        "input_layernorm.weight": (H,), "linear_attn.in_proj.weight": ((2 * k + 2 * v + 2 * NV) // TP, H),
        "linear_attn.conv1d.weight": ((2 * k + v) // TP, 1, CONV), "linear_attn.dt_bias": (NV // TP,),
        "linear_attn.A_log": (NV // TP,), "linear_attn.out_norm.weight": (VD,),
        "linear_attn.out_proj.weight": (H, v // TP)}
    assert {n.kind for n in src.nodes(0) if n.layer == 3} >= {"mha"}  # every 4th layer attends


def test_gdn_layer_saves_what_the_sources_say(run):
    """The fused norm (fp32 rsigma, its output for in_proj), the conv's contiguous input [t, (2K + V)/tp], the
    l2norm's output [t, 2K/tp] and fp32 rstd (a row per head), q and k at the value heads, v, the compiled gate
    function's alpha and beta, the chunk kernel's sigmoid beta, fp32 cumulative g and A [t, v_heads/tp, 64],
    out_norm's input and fp32 rsigma, the gate and out_norm's output (the compiled gated product), out_proj's
    input."""
    t, k, v, nk, nv = B * S, NK * KD // TP, NV * VD // TP, NK // TP, NV // TP
    qk = nv * KD  # q and k repeated to the value heads
    expected = (4 * t + 2 * t * H  # input norm
                + 2 * t * (2 * k + v)  # conv input
                + 2 * t * 2 * k + 4 * t * 2 * nk  # l2norm y, rstd
                + 2 * 2 * t * qk + 2 * t * v  # q, k, v
                + 2 * 2 * t * nv + 2 * t * nv  # alpha, beta in; sigmoid beta
                + 4 * t * nv + 2 * t * nv * 64  # chunk g, A
                + 2 * t * v + 4 * t * nv  # out_norm input, rsigma
                + 2 * t * v + 2 * t * v  # gate, out_norm output
                + 2 * t * v)  # out_proj input
    tpl = template_of(run, 0)
    saved = [st for st in tpl.saved if st.layer == 0 and (".linear_attn." in st.tensor.name
                                                           or ".input_layernorm." in st.tensor.name)]
    assert sum(st.tensor.size_bytes for st in saved) == expected
    assert tpl.layer_activation_bytes[0] == tpl.layer_activation_bytes[2] != tpl.layer_activation_bytes[3]


def test_gdn_training_elsewhere_is_refused(tmp_path):
    """Under context parallelism (the all-to-alls are not modelled), and under another profile."""
    path = tmp_path / "run.toml"
    path.write_text(RUN.replace("[parallel]", "[parallel]\ncp = 2"))
    with pytest.raises(UserError, match="parallel.cp: gated delta-net layers under context parallelism"):
        load_run(path, [])
    path.write_text(RUN.replace("[parallel]\ntp = 2", "[parallel]\ntp = 1").replace("[parallel]",
                                                                                   'profile = "hf"\n[parallel]'))
    with pytest.raises(UserError, match='model.layer_types: gated delta-net layers .* are trained as Megatron-Core'):
        load_run(path, [])


BASE = {"--num-layers": 4, "--hidden-size": 256, "--num-attention-heads": 8, "--seq-length": 512,
        "--micro-batch-size": 2, "--global-batch-size": 16, "--bf16": True}


def model_of(args: dict) -> dict:
    return convert(from_mapping(BASE | args), world_size=2).sections["model"]


def test_from_megatron_reads_the_gated_delta_net():
    """``--linear-attention-freq N`` makes every N-th layer attention (get_linear_attention_pattern); a list
    expression gives each layer; sizes default to TransformerConfig's."""
    m = model_of({"--experimental-attention-variant": "gated_delta_net", "--linear-attention-freq": 2})
    assert list(m["layer_types"]) == ["linear_attention", "full_attention"] * 2
    assert (m["linear_num_key_heads"], m["linear_num_value_heads"], m["linear_key_head_dim"],
            m["linear_value_head_dim"], m["linear_conv_kernel_dim"]) == (16, 32, 128, 128, 4)
    m = model_of({"--experimental-attention-variant": "gdn", "--linear-attention-freq": "[0]+[1]*3",
                  "--linear-num-key-heads": 2, "--linear-num-value-heads": 4})
    assert list(m["layer_types"]) == ["full_attention"] + ["linear_attention"] * 3
    assert (m["linear_num_key_heads"], m["linear_num_value_heads"]) == (2, 4)


def test_from_megatron_refuses_other_variants_and_a_missing_pattern():
    with pytest.raises(UserError, match="dsa: only the gated delta net"):
        model_of({"--experimental-attention-variant": "dsa"})
    with pytest.raises(UserError, match="needs --linear-attention-freq"):
        model_of({"--experimental-attention-variant": "gated_delta_net"})
    with pytest.raises(UserError, match="each of the 4 layers"):
        model_of({"--experimental-attention-variant": "gated_delta_net", "--linear-attention-freq": "[1]*3"})


def test_the_dev_branchs_linear_attention_type_is_the_variant():
    """``--linear-attention-type gated_delta_net`` (the dev branch, c7590d8c37 … a9fb6c8ba3) is what validate_args
    copies into ``experimental_attention_variant``: the same layers, with a note; its other kinds and a conflicting
    variant are one line each."""
    conv = convert(from_mapping(BASE | {"--linear-attention-type": "gated_delta_net", "--linear-attention-freq": 2}),
                   world_size=2)
    assert conv.sections["model"] == model_of({"--experimental-attention-variant": "gated_delta_net",
                                               "--linear-attention-freq": 2})
    assert any("dev branch's name for --experimental-attention-variant" in n for n in conv.notes)
    with pytest.raises(UserError, match="--linear-attention-type mamba: only gated_delta_net"):
        model_of({"--linear-attention-type": "mamba", "--linear-attention-freq": 2})
    with pytest.raises(UserError, match="deprecated name of the second"):
        model_of({"--linear-attention-type": "gated_delta_net", "--experimental-attention-variant": "dsa",
                  "--linear-attention-freq": 2})


def test_autotuned_kernels_hold_triton_s_flush_buffer_at_their_first_calls(run):
    """fla's kernels are @triton.autotune'd: Triton's do_bench holds its 256 MiB flush buffer (PyTorch ≥ 2.6's
    Triton) at the first forward's first GDN op and at the first backward's, which is the last GDN layer's."""
    from timeline.result.build import build_timeline

    tl = build_timeline(replace(run, framework=replace(run.framework, pytorch="2.8")))
    ev = tl.events(0)
    rows = [(tl.names[t], int(s), int(z), tl.names[o], int(m), int(i)) for t, s, z, o, m, i in zip(
        ev.tensor, ev.sign, ev.size, ev.op, ev.microbatch, ev.iteration, strict=True)
        if tl.names[t].startswith("autotune.gdn.")]
    assert [(n, s, z, o) for n, s, z, o, *_ in rows] == [
        ("autotune.gdn.forward.flush", 1, 256 * 2**20, "layers.0.linear_attn.chunk_gated_delta_rule"),
        ("autotune.gdn.forward.flush", -1, 256 * 2**20, "layers.0.linear_attn.chunk_gated_delta_rule"),
        ("autotune.gdn.backward.flush", 1, 256 * 2**20, "layers.2.linear_attn.chunk_gated_delta_rule"),
        ("autotune.gdn.backward.flush", -1, 256 * 2**20, "layers.2.linear_attn.chunk_gated_delta_rule")]
    assert {(m, i) for *_, m, i in rows} == {(0, 0)}  # once per process: the first micro-batch of the first iteration


def test_gdn_norm_out_recompute_keeps_the_checkpoint_inputs_only(run):
    """--recompute-modules gdn_norm_out (CheckpointWithoutOutput over _gated_norm_and_a2a): out_norm's output and
    rsigma and out_proj's discarded input are not kept; core_attn_out and the gate are, as the checkpoint's inputs."""
    from timeline.spec.recompute import parse_recompute

    t, v, nv = B * S, NV * VD // TP, NV // TP
    rc = replace(run, recompute=parse_recompute("selective:gdn_norm_out"))
    base, cut = template_of(run, 0), template_of(rc, 0)
    assert base.layer_activation_bytes[0] - cut.layer_activation_bytes[0] == 2 * t * v + 4 * t * nv + 2 * t * v
    kept = {st.tensor.name for st in cut.saved if st.layer == 0}
    assert {"layers.0.linear_attn.core_attn_out", "layers.0.linear_attn.gate"} <= kept
    assert not kept & {"layers.0.linear_attn.out_norm.out", "layers.0.linear_attn.norm_out"}
    assert cut.layer_activation_bytes[3] == base.layer_activation_bytes[3]  # the attention layer is untouched


def test_from_megatron_passes_gdn_norm_out_recompute():
    s = convert(from_mapping(BASE | {"--experimental-attention-variant": "gated_delta_net",
                                     "--linear-attention-freq": 2, "--recompute-granularity": "selective",
                                     "--recompute-modules": ["core_attn", "gdn_norm_out"]}), world_size=2).sections
    assert s["recompute"] == {"policy": "selective", "modules": ["core_attn", "gdn_norm_out"]}
