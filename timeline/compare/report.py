"""The comparison as data: the ``timeline.compare/1`` JSON document and the columns of
``compare.parquet`` (one row per variant × device). Formatting only; no I/O."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from timeline.compare.metrics import DeviceMetrics, VariantResult

SCHEMA = "timeline.compare/1"
FIELDS = tuple(f.name for f in dataclasses.fields(DeviceMetrics))


def compare_dict(results: Sequence[VariantResult]) -> dict[str, Any]:
    """``{"schema", "variants": [{"name", "recompute", "fits", "devices": [...]}]}``."""
    return {"schema": SCHEMA, "variants": [
        {"name": r.name, "recompute": r.recompute, "fits": r.fits,
         "devices": [dataclasses.asdict(d) for d in r.devices]} for r in results]}


def compare_columns(results: Sequence[VariantResult]) -> dict[str, np.ndarray | list[str]]:
    """Columns for ``compare.parquet``: ``variant``, ``recompute`` and every metric field."""
    rows = [(r, d) for r in results for d in r.devices]
    cols: dict[str, np.ndarray | list[str]] = {"variant": [r.name for r, _ in rows],
                                               "recompute": [r.recompute for r, _ in rows]}
    for f in FIELDS:
        values = [getattr(d, f) for _, d in rows]
        kind: type = type(values[0]) if values else int
        dtypes: dict[type, type] = {bool: np.bool_, float: np.float64}
        cols[f] = np.array(values, dtype=dtypes.get(kind, np.int64))
    return cols
