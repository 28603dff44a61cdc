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

#: |error| reached today, percent, per record and quantity (allocated, max allocated, reserved, max
#: reserved after iteration 20); each bound is today's error rounded up by at most 0.3 points
BOUNDS_PCT = {
    "seo-dense-baseline": (0.3, 0.3, 0.3, 0.3),  # today −0.18 / −0.02 / +0.06 / +0.06
    # the MoE peaks are short by 0.5–1.0 GiB (Megatron-Core 0.10's MoE layer); reserved follows them
    "seo-moe-top1-64e": (0.8, 1.9, 3.1, 3.1),  # today −0.51 / −1.60 / −2.80 / −2.80
    "seo-dropless-moe-top1-64e": (0.3, 3.2, 2.4, 2.4),  # today +0.06 / −2.91 / −2.19 / −2.19
    "seo-dropless-moe-top1-64e-b": (0.4, 3.3, 1.6, 1.6),  # today +0.10 / −3.02 / −1.38 / −1.38
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
    return {r["id"]: r for r in rows}, refused


def test_calibration_records_within_the_errors_reached(compared):
    rows, _ = compared
    assert set(rows) == set(BOUNDS_PCT)
    for rid, bounds in BOUNDS_PCT.items():
        r = rows[rid]
        assert r["side"] == "calibration" and r["rank"] == 0 and r["iteration"] == 20
        for q, bound in zip(QUANTITIES, bounds, strict=True):
            assert abs(r[q]["error_pct"]) <= bound, (rid, q, r[q])
    # the measured bytes are the printed MiB: the dense job's reserved is 28,404 MiB exactly
    assert rows["seo-dense-baseline"]["reserved"]["measured"] == 28404 * 2**20


def test_refused_records_name_why(compared):
    _, refused = compared
    why = {rid: reason for rid, _side, _gpu, reason in refused}
    assert set(why) == {"ling-mini-v2-pretrain-8k", "gnosia-gpt-70b-tp4-pp4"}
    assert why["ling-mini-v2-pretrain-8k"] == "not rebuildable: the page names neither the world size nor the GPU model"
    assert why["gnosia-gpt-70b-tp4-pp4"].startswith("--gpu rtx-pro-6000: unknown; use one of h100, ")


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
        assert all(abs(r[q]["error_pct"]) <= b for q, b in zip(QUANTITIES, BOUNDS_PCT[r["id"]], strict=True))