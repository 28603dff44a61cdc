"""``hf`` profile against real PyTorch autograd (``tools/groundtruth.py``, fake tensors on the CPU).

For Llama-style (MHA, GQA, fp32) and DeepSeek-V3-style configs — small dims and the full DeepSeek-V3
layer shape (one dense and one MoE layer, b = 1, s = 4096) — and small configs of every other family
the run file accepts under ``hf`` (Mistral, Qwen2, Qwen3, Gemma, Gemma-2, OPT, Mixtral, Qwen2-MoE, Qwen3-MoE, GPT-2, GPT-OSS
with GQA and MHA; and two layers of the published gpt-oss-20b at b = 1, s = 4096), with no recompute and with full recompute: every decoder layer's saved storages match the model's saved tensors size for size,
the layer totals agree within 1 % (they agree to the byte), tensors held by the same autograd node
attribute have the same sizes, and the step's total is within 1 % (outside the layers, full recompute's
checkpoints also keep the int64 position ids, s·8 B, which the model leaves out). Qwen3-MoE runs with
``norm_topk_prob`` both false and true (the renormalisation keeps an fp32 sum and copy). Skipped when torch or
transformers (the ``capture`` extra) is not installed. ``timeline static --json`` on an hf run
reports the numbers (no torch needed). GPT-OSS's eager attention is checked by its own autograd nodes
(``BmmBackward0``, ``MaxBackward0``) and by a closed form read off its modelling code.
"""

from __future__ import annotations

import json
import sys
from functools import cache
from pathlib import Path

import pytest
from sources import template_of

from timeline.io.runfile import load_run
from timeline.spec.hf_activations import HF_ACTIVATIONS

TOOLS = Path(__file__).resolve().parents[2] / "tools"

LLAMA = {"model_type": "llama", "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 16,
         "intermediate_size": 2816, "vocab_size": 32000, "num_hidden_layers": 2, "max_position_embeddings": 4096}
DSV3 = {"model_type": "deepseek_v3", "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 8,
        "q_lora_rank": 128, "kv_lora_rank": 64, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 96,
        "intermediate_size": 1408, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
        "moe_intermediate_size": 256, "vocab_size": 32000, "num_hidden_layers": 2, "first_k_dense_replace": 1,
        "n_group": 1, "topk_group": 1, "max_position_embeddings": 4096}
DSV3_FULL = {**DSV3, "hidden_size": 7168, "num_attention_heads": 128, "num_key_value_heads": 128,
             "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
             "v_head_dim": 128, "intermediate_size": 18432, "n_routed_experts": 256, "num_experts_per_tok": 8,
             "moe_intermediate_size": 2048, "vocab_size": 129280, "n_group": 8, "topk_group": 4}

