"""``events.parquet`` (``timeline.events/2``): every alloc and free — device, time, sequence,
iteration, alloc_id (the same on an alloc and its free), action, tensor, category, requested and
block bytes, address, op, micro-batch, stage. "None" is null, never −1 (static state has no
iteration, action, micro-batch or stage; the ideal allocator no address)."""

from __future__ import annotations

from typing import BinaryIO

import numpy as np

from timeline.exporters.parquet_util import dictionary, nullable, write_table
from timeline.result.categories import CATEGORIES
from timeline.result.timeline import Timeline

FILENAME = "events.parquet"
#: integer columns whose negative values are written as null
NULLABLE = ("iteration", "address", "segment", "microbatch", "stage")
SCHEMA = "timeline.events/2"
#: string columns written as dictionaries of codes
DICTIONARY = ("tensor", "category", "op")


def write(tl: Timeline, handle: BinaryIO, options: dict | None = None) -> None:
    import pyarrow as pa

    names = tl.names
    cols: dict[str, list] = {k: [] for k in ("device", "t_us", "seq", "iteration", "alloc_id", "kind", "action",
                                             "tensor", "category",
                                             "requested_bytes", "block_bytes", "address", "segment", "op", "microbatch",
                                             "stage")}
    for d, dev in enumerate(tl.devices):
        ev, mem = tl.events(d), tl.memory[d]
        n = len(ev.t_us)
        spans = tl.spans[d]
        labels = [f"{s.stage}{s.kind}{s.microbatch}" if s.kind != "step" else "step" for s in spans]
        cols["device"].append(np.full(n, dev.device, dtype=np.int32))
        cols["t_us"].append(ev.t_us)
        cols["seq"].append(np.arange(n, dtype=np.int64))
        cols["iteration"].append(tl.event_iterations(d))
        cols["alloc_id"].append(tl.alloc_ids(d))
        cols["kind"].append(np.where(ev.sign > 0, 0, 1).astype(np.int32))
        cols["action"].append(_action_column(ev.action, labels))
        cols["tensor"].append(ev.tensor)
        cols["category"].append(ev.cat)
        cols["requested_bytes"].append(ev.size)
        cols["block_bytes"].append(np.abs(mem.block_bytes))
        cols["address"].append(mem.address)
        cols["segment"].append(mem.segment)
        cols["op"].append(ev.op)
        cols["microbatch"].append(ev.microbatch)
        cols["stage"].append(ev.stage.astype(np.int32))
    out = {}
    for k, v in cols.items():
        if k in DICTIONARY:  # every device's codes index the same names: one array over all of them
            out[k] = dictionary(np.concatenate(v), list(CATEGORIES) if k == "category" else names)
        elif k in NULLABLE:
            out[k] = nullable(np.concatenate(v))
        elif k == "kind":
            out[k] = pa.DictionaryArray.from_arrays(pa.array(np.concatenate(v)), pa.array(["alloc", "free"]))
        elif isinstance(v[0], np.ndarray):
            out[k] = np.concatenate(v)
        else:
            out[k] = pa.chunked_array(v).combine_chunks() if len(v) > 1 else v[0]
            if isinstance(out[k], pa.ChunkedArray):
                out[k] = out[k].combine_chunks()
    write_table(out, handle, SCHEMA)


def _action_column(action: np.ndarray, labels: list[str]) -> object:
    """``pa.array([labels[a] or None …]).dictionary_encode()`` without a string per event: the
    dictionary holds each distinct label in order of its first event (an action's label repeats
    across iterations), the indices point into it, and static events (−1) are null."""
    import pyarrow as pa

    valid = action >= 0
    if not valid.any():
        return pa.array([None] * len(action), type=pa.string()).dictionary_encode()
    label_id: dict[str, int] = {}
    of_span = np.array([label_id.setdefault(x, len(label_id)) for x in labels], dtype=np.int64)
    key = np.where(valid, of_span[np.where(valid, action, 0)], -1)
    distinct, first = np.unique(key[valid], return_index=True)
    order = np.argsort(first, kind="stable")  # dictionary order: first appearance
    rank = np.empty(len(distinct), dtype=np.int32)
    rank[order] = np.arange(len(distinct), dtype=np.int32)
    words = list(label_id)
    index = np.zeros(len(action), dtype=np.int32)
    index[valid] = rank[np.searchsorted(distinct, key[valid])]
    return pa.DictionaryArray.from_arrays(pa.array(index, mask=~valid, type=pa.int32()),
                                          pa.array([words[k] for k in distinct[order].tolist()], type=pa.string()))
