"""Captured traces under TP, SP and EP (issue 12 item 4): a Qwen3-MoE trace under tp = 2, ep = 4 holds,
parameter by parameter, what ``timeline static`` of the same HF config holds; each EP rank receives
``(b·s/(tp·cp))·top_k`` routed rows; a dense Llama trace under tp = 2 halves its per-head and per-column
tensors, and its ``[s, b, h]`` ones only under SP."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from sources import template_of

pytest.importorskip("torch")
pytest.importorskip("transformers")

from captures import LLAMA, QWEN3_MOE, RUN_TAIL, B, S, capture_config  # noqa: E402

from timeline.errors import SpecError  # noqa: E402
from timeline.graph.source import model_source  # noqa: E402
from timeline.io.runfile import load_run  # noqa: E402
from timeline.placement.devices import chunk_params  # noqa: E402
from timeline.result.build import build_timeline  # noqa: E402

MEGATRON = ["model.profile=megatron"]
MOE_PAR = ["parallel.tp=2", "parallel.ep=4", "parallel.etp=1", "parallel.dp=4"]
LOCAL_EXPERTS = QWEN3_MOE["num_experts"] // 4

ANALYTIC_RUN = """\
[model]
hf_config = "{config}"
profile = "megatron"
""" + RUN_TAIL


def analytic_names(trace_name: str, local_experts: int) -> list[str]:
    """The analytic graph's parameters that a captured Hugging Face parameter stands for (one device)."""
    fixed = {"model.embed_tokens.weight": "embedding.word_embeddings.weight", "lm_head.weight": "output_layer.weight",
             "model.norm.weight": "final_norm.weight"}
    if trace_name in fixed:
        return [fixed[trace_name]]
    m = re.fullmatch(r"model\.(layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)", trace_name)
    if m:  # HF fuses the experts into one [E, …] tensor; the graph holds one MLP per local expert
        parts = ("gate_proj", "up_proj") if m.group(2) == "gate_up_proj" else ("down_proj",)
        return [f"{m.group(1)}.{e}.{p}.weight" for e in range(local_experts) for p in parts]
    return [trace_name.removeprefix("model.")]


def analytic_run(tmp_path: Path, config: dict, overrides: list[str]):
    (tmp_path / "config.json").write_text(json.dumps(config))
    path = tmp_path / "analytic.toml"
    path.write_text(ANALYTIC_RUN.format(config="config.json", b=B, s=S))
    return load_run(path, overrides)


def param_bytes(run) -> dict[str, int]:
    """Trainable parameter → bytes on pipeline rank 0's device (one chunk: pp = 1)."""
    return {t.name: t.size_bytes for t in chunk_params(model_source(run), [0])[0] if t.trainable}


def mapped(trace: dict[str, int], local_experts: int) -> dict[str, int]:
    """The trace's parameter bytes, keyed by the analytic names (a fused tensor spread evenly)."""
    out: dict[str, int] = {}
    for name, nbytes in trace.items():
        names = analytic_names(name, local_experts)
        assert nbytes % len(names) == 0
        for n in names:
            assert n not in out, f"{n} mapped twice"
            out[n] = nbytes // len(names)
    return out


def static_bytes(run_file: Path, overrides: list[str], capsys) -> dict[str, int]:
    from timeline.cli import main

    args = [a for o in overrides for a in ("--set", o)]
    assert main(["static", str(run_file), *args, "--json"]) == 0
    dev = json.loads(capsys.readouterr().out)["devices"][0]
    return {**dev["bytes"], "buffers": dev["buffers"], **{f"params.{k}": v for k, v in dev["params"]["by_module"].items()}}


def test_name_map_covers_every_analytic_parameter_once(qwen3_moe_run, tmp_path):
    trace = param_bytes(load_run(qwen3_moe_run, MEGATRON + MOE_PAR))
    analytic = param_bytes(analytic_run(tmp_path, QWEN3_MOE, MOE_PAR))
    assert sorted(mapped(trace, LOCAL_EXPERTS)) == sorted(analytic)
    assert analytic_names("model.layers.1.mlp.experts.down_proj", 2) == [
        "layers.1.mlp.experts.0.down_proj.weight", "layers.1.mlp.experts.1.down_proj.weight"]


