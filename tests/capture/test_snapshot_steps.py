"""Whole steps captured with ``--step`` against the real CUDA snapshots of the scripts that ran them.

Each ``--step`` function in :mod:`tests.capture.cs336` rebuilds a snapshot's model and step from
its public repository; the simulated last iteration (after the script's warm-up, simulated with
``warmup_iterations``) is compared with ``timeline replay`` of the real snapshot (block-level):
peak allocated within 1 %, peak reserved within 3 %, number of allocations within 5 %, the peak
in the same phase. Reads ``../shared/snapshots`` at run time; skips when it is absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

import cs336  # noqa: E402

SNAPSHOTS = Path(__file__).parents[2].parent / "shared" / "snapshots"
pytestmark = pytest.mark.skipif(not SNAPSHOTS.is_dir(), reason=f"{SNAPSHOTS} is absent")

RUN = """\
[model]
trace = "{trace}"
profile = "hf"
[training]
num_microbatches = 1
dtype = "fp32"
warmup_iterations = {warmup}
iterations = 1
[hardware]
capacity_gib = 141
"""

PHASES = {"F": "forward", "B": "backward", "step": "optimizer", "init": "init"}


def real_phase(entry: dict) -> str:
    """forward / backward / optimizer of a snapshot trace entry, from its stack frames."""
    frames = entry.get("frames", [])
    names = [f["name"] for f in frames]
    files = [f["filename"] for f in frames]
    if any(n == "step" and "optim" in f for n, f in zip(names, files, strict=True)):
        return "optimizer"
    if any("autograd::Engine" in n or "backward" in n.lower() for n in names):
        return "backward"
    return "forward"


def real(name: str) -> dict:
    from timeline.alloc import replay_snapshot
    from timeline.io.snapshot import load_snapshot

    snap = load_snapshot(SNAPSHOTS / name)
    r = replay_snapshot(snap)[0]
    trace = snap["device_traces"][0]
    # the allocated peak's entry: the start state plus the trace's allocs and frees
    cur, best, at = 0, 0, 0
    for i, e in enumerate(trace):
        cur += e["size"] if e["action"] == "alloc" else -e["size"] if e["action"] == "free_completed" else 0
        if cur > best:
            best, at = cur, i
    return {"allocated": r.peak_allocated_bytes_model, "reserved": r.peak_reserved_bytes_model,
            "allocs": r.allocs, "phase": real_phase(trace[at])}


def simulated(tmp_path: Path, func, steps: int, warmup: int) -> dict:
    import numpy as np

    from timeline.capture.step import capture_step
    from timeline.io.runfile import load_run
    from timeline.io.trace_file import write_trace
    from timeline.result.build import build_timeline

    write_trace(capture_step(func, steps=steps), tmp_path / "step.parquet")
    (tmp_path / "run.toml").write_text(RUN.format(trace="step.parquet", warmup=warmup))
    tl = build_timeline(load_run(tmp_path / "run.toml"), None)
    pk = tl.peak(0)
    ev = tl.events(0)
    last = ev.t_us >= tl.sim.report_start_us
    span = tl.sim.spans[0][int(ev.action[int(np.argmax(np.cumsum(tl.memory[0].block_bytes)))])]
    return {"allocated": pk.allocated_bytes, "reserved": pk.reserved_bytes,
            "allocs": int(((ev.sign > 0) & last).sum()), "phase": PHASES[span.kind]}


CASES = {
    "Wedsonlin_medium_128_training_memory_snapshot.pickle": (cs336.wedsonlin_medium_128, 2, 5),
    "MAGMA27_memory_snapshot.pickle": (cs336.magma27, 2, 5),
    "Wedsonlin_medium_512_training_memory_snapshot.pickle": (cs336.wedsonlin_medium_512, 2, 5),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_simulated_step_matches_the_real_snapshot(tmp_path, name):
    func, steps, warmup = CASES[name]
    want, got = real(name), simulated(tmp_path, func, steps, warmup)
    print(name, want, got)
    assert got["phase"] == want["phase"]
    assert abs(got["allocated"] / want["allocated"] - 1) <= 0.01
    assert abs(got["reserved"] / want["reserved"] - 1) <= 0.03
    assert abs(got["allocs"] / want["allocs"] - 1) <= 0.05
