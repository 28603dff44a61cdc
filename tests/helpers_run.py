"""The tests' tiny run: a 256-wide Llama with one layer per pipeline rank (unless ``layers`` says
otherwise), 128-token sequences, 4 micro-batches, 2 iterations, megatron profile, 1F1B and the
caching allocator. ``tiny_run(**overrides)`` changes any field by its name:

- a field of exactly one section by its own name: ``pp=4``, ``num_microbatches=8``,
  ``capacity_gib=0.04``, ``expandable_segments=True``, ``latency_us=0.0``;
- the two ``kind`` fields by their section: ``schedule="gpipe"``, ``allocator="ideal"``;
- whole parts: ``model=``, ``profile=``, ``name=``, ``recompute=RecomputeSpec(...)``, ``layers=``.

Importable from every test directory (``tests/`` is on ``sys.path`` through the top conftest)
and from ``tools/regen_goldens.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace

from timeline.spec.framework import FrameworkSpec
from timeline.spec.model import ModelSpec
from timeline.spec.presets import PRESETS
from timeline.spec.run import (
    AllocatorSpec,
    HardwareSpec,
    ParallelSpec,
    RecomputeSpec,
    RunSpec,
    ScheduleSpec,
    TrainingSpec,
)

#: a small dense model; ``num_hidden_layers`` is set per run
TINY_MODEL = replace(PRESETS["llama3-8b"], hidden_size=256, num_attention_heads=8, num_key_value_heads=8,
                     intermediate_size=512, vocab_size=1024)

_SECTIONS = {"parallel": ParallelSpec, "training": TrainingSpec, "recompute": RecomputeSpec,
             "schedule": ScheduleSpec, "allocator": AllocatorSpec, "hardware": HardwareSpec,
             "framework": FrameworkSpec}
_DEFAULTS = {"training": {"seq_len": 128, "num_microbatches": 4, "iterations": 2}}


def _section_of(key: str) -> str:
    owners = [s for s, cls in _SECTIONS.items() if key in {f.name for f in dataclasses.fields(cls)}]
    if len(owners) != 1:
        raise TypeError(f"tiny_run: {key!r} names a field of {owners or 'no section'}; "
                        "use schedule=/allocator= for the kinds")
    return owners[0]


def tiny_run(*, layers: int | None = None, model: ModelSpec | None = None, profile: str = "megatron",
             name: str = "tiny", schedule: str = "1f1b", allocator: str = "caching",
             recompute: RecomputeSpec | None = None, **overrides) -> RunSpec:
    """The tiny run with ``overrides`` applied (see the module docstring)."""
    fields: dict[str, dict] = {s: dict(_DEFAULTS.get(s, {})) for s in _SECTIONS}
    fields["schedule"]["kind"] = schedule
    fields["allocator"]["kind"] = allocator
    for key, value in overrides.items():
        fields[_section_of(key)][key] = value
    sections = {s: cls(**fields[s]) for s, cls in _SECTIONS.items()}
    if recompute is not None:
        sections["recompute"] = recompute
    if model is None:  # one layer per rank unless ``layers`` says otherwise; a given model keeps its own
        model = replace(TINY_MODEL, num_hidden_layers=layers or sections["parallel"].pp)
    elif layers is not None:
        model = replace(model, num_hidden_layers=layers)
    return RunSpec(name=name, source="-", model=model, profile=profile, model_source="test", **sections)


#: the same tiny model as a run file, for CLI tests (two iterations unless a test appends its own)
TINY_RUN_TOML = """
name = "tiny"
[model]
preset = "llama3-8b"
num_hidden_layers = 4
hidden_size = 256
num_attention_heads = 8
num_key_value_heads = 8
intermediate_size = 512
vocab_size = 1024
[parallel]
pp = 2
[training]
seq_len = 128
num_microbatches = 4
"""


def edited_run(tmp_path, text: str, **edits: str) -> RunSpec:
    """Load run-file ``text`` with each ``key = value`` line of ``edits`` replaced (the old value left behind a
    ``#``; a value may carry further lines), for tests of one architecture's shape under a few changes."""
    from timeline.io.runfile import load_run

    for key, value in edits.items():
        assert f"\n{key} = " in text, key
        text = text.replace(f"\n{key} = ", f"\n{key} = {value}\n#", 1)
    path = tmp_path / "run.toml"
    path.write_text(text)
    return load_run(path, [])


def from_megatron_folder(tmp_path, family: str, case: str, env: dict, args: dict) -> dict:
    """``timeline from-megatron`` on a functional test's folder ``test_cases/{family}/{case}/model_config.yaml``
    (8 GPUs), as a user runs it; returns the run file it writes, parsed."""
    import tomllib

    import yaml

    from timeline.cli import main

    path = tmp_path / "test_cases" / family / case / "model_config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({"ENV_VARS": env, "MODEL_ARGS": args, "TEST_TYPE": "regular"}))
    out = tmp_path / f"{family}.toml"
    assert main(["from-megatron", str(path), "--world-size", "8", "-o", str(out)]) == 0
    return tomllib.loads(out.read_text())


#: the Megatron-LM records ``tools/collect_megatron_cases.py`` writes (absent in CI: tests reading them skip)
COLLECTED_CASES = __import__("pathlib").Path.home() / ".cache" / "timeline" / "megatron-cases.json"


def collected_record(name: str, where: str) -> dict:
    """The collected calibration-side record of the test whose name ends with ``name``, recorded ``where`` (its
    record id's ``@COMMIT:PLATFORM`` part, or a prefix of it); the calling test skips where there is none."""
    import json

    import pytest

    if not COLLECTED_CASES.exists():
        pytest.skip(f"{COLLECTED_CASES}: the collected Megatron-LM records are absent (tools/collect_megatron_cases.py)")
    rec = next((r for r in json.loads(COLLECTED_CASES.read_text()) if r["name"].endswith(name)
                and r["record_id"].split("@", 1)[-1].startswith(where) and r.get("side") == "calibration"), None)
    if rec is None:
        pytest.skip(f"no calibration record of {name} at {where}")
    return rec


def validate_measured():
    """``tools/validate_measured.py`` as a module (its ``predict`` simulates a collected record as recorded)."""
    return tool_module("validate_measured")

def tool_module(name: str):
    """``tools/NAME.py`` as a module, registered under its name (its dataclasses look their module up), with
    ``tools/`` on the path for the modules it imports."""
    import importlib.util
    import sys
    from pathlib import Path

    tools = Path(__file__).resolve().parents[1] / "tools"
    if str(tools) not in sys.path:
        sys.path.insert(0, str(tools))
    spec = importlib.util.spec_from_file_location(name, tools / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def sim_plan(run):
    """The simulation plan of ``run`` (its compiled phases, devices and states), as ``build_timeline`` makes it."""
    from timeline.graph.source import model_source
    from timeline.profiles import profile
    from timeline.sim.plan import plan, plan_pipeline
    from timeline.sim.static_state import StateRules

    pipe = plan_pipeline(run.schedule, run.parallel, run.training.num_microbatches, run.hardware, run.csv_rows)
    rules = StateRules(profile=run.profile, framework=run.framework, sm=run.hardware.sm, traced=run.trace is not None,
                       expert_state_group=profile(run.profile).params.expert_state_group,
                       combined_1f1b=run.schedule.combined_1f1b)
    return plan(model_source(run), pipe, model=run.model, training=run.training, parallel=run.parallel, rules=rules,
                recompute=run.recompute)
