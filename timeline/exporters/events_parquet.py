"""``events.parquet``: every alloc and free — device, time, sequence, action, tensor, category,
requested and block bytes, address, op, micro-batch, stage."""

from __future__ import annotations

from typing import BinaryIO

import numpy as np

from timeline.exporters.parquet_util import dictionary, write_table
from timeline.graph.tensors import CATEGORIES
from timeline.result.timeline import Timeline

FILENAME = "events.parquet"
SCHEMA = "timeline.events/1"


def write(tl: Timeline, handle: BinaryIO, options: dict | None = None) -> None:
    import pyarrow as pa

    names = tl.sim.names
    cols: dict[str, list] = {k: [] for k in ("device", "t_us", "seq", "kind", "action", "tensor", "category",
                                             "requested_bytes", "block_bytes", "address", "segment", "op", "microbatch",
                                             "stage")}
    for d, dev in enumerate(tl.sim.devices):
        ev, mem = tl.sim.events[d], tl.memory[d]
        n = len(ev.t_us)
        spans = tl.sim.spans[d]
        labels = [f"{s.stage}{s.kind}{s.microbatch}" if s.kind != "step" else "step" for s in spans]
        cols["device"].append(np.full(n, dev.device, dtype=np.int32))
        cols["t_us"].append(ev.t_us)
        cols["seq"].append(np.arange(n, dtype=np.int64))
        cols["kind"].append(np.where(ev.sign > 0, 0, 1).astype(np.int32))
        cols["action"].append(pa.array([labels[a] if a >= 0 else None for a in ev.action.tolist()],
                                       type=pa.string()).dictionary_encode())
        cols["tensor"].append(dictionary(ev.tensor, names))
        cols["category"].append(dictionary(ev.cat, list(CATEGORIES)))
        cols["requested_bytes"].append(ev.size)
        cols["block_bytes"].append(np.abs(mem.block_bytes))
        cols["address"].append(mem.address)
        cols["segment"].append(mem.segment)
        cols["op"].append(dictionary(ev.op, names))
        cols["microbatch"].append(ev.microbatch)
        cols["stage"].append(ev.stage.astype(np.int32))
    out = {}
    for k, v in cols.items():
        if k == "kind":
            out[k] = pa.DictionaryArray.from_arrays(pa.array(np.concatenate(v)), pa.array(["alloc", "free"]))
        elif isinstance(v[0], np.ndarray):
            out[k] = np.concatenate(v)
        else:
            out[k] = pa.chunked_array(v).combine_chunks() if len(v) > 1 else v[0]
            if isinstance(out[k], pa.ChunkedArray):
                out[k] = out[k].combine_chunks()
    write_table(out, handle, SCHEMA)
