"""A plan's candidates as columns: every point of a space as value codes, in the order of the
canonical candidate string — no Python object per candidate (a 2,048-GPU default space holds
5.3 M of them; the names are joined only where plan.parquet is written).

Candidates that differ only in their recompute policy share a *layout group*: their derived
counts, their validation outside the recompute section and their coarse bound are the same
(:func:`timeline.spec.validate.validate_all_but_recompute`, :func:`timeline.plan.bound.coarse_stats`),
so the planner works per group and spreads the results over the group's policies.

The rows are exactly those of :func:`timeline.plan.space.candidates` (the factorisation filter
is the same arithmetic, on whole columns), sorted as Python sorts their names (:func:`_name_sort`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from timeline.plan.space import SHORT, Candidate, Space, value_text


@dataclass(frozen=True, slots=True)
class Table:
    """The candidates of ``space`` (rows sorted by name). ``codes[i, j]``: the index of row ``i``'s
    value of the space's ``j``-th key (:attr:`Space.values` order); ``group[i]`` and
    ``policy[i]``: its layout group (a row of ``groups``) and its recompute value's index."""

    space: Space
    codes: np.ndarray  # (rows, keys) int32
    group: np.ndarray  # (rows,) int64
    policy: np.ndarray  # (rows,) int64
    groups: np.ndarray  # (groups, keys) int32; the recompute column holds 0

    @property
    def size(self) -> int:
        return int(self.codes.shape[0])

    def name(self, i: int) -> str:
        return self.candidate(i).name

    def field_texts(self) -> list[tuple[int, list[str]]]:
        """Per key in name order: its column and the ``key=text`` field of each of its values."""
        return [(j, [f"{SHORT.get(k, k)}={value_text(v)}" for v in vs])
                for j in name_order(self.space) for k, vs in [self.space.values[j]]]

    def candidate(self, i: int) -> Candidate:
        return _candidate(self.space, self.codes[i])

    def group_candidate(self, g: int) -> Candidate:
        """The group's candidate with its first recompute value (the group's settings but one)."""
        return _candidate(self.space, self.groups[g])


def name_order(space: Space) -> list[int]:
    """Indices of the space's keys in the order a candidate lists them: the searched keys, then the
    others sorted (:class:`timeline.plan.space.Candidate`)."""
    keys = [k for k, _ in space.values]
    searched = [i for i, k in enumerate(keys) if k in SHORT]
    return searched + sorted((i for i, k in enumerate(keys) if k not in SHORT), key=lambda i: keys[i])


def _candidate(space: Space, codes: np.ndarray) -> Candidate:
    return Candidate(tuple((space.values[j][0], space.values[j][1][int(codes[j])]) for j in name_order(space)))


def build_table(space: Space) -> Table:
    """Every candidate of ``space`` as columns, sorted by name."""
    keys = [k for k, _ in space.values]
    sizes = [len(vs) for _, vs in space.values]
    rc = keys.index("recompute")
    others = [j for j in range(len(keys)) if j != rc]
    grid = np.indices([sizes[j] for j in others], dtype=np.int32).reshape(len(others), -1)
    groups = np.zeros((grid.shape[1], len(keys)), dtype=np.int32)
    groups[:, others] = grid.T
    if space.factorised:  # the filter of plan.space.candidates, on columns
        def col(key: str) -> np.ndarray:
            j = keys.index(key)
            vals = np.array([-1 if v == "tp" else v for v in space.values[j][1]], dtype=np.int64)
            return vals[groups[:, j]]
        tp, pp, cp, ep, etp = (col(f"parallel.{k}") for k in ("tp", "pp", "cp", "ep", "etp"))
        etp = np.where(etp < 0, tp, etp)
        n = space.world_size
        keep = (n % (tp * pp * cp) == 0) & ((n // pp) % (ep * etp) == 0)
        groups = groups[keep]
    policies = sizes[rc]
    codes = np.repeat(groups, policies, axis=0)
    codes[:, rc] = np.tile(np.arange(policies, dtype=np.int32), len(groups))
    group = np.repeat(np.arange(len(groups), dtype=np.int64), policies)
    perm = _name_sort(space, codes)
    codes, group = codes[perm], group[perm]
    return Table(space=space, codes=codes, group=group, policy=codes[:, rc].astype(np.int64), groups=groups)


def _name_sort(space: Space, codes: np.ndarray) -> np.ndarray:
    """The permutation that sorts the rows by name, as Python sorts the strings (stably). A name is
    ``key=text`` fields joined by spaces, the keys the same on every row; where no text holds a
    character at or below the space, comparing two names is comparing their first differing texts
    (a text that is a prefix of the other ends at a space or the end, below any character of the
    other), so a lexicographic sort on each field's text rank is the string sort. Otherwise the
    names are sorted themselves."""
    order = name_order(space)
    texts = [[value_text(v) for v in space.values[j][1]] for j in order]
    if any(ord(c) <= 32 for field in texts for t in field for c in t):
        names = [" ".join(f"{SHORT.get(space.values[j][0], space.values[j][0])}={texts[f][c]}"
                          for f, (j, c) in enumerate(zip(order, row, strict=True))) for row in codes[:, order].tolist()]
        return np.array(sorted(range(len(names)), key=names.__getitem__), dtype=np.int64)
    keys = []
    for f, j in enumerate(order):
        ranks = {t: r for r, t in enumerate(sorted(set(texts[f])))}
        keys.append(np.array([ranks[t] for t in texts[f]], dtype=np.int64)[codes[:, j]])
    return np.lexsort(tuple(reversed(keys))) if keys else np.arange(len(codes))
