"""``megatron`` profile on GPT-OSS (Megatron-Core 0.15, TE 2.8; ``timeline/profiles/megatron_gptoss.py``):
the published gpt-oss-20b under TP 2 (sequence parallel), EP 4, expert-TP 2, one micro-batch of 4096
tokens. Each decoder layer saves exactly what the cited rules say — fused attention with the sinks'
fp32 ``softmax_offset`` and no s² tensor, the clamped quick-GEGLU's concatenated input and offset
scalar — and sliding-window layers cost fewer attention FLOPs but save the same bytes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from sources import forward_ops_of, template_of, tensors_of

from timeline.io.runfile import load_run
from timeline.profiles.megatron_gptoss import RULES, extend
from timeline.spec.recompute import parse_recompute

CONFIG = Path(__file__).resolve().parents[1] / "data" / "hf" / "gpt-oss-20b" / "config.json"
S, TP, EP = 4096, 2, 4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("gptoss") / "run.toml"
    path.write_text(f'[model]\nhf_config = "{CONFIG}"\nprofile = "megatron"\n[parallel]\npp = 2\ntp = {TP}\n'
                    f'ep = {EP}\ndp = 4\n[training]\nseq_len = {S}\nnum_microbatches = 4\n')
    return load_run(path, [])


def layer_bytes(m, etp: int = TP) -> int:
    """One GPT-OSS MoE layer as the rules save it (bf16, b = 1): the input norm fused into linear_qkv
    (input, fp32 rsigma, local output shard), fused attention (q, k, v, output, fp32 softmax stats,
    rng state, fp32 softmax_offset per local head), the pre-MLP TENorm (input, rsigma, output), the
    softmax router (fp32 top-k softmax, int64 indices), the permutation (transposed probs and routing
    map, int64 sorted indices), the experts' received rows and probs, linear_fc1's output, the clamped
    concatenation and its offset scalar, and the activation output."""
    h, d, nq, nkv = m.hidden_size, m.attn_head_dim, m.num_attention_heads // TP, m.kv_heads // TP
    t_sp, k, e, i = S // TP, m.num_experts_per_tok, m.n_routed_experts, m.moe_intermediate_size
    norm = 2 * t_sp * h + 4 * t_sp + 2 * t_sp * h
    attention = 2 * S * nq * d * 2 + 2 * S * nkv * d * 2 + 4 * nq * S + 16 + 4 * nq
    router = 4 * t_sp * k + 8 * t_sp * k + 2 * e * t_sp + e * t_sp + 8 * t_sp * k
    rows = t_sp * k * etp
    experts = 2 * rows * h + 2 * rows + 2 * (2 * rows * 2 * i // etp) + 2 + 2 * rows * i // etp
    return 2 * norm + attention + router + experts


def test_layer_is_the_sum_of_its_rules(run):
    t = template_of(run, 0)
    assert t.layer_activation_bytes[1] == layer_bytes(run.model)
    assert t.layer_activation_bytes[0] == t.layer_activation_bytes[1]  # sliding and full layers save alike


def test_sinks_keep_an_fp32_offset_and_no_s2_tensor(run):
    saved = {st.tensor.name: st for st in template_of(run, 0).saved if st.layer == 0}
    offset = saved["layers.0.self_attn.core_attn.softmax_offset"]
    assert offset.tensor.shape == (1, 64 // TP, 1, 1) and offset.tensor.size_bytes == 4 * 64 // TP
    assert "cuDNN ≥ 9.13.1" in offset.source and "TE ≥ 2.8.0" in offset.source
    attention = [st.tensor.numel for n, st in saved.items() if ".self_attn." in n]
    assert len(attention) == 7 and max(attention) < S * S  # fused: no scores, no softmax


def test_off_by_one_sink_is_a_plain_fp32_tensor_kept_without_a_copy(run):
    """TE's softmax_type off-by-one (dot_product_attention.py: DotProductAttention.__init__): torch.zeros(heads/tp)
    in fp32, no parameter; forward's .to(torch.float32) is the tensor itself, so nothing more is saved."""
    fixed = replace(run, model=replace(run.model, sink_fixed=True))
    _, tensors = tensors_of(fixed, 0)
    by = {t.name: t for t in tensors}
    offset = by["layers.0.self_attn.softmax_offset"]
    assert (offset.numel, offset.dtype, offset.trainable) == (64 // TP, "fp32", False)
    assert "layers.0.self_attn.sinks" not in by
    learnable, off_by_one = template_of(run, 0), template_of(fixed, 0)
    assert learnable.layer_activation_bytes[0] - off_by_one.layer_activation_bytes[0] == 4 * 64 // TP
    assert "layers.0.self_attn.core_attn.softmax_offset" not in {st.tensor.name for st in off_by_one.saved}


def test_clamped_geglu_keeps_its_concatenated_input(run):
    saved = {st.tensor.name: st.tensor for st in template_of(run, 0).saved if st.layer == 1}
    fc1, clamped = saved["layers.1.mlp.experts.linear_fc1.out"], saved["layers.1.mlp.experts.act.clamped"]
    assert clamped.shape == fc1.shape and saved["layers.1.mlp.experts.act.linear_offset"].size_bytes == 2
    plain = replace(run, model=replace(run.model, swiglu_limit=0.0))  # the weighted SwiGLU it replaces
    assert template_of(run, 0).layer_activation_bytes[1] - template_of(plain, 0).layer_activation_bytes[1] \
        == clamped.size_bytes + 2


def test_selective_moe_act_drops_the_clamp_too(run):
    rc = replace(run, recompute=parse_recompute("selective:moe_act"))
    names = {st.tensor.name for st in template_of(rc, 0).saved if st.layer == 1}
    assert not {n for n in names if ".experts.act." in n}


def test_sliding_layers_cost_window_over_sequence(run):
    flops = {op.layer: op.flops for op in forward_ops_of(run, 0) if op.name.endswith("self_attn.core_attn")}
    assert run.model.is_sliding(0) and not run.model.is_sliding(1)
    assert flops[0] * S == flops[1] * run.model.sliding_window


def test_gpt_oss_rules_only_add_names():
    from timeline.profiles import megatron

    assert not set(RULES) & set(megatron.RULES)
    with pytest.raises(ValueError, match="replace megatron rules"):
        extend(extend(megatron.BASE))


def test_attention_parameters_split_over_tp(run):

    _, tensors = tensors_of(run, 0)
    by = {t.name: t for t in tensors}
    assert by["layers.0.self_attn.sinks"].numel == 64 // TP  # softmax_offset per local head
    assert by["layers.0.self_attn.o_proj.bias"].numel == 2880  # row-parallel bias, replicated
    assert by["layers.0.mlp.gate.bias"].numel == 32
    assert by["layers.0.mlp.experts.0.down_proj.bias"].numel == 2880
    assert by["layers.0.mlp.experts.0.gate_proj.bias"].numel == 2880 // TP  # fc1 bias split with its columns
    assert sum(1 for n in by if n.endswith(".down_proj.weight") and n.startswith("layers.0.")) == 32 // EP


def test_context_parallel_sinks_are_refused(tmp_path, capsys):
    """TE 2.8 keeps no backend for a learnable softmax under the ring (p2p) context parallelism."""
    from timeline.cli import main

    path = tmp_path / "run.toml"
    path.write_text(f'[model]\nhf_config = "{CONFIG}"\nprofile = "megatron"\n[parallel]\ncp = 2\ndp = 2\n')
    assert main(["static", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "parallel.cp" in err and "cp_comm_type = a2a" in err
