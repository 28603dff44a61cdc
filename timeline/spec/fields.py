"""Field metadata helpers: the type and range rules each spec field declares.

A field carries ``metadata={"check": ...}``: a tuple of rule names the generic section
checker (:func:`check_value`) applies. Keeping rules beside the fields means one place says
what a valid ``parallel.tp`` is, and the run-file reader reports it with the key path.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

DTYPES = ("fp32", "bf16", "fp16", "fp8")
#: bytes per element; masks are one byte (Korthikanti et al. 2022 §4)
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int64": 8, "int32": 4, "int16": 2,
                               "uint8": 1, "bool": 1, "fp64": 8}


def spec_field(default: Any = dataclasses.MISSING, *, doc: str = "", positive: bool = False,
               nonneg: bool = False, choices: tuple | None = None, minimum: float | None = None,
               maximum: float | None = None) -> Any:
    """A dataclass field with validation metadata."""
    meta = {"doc": doc, "positive": positive, "nonneg": nonneg, "choices": choices,
            "minimum": minimum, "maximum": maximum}
    if isinstance(default, (list, dict)):
        raise TypeError("mutable default")
    return dataclasses.field(default=default, metadata=meta)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_type_name(a) for a in typing.get_args(tp) if a is not type(None))
    if origin is tuple:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a table"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def _coerce(value: Any, tp: Any) -> tuple[bool, Any]:
    """Return (ok, coerced) for a TOML value against an annotation."""
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        for arg in typing.get_args(tp):
            if arg is type(None):
                if value is None:
                    return True, None
                continue
            ok, v = _coerce(value, arg)
            if ok:
                return True, v
        return False, None
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return False, None
        (elem,) = typing.get_args(tp)[:1]
        out = []
        for item in value:
            ok, v = _coerce(item, elem)
            if not ok:
                return False, None
            out.append(v)
        return True, tuple(out)
    if origin is dict:
        if not isinstance(value, dict):
            return False, None
        return True, tuple(sorted(value.items()))
    if tp is bool:
        return (isinstance(value, bool), value)
    if tp is int:
        return (isinstance(value, int) and not isinstance(value, bool), value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False, None
        return True, float(value)
    if tp is str:
        return (isinstance(value, str), value)
    return False, None


def _describe_range(meta: Mapping[str, Any]) -> str:
    if meta.get("choices"):
        return "one of " + ", ".join(repr(c) for c in meta["choices"])
    if meta.get("positive"):
        return "a positive value"
    if meta.get("nonneg"):
        return "a value ≥ 0"
    return ""


def check_value(f: dataclasses.Field, tp: Any, value: Any) -> tuple[Any, str | None]:
    """Coerce ``value`` for field ``f`` of annotation ``tp``; return (value, problem or None)."""
    ok, v = _coerce(value, tp)
    if not ok:
        return None, f"expected {_type_name(tp)}, got {value!r}"
    meta = f.metadata
    items = v if isinstance(v, tuple) and typing.get_origin(tp) is not dict else (v,)
    for item in items:
        if item is None or isinstance(item, (bool, tuple)):
            continue
        if meta.get("choices") and item not in meta["choices"]:
            return None, f"{item!r} is not valid; use {_describe_range(meta)}"
        if isinstance(item, float) and not math.isfinite(item):
            return None, f"must be a finite number, got {item!r}"
        if isinstance(item, (int, float)):
            if meta.get("positive") and item <= 0:
                return None, f"must be positive, got {item!r}"
            if meta.get("nonneg") and item < 0:
                return None, f"must be ≥ 0, got {item!r}"
            if meta.get("minimum") is not None and item < meta["minimum"]:
                return None, f"must be ≥ {meta['minimum']}, got {item!r}"
            if meta.get("maximum") is not None and item > meta["maximum"]:
                return None, f"must be ≤ {meta['maximum']}, got {item!r}"
    return v, None


def build_section(cls: type, section: str, values: dict[str, Any],
                  problems: list[tuple[str, str]]) -> Any:
    """Build ``cls`` from ``values``; append (key path, message) problems; None if any."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    before = len(problems)
    for key, value in values.items():
        if key not in fields:
            close = [n for n in fields if n.startswith(key[:3])]
            hint = f" (did you mean {close[0]!r}?)" if close else f"; valid keys: {', '.join(fields)}"
            problems.append((f"{section}.{key}", f"unknown key{hint}"))
            continue
        v, problem = check_value(fields[key], hints[key], value)
        if problem:
            problems.append((f"{section}.{key}", problem))
        else:
            kwargs[key] = v
    if len(problems) > before:
        return None
    return cls(**kwargs)
