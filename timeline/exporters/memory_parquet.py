"""``memory.parquet`` (``timeline.memory/2``): per device, one row per distinct time — the
iteration it falls in (null before the first), requested, allocated, reserved bytes and one
int64 column per category (summing to ``requested_bytes`` on every row)."""

from __future__ import annotations

from typing import BinaryIO

import numpy as np

from timeline.exporters.parquet_util import nullable, write_table
from timeline.result.categories import CATEGORIES
from timeline.result.timeline import Timeline

FILENAME = "memory.parquet"
SCHEMA = "timeline.memory/2"


def write(tl: Timeline, handle: BinaryIO, options: dict | None = None) -> None:
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("device", "t_us", "iteration", "requested_bytes",
                                                          "allocated_bytes",
                                                          "reserved_bytes", *CATEGORIES)}
    for d, dev in enumerate(tl.devices):
        s = tl.series(d)
        parts["device"].append(np.full(len(s.t_us), dev.device, dtype=np.int32))
        parts["t_us"].append(s.t_us)
        parts["iteration"].append(tl.iteration_at(d, s.t_us))
        parts["requested_bytes"].append(s.requested)
        parts["allocated_bytes"].append(s.allocated)
        parts["reserved_bytes"].append(s.reserved)
        for c in CATEGORIES:
            parts[c].append(s.by_category[c].astype(np.int64))
    cols: dict = {k: np.concatenate(v) for k, v in parts.items()}
    cols["iteration"] = nullable(cols["iteration"])
    write_table(cols, handle, SCHEMA)
