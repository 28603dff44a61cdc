"""Write run-file data (the dict a run file parses to) back as TOML that :func:`load_run` reads
to the same run: top-level keys first, then one table per section, in the order given.

Used by ``timeline plan`` for ``best/NN.toml``. This module only formats; it validates nothing.
"""

from __future__ import annotations

import json
from typing import Any


def toml_value(v: Any) -> str:
    """One TOML value: booleans, integers, floats (as Python writes them, which TOML reads back
    exactly), strings, arrays and inline tables."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            raise ValueError(f"cannot write {v!r} in a run file")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {v!r} as TOML")


def run_file_text(data: dict[str, Any], header: str = "") -> str:
    """``data`` as a run file; ``header`` becomes leading comment lines."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    for key, value in data.items():
        if not isinstance(value, dict):
            lines.append(f"{key} = {toml_value(value)}")
    for key, value in data.items():
        if isinstance(value, dict):
            lines += ["", f"[{key}]"]
            lines += [f"{k} = {toml_value(v)}" for k, v in value.items()]
    return "\n".join(lines) + "\n"
