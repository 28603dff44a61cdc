"""Checkpoints quantized as their tools publish them — NVIDIA ModelOpt (FP8, NVFP4), compressed-tensors NVFP4,
AutoRound, bitsandbytes — and GPTQ / AWQ on the kernels vLLM moves them to (Marlin, Machete), each held to a hand
count of the bytes vLLM keeps after ``process_weights_after_loading`` (:mod:`timeline.serve.quant_layout`, read at
vLLM 0.11.0 and 0.19.0). The models are published configs (``tests/data/hf``: Llama-3.1-8B, Qwen3-30B-A3B) with a
``quantization_config`` in the keys each method's exporter writes and vLLM reads."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from timeline.cli import main
from timeline.errors import SpecError
from timeline.io.serve_runfile import load_serve_run
from timeline.serve.graph_view import device_params
from timeline.serve.quant_layout import _fp4_linear, checkpoint_bytes
from timeline.serve.weights import weight_bytes
from timeline.spec.quant import CheckpointQuant

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "tests" / "data" / "hf"

# Llama-3.1-8B per decoder layer, one device: (out, in) of vLLM's merged layers
LLAMA_LAYERS = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]  # qkv, o, gate_up, down
LLAMA_QUANT_NUMEL = 32 * sum(o * i for o, i in LLAMA_LAYERS)  # 6,979,321,856
# embedding and untied head (128,256 × 4,096, bf16) and 65 RMSNorm weights
LLAMA_DENSE = 2 * 128256 * 4096 * 2 + 65 * 4096 * 2

NVFP4_MODELOPT = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ["lm_head"],
                  "kv_cache_scheme": {"type": "float", "num_bits": 8, "dynamic": False}}
NVFP4_CT = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                            "symmetric": True},
                "input_activations": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                                      "dynamic": "local", "symmetric": True}}}}
AUTO_ROUND = {"quant_method": "auto-round", "bits": 4, "group_size": 128, "sym": True, "data_type": "int",
              "packing_format": "auto_round:auto_gptq"}
BNB4 = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True, "bnb_4bit_quant_storage": "uint8"}


def _config(tmp_path: Path, base: str, quant: dict[str, Any] | None, quant_file: dict[str, Any] | None = None) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir(exist_ok=True)
    cfg = copy.deepcopy(json.loads((HF / base / "config.json").read_text()))
    if quant is not None:
        cfg["quantization_config"] = quant
    (folder / "config.json").write_text(json.dumps(cfg))
    if quant_file is not None:
        (folder / "hf_quant_config.json").write_text(json.dumps(quant_file))
    return folder / "config.json"


def _run(tmp_path: Path, config: Path, gpu: str, version: str, tp: int = 1, serving: str = ""):
    path = tmp_path / "r.toml"
    path.write_text(f'[model]\nhf_config = "{config}"\n[parallel]\ntp = {tp}\n[hardware]\ngpu = "{gpu}"\n'
                    f'[serving]\nengine_version = "{version}"\nmax_model_len = 4096\n{serving}\n'
                    '[serving.load]\nnum_requests = 1\n')
    return load_serve_run(path)


def _bytes(run) -> tuple[int, int]:
    return checkpoint_bytes(run, device_params(run))


def test_modelopt_nvfp4_on_blackwell_and_on_marlin(tmp_path):
    """Two fp4 values a byte and an fp8 scale per 16 (9/16 byte a parameter); on a B200 at 0.19 the CUTLASS
    layout (aligned here: nothing padded) with four fp32 scalars a merged layer, a 512-byte block each; on an
    H100 Marlin repacks at the same size and adds a workspace of one int32 per SM (132 → one 1,024-byte block)."""
    config = _config(tmp_path, "llama-3.1-8b", NVFP4_MODELOPT)
    values = LLAMA_QUANT_NUMEL * 9 // 16
    assert values == 3_925_868_544
    b200 = _run(tmp_path, config, "b200", "0.19.0")
    assert _bytes(b200) == (values + 128 * 4 * 512, LLAMA_DENSE)
    h100 = _run(tmp_path, config, "h100", "0.19.0")
    assert _bytes(h100) == (values + 128 * (4 * 512 + 1024), LLAMA_DENSE)
    # its fp8 KV cache scheme makes --kv-cache-dtype auto fp8_e4m3 from 0.14 (not at 0.13)
    assert b200.serving.kv_cache_dtype == "fp8_e4m3"
    assert _run(tmp_path, config, "b200", "0.13.0").serving.kv_cache_dtype == "auto"


def test_nvfp4_cutlass_padding_and_scalars_by_version():
    """A merged layer whose sizes are off the tiles: 0.19 pads the values to 32 × 32 and both versions swizzle the
    scales into 128 × 4 tiles; ModelOpt keeps 4 fp32 scalars there (input and weight global scales, alpha, the
    inverse input scale), each a 512-byte block; 0.11's Marlin path deletes alpha and the input scale (2 left)."""
    from timeline.graph.tensors import Category, TensorDef

    member = [TensorDef(name="layers.0.self_attn.o_proj.weight", shape=(100, 80), dtype="bf16",
                        category=Category.WEIGHTS, module="layers.0.self_attn.o_proj", storage="o")]
    q = CheckpointQuant(method="modelopt", weight_dtype="nvfp4", bits=4, group_size=16)

    class _Run:
        def __init__(self, version: str, sm: int) -> None:
            self.serving = type("S", (), {"engine_version": version})()
            self.hardware = type("H", (), {"sm": sm, "sms": 148})()

    assert _fp4_linear(_Run("0.19.0", 100), q, member) == 128 * 96 // 2 + 128 * 8 + 4 * 512
    assert _fp4_linear(_Run("0.11.0", 100), q, member) == 100 * 80 // 2 + 128 * 8 + 4 * 512
    # Marlin below sm 100: values and scales as loaded, 2 scalars at 0.11, the workspace (148 int32 → 1 block)
    assert _fp4_linear(_Run("0.11.0", 90), q, member) == 100 * 80 // 2 + 100 * 5 + 2 * 512 + 1024


