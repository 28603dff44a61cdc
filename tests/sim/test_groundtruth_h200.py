"""The ``hf`` profile against a real H200 (``traces/groundtruth-h200``: torch 2.11.0+cu130, transformers 5.17.0,
four small Hugging Face models trained six micro-batches deep, twice, under the default allocator and under
expandable segments). Each case runs as ``tools/compare_groundtruth.py`` writes it from ``results.json``; no
torch needed.

Tolerances are what the rules reach, each with its cause:

- peak allocated within 0.2 % (worst +0.12 %, qwen2_tied: blocks the cache hands out whole, a different
  free-block history);
- peak reserved within 1.5 % under the default allocator (worst −1.27 %), 6 % under expandable segments
  (worst −5.58 %, deepseek_v3_tiny; llama_gqa's −4.18 % is the allocator's state when the recording starts —
  the recorded requests themselves replayed from an empty cache reach −4.12 %);
- allocated after every action from the first backward on within 1 % (worst +0.86 %);
- before it, the recorder's untimed warm-up forward and backward (``saved_bytes_per_layer``) had already made
  the autograd thread's cuBLAS workspace, which the simulation makes at its first backward: those forwards
  agree within 1.1 % with that workspace added (worst +1.06 %, llama_mha 0F0, whose activations the fresh
  cache serves in larger blocks).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from timeline.result.build import build_timeline

ROOT = Path(__file__).resolve().parents[2]
GT = ROOT / "traces" / "groundtruth-h200"
sys.path.insert(0, str(ROOT / "tools"))
import compare_groundtruth as cg  # noqa: E402

CASES = ("llama_mha", "llama_gqa", "qwen2_tied", "deepseek_v3_tiny")
WORKSPACE = 33_554_432  # PyTorch's cuBLAS workspace on compute capability 9.0 (profiles/hf.py: workspaces)


def recorded(allocator: str, case: str) -> dict:
    return next(c for c in json.loads((GT / allocator / "results.json").read_text()) if c["case"] == case)


@pytest.fixture(scope="module")
def timelines(tmp_path_factory):
    cache: dict = {}

    def get(allocator: str, case: str):
        if (allocator, case) not in cache:
            run = cg.case_run(recorded(allocator, case), tmp_path_factory.mktemp(f"{allocator}_{case}"))
            cache[allocator, case] = build_timeline(run)
        return cache[allocator, case]
    return get


def rel(model: int, measured: int) -> float:
    return abs(model - measured) / measured


@pytest.mark.parametrize("allocator", ["default", "expandable"])
@pytest.mark.parametrize("case", CASES)
def test_peaks(timelines, allocator, case):
    real, tl = recorded(allocator, case), timelines(allocator, case)
    assert tl.meta.run.allocator.expandable_segments == (allocator == "expandable")
    pk = tl.peak(0)
    assert rel(pk.allocated_bytes, real["max_allocated_bytes"]) <= 0.002
    assert rel(pk.reserved_bytes, real["max_reserved_bytes"]) <= (0.015 if allocator == "default" else 0.06)


@pytest.mark.parametrize("allocator", ["default", "expandable"])
@pytest.mark.parametrize("case", CASES)
def test_allocated_after_every_action(timelines, allocator, case):
    real, tl = recorded(allocator, case), timelines(allocator, case)
    sim = cg.allocated_after_actions(tl)
    assert [(it, a) for it, a, _ in sim] == [(it, a) for it, a, _ in real["allocated_after_phase"]]
    first_b = next(i for i, (_, a, _) in enumerate(sim) if a[1] == "B")
    for i, ((it, a, measured), (_, _, model)) in enumerate(zip(real["allocated_after_phase"], sim, strict=True)):
        if i < first_b:  # the recording's warm-up made the autograd thread's workspace already
            assert rel(model + WORKSPACE, measured) <= 0.011, (it, a, measured, model)
        else:
            assert rel(model, measured) <= 0.01, (it, a, measured, model)


@pytest.mark.parametrize("case", CASES)
def test_the_peak_is_the_loss_backward_with_two_more_fp32_logits(timelines, case):
    """Both peak in a backward, at the loss: beside each in-flight micro-batch's saved fp32 log-probabilities
    (b·s, V), NllLossBackward0's grad_input and LogSoftmaxBackward0's — as many such tensors live as in the
    snapshot at its peak."""
    from timeline.io.snapshot import load_snapshot

    real, tl = recorded("default", case), timelines("default", case)
    logits = real["batch"] * real["seq"] * real["hf_config"]["vocab_size"] * 4
    live: dict[int, int] = {}
    total = best = 0
    at_peak: list[int] = []
    for e in load_snapshot(GT / "default" / f"{case}.pickle.gz")["device_traces"][0]:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            total += e["size"]
        elif e["action"] == "free_requested" and e["addr"] in live:
            total -= live.pop(e["addr"])
        if total > best:
            best, at_peak = total, list(live.values())
    ev = tl.events(0)
    held = [i for i in tl.live_at(0, tl.peak(0).event_index).tolist() if int(ev.size[i]) == logits]
    in_flight = len(tl.peak_context(0)["in_flight"])
    assert tl.peak_context(0)["action"][1] == "B"
    assert len(held) == in_flight + 2 == at_peak.count(logits)
    assert sum(tl.names[ev.tensor[i]].endswith("loss.backward_scratch.exp_logits") for i in held) == 1


def test_cuda_workspaces_as_the_snapshot_holds_them(timelines):
    """Two 32 MiB cuBLAS workspaces beside the weights (the forward thread's and the autograd thread's)."""
    from timeline.io.snapshot import load_snapshot

    snap = load_snapshot(GT / "default" / "llama_mha.pickle.gz")
    made = {e["addr"] for e in snap["device_traces"][0] if e["action"] == "alloc"}
    held = [b["size"] for s in snap["segments"] for b in s["blocks"]
            if b["state"] == "active_allocated" and b["address"] not in made]
    assert held.count(WORKSPACE) == 2
    tl = timelines("default", "llama_mha")
    ev = tl.events(0)
    ws = [(tl.names[ev.tensor[i]], int(ev.size[i])) for i in range(len(ev.t_us))
          if tl.names[ev.tensor[i]].startswith("workspace.")]
    assert sorted(ws) == [("workspace.torch_cublas_backward", WORKSPACE), ("workspace.torch_cublas_forward", WORKSPACE)]


@pytest.mark.parametrize("case", CASES)
def test_cudnn_backward_workspace_as_the_snapshot_allocates_it(timelines, case):
    """The attention backward's one workspace: cudnn-frontend's dQ accumulator and softmax_sum (and, with
    GQA, dK/dV at every query head) — 256 bytes under each allocation the snapshot makes, the backend's own."""
    from timeline.io.snapshot import load_snapshot

    trace = load_snapshot(GT / "default" / f"{case}.pickle.gz")["device_traces"][0]
    # a workspace: allocated without Python frames (the autograd thread) and freed right after
    real = {e["size"] for e, f in zip(trace, trace[1:], strict=False)
            if e["action"] == "alloc" and not e["frames"] and f["action"] == "free_requested"
            and f["addr"] == e["addr"] and e["size"] > 2**20}
    tl = timelines("default", case)
    ev = tl.events(0)
    sim = {int(ev.size[i]) for i in range(len(ev.t_us)) if tl.names[ev.tensor[i]].endswith("backward_scratch.workspace")}
    assert len(sim) == 1
    assert {s + 256 for s in sim} <= real