@pytest.mark.parametrize("etp", [1, 2], ids=["etp1", "etp-default"])
def test_moe_trace_tp2_ep4_holds_what_static_holds(qwen3_moe_run, tmp_path, capsys, etp):
    par = [p for p in MOE_PAR if etp == 1 or p != "parallel.etp=1"]  # etp defaults to tp = 2
    run = load_run(qwen3_moe_run, MEGATRON + par)
    assert run.parallel.etp == etp
    trace = param_bytes(run)
    analytic = param_bytes(analytic_run(tmp_path, QWEN3_MOE, par))
    assert mapped(trace, LOCAL_EXPERTS) == analytic
    # one device: 16/4 experts of [2·96/etp, 128] + [128, 96/etp] bf16 per layer, q heads 4/2 · 32 columns
    assert trace["model.layers.0.mlp.experts.gate_up_proj"] == 4 * 192 // etp * 128 * 2
    assert trace["model.layers.0.self_attn.q_proj.weight"] == 64 * 128 * 2
    assert trace["model.embed_tokens.weight"] == 512 * 128 * 2  # vocab 1000 padded to 128·tp = 1024, /2
    t = static_bytes(qwen3_moe_run, MEGATRON + par, capsys)
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_MOE))
    a = static_bytes(tmp_path / "analytic.toml", par, capsys)
    assert (t["grads"], t["optimizer"]) == (a["grads"], a["optimizer"])
    # the capture's rotary inv_freq and original_inv_freq buffers (16 fp32 each), which the graph leaves out
    assert t["weights"] - a["weights"] == 2 * 16 * 4 and t["buffers"] == 32


def test_etp2_experts_equal_the_capture_of_their_share(qwen3_moe_run, tmp_path):
    """Under tp = etp = 2, ep = 4 (SP) an EP rank's experts read (b·s/2)·top_k·2 = b·s·top_k all-gathered
    rows with half their FFN columns: what a model of 4 experts of width 96/2 captured at the same b·s
    allocates between and in its expert GEMMs (the tensors with an FFN-width dim)."""
    share = template_of(load_run(capture_config({**QWEN3_MOE, "num_experts": 4, "moe_intermediate_size": 48},
                                                tmp_path / "share.parquet"), MEGATRON), 0)
    sharded = template_of(load_run(qwen3_moe_run, MEGATRON + ["parallel.tp=2", "parallel.ep=4", "parallel.dp=4"]), 0)

    def ffn(t, phase: str) -> Counter:
        return Counter({k: v for k, v in _layer_allocs(t, phase, "mlp.experts").items() if {48, 96} & set(k[1])})

    for phase in "FB":
        assert ffn(sharded, phase) == ffn(share, phase) and ffn(share, phase)


def _forward_allocs(run, module: str, op: str) -> list:
    t = template_of(run, 0)
    return [a for o in t.forward if o.name == f"{module}:{op}" for a in o.allocs]


#: a small GPT-OSS (learned sinks, router bias, expert biases; a sliding and a full attention layer)
GPT_OSS = {"model_type": "gpt_oss", "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 96, "num_local_experts": 4,
           "num_experts_per_tok": 2, "vocab_size": 1000, "sliding_window": 32,
           "layer_types": ["sliding_attention", "full_attention"]}


