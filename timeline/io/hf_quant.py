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
"""

from __future__ import annotations

from typing import Any

from timeline.errors import UserError
from timeline.spec.quant import CheckpointQuant


def _patterns(raw: Any) -> tuple[str, ...]:
    return tuple(str(p) for p in raw) if isinstance(raw, list) else ()


def _compressed_tensors(q: dict[str, Any], ignore: tuple[str, ...]) -> CheckpointQuant:
    groups = q.get("config_groups") or {}
    weights: list[dict[str, Any]] = [g["weights"] for g in groups.values()
                                     if isinstance(g, dict) and isinstance(g.get("weights"), dict)]
    if len(weights) != 1:
        raise UserError("quantization_config: compressed-tensors with other than one weight scheme in config_groups "
                        "is not modelled")
    w = weights[0]
    bits, kind, strategy = int(w.get("num_bits", 8)), w.get("type", "int"), w.get("strategy", "tensor")
    group = int(w.get("group_size") or 0) if strategy == "group" else 0 if strategy == "channel" else -1
    if kind == "float" and bits == 8:
        # CompressedTensorsW8A8Fp8.create_weights: fp8 weight and one fp32 scale per channel (or per tensor)
        return CheckpointQuant(method="compressed-tensors", weight_dtype="fp8", bits=8, group_size=group,
                               not_converted=ignore, source=f"compressed-tensors fp8 {strategy}")
    acts = next((g.get("input_activations") for g in groups.values() if isinstance(g, dict)), None)
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


def read_quantization(cfg: dict[str, Any]) -> CheckpointQuant | None:
    """The checkpoint's quantization, or None when ``cfg`` has no ``quantization_config``."""
    q = cfg.get("quantization_config")
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
        return CheckpointQuant(method=method, weight_dtype=f"int{bits}", bits=bits, group_size=group,
                               zero_point=zero, desc_act=bool(q.get("desc_act", False)), not_converted=ignore,
                               source=f"{method} int{bits} g{group}")
    if method == "mxfp4":
        return CheckpointQuant(method="mxfp4", weight_dtype="mxfp4", bits=4, group_size=32, experts_only=True,
                               not_converted=ignore, source="mxfp4 experts")
    if method == "compressed-tensors":
        return _compressed_tensors(q, ignore)
    raise UserError(f"quantization_config: quant_method {method!r} is not modelled; the serving budget reads fp8, "
                    "awq, gptq, mxfp4 and compressed-tensors checkpoints")