#: recorded later on the same machine and stack (``gpt2-calibration``: GPT-2's ``gelu_new`` rule was written
#: from these; ``reserved-calibration``: two models whose loss blocks dwarf their layers)
LATER = {"gpt2-calibration": ("gpt2_small_cal", "gpt2_wide_cal", "gpt2_nodrop_cal"),
         "reserved-calibration": ("qwen3_tied_cal", "llama_bigvocab_cal")}


@pytest.mark.parametrize("allocator", ["default", "expandable"])
@pytest.mark.parametrize(("folder", "case"), [(f, c) for f, cases in LATER.items() for c in cases])
def test_later_calibration_recordings(allocator, folder, case, tmp_path):
    """Saved bytes per block to the byte; peak allocated within 0.25 % (worst +0.22 %, gpt2_nodrop_cal under
    the default allocator, which hands out cached blocks whole); allocated after every action from the first
    backward on within 1.5 % (worst +1.23 %). Peak reserved (not asserted) is −5.6 … +10.0 %: replaying the
    recorded requests from an empty cache moves it by as much (−8.8 … +11.4 %), the cache the recorder's
    warm-up pass leaves behind."""
    rec = next(c for c in json.loads((GT / folder / allocator / "results.json").read_text()) if c["case"] == case)
    tl = build_timeline(cg.case_run(rec, tmp_path))
    layers = tl.sim.templates[0].layer_activation_bytes
    assert [layers[i] for i in range(len(rec["layer_saved_bytes"]))] == rec["layer_saved_bytes"]
    assert rel(tl.peak(0).allocated_bytes, rec["max_allocated_bytes"]) <= 0.0025
    sim = cg.allocated_after_actions(tl)
    first_b = next(i for i, (_, a, _) in enumerate(rec["allocated_after_phase"]) if a[1:2] == "B")
    for (it, a, measured), (_, _, model) in list(zip(rec["allocated_after_phase"], sim, strict=True))[first_b:]:
        assert rel(model, measured) <= 0.015, (it, a, model, measured)