#: the other families the run file accepts under ``hf`` (small: h 256, 4 heads, 2 KV heads, 2 layers)
SMALL = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
         "vocab_size": 1024, "num_hidden_layers": 2, "max_position_embeddings": 1024}
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128}
FAMILIES = {
    "mistral": {**SMALL, "model_type": "mistral", "sliding_window": None},
    "qwen2": {**SMALL, "model_type": "qwen2", "tie_word_embeddings": True},  # Q/K/V biases save nothing more
    "qwen3": {**SMALL, "model_type": "qwen3", "head_dim": 64},  # per-head q/k RMSNorm
    "mixtral": {**SMALL, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
    # shared expert with a sigmoid gate; decoder_sparse_step 2: layer 0 dense, layer 1 MoE
    "qwen2_moe": {**SMALL, **MOE, "model_type": "qwen2_moe", "shared_expert_intermediate_size": 256,
                  "decoder_sparse_step": 2},
    "qwen3_moe": {**SMALL, **MOE, "model_type": "qwen3_moe", "head_dim": 64},
    # gated GeLU (gelu_pytorch_tanh), RMSNorm scaling by fp32 (1 + weight) and keeping its fp32 normalised tensor
    "gemma": {**SMALL, "model_type": "gemma", "head_dim": 64},
    # LayerNorm, ReLU MLP with biases, learned positions ((b, s) ids, 2 offset rows), dropout 0.1 after attention
    # and fc2 (none on the embeddings)
    "opt": {"model_type": "opt", "hidden_size": 256, "num_attention_heads": 4, "ffn_dim": 512, "vocab_size": 1024,
            "num_hidden_layers": 2, "max_position_embeddings": 1024, "word_embed_proj_dim": 256},
    # eager attention (no SDPA) with tanh soft-capping of the attention and output logits, a norm on each
    # sub-block's output too, layer 0 sliding (window 32 < s); and without the capping, MHA
    "gemma2": {**SMALL, "model_type": "gemma2", "head_dim": 64, "sliding_window": 32},
    "gemma2-nocap": {**SMALL, "model_type": "gemma2", "head_dim": 64, "num_key_value_heads": 4,
                     "attn_logit_softcapping": None, "final_logit_softcapping": None},
    "qwen3_moe-norm": {**SMALL, **MOE, "model_type": "qwen3_moe", "head_dim": 64, "norm_topk_prob": True},
    # LayerNorm, GeLU MLP, learned positions, dropout 0.1 (bool masks; attention dropout inside SDPA)
    "gpt2": {"model_type": "gpt2", "n_embd": 256, "n_head": 4, "n_layer": 2, "vocab_size": 1024,
             "n_positions": 1024, "activation_function": "gelu"},
    # eager attention with sinks over s + 1 columns, layer 0 sliding (window 32 < s), layer 1 full; biased
    # router (top-k, then softmax) and experts, clamped SwiGLU
    "gpt_oss": {**SMALL, "model_type": "gpt_oss", "head_dim": 64, "num_local_experts": 4, "num_experts_per_tok": 2,
                "intermediate_size": 128, "sliding_window": 32},
    # attention dropout on the sliced softmax: a bool mask and the dropout output (b, h, s, s) for the ·V
    "gpt_oss-dropout": {**SMALL, "model_type": "gpt_oss", "head_dim": 64, "num_local_experts": 4,
                        "num_experts_per_tok": 2, "intermediate_size": 128, "sliding_window": 32,
                        "attention_dropout": 0.1},
    "gpt_oss-mha": {**SMALL, "model_type": "gpt_oss", "num_key_value_heads": 4, "head_dim": 64,
                    "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 128},
}

#: the published gpt-oss-20b config cut to two layers (one sliding, one full)
GPT_OSS_20B = {k: v for k, v in json.loads((Path(__file__).resolve().parents[1] / "data" / "hf" / "gpt-oss-20b" /
                                            "config.json").read_text()).items()
               if k not in ("quantization_config", "architectures", "transformers_version")}
GPT_OSS_20B.update(num_hidden_layers=2, layer_types=GPT_OSS_20B["layer_types"][:2])

#: the published gemma-2-9b-it config cut to two layers (one sliding, one full); not used to write the rules
GEMMA2_9B = {k: v for k, v in json.loads((Path(__file__).resolve().parents[1] / "data" / "hf" / "gemma-2-9b-it" /
                                          "config.json").read_text()).items()
             if k not in ("architectures", "transformers_version", "torch_dtype")}
GEMMA2_9B.update(num_hidden_layers=2)

#: name -> (config, seq_len, micro_batch, dtype); groundtruth.md §5
CONFIGS = {
    "llama-mha": (LLAMA, 512, 2, "bf16"),
    "llama-gqa": ({**LLAMA, "num_key_value_heads": 4}, 512, 2, "bf16"),
    "llama-gqa-fp32": ({**LLAMA, "num_key_value_heads": 4}, 512, 2, "fp32"),  # memory-efficient kernel, repeat_kv
    "dsv3-small": (DSV3, 512, 2, "bf16"),  # MLA on the flash kernel (equal head dims)
    "dsv3-full-shape": (DSV3_FULL, 4096, 1, "bf16"),  # MLA on the memory-efficient kernel (192 ≠ 128)
    **{name: (cfg, 128, 2, "bf16") for name, cfg in FAMILIES.items()},
    "gpt2-fp32": (FAMILIES["gpt2"], 64, 2, "fp32"),  # memory-efficient kernel on views of one c_attn output
    "gpt-oss-20b-shape": (GPT_OSS_20B, 4096, 1, "bf16"),  # two layers of the published gpt-oss-20b
    "gemma-2-9b-shape": (GEMMA2_9B, 4096, 1, "bf16"),  # two layers of the published gemma-2-9b-it
}
CASES = [(name, rc) for name in CONFIGS for rc in ("none", "full")]

#: autograd node attributes (a key starting "Backward0." matches every node class) -> the model tensors
#: they hold (by name suffix)
NODES = {
    ("PowBackward0.self",): ("norm.upcast.out",),  # RMSNorm's fp32 input copy (16-bit models)
    ("RsqrtBackward0.result",): (".rsigma",),
    ("Backward0.logsumexp", "Backward0.log_sumexp"): (".softmax_lse",),  # flash / memory-efficient kernel
    ("Backward0.query",): (".q", ".q_rope", ".qkv"),  # GPT-2: q, k, v are views of c_attn's output
    ("Backward0.key",): (".k", ".k_rope", ".k_expanded", ".qkv"),
    ("Backward0.value",): (".v", "linear_kv_up_proj.out", ".v_expanded", ".qkv"),
    # the activation's input: a gate's (SiLU; Gemma's GeLU), GPT-2's fc1 output, GPT-OSS's clamped SwiGLU
    # (ClampBackward1 keeps the gate_up output whole)
    ("SiluBackward0.self", "ClampBackward1.self", "GeluBackward0.self"): (".gate_proj.out", "mlp.experts.linear_fc1.out",
                                                                          "mlp.linear_fc1.out"),
    # DeepSeek's sigmoid router, Mixtral/Qwen-MoE's softmax router, Qwen2-MoE's shared-expert gate
    # (GPT-OSS: the experts' sigmoid(alpha·gate), the attention softmax over s + 1 columns)
    ("SigmoidBackward0.result", "SoftmaxBackward0.result"): ("router.scores", "shared_expert_gate.sigmoid",
                                                             ".act.sigmoid", "core_attn.softmax"),
    ("NativeDropoutBackward0.result1",): (".mask",),  # (GPT-OSS's causal masks are named causal_mask.*)
    ("GroupedMmBackward0.self",): ("dispatch.permuted", "mlp.experts.act.out"),
    ("IndexBackward0.indices",): ("dispatch.sorted_idx", "dispatch.src_idx", "combine.inv_idx",
                                  "dispatch.expert_ids"),  # GPT-OSS: the expert biases' gather
    ("LogSoftmaxBackward0.result",): ("loss.exp_logits",),
    ("TanhBackward0.result",): (".tanh",),  # Gemma-2's soft-capped attention and output logits
}


#: GPT-OSS's eager attention (BmmBackward0 on views) and router, checked on its configs only
NODES_GPT_OSS = {
    ("BmmBackward0.self",): (".q_rope", "core_attn.softmax"),
    ("BmmBackward0.mat2",): (".k_rope", ".k_expanded", ".v_expanded"),
    ("MaxBackward0.indices",): (".row_max_idx",),
    ("TopkBackward0.indices",): ("router.topk_idx",),
    ("ClampBackward1.self",): ("mlp.experts.linear_fc1.out",),
    ("MulBackward0.self",): (".act.gate_clamped", ".act.up_offset", "experts.linear_fc2.out", ".upcast.out"),
}


def held(attr: str, node: tuple[str, ...]) -> bool:
    """Whether autograd attribute ``attr`` (``MmBackward0.self``) is one of ``node``'s."""
    return any(attr == k or (k.startswith("Backward0.") and attr.endswith(k)) for k in node)


def tool():
    """``tools/groundtruth.py``, or a skip when the capture extra (torch, transformers) is absent."""
    pytest.importorskip("torch", reason="needs CPU torch: pip install -e '.[capture]'")
    pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[capture]'")
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))
    import groundtruth

    return groundtruth


