"""The planner's columns stand for its candidates one by one: the table holds exactly the
candidates of the space in name order, and a worker's per-group answer (validation outside the
recompute section once, the coarse bound once per zero-acts class) is what deriving, validating
and bounding each candidate as a whole run gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from timeline.io.runfile import load_run
from timeline.plan.search import bound_block, derive, run_bound
from timeline.plan.space import build_space, candidates
from timeline.plan.table import build_table

TINY = Path(__file__).with_name("tiny_moe.toml")
#: validation's recompute section fails for full:uniform:3 where no virtual stage has 3 layers;
#: full:block:1 is a grouping the probe cannot stand for (its saved bytes count as none)
POLICIES = ["none", "selective:moe_act", "selective:mla_up_proj", "full:uniform:1", "full:block:1",
            "full:uniform:3"]


def _space(path: Path, table: dict, world: int = 8, batch: int = 16):
    run = load_run(path)
    return run, build_space(run.model, table, world=world, global_batch=batch, selective=("selective:moe_act",))


@pytest.mark.parametrize("table", [
    {},  # the default: every factorisation of 8
    {"parallel.tp": [2, 1, 4], "parallel.pp": [1, 2, 3], "parallel.ep": [2, 1], "training.zero": [1, 0]},
    {"parallel.tp": [1], "parallel.pp": [2], "parallel.ep": [1], "schedule.csv": ["b c.csv", "a.csv", "b.csv"]},
])
def test_table_holds_the_candidates_in_name_order(table):
    """Every candidate once, sorted as Python sorts the names; the last space's texts hold a space
    (names sorted themselves)."""
    _, space = _space(TINY, table)
    t = build_table(space)
    want = sorted(c.name for c in candidates(space))
    assert [t.name(i) for i in range(t.size)] == want
    assert t.size == space.size and len(t.groups) * len(dict(space.values)["recompute"]) == t.size


@pytest.mark.parametrize(("path", "table"), [
    (TINY, {"parallel.pp": [1, 2, 4], "parallel.cp": [1], "parallel.etp": [1], "recompute": POLICIES}),
    (TINY, {"parallel.tp": [1, 2, 3], "parallel.cp": [1, 2], "training.zero": [0, 1], "recompute": POLICIES}),
])
def test_groups_answer_as_each_candidate_would(path, table):
    """Per candidate: the first validation problem of its whole run, else its derived counts and
    the coarse bound of its own run (``plan.search.derive`` / ``run_bound``)."""
    base, space = _space(path, table)
    t = build_table(space)
    groups = tuple(t.group_candidate(g) for g in range(len(t.groups)))
    results = bound_block((base, space, groups))
    seen = set()
    for i in range(t.size):
        cand, res, p = t.candidate(i), results[t.group[i]], int(t.policy[i])
        run, reason = derive(base, space, cand)
        assert res.invalid[p] == reason, cand.name
        seen.add(reason.partition(":")[0])
        if run is None:
            assert res.bounds[p] is None
            continue
        b = run_bound(run, coarse=True)
        assert res.bounds[p] == (b.memory_bytes, b.memory_rank, b.time_us, b.memory_bytes > run.hardware.capacity_bytes)
        assert (res.dp, res.num_microbatches, res.layout) == (run.parallel.dp, run.training.num_microbatches,
                                                              run.parallel.layout)
    assert "" in seen and "recompute.num_layers" in seen and len(seen) >= 4, seen
