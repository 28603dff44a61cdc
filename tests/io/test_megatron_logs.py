"""Megatron-LM jobs' own memory lines, reserved included (``tests/data/megatron_logs.json``, issue 31 item 4).

The split into calibration and unseen is fixed by a hash of each record's URL
(``tools/megatron_logs_split.json``); every record must be in it, on the side the rule gives. The
calibration records ``tools/compare_megatron_logs.py`` can simulate are held to the errors reached
today (measured: never exact), per memory-line quantity; the others are held to the one-line reason
they are refused for.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: arguments ``from-megatron``'s table does not classify yet (the parser-wide classification is another
#: item of issue 31), left out here only where ``from-megatron`` refuses them as unknown: data paths, the
#: distributed-checkpoint format (read when saving or loading, after the logged iterations here) and
#: ``--no-async-tensor-model-parallel-allreduce`` (a no-op at Megatron-Core 0.10: the job's own log warns
#: that async_grad_allreduce is deprecated and not in use)
ASSUMED_NEUTRAL = ("--train-data-path", "--valid-data-path", "--no-async-tensor-model-parallel-allreduce",
                   "--use-dist-ckpt", "--dist-ckpt-format")

#: |error| reached today, percent, per (record, logged rank) and quantity (allocated, max allocated, reserved,
#: max reserved after the logged iteration); each bound is today's error rounded up by at most 0.3 points
BOUNDS_PCT = {
    ("seo-dense-baseline", 0): (0.3, 0.3, 0.3, 0.3),  # today −0.18 / −0.02 / +0.06 / +0.06
    # the MoE peaks are short by up to 0.6 GiB (Megatron-Core 0.10's MoE layer); reserved follows them
    ("seo-moe-top1-64e", 0): (0.8, 0.8, 2.1, 2.1),  # today −0.51 / −0.45 / −1.79 / −1.79
    ("seo-dropless-moe-top1-64e", 0): (0.3, 2.1, 1.5, 1.5),  # today +0.06 / −1.77 / −1.17 / −1.17
    ("seo-dropless-moe-top1-64e-b", 0): (0.4, 2.4, 0.6, 0.6),  # today +0.09 / −2.10 / −0.26 / −0.26
    # TP 4 x PP 8 on RTX PRO 6000 under PyTorch 2.11, without Transformer Engine or Apex (the record's
    # packages_absent): Megatron falls back to torch's AdamW (megatron/core/optimizer/__init__.py@3758b54b2b), whose
    # foreach step holds torch._foreach_sqrt(exp_avg_sqs) per parameter group (timeline.profiles.torch_adam):
    # 7,680 MiB on stage 1 against the measured peak's 7,675 MiB above the steady state (the 4.8 MiB: Megatron from
    # 41cedd6277 steps the decayed group first, before the other group's moments exist; timeline's groups are in
    # first-seen order). Before that rule: max allocated −20.9 … −21.2 %, reserved −21.1 … −24.0 %. Left: allocated
    # is 1.6 GiB (stage 1 and 3) and 2.1 GiB (stage 0) short in the steady state (not diagnosed), and stage 0's
    # measured reserved is 1.8 GiB above its max allocated (timeline: 0.1 GiB)
    # stage 0: the first step's states were made before the last backward's frees at the same instant until stop 58
    # (sim/expand.py: device_events pushes them after); max allocated and reserved were −4.22 / −7.60 %
    ("gnosia-gpt-70b-tp4-pp4", 0): (5.7, 5.0, 8.4, 8.4),  # today −5.43 / −4.76 / −8.12 / −8.12
    ("gnosia-gpt-70b-tp4-pp4", 4): (4.8, 4.0, 4.2, 4.2),  # today −4.51 / −3.72 / −3.93 / −3.93
    ("gnosia-gpt-70b-tp4-pp4", 12): (4.8, 4.0, 4.1, 4.1),  # today −4.51 / −3.72 / −3.79 / −3.79
}


QUANTITIES = ("allocated", "max_allocated", "reserved", "max_reserved")


def _tool():
    spec = importlib.util.spec_from_file_location("compare_megatron_logs", ROOT / "tools" / "compare_megatron_logs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _records() -> list[dict]:
    return json.loads((ROOT / "tests" / "data" / "megatron_logs.json").read_text())["records"]


def test_every_record_is_in_the_split_on_the_side_its_url_gives():
    tool = _tool()
    split = json.loads((ROOT / "tools" / "megatron_logs_split.json").read_text())
    assert tool.split_problems(_records(), split) == []
    assert {r["id"] for r in _records()} == {s["id"] for s in split["records"]}
    # the rule itself: a URL whose hash is 0 mod 3 is unseen
    assert tool.side_of("https://github.com/inclusionAI/Ling-V2/blob/af8837e677a1aa36895845da084f9c91acf4fed2/"
                        "docs/gpu_based_training.md") == "calibration"
    assert [tool.side_of(f"u{i}") for i in range(6)] == ["calibration"] * 5 + ["unseen"]


def test_a_record_moved_to_the_other_side_is_reported():
    tool = _tool()
    split = json.loads((ROOT / "tools" / "megatron_logs_split.json").read_text())
    records = _records()
    records[0] = {**records[0], "side": "unseen"}
    assert tool.split_problems(records, split) == [f"{records[0]['id']}: side or url differs from the split "
                                                   f"(calibration, rule calibration)"]


def test_the_logged_rank_maps_to_its_pipeline_stage():
    class Dev:
        def __init__(self, device, pp_rank):
            self.device, self.pp_rank = device, pp_rank

    class Tl:
        devices = [Dev(0, 0), Dev(8, 1), Dev(16, 2), Dev(24, 3)]
        num_devices = 4

    tool = _tool()
    # tp 4 · dp 2 ranks per stage of 32 ranks in 4 stages (Megatron's order: tp fastest, pp slowest)
    assert [tool.device_of(Tl, r, 32, 4) for r in (0, 7, 8, 31)] == [0, 0, 1, 3]


@pytest.fixture(scope="module")
def compared() -> tuple[dict, list]:
    refused: list = []
    rows = _tool().compare(_records(), as_run=True, assume_neutral=ASSUMED_NEUTRAL, refused=refused)
    return {(r["id"], r["rank"]): r for r in rows}, refused


def test_calibration_records_within_the_errors_reached(compared):
    rows, _ = compared
    assert set(rows) == set(BOUNDS_PCT)
    for key, bounds in BOUNDS_PCT.items():
        r = rows[key]
        assert r["side"] == "calibration" and r["iteration"] == (1 if key[0].startswith("gnosia") else 20)
        for q, bound in zip(QUANTITIES, bounds, strict=True):
            assert abs(r[q]["error_pct"]) <= bound, (key, q, r[q])
    # the measured bytes are the printed MiB: the dense job's reserved is 28,404 MiB exactly
    assert rows[("seo-dense-baseline", 0)]["reserved"]["measured"] == 28404 * 2**20
    # the 70B job's ranks 0, 4 and 12 stand for pipeline stages 0, 1 and 3 of 8 (TP 4, DP 1)
    assert [rows[("gnosia-gpt-70b-tp4-pp4", r)]["device"] for r in (0, 4, 12)] == [0, 4, 12]


def test_which_adam_megatron_imported_follows_the_record_s_evidence():
    tool = _tool()
    by_id = {r["id"]: r for r in _records()}
    # the 70B job's page installs megatron-core alone (packages_absent, packages_evidence): torch's AdamW
    assert tool.optimizer_impl_of(by_id["gnosia-gpt-70b-tp4-pp4"]) == "torch_foreach"
    assert by_id["gnosia-gpt-70b-tp4-pp4"]["packages_evidence"]
    # a record that says nothing ran Transformer Engine's FusedAdam (from-megatron's default)
    assert tool.optimizer_impl_of(by_id["seo-dense-baseline"]) is None
    assert tool.optimizer_impl_of({"packages_absent": ["transformer_engine"]}) == "apex_fused"
    run, _ = tool.run_of(by_id["gnosia-gpt-70b-tp4-pp4"], 1, True)
    assert (run.framework.optimizer_impl, run.framework.pytorch) == ("torch_foreach", "2.11")


def test_refused_records_name_why(compared):
    _, refused = compared
    why = {rid: reason for rid, _side, _gpu, reason in refused}
    # every record the test does not simulate is refused, and only for what its page lacks
    assert set(why) == {r["id"] for r in _records()} - {key[0] for key in BOUNDS_PCT}
    assert all(reason.startswith("not rebuildable: ") for reason in why.values())
    assert why["ling-mini-v2-pretrain-8k"] == "not rebuildable: the page names neither the world size nor the GPU model"
    assert "NeMo 2" in why["nemo-qwen3-30b-a3b-perf"]


def test_as_a_user_runs_them_the_simulable_records_simulate():
    """``--no-load-optim`` is mapped (a load without the optimizer's state: the moments are made in the first
    step, as a fresh run's) and ``--no-load-rng`` is memory-neutral, so ``from-megatron`` converts each record
    as its user runs it, to the same bytes as with the record's facts (``--as-run``), within its bounds."""
    tool = _tool()
    refused: list = []
    rows = tool.compare(_records(), only="seo-", refused=refused)
    as_run = tool.compare(_records(), as_run=True, only="seo-", refused=[])
    assert refused == [] and len(rows) == len(as_run) == 4
    for r, a in zip(rows, as_run, strict=True):
        assert [r[q]["predicted"] for q in QUANTITIES] == [a[q]["predicted"] for q in QUANTITIES]
        assert all(abs(r[q]["error_pct"]) <= b for q, b in zip(QUANTITIES, BOUNDS_PCT[(r["id"], r["rank"])], strict=True))