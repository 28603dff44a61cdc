"""``plan.parquet``: one row per candidate of a plan, sorted by the canonical candidate string.

Columns: ``candidate`` (the canonical string), the searched settings (``tp`` … ``recompute``,
plus any other space key by its run-file name), the derived ``dp``, ``num_microbatches`` and
``layout``; ``invalid`` (why it cannot run); the static bound (``bound_peak_bytes`` on
``bound_pp_rank``, ``bound_time_us``; ``bound_exact``: of the candidate's own recompute policy,
else its layout's coarse bound, below every policy's); the simulated peaks (max over devices), ``worst_device``,
``short_bytes``, ``fits``, ``iteration_time_us``, ``tokens_per_s_per_gpu``; ``pruned_by`` (empty,
``static_bound``, ``oom``, ``invalid``, ``time_bound``, ``too_large``, ``budget``) and ``rank`` among those
that fit. Nothing that depends on the machine or the moment (wall times, host names) is in
it, so the same plan gives the same bytes on every engine. Schema ``timeline.plan/2``.
"""

from __future__ import annotations

from typing import BinaryIO

from timeline.exporters.parquet_util import write_table
from timeline.plan.search import PlanResult
from timeline.plan.space import SHORT

FILENAME = "plan.parquet"
SCHEMA = "timeline.plan/2"


def write(res: PlanResult, handle: BinaryIO) -> None:
    import pyarrow as pa

    rows = res.rows
    keys = [k for k, _ in res.space.values]
    cols: dict[str, object] = {"candidate": pa.array([r.name for r in rows], pa.string())}
    # every candidate lists the same keys in the same order (plan.space.candidates): read by position
    position = {k: i for i, (k, _) in enumerate(rows[0].candidate.settings)} if rows else {}
    for key in keys:
        i = position[key] if rows else 0
        pairs = [r.candidate.settings[i] for r in rows]
        assert all(k == key for k, _ in pairs)
        values = [v for _, v in pairs]
        name = SHORT.get(key, key)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            cols[name] = pa.array(values, pa.int64())
        else:
            cols[name] = pa.array([str(v).lower() if isinstance(v, bool) else str(v) for v in values], pa.string())

    def ints(attr: str) -> object:
        return pa.array([getattr(r, attr) for r in rows], pa.int64())

    def floats(attr: str) -> object:
        return pa.array([getattr(r, attr) for r in rows], pa.float64())

    cols["dp"] = pa.array([r.dp or None for r in rows], pa.int64())
    cols["num_microbatches"] = pa.array([r.num_microbatches or None for r in rows], pa.int64())
    cols["layout"] = pa.array([None if r.layout is None else ",".join(map(str, r.layout)) for r in rows],
                              pa.string())
    cols["invalid"] = pa.array([r.invalid for r in rows], pa.string())
    cols["bound_peak_bytes"] = ints("bound_bytes")
    cols["bound_pp_rank"] = ints("bound_rank")
    cols["bound_time_us"] = floats("bound_time_us")
    cols["bound_exact"] = pa.array([r.bound_exact for r in rows], pa.bool_())
    cols["simulated"] = pa.array([r.simulated for r in rows], pa.bool_())
    for attr in ("peak_requested_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "worst_device"):
        cols[attr] = ints(attr)
    cols["short_bytes"] = ints("short_bytes")
    cols["fits"] = pa.array([r.fits for r in rows], pa.bool_())
    cols["iteration_time_us"] = floats("iteration_time_us")
    cols["tokens_per_s_per_gpu"] = floats("tokens_per_s_per_gpu")
    cols["pruned_by"] = pa.array([r.pruned_by for r in rows], pa.string()).dictionary_encode()
    cols["rank"] = ints("rank")
    write_table(cols, handle, SCHEMA)
