"""What a plan knows of each candidate, as columns over its :class:`~timeline.plan.table.Table`
(rows in name order), and :class:`Row`, the object form of the few candidates the search handles
one by one (bounded exactly, simulated, ranked).

Every candidate of a layout group gets the group's derived counts and coarse bound
(:class:`GroupResult`, a worker's answer); the counts are set, as on a whole run, only where
validation passes. Per row: the validation problem (an index into ``reasons``, 0 = none), the
bound (``bounded``: it has one), whether it is the candidate's own policy's (``bound_exact``),
and why it was set aside (an index into :data:`PRUNED_NAMES`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from timeline.plan.space import Candidate
from timeline.plan.table import Table

#: why a candidate was set aside, in plan.parquet's words
PRUNED = ("static_bound", "oom", "invalid", "time_bound", "too_large", "budget")
PRUNED_NAMES = ("", *PRUNED)


@dataclass(slots=True)
class Row:
    """One candidate's fate (a row of plan.parquet), for those the search handles one by one."""

    candidate: Candidate
    index: int = -1  # its row in the plan's table (name order)
    dp: int = 0
    num_microbatches: int = 0
    layout: tuple[int, ...] | None = None
    invalid: str = ""  # "key: problem" of an invalid candidate
    bound_bytes: int | None = None
    bound_rank: int | None = None
    bound_time_us: float | None = None
    bound_exact: bool = False  # the bound of the candidate's own policy (else its layout's coarse one)
    simulated: bool = False
    peak_requested_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None  # max over devices
    worst_device: int | None = None  # the device with the most peak reserved (or short of the most)
    short_bytes: int = 0  # oom: what the worst device lacks
    fits: bool | None = None
    iteration_time_us: float | None = None
    tokens_per_s_per_gpu: float | None = None
    pruned_by: str = ""
    rank: int | None = None

    @property
    def name(self) -> str:
        return self.candidate.name


@dataclass(frozen=True, slots=True)
class GroupResult:
    """One layout group's fate, for each recompute value of the space (a worker's answer)."""

    dp: int
    num_microbatches: int
    layout: tuple[int, ...] | None
    #: per recompute value: "" (valid), or the "key: problem" of the first problem validation finds
    invalid: tuple[str, ...]
    #: per recompute value that validates: its coarse bound (bytes, pp rank, time µs, over capacity),
    #: or the schedule generator's refusal (a "key: problem" str); None for the others
    bounds: tuple[tuple[int, int, float, bool] | str | None, ...]