@cache
def measured(name: str, recompute: str) -> dict:
    cfg, s, b, dtype = CONFIGS[name]
    return tool().measure(cfg, seq_len=s, micro_batch=b, dtype=dtype, recompute=recompute, peak=False)


def hf_run(tmp_path: Path, name: str, recompute: str):
    cfg, s, b, dtype = CONFIGS[name]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    rc = '[recompute]\npolicy = "full"\nmethod = "uniform"\nnum_layers = 1\n' if recompute == "full" else ""
    # tools/groundtruth.py emulates the flash / memory-efficient SDPA kernels (capture/gpu.py), which CUDA
    # runs on an A100; an sm90 GPU with PyTorch >= 2.11 runs cuDNN attention (graph/families/sdpa.py)
    (tmp_path / "run.toml").write_text(f'[model]\nhf_config = "config.json"\nprofile = "hf"\n[training]\n'
                                       f'seq_len = {s}\nmicro_batch_size = {b}\ndtype = "{dtype}"\n{rc}'
                                       '[hardware]\ngpu = "a100"\n')
    return load_run(tmp_path / "run.toml", [])


@pytest.mark.parametrize(("name", "recompute"), CASES)
def test_layers_match_autograd(tmp_path, name, recompute):
    real = measured(name, recompute)
    t = template_of(hf_run(tmp_path, name, recompute), 0)
    for layer, got in real["layers"].items():
        if layer < 0:
            continue
        model = t.layer_activation_bytes[layer]
        assert abs(model - got) <= 0.01 * got, (layer, model, got)
        sizes = sorted(x["bytes"] for x in real["tensors"] if x["layer"] == layer)
        assert sorted(st.tensor.size_bytes for st in t.saved if st.layer == layer) == sizes, layer
    assert abs(t.activation_bytes - real["total"]) <= 0.01 * real["total"]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_tensors_by_autograd_node(tmp_path, name):
    real = measured(name, "none")
    t = template_of(hf_run(tmp_path, name, "none"), 0)
    for node, suffixes in NODES.items():
        for layer in {x["layer"] for x in real["tensors"]}:
            got = sorted(x["bytes"] for x in real["tensors"] if x["layer"] == layer
                         and any(held(n, node) for n in x["nodes"]))
            model = sorted(st.tensor.size_bytes for st in t.saved if st.layer == layer
                           and st.tensor.name.endswith(suffixes))
            if node == ("PowBackward0.self",) and CONFIGS[name][3] == "fp32":
                continue  # fp32 models: the norm saves the residual stream itself
            if node == ("RsqrtBackward0.result",) and CONFIGS[name][0]["model_type"] in ("gpt2", "opt"):
                continue  # LayerNorm keeps mean and rstd (".rsigma") without an rsqrt node
            if node[0].startswith("Backward0.") and CONFIGS[name][0]["model_type"] in ("gpt_oss", "gemma2"):
                continue  # eager attention: bmm nodes (GPT-OSS's in test_gpt_oss_tensors_by_autograd_node)
            assert model == got, (node, layer)


