"""Read a Hugging Face ``quantization_config`` into a :class:`~timeline.spec.quant.CheckpointQuant`.

Each method is read as vLLM reads it (``vllm/model_executor/layers/quantization/``, the 0.11.0 PyPI
wheel): ``fp8.py`` ``Fp8Config.from_config`` (``weight_block_size``, ``ignored_layers`` from
``modules_to_not_convert``), ``awq.py`` ``AWQConfig.from_config`` (``bits``/``w_bit``,
``group_size``/``q_group_size``, ``zero_point``, ``modules_to_not_convert``), ``gptq.py``
``GPTQConfig.from_config`` (``bits``, ``group_size``, ``desc_act``), ``mxfp4.py`` ``Mxfp4Config``
(only ``FusedMoE`` layers; every linear layer must be in ``modules_to_not_convert``), and
``compressed_tensors/compressed_tensors.py`` ``CompressedTensorsConfig.from_config``
(``config_groups[*].weights``: ``num_bits``, ``type``, ``strategy``, ``group_size``,
``symmetric``; ``ignore``; int8 weights with int8 ``input_activations`` are ``CompressedTensorsW8A8Int8``,
``_get_scheme_from_parts``: ``_is_dynamic_token_w8a8`` / ``_is_static_tensor_w8a8``). Anything else is
refused in one line naming the method.

Read at vLLM 0.19.0 besides (``model_executor/layers/quantization/``):

* ``modelopt.py`` ``ModelOptQuantConfigBase.from_config``: NVIDIA ModelOpt checkpoints, ``quant_method``
  ``modelopt`` / ``modelopt_fp4`` with ``quant_algo`` ``FP8`` (one scale per tensor),
  ``FP8_PER_CHANNEL_PER_TOKEN`` (per output channel), ``FP8_PB_WO`` (128 × 128 blocks) or ``NVFP4`` (fp4
  values, an fp8 scale per 16, ``group_size``); the excluded modules are ``ignore`` (``config.json``) or
  ``exclude_modules`` (``hf_quant_config.json``, ModelOpt ≤ 0.29, whose ``quantization`` section
  :func:`read_quantization` takes when ``config.json`` has no ``quantization_config``:
  ``transformers_utils/config.py`` ``get_config``); ``kv_cache_quant_algo`` / ``kv_cache_scheme`` fp8 is
  kept for the KV cache's default dtype (``utils/torch_utils.py`` ``get_kv_cache_quant_algo_string``).
* ``compressed_tensors.py`` ``_is_nvfp4_format`` / ``_is_mxfp4``: fp4 weights (``type`` float, 4 bits)
  in groups of 16 (``tensor_group``: NVFP4; W4A4 with NVFP4 ``input_activations``, else W4A16) or of 32
  (MXFP4, W4A16).
* ``inc.py`` ``INCConfig.from_config`` (``auto_round.py`` ``AutoRoundConfig`` at 0.11.0): AutoRound's
  ``auto-round`` checkpoints — ``bits``, ``group_size``, ``sym``, ``packing_format``
  (``auto_round:auto_gptq`` the default, ``auto_round:auto_awq``), ``data_type`` ``int``, ``extra_config``
  per layer; ``intel/auto-round`` is no method vLLM knows (``config/model.py``: "Unknown quantization
  method").
* ``bitsandbytes.py`` ``BitsAndBytesConfig.from_config``: ``load_in_4bit`` (``bnb_4bit_quant_type`` nf4 /
  fp4, blocks of 64 values a fp32 absmax: the double-quantized statistics are turned back into fp32 at
  load, ``model_loader/bitsandbytes_loader.py`` ``_dequantize_dq``) or ``load_in_8bit``;
  ``llm_int8_skip_modules`` stay in the model dtype.
"""

from __future__ import annotations

from typing import Any

from timeline.errors import UserError
from timeline.spec.quant import CheckpointQuant, LayerOverride


def _patterns(raw: Any) -> tuple[str, ...]:
    return tuple(str(p) for p in raw) if isinstance(raw, list) else ()