def test_nvfp4_moe_backends_and_the_011_leak(tmp_path):
    """Qwen3-30B-A3B (48 layers of 128 experts, hidden 2,048, intermediate 768): 27/16 byte a parameter on every
    backend that leaves the layout aligned, plus what each keeps beside — Marlin two fp32 vectors of 128 and a
    workspace of 4 int32 per SM; FlashInfer TRT-LLM (sm 100, hidden % 512 = 0) four vectors. compressed-tensors at
    0.11.0 keeps the loaded packed experts beside Marlin's copies (0.11.1 deletes them)."""
    params = 128 * 3 * 2048 * 768
    experts = params * 9 // 16  # 27/16 byte per expert hidden × intermediate
    assert experts == 339_738_624
    h100 = _bytes(_run(tmp_path, _config(tmp_path, "qwen3-30b-a3b", NVFP4_MODELOPT), "h100", "0.19.0"))
    b200 = _bytes(_run(tmp_path, _config(tmp_path, "qwen3-30b-a3b", NVFP4_MODELOPT), "b200", "0.19.0"))
    attention = (5120 * 2048 + 2048 * 4096) * 9 // 16 + 2 * 4 * 512  # qkv and o, four scalars each
    assert b200[0] == 48 * (attention + experts + 4 * 512)
    # per layer: Marlin's two vectors and workspace (4 × 132 int32 → 2,560 B) against TRT-LLM's four vectors,
    # and the attention's two merged layers' Marlin workspaces (132 int32 → 1,024 B)
    assert h100[0] - b200[0] == 48 * ((2 * 512 + 2560) - 4 * 512) + 48 * 2 * 1024
    ct = _config(tmp_path, "qwen3-30b-a3b", NVFP4_CT)
    ct11 = _bytes(_run(tmp_path, ct, "h100", "0.11.0"))
    ct111 = _bytes(_run(tmp_path, ct, "h100", "0.11.1"))
    assert ct11[0] - ct111[0] == 48 * params // 2


