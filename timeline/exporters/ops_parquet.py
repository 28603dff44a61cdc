"""``ops.parquet``: every op span — device, stream, name, start and end, phase (F/B/I/W, R for
recompute, step), micro-batch, stage, layer, FLOPs."""

from __future__ import annotations

from typing import BinaryIO

import numpy as np

from timeline.exporters.parquet_util import dictionary, write_table
from timeline.result.timeline import Timeline

FILENAME = "ops.parquet"
SCHEMA = "timeline.ops/1"


def write(tl: Timeline, handle: BinaryIO, options: dict | None = None) -> None:
    names = tl.sim.names
    cols: dict[str, list] = {k: [] for k in ("device", "stream", "name", "t_start_us", "t_end_us", "phase",
                                             "microbatch", "stage", "layer", "flops")}
    for d, dev in enumerate(tl.sim.devices):
        ops = tl.sim.ops[d]
        n = len(ops.t_start_us)
        cols["device"].append(np.full(n, dev.device, dtype=np.int32))
        for k in ("stream", "name", "phase"):
            cols[k].append(np.asarray(getattr(ops, k), dtype=np.int32))
        cols["t_start_us"].append(np.asarray(ops.t_start_us, dtype=np.float64))
        cols["t_end_us"].append(np.asarray(ops.t_end_us, dtype=np.float64))
        for k in ("microbatch", "stage", "layer"):
            cols[k].append(np.asarray(getattr(ops, k), dtype=np.int32))
        cols["flops"].append(np.asarray(ops.flops, dtype=np.float64))
    out = {k: np.concatenate(v) for k, v in cols.items()}
    for k in ("stream", "name", "phase"):
        out[k] = dictionary(out[k], names)
    write_table(out, handle, SCHEMA)