def test_gpt_oss_trace_tp2_ep2_holds_what_static_holds(tmp_path, capsys):
    """Sinks split with the heads, router and its bias replicated, expert biases with their experts."""
    par = ["parallel.tp=2", "parallel.ep=2", "parallel.etp=1"]
    run_file = capture_config(GPT_OSS, tmp_path / "gptoss.parquet")
    trace = param_bytes(load_run(run_file, MEGATRON + par))
    assert trace["model.layers.0.self_attn.sinks"] == 2 * 2
    assert trace["model.layers.0.mlp.experts.gate_up_proj_bias"] == 2 * 2 * 96 * 2
    t = static_bytes(run_file, MEGATRON + par, capsys)
    analytic_run(tmp_path, GPT_OSS, par)
    a = static_bytes(tmp_path / "analytic.toml", par, capsys)
    assert (t["grads"], t["optimizer"]) == (a["grads"], a["optimizer"])
    assert {k: v for k, v in t.items() if k.startswith("params.")} == {k: v for k, v in a.items()
                                                                        if k.startswith("params.")}
    assert t["weights"] - a["weights"] == t["buffers"] * 4 == 2 * 16 * 4  # HF's rotary inv_freq buffers


@pytest.mark.parametrize(("tp", "ep", "etp"), [(2, 4, 1), (1, 4, 1), (2, 1, 1), (2, 4, 2), (2, 2, 2)])
def test_routed_rows_per_ep_rank(qwen3_moe_run, tp, ep, etp):
    """Each EP rank receives (b·s/tp)·top_k rows (SP, balanced routing); under expert-TP its experts read them
    all-gathered over etp, each with 1/etp of its FFN columns, and cut their fc2 output back by a
    reduce-scatter."""
    run = load_run(qwen3_moe_run, MEGATRON + [f"parallel.tp={tp}", f"parallel.ep={ep}", f"parallel.etp={etp}",
                                             "parallel.dp=4"])
    rows = B * S // tp * QWEN3_MOE["num_experts_per_tok"]
    gathered = [a for a in _forward_allocs(run, "model.layers.0.mlp.experts", "index.Tensor") if a.dtype == "bf16"]
    assert gathered[0].shape == (rows * etp, 128)  # the tokens the local experts read
    fc1, fc2 = _forward_allocs(run, "model.layers.0.mlp.experts", "_grouped_mm.default")
    assert (fc1.shape, fc2.shape) == ((rows * etp, 2 * 96 // etp), (rows * etp, 128))
    if etp > 1:
        (received,) = _forward_allocs(run, "model.layers.0.mlp.experts", "etp.reduce_scatter")
        assert received.shape == (rows, 128)


def _saved(run) -> dict[tuple[str, str], list[int]]:
    out: dict[tuple[str, str], list[int]] = {}
    for s in template_of(run, 0).saved:
        out.setdefault((s.op, s.tensor.dtype), []).append(s.tensor.size_bytes)
    return out


@pytest.mark.parametrize("sp", [True, False])
def test_dense_trace_tp2_weights_and_activations(llama_run, tmp_path, sp):
    par = ["parallel.tp=2", f"parallel.sp={str(sp).lower()}"]
    run = load_run(llama_run, MEGATRON + par)
    assert {k.removeprefix("model."): v for k, v in mapped(param_bytes(run), 0).items()} == \
        param_bytes(analytic_run(tmp_path, LLAMA, par))
    saved = _saved(run)
    b, s, h, tokens = B, S, LLAMA["hidden_size"], B * S
    hd = h // LLAMA["num_attention_heads"]
    rows = tokens // 2 if sp else tokens
    # [b, s, h]: the norm's fp32 copy, split by tp only under SP
    assert saved[("model.layers.0.input_layernorm:_to_copy.default", "fp32")][0] == rows * h * 4
    # per head: v_proj's output (2 kv heads → 1), flash attention's output and its fp32 logsumexp
    assert saved[("model.layers.0.self_attn.v_proj:mm.default", "bf16")] == [tokens * hd * 2]
    attn = saved[("model.layers.0.self_attn:_scaled_dot_product_flash_attention.default", "bf16")]
    lse = saved[("model.layers.0.self_attn:_scaled_dot_product_flash_attention.default", "fp32")]
    assert (attn, lse) == ([b * 2 * s * hd * 2], [b * 2 * s * 4])
    # per column: the SwiGLU's silu (intermediate 704 → 352)
    assert saved[("model.layers.0.mlp.act_fn:silu.default", "bf16")] == [tokens * 352 * 2]
    # logits' fp32 log-softmax: 1024 padded rows / 2 per rank, whole sequence (gathered before the head)
    assert saved[("aten._log_softmax.default", "fp32")] == [tokens * 512 * 4]


def test_sp_halves_every_saved_layer_tensor_but_the_rng_state(llama_run):
    """Under tp = 2 with SP every tensor a layer saves has a token dim and halves, but flash attention's
    RNG seed and offset (uint64 [2] and []); without SP the [s, b, h] ones stay whole."""
    whole = template_of(load_run(llama_run, MEGATRON), 0).layer_activation_bytes[0]
    with_sp = template_of(load_run(llama_run, MEGATRON + ["parallel.tp=2"]), 0).layer_activation_bytes[0]
    without = template_of(load_run(llama_run, MEGATRON + ["parallel.tp=2", "parallel.sp=false"]), 0)
    rng = 16 + 8
    assert 2 * with_sp - whole == rng
    # [s, b, h] saved by the two norms (fp32 copy, bf16 cast, weighted output) and their [s, b, 1] rsqrt
    h = LLAMA["hidden_size"]
    norms = 2 * B * S * (h * (4 + 2 + 2) + 4)
    assert without.layer_activation_bytes[0] - with_sp == norms // 2


def _layer_allocs(template, phase: str, module: str = "") -> Counter:
    ops = template.forward if phase == "F" else template.backward
    return Counter((o.name.split(":")[0], a.shape, a.dtype, a.size_bytes) for o in ops
                   if o.layer == 0 and module in o.name for a in o.allocs)


def test_tp2_layer_equals_the_capture_of_one_tp_rank(tmp_path):
    """Without SP one Megatron TP rank computes the layer with half the heads and FFN columns and whole
    ``[s, b, h]`` tensors: the same model captured that way allocates, op by op, what the sharded trace does."""
    gqa = {**LLAMA, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32}
    rank = {**gqa, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 352}
    sharded = template_of(load_run(capture_config(gqa, tmp_path / "gqa.parquet"),
                                   MEGATRON + ["parallel.tp=2", "parallel.sp=false"]), 0)
    one_rank = template_of(load_run(capture_config(rank, tmp_path / "rank.parquet"), MEGATRON), 0)
    for phase in "FB":
        assert _layer_allocs(sharded, phase) == _layer_allocs(one_rank, phase)
    assert sharded.layer_activation_bytes[0] == one_rank.layer_activation_bytes[0]


def test_ep4_experts_equal_the_capture_of_four_experts(qwen3_moe_run, tmp_path):
    """Under ep = 4 an EP rank's experts (4 of 16, the same b·s·top_k rows) allocate what a 4-expert model
    captured does, but the per-expert token counts (``histc``, offsets): the trace keeps all 16, as the source
    rank counts them; the router stays replicated over all 16 experts."""
    four = template_of(load_run(capture_config({**QWEN3_MOE, "num_experts": 4}, tmp_path / "four.parquet"),
                                MEGATRON), 0)
    sharded = template_of(load_run(qwen3_moe_run, MEGATRON + ["parallel.ep=4", "parallel.dp=4"]), 0)
    for phase in "FB":
        a, b = _layer_allocs(sharded, phase, "mlp.experts"), _layer_allocs(four, phase, "mlp.experts")
        counts = {k for k in a if k[1] == (16,)}
        assert {k for k in b if k not in a} == {(m, (4,), dt, n // 4) for m, _, dt, n in counts}
        assert Counter({k: v for k, v in a.items() if k not in counts}) == \
            Counter({k: v for k, v in b.items() if k[1] != (4,)})


def test_simulated_moe_trace_runs_sharded(qwen3_moe_run):
    tl = build_timeline(load_run(qwen3_moe_run, MEGATRON + MOE_PAR))
    whole = build_timeline(load_run(qwen3_moe_run, MEGATRON))
    assert 0 < tl.peak(0).allocated_bytes < whole.peak(0).allocated_bytes


@pytest.mark.parametrize(("overrides", "key"), [
    (["parallel.cp=2"], "parallel.cp"),
])
def test_refusals_name_the_key(qwen3_moe_run, overrides, key):
    with pytest.raises(SpecError, match=re.escape(key)):
        load_run(qwen3_moe_run, MEGATRON + overrides)


def test_module_trace_without_hf_projections_is_refused(tmp_path):
    from timeline.capture.run import capture, load_factory
    from timeline.io.trace_file import write_trace

    path = tmp_path / "tiny.parquet"
    write_trace(capture(load_factory("captures:tiny_factory")), path)
    run = tmp_path / "tiny.toml"
    run.write_text(f'[model]\ntrace = "{path.name}"\nprofile = "megatron"\n[parallel]\ntp = 2\n'
                   "[training]\nnum_microbatches = 1\n")
    with pytest.raises(SpecError, match=r"parallel\.tp.*layers\.0\.fc\.weight.*matches no sharding rule"):
        load_run(run)


def test_tensor_names_read_as_module_paths(llama_run):
    """A trace's tensors are named by the module and op that made them, the layer index the run layer's
    (layer 2 repeats captured layer 1), and the storage id; saved ones name the op that saved them."""
    saved = template_of(load_run(llama_run, ["model.num_layers=3"]), 0).saved
    by_layer = {s.layer: [x.tensor.name for x in saved if x.layer == s.layer] for s in saved}
    assert "model.layers.2.input_layernorm:_to_copy#" in by_layer[2][0]
    assert all(n.startswith("model.layers.2.") for n in by_layer[2])
    for s in (x for x in saved if x.layer >= 0):
        assert re.fullmatch(rf"{re.escape(s.op.split(':')[0])}:{re.escape(s.op.split(':')[1].split('.')[0])}#\d+",
                            s.tensor.name), (s.op, s.tensor.name)


def test_sp_gathers_before_column_gemms_and_reduce_scatters_after_row_gemms(llama_run):
    """Under SP the column-parallel GEMMs read the whole sequence all-gathered (a comm buffer their GEMM
    frees) and the row-parallel ones make whole partial sums that a reduce-scatter cuts to the local rows;
    without SP nothing is added (the all-reduces work in place)."""
    from timeline.graph.tensors import Category

    whole = B * S * LLAMA["hidden_size"] * 2
    t = template_of(load_run(llama_run, MEGATRON + ["parallel.tp=2"]), 0)
    layer = [o for o in t.forward if o.layer == 0]
    gathers = [o for o in layer if o.name.endswith(":tp.all_gather")]
    assert [o.module.rsplit(".", 1)[-1] for o in gathers] == ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"]
    for g in gathers:
        (buf,) = g.allocs
        assert (buf.size_bytes, buf.category, g.stream) == (whole, Category.COMM, "tp")
        gemm = layer[layer.index(g) + 1]
        assert gemm.name.endswith(":mm.default") and buf.name in gemm.frees
    for mod in ("self_attn.o_proj", "mlp.down_proj"):
        gemm = next(o for o in layer if o.name == f"model.layers.0.{mod}:mm.default")
        rs = layer[layer.index(gemm) + 1]
        assert rs.name == f"model.layers.0.{mod}:tp.reduce_scatter"
        assert [a.size_bytes for a in gemm.allocs] == [whole] and [a.size_bytes for a in rs.allocs] == [whole // 2]
        assert rs.frees == (gemm.allocs[0].name,)
    plain = template_of(load_run(llama_run, MEGATRON + ["parallel.tp=2", "parallel.sp=false"]), 0)
    assert not [o for o in (*plain.forward, *plain.backward) if o.kind == "collective"]
