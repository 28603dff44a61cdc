"""``timeline plan`` end to end on a reduced space: the ranking and its files, byte-identical
plan.parquet whatever the workers, best run files that ``simulate`` reproduces, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from timeline.cli import main
from timeline.io.runfile import load_run
from timeline.plan.search import simulate_summary

TINY = Path(__file__).with_name("tiny_moe.toml")
TOP = 3  # --top of the planned fixture
SPACE = """[space]
"parallel.tp" = [1, 2]
"parallel.pp" = [1, 2, 4]
"parallel.cp" = [1]
"parallel.ep" = [1, 2]
"parallel.etp" = [1]
"parallel.vpp" = [1, 2]
"training.micro_batch_size" = [1]
"schedule.kind" = ["1f1b", "dualpipev"]
"recompute" = ["none", "full:uniform:1"]
"""


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plan")
    (tmp / "space.toml").write_text(SPACE)
    outs = {}
    for workers in (1, 2):
        out = tmp / f"out{workers}"
        code = main(["plan", str(TINY), "--world-size", "8", "--space", str(tmp / "space.toml"), "--top", str(TOP),
                     "--workers", str(workers), "-o", str(out)])
        assert code == 0
        outs[workers] = out
    return tmp, outs


def test_plan_parquet_has_one_row_per_candidate_sorted(planned):
    _, outs = planned
    t = pq.read_table(outs[1] / "plan.parquet")
    rows = t.to_pylist()
    # 2 tp × 3 pp × 2 ep × 2 vpp × 2 schedules × 2 policies
    assert len(rows) == 96
    names = [r["candidate"] for r in rows]
    assert names == sorted(names) and len(set(names)) == 96
    assert t.schema.metadata[b"schema"] == b"timeline.plan/2"
    assert not any("wall" in c or "host" in c for c in t.column_names)
    pruned = {r["pruned_by"] for r in rows}
    assert pruned <= {"", "static_bound", "oom", "invalid", "time_bound", "too_large", "budget"}
    # vpp must match the schedule: half the candidates are invalid by the schedule's own rule
    invalid = [r for r in rows if r["pruned_by"] == "invalid"]
    assert len(invalid) >= 48 and all(r["invalid"] for r in invalid)
    ranked = sorted((r for r in rows if r["rank"] is not None), key=lambda r: r["rank"])
    assert ranked and all(r["fits"] and r["simulated"] for r in ranked)
    keys = [(r["iteration_time_us"], r["peak_reserved_bytes"], r["candidate"]) for r in ranked]
    assert keys == sorted(keys)
    for r in ranked:  # tokens/s per GPU = G·seq / (iteration time · N), G = 4·1·4 from the run file
        assert r["tokens_per_s_per_gpu"] == pytest.approx(16 * 256 / (r["iteration_time_us"] / 1e6 * 8))
        assert r["bound_peak_bytes"] <= r["peak_requested_bytes"] <= r["peak_reserved_bytes"]
        assert r["bound_time_us"] <= r["iteration_time_us"]
    for r in rows:
        if r["pruned_by"] == "oom":
            assert r["simulated"] and not r["fits"] and r["short_bytes"] > 0


def test_lazy_exact_bounds_pick_what_bounding_all_would(planned, tmp_path, monkeypatch):
    """Exact bounds are computed a chunk at a time, yet the candidates simulated and their ranks are
    those of bounding every candidate exactly first; each left as time_bound has a bound (exact, or
    its layout's coarse one) above the best fitting iteration time (--top 1)."""
    import timeline.plan.search as search

    tmp, _ = planned
    out = {}
    for chunk in (2, 10**9):
        monkeypatch.setattr(search, "EXACT_CHUNK", chunk)
        assert main(["plan", str(TINY), "--world-size", "8", "--space", str(tmp / "space.toml"), "--top", "1",
                     "-o", str(tmp_path / str(chunk))]) == 0
        out[chunk] = pq.read_table(tmp_path / str(chunk) / "plan.parquet").to_pylist()
    lazy, eager = out[2], out[10**9]
    assert [(r["candidate"], r["simulated"], r["rank"], r["peak_reserved_bytes"]) for r in lazy] == \
        [(r["candidate"], r["simulated"], r["rank"], r["peak_reserved_bytes"]) for r in eager]
    best = min(r["iteration_time_us"] for r in lazy if r["fits"])
    left = [r for r in lazy if r["pruned_by"] == "time_bound"]
    # a candidate timed but not simulated keeps its iteration time; the others their bound
    assert left and all((r["bound_time_us"] if r["iteration_time_us"] is None else r["iteration_time_us"]) > best
                        for r in left)
    assert any(r["iteration_time_us"] is not None and r["bound_time_us"] <= best for r in left)
    assert all(r["bound_exact"] for r in lazy if r["simulated"])
    assert any(not r["bound_exact"] for r in left)
    assert all(r["bound_exact"] for r in eager if r["pruned_by"] in ("", "oom", "time_bound", "too_large"))


def test_workers_do_not_change_a_byte(planned):
    _, outs = planned
    assert (outs[1] / "plan.parquet").read_bytes() == (outs[2] / "plan.parquet").read_bytes()
    ranked = [r for r in pq.read_table(outs[1] / "plan.parquet").to_pylist() if r["rank"] is not None]
    # best/ holds the --top fitting candidates (fewer where fewer fit)
    assert sorted(p.name for p in (outs[1] / "best").iterdir()) == [f"{i:02d}.toml" for i in
                                                                     range(1, min(TOP, len(ranked)) + 1)]
    assert "wall" in (outs[1] / "plan.log").read_text()


def test_workers_do_not_change_which_candidates_are_simulated(planned, tmp_path):
    """At 0.27 GiB a batch sized by the worker count simulated two candidates more with 2 workers than
    with 1 (pruned by the time bound there): the batch between two checks of the stopping rule is a
    constant (``search.SIM_BATCH``)."""
    tmp, _ = planned
    out = {}
    for workers in (1, 2):
        out[workers] = tmp_path / f"w{workers}"
        assert main(["plan", str(TINY), "--world-size", "8", "--space", str(tmp / "space.toml"), "--top", "3",
                     "--capacity", "0.27GiB", "--workers", str(workers), "-o", str(out[workers])]) == 0
    assert (out[1] / "plan.parquet").read_bytes() == (out[2] / "plan.parquet").read_bytes()
    simulated = [r for r in pq.read_table(out[1] / "plan.parquet").to_pylist() if r["simulated"]]
    assert len(simulated) > 3


def test_best_run_files_reproduce_their_peaks(planned, tmp_path):
    """With room for 20 fitting candidates, all ten written run files simulate (``timeline
    simulate``, as a user runs them) to the peaks plan.parquet holds, to the byte, and fit."""
    tmp, _ = planned
    plan_dir = tmp_path / "plan"
    assert main(["plan", str(TINY), "--world-size", "8", "--space", str(tmp / "space.toml"), "--top", "10",
                 "--capacity", "0.32GiB", "--workers", "2", "-o", str(plan_dir)]) == 0
    rows = pq.read_table(plan_dir / "plan.parquet").to_pylist()
    ranked = sorted((r for r in rows if r["rank"] is not None), key=lambda r: r["rank"])
    assert len(ranked) >= 10
    for i, want in enumerate(ranked[:10], 1):
        path = plan_dir / "best" / f"{i:02d}.toml"
        assert want["candidate"] in path.read_text()
        got = simulate_summary(load_run(path))
        assert (got.peak_requested_bytes, got.peak_reserved_bytes, got.fits) == \
            (want["peak_requested_bytes"], want["peak_reserved_bytes"], True)
        out = tmp_path / f"sim{i:02d}"
        assert main(["simulate", str(path), "--format", "summary", "--no-progress", "-o", str(out)]) == 0
        devices = json.loads((out / "summary.json").read_text())["devices"]
        assert max(d["peak_requested_bytes"] for d in devices) == want["peak_requested_bytes"]
        assert max(d["peak_allocated_bytes"] for d in devices) == want["peak_allocated_bytes"]
        assert max(d["peak_reserved_bytes"] for d in devices) == want["peak_reserved_bytes"]
        assert not any(d["oom"] for d in devices)


@pytest.mark.parametrize(("argv", "words"), [
    (["--world-size", "0"], "expected 1 or more"),
    (["--world-size", "8", "--space", "SPACE"], "not a run-file key"),
    (["--world-size", "8", "--space", "TWO"], "one table"),
    (["--world-size", "8", "--address", "auto"], "--engine ray only"),
    (["--world-size", "8", "--capacity", "lots"], "--capacity"),
    (["--world-size", "8", "--global-batch-size", "-3"], "expected 1 or more"),
])
def test_bad_input_is_one_error_line(tmp_path, capsys, argv, words):
    (tmp_path / "bad.toml").write_text('[space]\n"parallel.bogus" = [1]\n')
    (tmp_path / "two.toml").write_text('[space]\n"parallel.tp" = [1]\n[other]\nx = 1\n')
    argv = [a.replace("SPACE", str(tmp_path / "bad.toml")).replace("TWO", str(tmp_path / "two.toml")) for a in argv]
    with pytest.raises(SystemExit) if "-3" in argv or "0" in argv else _nothing() as exc:
        code = main(["plan", str(TINY), *argv, "-o", str(tmp_path / "out")])
    code = exc.value.code if exc is not None and hasattr(exc, "value") else code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error:") and words in err[0]
    assert not (tmp_path / "out").exists()


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_max_simulations_leaves_the_rest_as_budget(planned, tmp_path):
    tmp, outs = planned
    out = tmp_path / "out"
    assert main(["plan", str(TINY), "--world-size", "8", "--space", str(tmp / "space.toml"), "--top", "3",
                 "--workers", "1", "--max-simulations", "2", "-o", str(out)]) in (0, 1)
    rows = pq.read_table(out / "plan.parquet").to_pylist()
    full = {r["candidate"]: r for r in pq.read_table(outs[1] / "plan.parquet").to_pylist()}
    simulated = [r for r in rows if r["simulated"]]
    assert len(simulated) == 2  # the budget, not a whole batch
    assert sum(r["pruned_by"] == "budget" for r in rows) == sum(
        1 for r in full.values() if r["pruned_by"] not in ("invalid", "static_bound")) - 2
    for r in simulated:  # the same simulation, whatever the budget
        assert r["peak_reserved_bytes"] == full[r["candidate"]]["peak_reserved_bytes"]


def test_layout_is_recorded(planned):
    _, outs = planned
    rows = pq.read_table(outs[1] / "plan.parquet").to_pylist()
    by = {(r["pp"], r["vpp"]): r["layout"] for r in rows if r["layout"]}
    # 5 layers: 2 stages split 3 + 2; 4 stages give the middle two ⌈5/4⌉ = 2 and the ends the 1 left
    assert by[(2, 1)] == "3,2" and by[(4, 1)] == "1,2,2,0" and by[(1, 2)] == "3,2" and by[(2, 2)] == "1,2,2,0"
