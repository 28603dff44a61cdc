"""The work estimate is within 2× of what simulate really makes on every shipped run, and it
refuses an absurd run in well under a second, with its numbers."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sources import estimate_of, plan_of

from timeline.cli import main
from timeline.graph.source import model_source
from timeline.io.runfile import load_run
from timeline.sim.simulate import simulate

SCHEDULES = Path(__file__).resolve().parents[2] / "schedules"
CASES = [("deepseek-v3-pp16-tp2-ep8", []), ("deepseek-v3-pp16-tp2-ep8", ["model.profile=megatron"]),
         ("deepseek-v3-pp16-tp2-ep8", ["recompute.policy=full"]),
         ("deepseek-v3-dualpipev-megatron", []), ("llama3-8b-csv", [])]


@pytest.mark.parametrize(("stem", "sets"), CASES, ids=lambda c: c if isinstance(c, str) else "+".join(c) or "as-is")
def test_estimate_within_2x_of_the_simulated_counts(stem, sets):
    run = load_run(SCHEDULES / f"{stem}.toml", ["training.iterations=1", *sets])
    est = estimate_of(run)
    sim = simulate(plan_of(run, model_source))
    events = sum(len(e.t_us) for e in sim.events)
    ops = sum(len(o.name) for o in sim.ops)
    actions = sum(1 for sp in (s for row in sim.spans for s in row) if sp.kind != "step")
    assert est.devices == len(sim.devices)
    for name, real, guess in (("events", events, est.memory_events), ("ops", ops, est.ops),
                              ("actions", actions, est.actions)):
        assert real / 2 <= guess <= real * 2, (name, real, guess)


def test_a_billion_microbatches_is_refused_at_once_with_its_estimate(tmp_path, capsys):
    start = time.perf_counter()
    code = main(["simulate", str(SCHEDULES / "deepseek-v3-pp16-tp2-ep8.toml"), "-o", str(tmp_path / "out"),
                 "--set", "training.num_microbatches=1000000000"])
    elapsed = time.perf_counter() - start
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "memory events" in err[0] and "--max-events 50,000,000" in err[0] and "num_microbatches" in err[0]
    # the estimate's number: 32 → 10**9 micro-batches scales the shipped run's count
    assert "about 22," in err[0]
    assert elapsed < 5.0  # a generous bound for a loaded CI machine; typically ≈ 0.3 s
    assert not (tmp_path / "out").exists()


def test_max_events_is_the_users_bound(tmp_path, capsys):
    run = SCHEDULES / "llama3-8b-csv.toml"
    assert main(["simulate", str(run), "-o", str(tmp_path / "o"), "--format", "summary", "--max-events", "1000"]) == 2
    assert "over --max-events 1,000" in capsys.readouterr().err
    assert main(["static", str(run), "--max-events", "10"]) == 2
    assert "ops per micro-batch, over --max-events 10" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # argparse's own exit, one error line
        main(["simulate", str(run), "--max-events", str(2**31)])
    assert exc.value.code == 2 and "at most 2,147,483,647" in capsys.readouterr().err