def test_full_recompute_keeps_exactly_the_layer_input(tmp_path):
    """groundtruth.md §5: 2sbh per layer (bf16 input kept by checkpoint); cos/sin count outside layers."""
    t = template_of(hf_run(tmp_path, "dsv3-full-shape", "full"), 0)
    assert t.layer_activation_bytes[0] == t.layer_activation_bytes[1] == 2 * 4096 * 7168
    names = {st.tensor.name: st.layer for st in t.saved}
    assert names["rotary_emb.cos"] == -1


def test_reference_numbers(tmp_path):
    """The model reproduces groundtruth.md §5's measured per-layer bytes (+24 B emulated flash RNG state)."""
    small = template_of(hf_run(tmp_path, "dsv3-small", "none"), 0).layer_activation_bytes
    assert (small[0], small[1]) == (30_523_392 + 24, 31_625_248 + 24)
    full = template_of(hf_run(tmp_path, "dsv3-full-shape", "none"), 0).layer_activation_bytes
    assert (full[0], full[1]) == (1_949_368_336, 3_010_806_800)  # efficient kernel: 16 B philox state
    mha = template_of(hf_run(tmp_path, "llama-mha", "none"), 0).layer_activation_bytes
    assert (mha[0], mha[1]) == (48_439_296 + 24, 48_308_224 + 24)


