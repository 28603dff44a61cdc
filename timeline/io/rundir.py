"""Read back a run directory written by ``timeline simulate``: ``summary.json`` and the columns
of ``memory.parquet``. Checks the schema names; does not interpret the numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from timeline.errors import UserError


def read_summary(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "summary.json"
    if not path.is_file():
        raise UserError(f"{run_dir}: no summary.json; is this a run directory from `timeline simulate`?")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc}); simulate the run again") from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if not str(schema or "").startswith("timeline.summary/"):
        raise UserError(f"{path}: not a timeline summary (schema {schema!r})")
    return data


def read_memory(run_dir: Path) -> dict[str, np.ndarray]:
    """Every column of ``memory.parquet`` as a numpy array (rows of all devices, in file order)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = run_dir / "memory.parquet"
    if not path.is_file():
        raise UserError(f"{run_dir}: no memory.parquet; simulate with --format including memory")
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise UserError(f"{path}: cannot read as Parquet ({exc}); simulate the run again") from None
    schema = (table.schema.metadata or {}).get(b"schema", b"").decode()
    if not schema.startswith("timeline.memory/"):
        raise UserError(f"{path}: not a timeline memory table (schema {schema!r})")
    return {name: (table.column(name).fill_null(-1) if table.column(name).null_count else table.column(name)).to_numpy()
            for name in table.column_names}


def read_columns(path: Path, schema_prefix: str) -> dict[str, np.ndarray] | None:
    """Every column of the Parquet file ``path`` (its ``schema`` metadata starting with
    ``schema_prefix``) as numpy arrays, strings as object arrays; None if the file is absent."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        return None
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise UserError(f"{path}: cannot read as Parquet ({exc})") from None
    schema = (table.schema.metadata or {}).get(b"schema", b"").decode()
    if not schema.startswith(schema_prefix):
        raise UserError(f"{path}: not a {schema_prefix} table (schema {schema!r})")
    out = {}
    for name in table.column_names:
        col = table.column(name)
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        if pa.types.is_integer(col.type) and col.null_count:  # "none" (null in the file) reads as −1
            col = col.fill_null(-1)
        out[name] = col.to_numpy(zero_copy_only=False)
    return out
