"""The Python interface (``timeline.load_run``, ``timeline.simulate``): imported lazily, and the
same numbers as ``timeline simulate`` writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import timeline
from timeline.cli import main
from timeline.errors import SpecError

ROOT = Path(__file__).resolve().parents[1]
CSV_RUN = ROOT / "schedules" / "llama3-8b-csv.toml"


def test_import_timeline_loads_nothing_heavy():
    code = ("import sys, timeline; heavy = sorted(({m.split('.')[0] for m in sys.modules} & "
            "{'pyarrow', 'simpy', 'networkx', 'numpy'}) | ({'timeline.api'} & set(sys.modules))); print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'simulation'"):
        timeline.simulation  # noqa: B018


def test_overrides_as_mapping_or_set_texts():
    a = timeline.load_run(CSV_RUN, {"training.iterations": 1, "model.profile": "megatron"})
    b = timeline.load_run(CSV_RUN, ["training.iterations=1", "model.profile=megatron"])
    assert a == b and a.training.iterations == 1 and a.profile == "megatron"


def test_bad_override_names_the_field():
    with pytest.raises(SpecError, match="parallel.tp"):
        timeline.load_run(CSV_RUN, {"parallel.tp": "four"})
    with pytest.raises(SpecError, match="'tp' is not section.key"):
        timeline.load_run(CSV_RUN, {"tp": 2})


def test_simulate_matches_the_command_line(tmp_path):
    assert main(["simulate", str(CSV_RUN), "--format", "summary", "-o", str(tmp_path / "out"),
                 "--no-progress"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    tl = timeline.simulate(timeline.load_run(CSV_RUN))
    assert tl.num_devices == len(summary["devices"]) == 4
    for d, dev in enumerate(summary["devices"]):
        pk = tl.peak(d)
        assert (pk.requested_bytes, pk.allocated_bytes, pk.reserved_bytes) == (
            dev["peak_requested_bytes"], dev["peak_allocated_bytes"], dev["peak_reserved_bytes"])