@pytest.mark.parametrize("name", ["dsv3-small", "gpt_oss"])
def test_sum_equals_memtracker(name):
    """The tool's own cross-check (groundtruth.md §2): saved storages = MemTracker's Activation after
    forward, less the 4-byte loss the caller holds (GPT-OSS: its eager masks are freed by then)."""
    groundtruth = tool()
    cfg, s, b, dtype = CONFIGS[name]
    res = groundtruth.measure(cfg, seq_len=s, micro_batch=b, dtype=dtype)
    assert res["memtracker"]["activation_after_forward"] == res["total"] + 4


def test_static_json_reports_hf_activations(tmp_path, capsys):
    from timeline.cli import main

    hf_run(tmp_path, "dsv3-small", "none")
    assert main(["static", str(tmp_path / "run.toml"), "--json"]) == 0
    dev = json.loads(capsys.readouterr().out)["devices"][0]
    # groundtruth.md §5 (dsv3, b = 2, s = 512): the two layers' bytes, +24 B emulated flash RNG state each
    layers = (30_523_392 + 24, 31_625_248 + 24)
    cfg, s, b, _ = CONFIGS["dsv3-small"]
    sb, h, vocab = s * b, cfg["hidden_size"], cfg["vocab_size"]
    # outside the layers (§4): the final RMSNorm's fp32 input copy, normed and weighted outputs (bf16) and
    # rsigma; the loss's fp32 log_softmax output, its int64 target and the 4-byte total weight
    final_norm = 4 * sb * h + 2 * 2 * sb * h + 4 * sb
    loss = 4 * sb * vocab + 8 * sb + 4
    assert dev["activation_bytes_per_microbatch"] == sum(layers) + final_norm + loss
    assert {e["layer"]: e["bytes"] for e in dev["layer_activation_bytes"]}[1] == layers[1]


GPT_OSS_CASES = [n for n in CONFIGS if CONFIGS[n][0]["model_type"] == "gpt_oss"]


@pytest.mark.parametrize("name", GPT_OSS_CASES)
def test_gpt_oss_tensors_by_autograd_node(tmp_path, name):
    real = measured(name, "none")
    t = template_of(hf_run(tmp_path, name, "none"), 0)
    nodes = dict(NODES_GPT_OSS)
    if CONFIGS[name][0].get("attention_dropout"):  # the ·V product keeps the dropout output, not the softmax
        nodes[("BmmBackward0.self",)] = (".q_rope", "core_attn.dropout.out")
    for node, suffixes in nodes.items():
        for layer in {x["layer"] for x in real["tensors"]}:
            got = sorted(x["bytes"] for x in real["tensors"] if x["layer"] == layer
                         and any(held(n, node) for n in x["nodes"]))
            model = sorted(st.tensor.size_bytes for st in t.saved if st.layer == layer
                           and st.tensor.name.endswith(suffixes))
            assert model == got, (node, layer)


