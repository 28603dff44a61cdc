"""``fit`` against exhaustive enumeration of its search space on a tiny run: the policy it
returns fits when simulated on its own, and nothing cheaper in the space fits."""

from __future__ import annotations

import itertools

import pytest
from recompute_template import recompute_template, tiny_run

from timeline.cli.fit import fit_run as fit
from timeline.cli.variants import policy_variants
from timeline.compare.fit import selective_modules
from timeline.compare.metrics import simulate_variants

MIB = 2**20


def space(pp: int, layers: int) -> list[str]:
    mods = selective_modules(tiny_run().model)
    sel = ["selective:" + "+".join(s) for k in range(1, len(mods) + 1) for s in itertools.combinations(mods, k)]
    uni = [f"full:uniform:{n}" for n in range(1, layers + 1)]
    blk = [f"full:block:{','.join(map(str, n))}" for n in itertools.product(range(layers + 1), repeat=pp) if any(n)]
    return ["none", *sel, *uni, *blk]


def cost(res):
    t = [d.recompute_time_us for d in res.devices]
    return (max(t), sum(t))


@pytest.fixture(scope="module")
def everything():
    run = tiny_run(pp=2, layers_per_rank=2)
    return {cap: simulate_variants(policy_variants(tiny_run(capacity_gib=cap / 1024), space(2, 2)),
                                   recompute_template, workers=1) for cap in (200, 80, 60, 48, 46, 40)}, run


@pytest.mark.parametrize("cap_mib", [200, 80, 60, 48, 46, 40])
def test_fit_is_the_cheapest_fitting_policy(everything, cap_mib):
    results, run = everything
    res = fit(run, recompute_template, capacity_gib=cap_mib / 1024)
    fitting = [r for r in results[cap_mib] if r.fits]
    if not fitting:
        assert res.best is None and res.shortfall is not None
        policy, device, over = res.shortfall
        assert over == min(r.worst_device().over_bytes for r in results[cap_mib])
        return
    assert res.best is not None
    (alone,) = simulate_variants(policy_variants(tiny_run(capacity_gib=cap_mib / 1024), [res.best.candidate.name]),
                                 recompute_template, workers=1)
    assert alone.fits
    cheapest = min(cost(r) for r in fitting)
    assert res.best.candidate.cost == pytest.approx(cheapest, rel=1e-9)
    assert cost(alone) == pytest.approx(res.best.candidate.cost, rel=1e-9)  # static cost = simulated cost
    for alt in res.alternatives:
        assert alt.fits and alt.candidate.cost >= res.best.candidate.cost


def test_fit_prunes_and_states_its_space():
    res = fit(tiny_run(), recompute_template, capacity_gib=46 / 1024)
    assert res.space == {"selective": 5, "selective_dominated": 2, "uniform": 2, "block": 8}
    simulated = [o for o in res.outcomes if o.result is not None]
    assert any(o.result is None and o.note.startswith("pruned") for o in res.outcomes)
    assert len(simulated) < len(space(2, 2))


def test_nothing_fits_names_device_and_bytes():
    res = fit(tiny_run(), recompute_template, capacity_gib=8 / 1024)
    assert res.best is None
    policy, device, over = res.shortfall
    assert device in (0, 1) and over > 0 and policy.startswith(("full", "selective"))


def test_selective_search_in_worker_processes_gives_the_same_answer(monkeypatch):
    import timeline.compare.fit as fit_module

    run = tiny_run()
    serial = fit(run, recompute_template, capacity_gib=0.05)
    monkeypatch.setattr(fit_module, "PARALLEL_TEMPLATES", 0)  # force the process pool
    parallel = fit(run, recompute_template, capacity_gib=0.05)
    def summary(res):
        return [(o.candidate.name, o.status, o.candidate.cost) for o in res.outcomes], res.space

    assert summary(parallel) == summary(serial)
    assert parallel.best.candidate.name == serial.best.candidate.name