def test_autoround_gptq_is_marlin_and_machete_on_hopper(tmp_path):
    """AutoRound's GPTQ packing (4-bit, sym, groups of 128) ends on GPTQ-Marlin: on an A100 the packed values,
    the bf16 scales and a workspace (108 int32 → one 512-byte block) per merged layer, the loaded zero points
    freed; on an H100 the kernel chooser takes Machete, which keeps the packed zero points and a g_idx of one
    int32 per input and no workspace."""
    config = _config(tmp_path, "llama-3.1-8b", AUTO_ROUND)
    packed = LLAMA_QUANT_NUMEL // 2
    scales = 32 * sum(-(-i // 128) * o * 2 for o, i in LLAMA_LAYERS)
    a100 = _bytes(_run(tmp_path, config, "a100", "0.19.0"))
    assert a100 == (packed + scales + 32 * 4 * 512, LLAMA_DENSE)
    h100 = _bytes(_run(tmp_path, config, "h100", "0.19.0"))
    zeros_g_idx = 32 * sum(-(-i // 128) * o // 2 + 4 * i for o, i in LLAMA_LAYERS)
    assert h100 == (packed + scales + zeros_g_idx, LLAMA_DENSE)
    # a layer extra_config keeps at 16 bits stays in the model dtype
    keep = dict(AUTO_ROUND, extra_config={"model.layers.0.mlp.down_proj": {"bits": 16}})
    kept = _bytes(_run(tmp_path, _config(tmp_path, "llama-3.1-8b", keep), "a100", "0.19.0"))
    assert kept[1] - a100[1] == 4096 * 14336 * 2
    assert a100[0] - kept[0] == 4096 * 14336 // 2 + 112 * 4096 * 2 + 512


def test_gptq_plain_when_asked_or_before_the_marlin_kernels(tmp_path):
    """TheBloke's Llama-2-7B-GPTQ (4-bit, groups of 128, no act-order): `--quantization gptq` keeps the plain
    method (packed zero points, g_idx emptied) where vLLM would take Marlin; releases before 0.7.3 likewise."""
    config = HF / "llama-2-7b-gptq" / "config.json"
    marlin = _bytes(_run(tmp_path, config, "a100", "0.11.0"))
    plain = _bytes(_run(tmp_path, config, "a100", "0.11.0", serving='quantization = "gptq"'))
    layers = [(3 * 4096, 4096), (4096, 4096), (2 * 11008, 4096), (4096, 11008)]
    zeros = 32 * sum(-(-i // 128) * o // 2 for o, i in layers)
    assert plain[0] - marlin[0] == zeros - 32 * 4 * 512
    assert _bytes(_run(tmp_path, config, "a100", "0.6.4")) == plain


def test_bitsandbytes_prequantized_and_at_load(tmp_path):
    """bitsandbytes 4-bit: half a byte a value, an fp32 absmax per 64 (double quantization undone at load) and a
    16-float code table per shard, 512-byte blocks; the same bytes when vLLM quantizes an unquantized checkpoint
    at load (`--quantization bitsandbytes`: NF4, blocks of 64). A pre-quantized checkpoint under tp > 1 is refused
    as vLLM refuses it."""
    config = _config(tmp_path, "llama-3.1-8b", BNB4)
    expected = LLAMA_QUANT_NUMEL // 2 + LLAMA_QUANT_NUMEL // 64 * 4 + 32 * 7 * 512
    assert _bytes(_run(tmp_path, config, "h100", "0.19.0")) == (expected, LLAMA_DENSE)
    with pytest.raises(SpecError, match="tensor parallelism"):
        _run(tmp_path, config, "h100", "0.19.0", tp=2)
    # quantized at load, tensor parallelism allowed: each rank quantizes its own shard
    nf4 = 'weight_dtype = "nf4"\nquant_group_size = 64'
    for tp in (1, 2):
        run = _run(tmp_path, HF / "llama-3.1-8b" / "config.json", "h100", "0.19.0", tp=tp, serving=nf4)
        numel = LLAMA_QUANT_NUMEL // tp
        assert weight_bytes(run, device_params(run)).quantized_bytes == numel // 2 + numel // 64 * 4 + 32 * 7 * 512


def test_from_vllm_bitsandbytes_at_load(tmp_path, capsys):
    out = tmp_path / "serve.toml"
    code = main(["from-vllm", "vllm serve meta-llama/Llama-3.1-8B --quantization bitsandbytes", "--hf-config",
                 str(HF / "llama-3.1-8b" / "config.json"), "--engine-version", "0.19.0", "--gpu", "h100",
                 "-o", str(out)])
    assert code == 0
    text = out.read_text()
    assert 'weight_dtype = "nf4"' in text and "quant_group_size = 64" in text


def test_modelopt_fp8_from_its_own_file_and_refusals(tmp_path):
    """A ModelOpt ≤ 0.29 export keeps its quantization in hf_quant_config.json beside config.json: read as vLLM
    reads it. ModelOpt FP8 needs compute capability 8.9 (no Marlin fallback): an A100 is refused; so are the
    method names vLLM does not know and AutoRound packings it does not read."""
    config = _config(tmp_path, "llama-3.1-8b", None, quant_file={
        "producer": {"name": "modelopt", "version": "0.23.0"},
        "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}})
    run = _run(tmp_path, config, "h100", "0.19.0")
    assert run.quant is not None and run.quant.source == "modelopt fp8"
    assert _bytes(run) == (LLAMA_QUANT_NUMEL + 32 * 7 * 4, LLAMA_DENSE)  # one fp32 scale per tensor
    with pytest.raises(SpecError, match="compute capability 8.9"):
        _run(tmp_path, config, "a100", "0.19.0")
    for quant, why in (({"quant_method": "intel/auto-round", "bits": 4}, "no method vLLM knows"),
                       (dict(AUTO_ROUND, packing_format="auto_round:gptqmodel"), "gptqmodel")):
        with pytest.raises(SpecError, match=why):
            _run(tmp_path, _config(tmp_path, "llama-3.1-8b", quant), "h100", "0.19.0")


def test_modelopt_mixed_precision(tmp_path):
    """ModelOpt MIXED_PRECISION names each layer's algo: Qwen3-30B-A3B with FP8 attention projections (one fp32
    scale a tensor) and NVFP4 experts (named whole, `…mlp.experts`); the router, named nowhere, stays bf16. On a
    B200 at 0.19 the experts take FlashInfer TRT-LLM; an A100 is refused (the mixed config needs sm 8.9)."""
    layers: dict[str, Any] = {}
    for i in range(48):
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            layers[f"model.layers.{i}.self_attn.{proj}"] = {"quant_algo": "FP8"}
        layers[f"model.layers.{i}.mlp.experts"] = {"quant_algo": "NVFP4", "group_size": 16}
    config = _config(tmp_path, "qwen3-30b-a3b", {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                                                 "quantized_layers": layers})
    run = _run(tmp_path, config, "b200", "0.19.0")
    attention = 4096 * 2048 + 2 * 512 * 2048 + 2048 * 4096 + 4 * 4
    experts = 128 * 3 * 2048 * 768 * 9 // 16 + 4 * 512
    assert _bytes(run)[0] == 48 * (attention + experts)
    with pytest.raises(SpecError, match="MIXED_PRECISION below compute capability 8.9"):
        _run(tmp_path, config, "a100", "0.19.0")


def test_compressed_tensors_config_groups_by_target(tmp_path):
    """Two config groups: a `re:` pattern on the MLP (int4 weight-only, groups of 128) wins over the `Linear`
    class (fp8, one scale per output channel) that the attention projections take (``find_matched_target``)."""
    fp8 = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}
    int4 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}
    config = _config(tmp_path, "llama-3.1-8b", {
        "quant_method": "compressed-tensors", "format": "mixed-precision", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["re:.*mlp.*"], "weights": int4},
                          "group_1": {"targets": ["Linear"], "weights": fp8}}})
    run = _run(tmp_path, config, "h100", "0.19.0")
    attention = sum(o * i + o * 4 for o, i in [(4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096)])
    mlp = sum(o * i // 2 + o * (i // 128) * 2 + 16 for o, i in [(14336, 4096), (14336, 4096), (4096, 14336)])
    assert _bytes(run) == (32 * (attention + mlp), LLAMA_DENSE)
    assert run.serving.weight_dtype == "fp8"  # the activations' quantization follows the fp8 layers


def test_a_quantization_name_vllm_does_not_know_is_refused_with_the_nearest(tmp_path):
    config = HF / "llama-2-7b-gptq" / "config.json"
    with pytest.raises(SpecError, match="'gtpq' is no vLLM quantization method; did you mean 'gptq'"):
        _run(tmp_path, config, "a100", "0.11.0", serving='quantization = "gtpq"')
