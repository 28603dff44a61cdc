"""``ops.parquet``: every op span — device, stream, name, start and end, phase (F/B/I/W, R for
recompute, step), micro-batch, stage, layer, FLOPs, and the iteration it runs in (``timeline.ops/2``:
null, never −1, where there is none)."""

from __future__ import annotations

from typing import BinaryIO

import numpy as np

from timeline.exporters.parquet_util import dictionary, nullable, write_table
from timeline.result.timeline import Timeline

FILENAME = "ops.parquet"
SCHEMA = "timeline.ops/2"


def write(tl: Timeline, handle: BinaryIO, options: dict | None = None) -> None:
    names = tl.names
    cols: dict[str, list] = {k: [] for k in ("device", "stream", "name", "t_start_us", "t_end_us", "phase",
                                             "microbatch", "stage", "layer", "flops", "iteration")}
    for d, dev in enumerate(tl.devices):
        ops = tl.ops[d]
        n = len(ops.t_start_us)
        cols["device"].append(np.full(n, dev.device, dtype=np.int32))
        for k in ("stream", "name", "phase"):
            cols[k].append(np.asarray(getattr(ops, k), dtype=np.int32))
        cols["t_start_us"].append(np.asarray(ops.t_start_us, dtype=np.float64))
        cols["t_end_us"].append(np.asarray(ops.t_end_us, dtype=np.float64))
        for k in ("microbatch", "stage", "layer"):
            cols[k].append(np.asarray(getattr(ops, k), dtype=np.int32))
        cols["flops"].append(np.asarray(ops.flops, dtype=np.float64))
        cols["iteration"].append(tl.iteration_at(d, ops.t_start_us))
    out = {k: np.concatenate(v) for k, v in cols.items()}
    for k in ("stream", "name", "phase"):
        out[k] = dictionary(out[k], names)
    for k in ("microbatch", "stage", "layer", "iteration"):
        out[k] = nullable(out[k])
    write_table(out, handle, SCHEMA)