def gpt_oss_layer_bytes(cfg: dict, s: int, b: int) -> int:
    """One GPT-OSS decoder layer under transformers' eager attention and grouped_mm experts (bf16), read
    off models/gpt_oss/modeling_gpt_oss.py and integrations/moe.py: two RMSNorms (fp32 input copy and
    normalised tensor, fp32 rstd, 16-bit output), q/k/v each at every query head's width and o_proj's
    input copy, the int64 row-max indices and the (b, h, s, s + 1) softmax; the router's int64 top-k
    indices and 16-bit softmax of the k logits; the experts' four int64 index vectors (sorted, source,
    expert ids, inverse), permuted tokens and down output (S·h each), 16-bit weights, int32 offsets,
    gate_up (2S·I) and five more S·I tensors (clamped gate, sigmoid, glu, up + 1, product)."""
    t, h, nq, d = b * s, cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"]
    k, e, i = cfg["num_experts_per_tok"], cfg["num_local_experts"], cfg["intermediate_size"]
    rows = t * k
    norms = 2 * (10 * t * h + 4 * t)
    attention = 8 * t * nq * d + 8 * b * nq * s + 2 * b * nq * s * (s + 1)
    if cfg.get("attention_dropout"):  # a bool mask and the 16-bit dropout output, (b, h, s, s) each
        attention += 3 * b * nq * s * s
    router = 8 * t * k + 2 * t * k
    experts = 32 * rows + 4 * rows * h + 2 * rows + 4 * e + 14 * rows * i
    return norms + attention + router + experts


@pytest.mark.parametrize("name", GPT_OSS_CASES)
def test_gpt_oss_layer_closed_form(tmp_path, name):
    """The model's bytes per layer equal the closed form read off the modelling code (layer 0 also holds
    the shared RoPE cos/sin, each (1, s, head_dim / 2)); the autograd tests above measure the same."""
    cfg, s, b, _ = CONFIGS[name]
    layers = template_of(hf_run(tmp_path, name, "none"), 0).layer_activation_bytes
    per_layer = gpt_oss_layer_bytes({"head_dim": 64, **cfg}, s, b)
    assert layers[1] == per_layer
    assert layers[0] == per_layer + 2 * 2 * s * cfg["head_dim"] // 2


def test_gpt_oss_20b_reference_numbers(tmp_path):
    """Two layers of gpt-oss-20b (b = 1, s = 4096), measured by tools/groundtruth.py: 3,370,877,056 and
    3,370,352,768 bytes, of which the sink-concatenated softmax is 64 · 4096 · 4097 · 2 = 2,148,007,936."""
    t = template_of(hf_run(tmp_path, "gpt-oss-20b-shape", "none"), 0)
    assert (t.layer_activation_bytes[0], t.layer_activation_bytes[1]) == (3_370_877_056, 3_370_352_768)
    probs = {st.tensor.name: st.tensor.size_bytes for st in t.saved}["layers.1.self_attn.core_attn.softmax"]
    assert probs == 2_148_007_936
    full = template_of(hf_run(tmp_path, "gpt-oss-20b-shape", "full"), 0)
    assert full.layer_activation_bytes[0] == full.layer_activation_bytes[1] == 2 * 4096 * 2880
    names = {st.tensor.name: st.layer for st in full.saved}
    assert names["causal_mask.full"] == names["causal_mask.sliding"] == -1  # kept by the checkpoints


#: every activation a config can name (transformers' ACT2CLS), on a plain MLP (GPT-2's c_fc → act → c_proj)
#: and a gated one (Gemma's act(gate_proj(x)) * up_proj(x), whose RMSNorm keeps fp32 tensors)
ACT_MODELS = {
    "gpt2": {"model_type": "gpt2", "n_embd": 128, "n_head": 2, "n_layer": 1, "vocab_size": 512, "n_positions": 256},
    "gemma": {"model_type": "gemma", "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
              "head_dim": 64, "intermediate_size": 256, "vocab_size": 512, "num_hidden_layers": 1},
}


def act_config(family: str, act: str) -> dict:
    key = "activation_function" if family == "gpt2" else "hidden_activation"
    return {**ACT_MODELS[family], key: act, **({"hidden_act": act} if family == "gemma" else {})}


