"""``devices.parquet`` (``timeline.devices/1``): one row per simulated device — its global rank
(``device``), pipeline rank, the stages it holds, how many ranks it represents and its capacity —
so a query joins memory, events and ops to the layout without reading ``summary.json``."""

from __future__ import annotations

from typing import BinaryIO

import numpy as np

from timeline.exporters.parquet_util import write_table
from timeline.result.timeline import Timeline

FILENAME = "devices.parquet"
SCHEMA = "timeline.devices/1"


def write(tl: Timeline, handle: BinaryIO, options: dict | None = None) -> None:
    import pyarrow as pa

    devs = tl.devices
    cap = tl.meta.capacity_bytes
    cols = {"device": np.array([d.device for d in devs], dtype=np.int32),
            "pp_rank": np.array([d.pp_rank for d in devs], dtype=np.int32),
            "stages": pa.array([list(d.stages) for d in devs], type=pa.list_(pa.int32())),
            "represents": np.array([d.represents for d in devs], dtype=np.int32),
            "capacity_bytes": pa.array([cap] * len(devs), type=pa.int64())}
    write_table(cols, handle, SCHEMA)
