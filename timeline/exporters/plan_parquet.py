"""``plan.parquet``: one row per candidate of a plan, sorted by the canonical candidate string.

Columns: ``candidate`` (the canonical string), the searched settings (``tp`` … ``recompute``,
plus any other space key by its run-file name), the derived ``dp``, ``num_microbatches`` and
``layout``; ``invalid`` (why it cannot run); the static bound (``bound_peak_bytes`` on
``bound_pp_rank``, ``bound_time_us``; ``bound_exact``: of the candidate's own recompute policy,
else its layout's coarse bound, below every policy's); the simulated peaks (max over devices), ``worst_device``,
``short_bytes``, ``fits``, ``iteration_time_us``, ``tokens_per_s_per_gpu`` (these two also on a
candidate timed but not simulated: its schedule's simulated time, known before its memory); ``pruned_by`` (empty,
``static_bound``, ``oom``, ``invalid``, ``time_bound``, ``too_large``, ``budget``) and ``rank`` among those
that fit. Nothing that depends on the machine or the moment (wall times, host names) is in
it, so the same plan gives the same bytes on every engine. Schema ``timeline.plan/2``.
"""

from __future__ import annotations

from typing import BinaryIO

from timeline.exporters.parquet_util import write_table
from timeline.plan.search import PRUNED_NAMES, PlanResult, Row, known
from timeline.plan.space import SHORT, value_text

FILENAME = "plan.parquet"
SCHEMA = "timeline.plan/2"


def write(res: PlanResult, handle: BinaryIO) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    cols, table = res.columns, res.columns.table
    n = table.size
    fields = [pa.array(texts, pa.string()).take(pa.array(table.codes[:, j])) for j, texts in table.field_texts()]
    names = pc.binary_join_element_wise(*fields, " ") if len(fields) > 1 else fields[0]
    out: dict[str, object] = {"candidate": names}
    for j, (key, vals) in enumerate(res.space.values):
        codes = table.codes[:, j]
        present = [vals[c] for c in np.unique(codes)]
        name = SHORT.get(key, key)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
            out[name] = pa.array(np.array([v if isinstance(v, int) else 0 for v in vals], dtype=np.int64)[codes],
                                 pa.int64())
        else:
            out[name] = pa.array([value_text(v) for v in vals], pa.string()).take(pa.array(codes))

    def nulls(values: np.ndarray, mask: np.ndarray, dtype: object) -> object:
        return pa.array(values, mask=mask, type=dtype)

    simulated = [r for r in res.rows.values() if r.simulated]
    timed = [r for r in res.rows.values() if r.iteration_time_us is not None]  # simulated, or timed only

    def sim(attr: str, dtype: type, arrow: object, rows: list[Row] | None = None) -> object:
        values: np.ndarray = np.zeros(n, dtype=dtype)
        mask = np.ones(n, dtype=bool)
        for r in simulated if rows is None else rows:
            v = getattr(r, attr)
            if v is not None:
                values[r.index], mask[r.index] = v, False
        return nulls(values, mask, arrow)

    out["dp"] = nulls(cols.dp, cols.dp == 0, pa.int64())
    out["num_microbatches"] = nulls(cols.nmb, cols.nmb == 0, pa.int64())
    layouts = pa.array([None if x is None else ",".join(map(str, x)) for x in cols.layouts], pa.string())
    out["layout"] = layouts.take(pa.array(cols.layout))
    out["invalid"] = pa.array(cols.reasons, pa.string()).take(pa.array(cols.invalid))
    out["bound_peak_bytes"] = nulls(cols.bound_bytes, ~cols.bounded, pa.int64())
    out["bound_pp_rank"] = nulls(cols.bound_rank, ~cols.bounded, pa.int64())
    out["bound_time_us"] = nulls(cols.bound_time, ~cols.bounded, pa.float64())
    out["bound_exact"] = pa.array(cols.bound_exact, pa.bool_())
    flags = np.zeros(n, dtype=bool)
    flags[[r.index for r in simulated]] = True
    out["simulated"] = pa.array(flags, pa.bool_())
    for attr in ("peak_requested_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "worst_device"):
        out[attr] = sim(attr, np.int64, pa.int64())
    short = np.zeros(n, dtype=np.int64)
    for r in simulated:
        short[r.index] = r.short_bytes
    out["short_bytes"] = pa.array(short, pa.int64())
    out["fits"] = sim("fits", np.bool_, pa.bool_())
    out["iteration_time_us"] = sim("iteration_time_us", np.float64, pa.float64(), timed)
    out["tokens_per_s_per_gpu"] = sim("tokens_per_s_per_gpu", np.float64, pa.float64(), timed)
    out["pruned_by"] = pa.array(PRUNED_NAMES, pa.string()).take(pa.array(cols.pruned)).dictionary_encode()
    rank = [r for r in res.rows.values() if r.rank is not None]
    ranks, mask = np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool)
    for r in rank:
        ranks[r.index], mask[r.index] = known(r.rank), False
    out["rank"] = nulls(ranks, mask, pa.int64())
    write_table(out, handle, SCHEMA)