def _ct_scheme(w: dict[str, Any], acts: Any, ignore: tuple[str, ...]) -> CheckpointQuant:
    """One compressed-tensors config group's scheme (``_get_scheme_from_parts``)."""
    bits, kind, strategy = int(w.get("num_bits", 8)), w.get("type", "int"), w.get("strategy", "tensor")
    if kind == "float" and bits == 4:
        group = int(w.get("group_size") or 0)
        if strategy == "tensor_group" and group == 16:
            # _is_nvfp4_format: W4A4 (CompressedTensorsW4A4Fp4) with fp4 input activations, else W4A16
            a16 = not (isinstance(acts, dict) and int(acts.get("num_bits") or 0) == 4)
            return CheckpointQuant(method="compressed-tensors", weight_dtype="nvfp4", bits=4, group_size=16,
                                   weight_only=a16, not_converted=ignore,
                                   source=f"compressed-tensors nvfp4 {'w4a16' if a16 else 'w4a4'}")
        if strategy == "group" and group == 32:
            # _is_mxfp4 → CompressedTensorsW4A16Mxfp4 (linear) / W4A4Mxfp4MoEMethod: Marlin, weight-only
            return CheckpointQuant(method="compressed-tensors", weight_dtype="mxfp4", bits=4, group_size=32,
                                   weight_only=True, not_converted=ignore, source="compressed-tensors mxfp4 w4a16")
        raise UserError(f"quantization_config: compressed-tensors fp4 weights with strategy {strategy!r} and group "
                        f"size {group} match no vLLM scheme (NVFP4: tensor_group of 16; MXFP4: group of 32)")
    group = int(w.get("group_size") or 0) if strategy == "group" else 0 if strategy == "channel" else -1
    if kind == "float" and bits == 8:
        # CompressedTensorsW8A8Fp8.create_weights: fp8 weight and one fp32 scale per channel (or per tensor)
        return CheckpointQuant(method="compressed-tensors", weight_dtype="fp8", bits=8, group_size=group,
                               not_converted=ignore, source=f"compressed-tensors fp8 {strategy}")
    if kind == "int" and bits == 8 and isinstance(acts, dict) and int(acts.get("num_bits") or 0) == 8:
        # CompressedTensorsW8A8Int8.create_weights: int8 weight and an fp32 scale per channel (or per tensor)
        return CheckpointQuant(method="compressed-tensors", weight_dtype="int8", bits=8, group_size=group,
                               int8_activations=True, not_converted=ignore, source=f"compressed-tensors w8a8 {strategy}")
    if kind == "int" and bits in (4, 8):
        # CompressedTensorsWNA16.create_weights: packed int32 weights, model-dtype scales, zeros when asymmetric
        return CheckpointQuant(method="compressed-tensors", weight_dtype=f"int{bits}", bits=bits,
                               group_size=group, zero_point=not w.get("symmetric", True), not_converted=ignore,
                               source=f"compressed-tensors int{bits} {strategy}")
    raise UserError(f"quantization_config: compressed-tensors {kind} {bits}-bit weights are not modelled")


def _compressed_tensors(q: dict[str, Any], ignore: tuple[str, ...]) -> CheckpointQuant:
    """The config groups' schemes: one group is the checkpoint's scheme; several are kept per ``targets`` (layer
    names, ``re:`` patterns, or a module class such as ``Linear``), matched as ``utils.py`` ``find_matched_target``
    matches them (a name or pattern before the class)."""
    groups = [g for g in (q.get("config_groups") or {}).values()
              if isinstance(g, dict) and isinstance(g.get("weights"), dict)]
    if not groups:
        raise UserError("quantization_config: compressed-tensors without a weights scheme in config_groups")
    schemes = [(tuple(str(t) for t in g.get("targets") or ["Linear"]),
                _ct_scheme(g["weights"], g.get("input_activations"), ignore)) for g in groups]
    if len(schemes) == 1:
        return schemes[0][1]
    return _mixed("compressed-tensors", schemes, ignore, "compressed-tensors mixed (" + ", ".join(
        f"{'|'.join(t)}: {sub.source.removeprefix('compressed-tensors ')}" for t, sub in schemes) + ")")