@dataclass(slots=True)
class Columns:
    table: Table
    dp: np.ndarray  # int64, 0 where validation failed
    nmb: np.ndarray  # int64, 0 likewise
    layout: np.ndarray  # int32 into layouts (0: none)
    layouts: list[tuple[int, ...] | None]
    invalid: np.ndarray  # int32 into reasons (0: valid)
    reasons: list[str]
    bounded: np.ndarray  # bool
    bound_bytes: np.ndarray  # int64
    bound_rank: np.ndarray  # int64
    bound_time: np.ndarray  # float64
    bound_exact: np.ndarray  # bool
    pruned: np.ndarray  # int8 into PRUNED_NAMES

    @classmethod
    def of(cls, table: Table, results: Sequence[GroupResult | None]) -> Columns:
        """The rows' columns from each layout group's result (``results[g]`` for ``table.groups[g]``)."""
        n_groups, policies = len(results), len(dict(table.space.values)["recompute"])
        reason_of: dict[str, int] = {"": 0}
        layout_of: dict[tuple[int, ...] | None, int] = {None: 0}
        g_reason = np.zeros((n_groups, policies), dtype=np.int32)
        g_valid = np.zeros((n_groups, policies), dtype=bool)  # validated: the derived counts are set
        g_bounded = np.zeros((n_groups, policies), dtype=bool)
        g_over = np.zeros((n_groups, policies), dtype=bool)
        g_bytes = np.zeros((n_groups, policies), dtype=np.int64)
        g_rank = np.zeros((n_groups, policies), dtype=np.int64)
        g_time = np.zeros((n_groups, policies), dtype=np.float64)
        g_dp = np.zeros(n_groups, dtype=np.int64)
        g_nmb = np.zeros(n_groups, dtype=np.int64)
        g_layout = np.zeros(n_groups, dtype=np.int32)
        for g, res in enumerate(results):
            assert res is not None  # every group was bounded
            g_dp[g], g_nmb[g] = res.dp, res.num_microbatches
            g_layout[g] = layout_of.setdefault(res.layout, len(layout_of))
            if not res.dp:  # the derived counts fail: one problem for every policy
                g_reason[g] = reason_of.setdefault(res.invalid[0], len(reason_of))
                continue
            for p, (why, b) in enumerate(zip(res.invalid, res.bounds, strict=True)):
                if why:
                    g_reason[g, p] = reason_of.setdefault(why, len(reason_of))
                    continue
                g_valid[g, p] = True
                if isinstance(b, str):
                    g_reason[g, p] = reason_of.setdefault(b, len(reason_of))
                elif b is not None:
                    g_bounded[g, p] = True
                    g_bytes[g, p], g_rank[g, p], g_time[g, p], g_over[g, p] = b
        rg, rp = table.group, table.policy
        valid, invalid = g_valid[rg, rp], g_reason[rg, rp]
        bounded = g_bounded[rg, rp]
        pruned = np.where(invalid > 0, PRUNED_NAMES.index("invalid"),
                          np.where(bounded & g_over[rg, rp], PRUNED_NAMES.index("static_bound"), 0)).astype(np.int8)
        return cls(table=table, dp=np.where(valid, g_dp[rg], 0), nmb=np.where(valid, g_nmb[rg], 0),
                   layout=np.where(valid, g_layout[rg], 0).astype(np.int32), layouts=list(layout_of),
                   invalid=invalid, reasons=list(reason_of), bounded=bounded,
                   bound_bytes=np.where(bounded, g_bytes[rg, rp], 0), bound_rank=np.where(bounded, g_rank[rg, rp], 0),
                   bound_time=np.where(bounded, g_time[rg, rp], 0.0), bound_exact=np.zeros(table.size, dtype=bool),
                   pruned=pruned)

    def survivors(self) -> np.ndarray:
        """The rows neither invalid nor over capacity by their bound, by (bound time, name)."""
        idx = np.flatnonzero(self.pruned == 0)
        return idx[np.lexsort((idx, self.bound_time[idx]))]

    def row(self, i: int) -> Row:
        """Row ``i`` (bounded) as an object."""
        return Row(candidate=self.table.candidate(i), index=i, dp=int(self.dp[i]), num_microbatches=int(self.nmb[i]),
                   layout=self.layouts[self.layout[i]], bound_bytes=int(self.bound_bytes[i]),
                   bound_rank=int(self.bound_rank[i]), bound_time_us=float(self.bound_time[i]))

    def prune(self, rows: np.ndarray, reason: str) -> None:
        self.pruned[rows] = PRUNED_NAMES.index(reason)

    def absorb(self, r: Row) -> None:
        """Write back what the search learnt of row ``r`` one by one."""
        i = r.index
        if r.bound_bytes is not None and r.bound_rank is not None and r.bound_time_us is not None:
            self.bound_bytes[i], self.bound_rank[i], self.bound_time[i] = r.bound_bytes, r.bound_rank, r.bound_time_us
        self.bound_exact[i] = r.bound_exact
        self.pruned[i] = PRUNED_NAMES.index(r.pruned_by)

    def counts(self, *, simulated: int, fit: int) -> dict[str, int]:
        def n(reason: str) -> int:
            return int(np.count_nonzero(self.pruned == PRUNED_NAMES.index(reason)))

        return {"candidates": self.table.size, "invalid": n("invalid"), "bounded": int(np.count_nonzero(self.bounded)),
                "static_bound": n("static_bound"), "simulated": simulated, "fit": fit, "oom": n("oom"),
                "time_bound": n("time_bound"), "too_large": n("too_large"), "budget": n("budget"),
                "bounded_exactly": int(np.count_nonzero(self.bound_exact))}