@pytest.mark.parametrize("family", list(ACT_MODELS))
@pytest.mark.parametrize("act", list(HF_ACTIVATIONS))
def test_every_activation_keeps_what_autograd_keeps(tmp_path, family, act):
    """Each ``hidden_act`` the profile reads from its expression (spec/hf_activations.py) keeps, storage for
    storage, what real PyTorch autograd keeps in the layer (GPT-2's ``gelu_new``: x, tanh, 0.5·x and
    1 + tanh beside the output, 3 × 8sbh bytes more than the fused GeLU; H200 calibration:
    traces/groundtruth-h200/gpt2-calibration)."""
    cfg = act_config(family, act)
    real = tool().measure(cfg, seq_len=64, micro_batch=2, dtype="bf16", recompute="none", peak=False)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "run.toml").write_text('[model]\nhf_config = "config.json"\nprofile = "hf"\n[training]\n'
                                       'seq_len = 64\nmicro_batch_size = 2\ndtype = "bf16"\n'
                                       '[hardware]\ngpu = "a100"\n')
    t = template_of(load_run(tmp_path / "run.toml", []), 0)
    assert sorted(st.tensor.size_bytes for st in t.saved if st.layer == 0) == \
        sorted(x["bytes"] for x in real["tensors"] if x["layer"] == 0)
    assert t.layer_activation_bytes[0] == real["layers"][0]


def test_every_transformers_activation_is_read():
    """The installed transformers names no activation the table lacks (the whole ACT2CLS surface)."""
    tool()
    from transformers.activations import ACT2CLS

    assert set(ACT2CLS) <= set(HF_ACTIVATIONS), sorted(set(ACT2CLS) - set(HF_ACTIVATIONS))


def test_gpt2_gelu_new_matches_h200_calibration(tmp_path):
    """GPT-2's default ``gelu_new`` on the H200 (torch 2.11, transformers 5.17): each block saves 88,211,472 B
    without dropout and 91,357,200 B with HF's 0.1 dropout (4 × 512, h 768) — the fused-GeLU reading gave
    50,462,736 B. Read from the calibration recording's results, no torch needed."""
    folder = Path(__file__).resolve().parents[2] / "traces" / "groundtruth-h200" / "gpt2-calibration" / "default"
    cases = {c["case"]: c for c in json.loads((folder / "results.json").read_text())}
    for name in ("gpt2_small_cal", "gpt2_nodrop_cal", "gpt2_wide_cal"):
        c = cases[name]
        cfg = {k: v for k, v in c["hf_config"].items() if k not in ("architectures", "transformers_version")}
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        (tmp_path / "run.toml").write_text(f'[model]\nhf_config = "config.json"\nprofile = "hf"\n[training]\n'
                                           f'seq_len = {c["seq"]}\nmicro_batch_size = {c["batch"]}\n'
                                           'dtype = "bf16"\n[hardware]\ngpu = "h200"\n')
        t = template_of(load_run(tmp_path / "run.toml", []), 0)
        assert [t.layer_activation_bytes[i] for i in range(len(c["layer_saved_bytes"]))] == c["layer_saved_bytes"]


def test_gemma_2_9b_reference_numbers(tmp_path):
    """Two layers of the published gemma-2-9b-it (b = 1, s = 4096), measured by tools/groundtruth.py: 3,284,262,912
    and 3,280,068,608 bytes a layer (layer 0 also holds RoPE's cos/sin; 16 heads' (s, s) tanh, fp32 softmax and
    16-bit probabilities are 2.1 GB of each), 6,438,320,140 outside them (the 16-bit soft-capped logits' tanh
    beside the fp32 log-softmax over 256,000 columns)."""
    t = template_of(hf_run(tmp_path, "gemma-2-9b-shape", "none"), 0)
    assert (t.layer_activation_bytes[0], t.layer_activation_bytes[1]) == (3_284_262_912, 3_280_068_608)
    assert t.activation_bytes == 13_002_651_660