def _mixed(method: str, schemes: list[tuple[tuple[str, ...], CheckpointQuant]], ignore: tuple[str, ...],
           source: str, kv_fp8: bool = False) -> CheckpointQuant:
    """A checkpoint whose layers carry schemes of their own (``schemes``: targets and the scheme): the record's own
    format fields are its first fp8 scheme's (the format the model-dtype activations are quantized to), else its
    first scheme's."""
    lead = next((sub for _, sub in schemes if sub.weight_dtype == "fp8"), schemes[0][1])
    return CheckpointQuant(method=method, weight_dtype=lead.weight_dtype, bits=lead.bits, group_size=lead.group_size,
                           block_rows=lead.block_rows, schemes=tuple(schemes), not_converted=ignore, kv_fp8=kv_fp8,
                           source=source)


#: ModelOpt's quant_algo values vLLM 0.19.0 reads (modelopt.py QUANT_ALGOS) and what each stores
_MODELOPT_FP8 = {"FP8": -1, "FP8_PER_CHANNEL_PER_TOKEN": 0, "FP8_PB_WO": 128}


def _modelopt(q: dict[str, Any]) -> CheckpointQuant:
    """ModelOpt's config: ``config.json``'s flat ``quantization_config`` or ``hf_quant_config.json``'s
    ``quantization`` section (``ModelOptQuantConfigBase.from_config`` @0.19.0)."""
    section = q.get("quantization")
    inner: dict[str, Any] = section if isinstance(section, dict) else q
    algo = str(inner.get("quant_algo") or "").upper()
    ignore = _patterns(inner.get("exclude_modules")) + _patterns(inner.get("ignore"))
    kv = inner.get("kv_cache_scheme") or q.get("kv_cache_scheme") or inner.get("kv_cache_quant_algo") \
        or q.get("kv_cache_quant_algo")
    kv_fp8 = (isinstance(kv, str) and kv.lower() == "fp8") or (
        isinstance(kv, dict) and kv.get("dynamic") is False and kv.get("num_bits") == 8 and kv.get("type") == "float")
    if algo in _MODELOPT_FP8:
        group = _MODELOPT_FP8[algo]
        return CheckpointQuant(method="modelopt", weight_dtype="fp8", bits=8, group_size=group,
                               block_rows=128 if group == 128 else 0, not_converted=ignore, kv_fp8=kv_fp8,
                               source=f"modelopt {algo.lower()}")
    if "FP4" in algo:
        group = int(inner.get("group_size") or 16)
        if group != 16:
            raise UserError(f"quantization_config: modelopt NVFP4 with group_size {group}; NVFP4 scales 16 values")
        return CheckpointQuant(method="modelopt", weight_dtype="nvfp4", bits=4, group_size=16, not_converted=ignore,
                               kv_fp8=kv_fp8, source="modelopt nvfp4")
    if algo == "MIXED_PRECISION":
        # ModelOptMixedPrecisionConfig: quantized_layers names each layer's algo (FP8 or NVFP4); a layer it does not
        # name stays in the model dtype (_resolve_quant_algo, get_quant_method)
        layers = inner.get("quantized_layers")
        if not isinstance(layers, dict) or not layers:
            raise UserError("quantization_config: modelopt MIXED_PRECISION needs a non-empty quantized_layers mapping "
                            "(vLLM raises without one)")
        schemes: list[tuple[tuple[str, ...], CheckpointQuant]] = []
        for name, info in layers.items():
            layer_algo = str(info.get("quant_algo", "")).upper() if isinstance(info, dict) else ""
            if layer_algo in ("FP8", "NVFP4"):  # any other algo: UnquantizedLinearMethod (the model dtype)
                schemes.append(((str(name),), _modelopt({"quant_algo": layer_algo,
                                                         "group_size": info.get("group_size", 16)})))
        if not schemes:
            raise UserError("quantization_config: modelopt MIXED_PRECISION names no FP8 or NVFP4 layer")
        return _mixed("modelopt", schemes, ignore, f"modelopt mixed precision ({len(schemes)} layers)", kv_fp8)
    if algo == "MXFP8":
        raise UserError("quantization_config: modelopt MXFP8 (ModelOptMxFp8Config) is not modelled; FP8, "
                        "FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, NVFP4 and MIXED_PRECISION are")
    raise UserError(f"quantization_config: modelopt quant_algo {algo or '(none)'!r} is not one vLLM reads (FP8, "
                    "FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, NVFP4, MXFP8, MIXED_PRECISION)")


