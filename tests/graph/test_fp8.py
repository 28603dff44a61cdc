"""FP8 training (``[training] fp8_recipe`` / ``fp8_param_gather``): the exact bytes of what one TE linear
keeps under FP8 — its FP8 input copy and ``scale_inv`` for the weight gradient, the FP8 weight copies
kept between micro-batches — and the userbuffers' cuBLAS workspace, from shapes."""

from __future__ import annotations

import pytest
from helpers_run import tiny_run
from sources import template_of

from timeline.profiles.megatron_fp8 import amax_histories, is_te_linear_weight, needs_transpose, weight_caches
from timeline.profiles.megatron_workspaces import ub_workspace_bytes
from timeline.result.build import build_timeline
from timeline.spec.validate import validate_run

T, H, FFN = 128, 256, 512  # the tiny run: seq 128 × micro-batch 1 tokens, hidden 256, SwiGLU ffn 512


def saved_of(run, layer: int = 0) -> dict[str, tuple[tuple[int, ...], str, int]]:
    return {st.tensor.name: (st.tensor.shape, st.tensor.dtype, st.tensor.size_bytes)
            for st in template_of(run, 0).saved if st.layer == layer}


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_a_te_linear_keeps_the_fp8_copy_of_its_input_and_its_scale_inv(recipe):
    run = tiny_run(tp=2, sp=True, fp8_recipe=recipe)
    s = saved_of(run)
    # linear_fc2 (row-parallel, no gather): the [tokens, ffn/tp] input quantized, 1 byte per element
    assert s["layers.0.mlp.linear_fc2.x_fp8"] == ((T, FFN // 2), "fp8", T * FFN // 2)
    assert s["layers.0.mlp.linear_fc2.x_scale_inv"] == ((1,), "fp32", 4)
    # linear_qkv under SP: the local row-wise shard [tokens/tp, h]
    assert s["layers.0.self_attn.linear_qkv.x_fp8"] == ((T // 2, H), "fp8", T // 2 * H)
    # the bf16 act output is no longer kept for fc2's weight gradient
    bf16 = saved_of(tiny_run(tp=2, sp=True))
    assert "layers.0.mlp.act.out" in bf16 and "layers.0.mlp.act.out" not in s


def test_only_the_decoder_layers_te_linears_quantize():
    run = tiny_run(tp=2, sp=True, fp8_recipe="tensorwise")
    names = {st.tensor.name for st in template_of(run, 0).saved if st.tensor.name.endswith(".x_fp8")}
    assert names == {f"layers.0.{m}.x_fp8" for m in ("self_attn.linear_qkv", "self_attn.linear_proj",
                                                      "mlp.linear_fc1", "mlp.linear_fc2")}


E = 1024 * 256  # elements of the [1024, 256] weight below


@pytest.mark.parametrize(("sm", "param_gather", "expected"), [
    (90, False, 2 * E + 4),  # Hopper: FP8 data + its transpose, one byte each, and a [1] fp32 scale_inv
    (100, False, E + 4),     # Blackwell takes non-TN FP8 GEMMs: no transpose
    (90, True, E),           # FP8 parameters: the kept transpose only (the weight itself is the parameter)
    (100, True, 0),
])
def test_fp8_weight_copies_per_te_linear(sm, param_gather, expected):
    class W:
        name, shape, trainable, expert = "layers.0.mlp.linear_fc1.weight", (1024, 256), True, False
    out = weight_caches([W()], param_gather=param_gather, sm=sm)
    assert sum(size for _n, size, _s in out) == expected


def _weight(name: str):
    class W:
        shape, trainable, expert = (1024, 256), True, False
    W.name = name
    return W()


@pytest.mark.parametrize("grouped", [True, False])
def test_delayed_scaling_keeps_an_amax_history_and_scales_per_te_module(grouped):
    """TE fp8.py DelayedScalingRecipeState per module: forward 3 quantizers per GEMM, backward 2, each an fp32
    [history, quantizers] amax history and an fp32 [quantizers] scale. q/k/v are one linear_qkv, gate and up one
    linear_fc1; a TEGroupedLinear's GEMMs are its local experts. The router is not a TE module."""
    names = [f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"] + ["layers.0.mlp.gate.weight"]
    names += [f"layers.0.mlp.experts.{e}.{p}_proj.weight" for e in range(4) for p in ("gate", "up", "down")]
    out = dict((n, size) for n, size, _ in amax_histories([_weight(n) for n in names], history=1024,
                                                           grouped_experts=grouped))
    assert out["fp8.amax_history.layers.0.self_attn.linear_qkv.fwd"] == 1024 * 3 * 4
    assert out["fp8.amax_history.layers.0.self_attn.linear_qkv.bwd"] == 1024 * 2 * 4
    assert out["fp8.scale.layers.0.self_attn.linear_qkv.fwd"] == 3 * 4
    assert "fp8.scale.layers.0.self_attn.linear_proj.bwd" in out
    if grouped:
        assert out["fp8.amax_history.layers.0.mlp.experts.linear_fc1.fwd"] == 1024 * 4 * 3 * 4
        assert len(out) == 4 * 4  # qkv, proj, the grouped fc1 and fc2: forward and backward, history and scale
    else:
        assert out["fp8.amax_history.layers.0.mlp.experts.3.linear_fc2.bwd"] == 1024 * 2 * 4
        assert len(out) == 10 * 4
    assert sum(out.values()) == 10 * (1024 * 5 * 4 + 5 * 4)  # the same ten GEMMs either way


def test_a_longer_amax_history_adds_its_rows_to_the_peak():
    """A one-layer dense device holds four TE modules of one GEMM (linear_qkv, linear_proj, linear_fc1,
    linear_fc2): 1,023 more rows of 3 + 2 fp32 amaxes each."""
    peaks = [build_timeline(tiny_run(fp8_recipe="delayed", fp8_amax_history_len=h, workspaces=True)).peak(0)
             for h in (1, 1024)]
    assert peaks[1].requested_bytes - peaks[0].requested_bytes == 4 * 1023 * 5 * 4


def test_te_linear_weights_exclude_router_norms_and_embeddings():
    assert is_te_linear_weight("layers.1.self_attn.q_proj.weight", (64, 64))
    assert not is_te_linear_weight("layers.1.mlp.gate.weight", (8, 64))  # router
    assert not is_te_linear_weight("layers.1.input_layernorm.weight", (64,))
    assert not is_te_linear_weight("embedding.word_embeddings.weight", (10, 64))
    assert not needs_transpose(100) and needs_transpose(90) and needs_transpose(120)


def test_userbuffers_workspace_replaces_then_joins_the_plain_one():
    assert ub_workspace_bytes(90, "2.9") == (3 * (33_554_432 + 1024), False)
    assert ub_workspace_bytes(90, "2.12") == (3 * (33_554_432 + 1024), True)
    assert ub_workspace_bytes(80, "2.2") == (3 * 4_194_304, False)


def test_fp8_param_gather_needs_the_distributed_optimizer_and_a_recipe():
    keys = {k for k, _ in validate_run(tiny_run(fp8_recipe="tensorwise", fp8_param_gather=True, zero=0), {})}
    assert "training.fp8_param_gather" in keys
    keys = {k for k, _ in validate_run(tiny_run(fp8_param_gather=True, zero=1), {})}
    assert "training.fp8_param_gather" in keys


def test_first_and_last_layers_in_bf16():
    """``--first-last-layers-bf16`` (Megatron ``fp8_utils.py: is_first_last_bf16_layer``, global layer index):
    a 4-layer pipeline stage with 1 bf16 layer at the start and 2 at the end keeps FP8 input copies only in
    layer 1, FP8 weight caches only for its TE linears, and the bf16 layers' saved tensors as without FP8; under
    FP8 parameters their weights stay bf16. Delayed scaling with bf16 layers, and more bf16 layers than a stage
    holds, are refused as Megatron refuses them."""
    run = tiny_run(layers=4, tp=2, sp=True, fp8_recipe="tensorwise", fp8_bf16_first_layers=1,
                   fp8_bf16_last_layers=2)
    copies = {st.layer for st in template_of(run, 0).saved if st.tensor.name.endswith(".x_fp8")}
    assert copies == {1}
    plain = tiny_run(layers=4, tp=2, sp=True)
    assert saved_of(run, 0) == saved_of(plain, 0) and saved_of(run, 3) == saved_of(plain, 3)
    fp8 = tiny_run(layers=4, tp=2, sp=True, fp8_recipe="tensorwise")
    assert saved_of(run, 1) == saved_of(fp8, 1)
    names = [f"layers.{i}.mlp.linear_fc1.weight" for i in range(4)]
    out = weight_caches([_weight(n) for n in names], param_gather=False, sm=90, bf16=(1, 2, 4))
    assert {n.rsplit("layers.", 1)[1] for n, _, _ in out} == {"1.mlp.linear_fc1.weight"}  # data, transpose, scale
    keys = {k for k, _ in validate_run(tiny_run(layers=4, fp8_recipe="delayed", fp8_bf16_first_layers=1), {})}
    assert "training.fp8_bf16_first_layers" in keys
    keys = {k for k, _ in validate_run(tiny_run(layers=4, pp=2, fp8_recipe="tensorwise", fp8_bf16_last_layers=3),
                                       {})}
    assert "training.fp8_bf16_last_layers" in keys
    # the whole device: FP8 parameters keep the bf16 layers' weights in bf16
    from timeline.profiles.megatron_fp8 import is_fp8_weight

    assert not is_fp8_weight("layers.0.mlp.linear_fc1.weight", (8, 8), 1, 2, 4)
    assert is_fp8_weight("layers.1.mlp.linear_fc1.weight", (8, 8), 1, 2, 4)
    assert not is_fp8_weight("layers.2.mlp.linear_fc1.weight", (8, 8), 1, 2, 4)


def test_block_scaled_recipes_keep_block_scales():
    """Float8BlockScaling saves the column-wise (transposed) FP8 input with an fp32 scale per 128 rows of each
    column, and caches each weight in both usages with fp32 scales per 128×128 block; MXFP8 saves a same-shape
    column-wise copy with an E8M0 byte per 32 rows, padded to (4, 128) tiles, and caches weights the same way with
    byte scales (TE v2.9 ``float8_blockwise_tensor.py: get_scale_shape``, ``mxfp8_tensor.py: make_empty``)."""
    from timeline.profiles.megatron_fp8 import input_scale

    assert input_scale("blockwise", (4096, 7168)) == ((32, 7168), "fp32")
    assert input_scale("mxfp8", (4096, 7168)) == ((128, 7168), "uint8")
    assert input_scale("tensorwise", (4096, 7168)) == ((1,), "fp32")
    s = saved_of(tiny_run(tp=2, sp=True, fp8_recipe="blockwise", sm=90))
    assert s["layers.0.mlp.linear_fc2.x_fp8"] == ((T, FFN // 2), "fp8", T * FFN // 2)
    assert s["layers.0.mlp.linear_fc2.x_scale_inv"] == ((1, FFN // 2), "fp32", 4 * FFN // 2)
    w = [_weight("layers.0.mlp.linear_fc1.weight")]  # [1024, 256]
    blockwise = weight_caches(w, param_gather=False, sm=90, recipe="blockwise")
    # scales: row-wise 8 × round_up(2, 4) and column-wise 2 × round_up(8, 4) fp32 blocks
    assert sum(size for _n, size, _s in blockwise) == 2 * E + 4 * (8 * 4 + 2 * 8)
    mx = weight_caches(w, param_gather=False, sm=100, recipe="mxfp8")
    assert sum(size for _n, size, _s in mx) == 2 * E + 1024 * 8 + 32 * 256
    keys = {k for k, _ in validate_run(tiny_run(fp8_recipe="mxfp8", sm=90), {})}
    assert "training.fp8_recipe" in keys
    keys = {k for k, _ in validate_run(tiny_run(fp8_recipe="blockwise", sm=80), {})}
    assert "training.fp8_recipe" in keys
    from timeline.profiles import LIMITS

    assert not validate_run(tiny_run(fp8_recipe="blockwise", sm=90), LIMITS)
    # MXFP8 parameters are taken; the grad-buffer reuse needs them
    assert not validate_run(tiny_run(fp8_recipe="mxfp8", sm=100, fp8_param_gather=True, zero=1), LIMITS)
    keys = {k for k, _ in validate_run(tiny_run(fp8_recipe="blockwise", sm=90, fp8_param_gather=True, zero=1,
                                                mxfp8_reuse_grad_buf=True), {})}
    assert "training.mxfp8_reuse_grad_buf" in keys
    # blockwise FP8 parameters: the parameter is the row-wise data; its scales and the column-wise copy are kept
    params = weight_caches(w, param_gather=True, sm=90, recipe="blockwise")
    assert sum(size for _n, size, _s in params) == E + 4 * (8 * 4 + 2 * 8)


def test_mxfp8_parameters_reusing_the_grad_buffer_have_no_param_buffer():
    """``--fp8-param-gather --reuse-grad-buf-for-mxfp8-param-ag`` under MXFP8 (``param_and_grad_buffer.py:
    _ParamAndGradBuffer.__init__``@4e85d74ae9): the FP8 weights' buffer is one fp32 ``shared_buffer`` — their grad
    buffer, whose first half the bf16 all-gather views — and each weight keeps its own MXFP8 data (``bucket.
    param_data`` is copied into ``param.data`` after the gather, then zeroed). Against the plain FP8 parameters the
    device loses the uint8 param buffer and keeps the same one byte per element in the weights themselves."""
    from sources import devices_of

    from timeline.sim.megatron_state import megatron_events

    base = {"fp8_recipe": "mxfp8", "sm": 100, "fp8_param_gather": True, "zero": 1, "dp": 2, "layers": 2}
    plain, reuse = tiny_run(**base), tiny_run(**base, mxfp8_reuse_grad_buf=True)
    (d_plain,), (d_reuse,) = devices_of(plain, buffers=True), devices_of(reuse, buffers=True)
    fp8_plain = [b for b in d_plain.dp_buffers if b.fp8]
    fp8_reuse = [b for b in d_reuse.dp_buffers if b.fp8]
    assert fp8_plain and all(b.param_buffer for b in fp8_plain)
    assert fp8_reuse and not any(b.param_buffer for b in fp8_reuse)
    assert [b.numel for b in fp8_plain] == [b.numel for b in fp8_reuse]  # the same fp32 grad buffers

    def live(ev):
        out: dict[str, int] = {}
        for at, name, size, _cat, sign in ev:
            if at == "start":
                out[name] = out.get(name, 0) + size * sign
        return out

    e_plain, e_reuse = live(megatron_events(plain.training, d_plain, "routed")), \
        live(megatron_events(reuse.training, d_reuse, "routed"))
    assert not [n for n in e_reuse if n.startswith("static.param_buffer.") and n.endswith(".fp8")]
    fp8_numel = sum(s.end - s.start for b in fp8_reuse for s in b.slots)
    kept = sum(v for n, v in e_reuse.items() if n.startswith("static.weights."))
    moved = sum(v for n, v in e_plain.items() if n.startswith("static.weights."))
    assert kept - moved == fp8_numel  # one byte per element, in the weights instead of the buffer
    from timeline.profiles import LIMITS

    assert validate_run(reuse, LIMITS) == []


def test_from_megatron_maps_mxfp8_parameters_and_the_grad_buffer_reuse():
    import pytest

    from timeline.errors import UserError
    from timeline.io.megatron_args import from_mapping
    from timeline.io.megatron_write import convert

    args = {"--num-layers": 2, "--hidden-size": 64, "--num-attention-heads": 4, "--seq-length": 128,
            "--max-position-embeddings": 128, "--micro-batch-size": 1, "--global-batch-size": 8, "--bf16": True,
            "--vocab-size": 1000, "--use-distributed-optimizer": True, "--fp8-format": "e4m3",
            "--fp8-recipe": "mxfp8", "--fp8-param-gather": True, "--reuse-grad-buf-for-mxfp8-param-ag": True}
    tr = convert(from_mapping(args), world_size=2, gpu="b200", megatron_core="0.16.0").sections["training"]
    assert tr["fp8_param_gather"] is True and tr["mxfp8_reuse_grad_buf"] is True
    for drop in (("--fp8-param-gather",), ("--fp8-param-gather", "--fp8-format")):
        with pytest.raises(UserError, match="--reuse-grad-buf-for-mxfp8-param-ag without MXFP8 parameters"):
            convert(from_mapping({k: v for k, v in args.items() if k not in drop}), world_size=2, gpu="b200",
                    megatron_core="0.16.0")


def test_mtp_layers_run_in_fp8_whatever_the_bf16_first_and_last_layers():
    """An MTP module runs its ``eh_proj`` and its layer's TE linears under the global FP8 context
    (``multi_token_prediction.py: MultiTokenPredictionLayer.forward``: ``get_fp8_context(self.config)`` without
    a layer number, so ``is_first_last_bf16_layer`` never sees it, @4e85d74ae9): under ``--first-last-layers-bf16``
    of a 2-layer model the MTP layer (index 2, past the last decoder layer) keeps FP8 input copies and, under the
    blockwise recipe, both usages of each TE weight with their 128 × 128-block fp32 scales."""
    from dataclasses import replace

    from helpers_run import TINY_MODEL

    from timeline.profiles.megatron_fp8 import bf16_layer

    assert bf16_layer(1, 1, 1, 2) and not bf16_layer(2, 1, 1, 2)  # the last decoder layer, then the MTP layer
    run = tiny_run(model=replace(TINY_MODEL, num_hidden_layers=2, mtp_layers=1), tp=2, sp=True,
                   fp8_recipe="blockwise", sm=90, fp8_bf16_first_layers=1, fp8_bf16_last_layers=1)
    s = saved_of(run, 2)
    # eh_proj: the [tokens, 2h] concatenation (modelled on the sequence-parallel rows) quantized column-wise
    assert s["mtp.0.eh_proj.x_fp8"] == ((T // 2, 2 * H), "fp8", T // 2 * 2 * H)
    assert s["mtp.0.eh_proj.x_scale_inv"] == ((1, 2 * H), "fp32", 4 * 2 * H)
    # the MTP layer's fc2: the [tokens, ffn/tp] input, as a decoder layer's
    assert s["mtp.0.layer.mlp.linear_fc2.x_fp8"] == ((T, FFN // 2), "fp8", T * FFN // 2)
    assert not any(n.endswith(".x_fp8") for n in saved_of(run, 1))  # the last decoder layer stays bf16
    # weight caches: [1024, 256] weights, 8 × 2 row-wise and 2 × 8 column-wise 128 × 128 blocks (rounded up to 4)
    w = [_weight(n) for n in ("mtp.0.eh_proj.weight", "mtp.0.layer.mlp.linear_fc1.weight",
                              "layers.1.mlp.linear_fc1.weight", "mtp.0.layer.mlp.gate.weight",
                              "mtp.embedding.word_embeddings.weight")]
    out = weight_caches(w, param_gather=False, sm=90, recipe="blockwise", bf16=(1, 1, 2))
    assert {n.split(".", 2)[2] for n, _, _ in out} == {"mtp.0.eh_proj.weight", "mtp.0.layer.mlp.linear_fc1.weight"}
    assert sum(size for _n, size, _s in out) == 2 * (2 * E + 4 * (8 * 4 + 2 * 8))
