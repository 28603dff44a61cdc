"""Shared Parquet writing: schema version in the file metadata, deterministic bytes."""

from __future__ import annotations

from typing import Any, BinaryIO


def write_table(columns: dict[str, Any], handle: BinaryIO, schema: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(columns)
    table = table.replace_schema_metadata({"schema": schema, "producer": "timeline"})
    pq.write_table(table, handle, compression="zstd", write_statistics=False)


def nullable(values: Any, dtype: Any = None) -> Any:
    """An integer column with every negative value (the in-memory "none" of micro-batch, stage,
    layer, address, iteration …) written as null, so a query's ``IS NULL`` finds them."""
    import numpy as np
    import pyarrow as pa

    arr = np.asarray(values) if dtype is None else np.asarray(values, dtype=dtype)
    mask = arr < 0
    return pa.array(np.where(mask, 0, arr), mask=mask) if mask.any() else pa.array(arr)


def dictionary(values: Any, names: list[str]) -> Any:
    """A dictionary-encoded string column from int codes into ``names`` (−1 → null)."""
    import numpy as np
    import pyarrow as pa

    codes = np.asarray(values, dtype=np.int32)
    mask = codes < 0
    return pa.DictionaryArray.from_arrays(pa.array(np.where(mask, 0, codes), mask=mask, type=pa.int32()),
                                          pa.array(names if names else [""], type=pa.string()))