def _auto_round(q: dict[str, Any]) -> CheckpointQuant:
    """AutoRound's config as vLLM's INCConfig (0.19.0; AutoRoundConfig at 0.11.0) reads it."""
    bits, group = int(q.get("bits") or 4), int(q.get("group_size") or 128)
    sym = bool(q.get("sym", True))
    packing = str(q.get("packing_format") or "auto_round:auto_gptq")
    if packing not in ("auto_round:auto_gptq", "auto_round:auto_awq"):
        raise UserError(f"quantization_config: auto-round packing_format {packing!r}; vLLM reads "
                        "auto_round:auto_gptq and auto_round:auto_awq only (inc.py INCConfig.__init__)")
    if str(q.get("data_type") or "int") != "int":
        raise UserError(f"quantization_config: auto-round data_type {q.get('data_type')!r}; vLLM reads int weights "
                        "only (inc.py INCConfig.__init__)")
    if bits not in (2, 3, 4, 8):
        raise UserError(f"quantization_config: auto-round with {bits}-bit weights; vLLM takes 2, 3, 4 or 8")
    path = "gptq" if "gptq" in packing or "gptq" in str(q.get("backend") or "") else "awq"
    # INCConfig.apply_gptq_quant_layer / apply_awq_quant_layer: Marlin for (4 | 8 bits, sym) GPTQ and 4-bit asym AWQ
    # in groups of -1, 32, 64 or 128 (check_marlin_supported), else the plain method
    marlin = group in (-1, 32, 64, 128) and ((path == "gptq" and sym and bits in (4, 8)) or (path == "awq" and not sym))
    if path == "awq" and bits != 4:
        raise UserError(f"quantization_config: auto-round AWQ packing with {bits}-bit weights; vLLM's AWQ path "
                        "takes 4 bits only (awq.py AWQConfig)")
    overrides = []
    given = q.get("extra_config")
    extra: dict[str, Any] = given if isinstance(given, dict) else {}
    for name, layer in extra.items():
        if isinstance(layer, dict):
            overrides.append(LayerOverride(pattern=str(name), bits=int(layer.get("bits", bits)),
                                           group_size=int(layer.get("group_size", group)),
                                           sym=bool(layer.get("sym", sym))))
    return CheckpointQuant(method="auto-round", weight_dtype=f"int{8 if bits == 8 else 4}", bits=bits,
                           group_size=group, zero_point=not sym or path == "awq", sym=sym,
                           packing=f"{path}_marlin" if marlin else path, overrides=tuple(overrides),
                           source=f"auto-round int{bits} g{group} {'sym' if sym else 'asym'} ({path} packing)")


def _bitsandbytes(q: dict[str, Any]) -> CheckpointQuant:
    """``BitsAndBytesConfig.from_config`` (0.19.0): 4-bit unless ``load_in_8bit``."""
    skip = _patterns(q.get("llm_int8_skip_modules"))
    if q.get("load_in_8bit") and not q.get("load_in_4bit"):
        return CheckpointQuant(method="bitsandbytes", weight_dtype="int8", bits=8, group_size=0, not_converted=skip,
                               source="bitsandbytes int8")
    if str(q.get("bnb_4bit_quant_storage") or "uint8") != "uint8":
        raise UserError(f"quantization_config: bitsandbytes bnb_4bit_quant_storage {q['bnb_4bit_quant_storage']!r}; "
                        "vLLM takes uint8 only (bitsandbytes.py BitsAndBytesConfig)")
    kind = str(q.get("bnb_4bit_quant_type") or "fp4")
    return CheckpointQuant(method="bitsandbytes", weight_dtype="nf4", bits=4, group_size=64, not_converted=skip,
                           source=f"bitsandbytes 4-bit {kind}")