FRESH = ("llama_mha", "llama_gqa", "qwen2_tied", "deepseek_v3_tiny", "gpt2_small_cal", "gpt2_wide_cal",
         "gpt2_nodrop_cal", "qwen3_tied_cal", "llama_bigvocab_cal")


def fresh_gaps(folder: str, tmp: Path) -> dict[tuple[str, str], tuple[float, float]]:
    """(allocated, reserved) relative gaps of the recordings under ``fresh/FOLDER`` (folder, case)."""
    gaps = {}
    for rec in json.loads((GT / "fresh" / folder / "results.json").read_text()):
        peak = build_timeline(cg.case_run(rec, tmp / f"{folder}_{rec['case']}")).peak(0)
        gaps[folder, rec["case"]] = ((peak.allocated_bytes - rec["max_allocated_bytes"]) / rec["max_allocated_bytes"],
                                     (peak.reserved_bytes - rec["max_reserved_bytes"]) / rec["max_reserved_bytes"])
    return gaps


def test_fresh_recordings(tmp_path):
    """Each case in a process of its own, without the recorder's warm-up pass — as a job starts (default
    allocator): peak allocated within 0.2 % on all nine (worst −0.15 %); peak reserved within 0.7 % on seven
    (worst −0.63 %), deepseek_v3_tiny −4.18 % and llama_bigvocab_cal +2.88 %, whose own requests the allocator
    replays from an empty cache to the byte (the gap is in the simulated request sequence: fresh/README.md)."""
    for case in FRESH:
        (tmp_path / f"per-process_{case}").mkdir()
    gaps = fresh_gaps("per-process", tmp_path)
    assert {c for _, c in gaps} == set(FRESH)
    assert all(abs(a) <= 0.002 for a, _ in gaps.values()), gaps
    wide = {c: r for (_, c), (_, r) in gaps.items() if abs(r) > 0.007}
    assert set(wide) == {"deepseek_v3_tiny", "llama_bigvocab_cal"}, wide
    assert all(abs(r) <= 0.045 for r in wide.values()), wide


def test_fresh_recordings_one_process(tmp_path):
    """All nine in one process: from the second case on the weights land in the previous case's cached segment,
    which the simulation does not hold; peak allocated stays within 0.2 % on all 18 (both allocators), and the
    process's first case (llama_mha) reaches peak reserved within 0.6 % under both (−0.56 %, +0.00 %)."""
    for folder in ("default", "expandable"):
        for case in FRESH:
            (tmp_path / f"{folder}_{case}").mkdir()
    gaps = {**fresh_gaps("default", tmp_path), **fresh_gaps("expandable", tmp_path)}
    assert len(gaps) == 18 and all(abs(a) <= 0.002 for a, _ in gaps.values()), gaps
    assert abs(gaps["default", "llama_mha"][1]) <= 0.006
    assert abs(gaps["expandable", "llama_mha"][1]) <= 0.006