def read_quantization(cfg: dict[str, Any], quant_file: dict[str, Any] | None = None) -> CheckpointQuant | None:
    """The checkpoint's quantization, or None when ``cfg`` has no ``quantization_config`` and no
    ``hf_quant_config.json`` (``quant_file``, ModelOpt's own file) sits beside it."""
    q = cfg.get("quantization_config")
    if not isinstance(q, dict) and isinstance(quant_file, dict) and isinstance(quant_file.get("quantization"), dict):
        return _modelopt(quant_file)
    if not isinstance(q, dict):
        return None
    method = str(q.get("quant_method", "")).lower()
    ignore = _patterns(q.get("modules_to_not_convert")) + _patterns(q.get("ignore"))
    if method == "fp8":
        block: Any = q.get("weight_block_size")
        if isinstance(block, list) and len(block) == 2:
            return CheckpointQuant(method="fp8", weight_dtype="fp8", bits=8, group_size=int(block[1]),
                                   block_rows=int(block[0]), not_converted=ignore,
                                   source=f"fp8 blocks {block[0]}×{block[1]}")
        return CheckpointQuant(method="fp8", weight_dtype="fp8", bits=8, group_size=-1, not_converted=ignore,
                               source="fp8 per tensor")
    if method in ("awq", "gptq"):
        bits = int(q.get("bits") or q.get("w_bit") or 4)
        if bits not in (4, 8):
            raise UserError(f"quantization_config: {method} with {bits}-bit weights is not modelled; 4 or 8")
        group = int(q.get("group_size") or q.get("q_group_size") or 128)
        zero = bool(q.get("zero_point", True)) if method == "awq" else True
        sym = bool(q.get("sym", True))
        # the Marlin upgrade vLLM makes without --quantization gptq / awq: GPTQMarlinConfig.is_gptq_marlin_compatible
        # (bits, group_size, sym and desc_act all given; symmetric 4 or 8 bits) and AWQMarlinConfig.
        # is_awq_marlin_compatible (4 bits with zero points), groups of -1, 32, 64 or 128 (MARLIN_SUPPORTED_GROUP_SIZES)
        keys = all(k in q for k in ("bits", "group_size", "sym", "desc_act"))
        marlin = group in (-1, 32, 64, 128) and (
            (method == "gptq" and keys and sym) or (method == "awq" and bits == 4 and zero))
        return CheckpointQuant(method=method, weight_dtype=f"int{bits}", bits=bits, group_size=group,
                               zero_point=zero, desc_act=bool(q.get("desc_act", False)), sym=sym,
                               packing=f"{method}_marlin" if marlin else method, not_converted=ignore,
                               source=f"{method} int{bits} g{group}")
    if method == "mxfp4":
        return CheckpointQuant(method="mxfp4", weight_dtype="mxfp4", bits=4, group_size=32, experts_only=True,
                               not_converted=ignore, source="mxfp4 experts")
    if method in ("compressed-tensors", "compressed_tensors"):
        return _compressed_tensors(q, ignore)
    if method in ("modelopt", "modelopt_fp4"):
        return _modelopt(q)
    if method == "auto-round":
        return _auto_round(q)
    if method == "bitsandbytes":
        return _bitsandbytes(q)
    if method == "intel/auto-round":
        raise UserError("quantization_config: quant_method 'intel/auto-round' is no method vLLM knows (it fails with "
                        "'Unknown quantization method'); AutoRound checkpoints vLLM loads say 'auto-round'")
    raise UserError(f"quantization_config: quant_method {method!r} is not modelled; the serving budget reads fp8, "
                    "awq, gptq, mxfp4, compressed-tensors, modelopt, auto-round and bitsandbytes checkpoints")
