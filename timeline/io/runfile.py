"""Load a run file (TOML), apply ``--set`` overrides, resolve defaults and validate.

The file overrides defaults; ``--set section.key=value`` overrides the file. Relative paths
in the file resolve against its folder when read; the run keeps them as written
(``model_source = "trace:traces/x.parquet"``, ``schedule.csv``) so that outputs do not depend on
where the run file lies. Every problem is collected and raised as one
:class:`~timeline.errors.SpecError` naming the file and each key.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from timeline.errors import SpecError, UserError
from timeline.io.csv_schedule import read_csv
from timeline.io.hf_config import NO_EXPLICIT_ZERO, read_hf_config
from timeline.io.text import read_user_text
from timeline.io.trace_file import read_trace, trace_model, trace_problems
from timeline.profiles import LIMITS, PROFILES
from timeline.spec.fields import build_section, check_value
from timeline.spec.framework import FrameworkSpec
from timeline.spec.hardware import fill_gpu
from timeline.spec.model import ALIASES, ModelSpec
from timeline.spec.presets import PRESETS
from timeline.spec.run import (
    AllocatorSpec,
    HardwareSpec,
    OffloadSpec,
    ParallelSpec,
    RecomputeSpec,
    RunSpec,
    ScheduleSpec,
    TrainingSpec,
)
from timeline.spec.trace import CapturedTrace
from timeline.spec.validate import validate_run

SECTIONS: dict[str, type] = {
    "parallel": ParallelSpec,
    "training": TrainingSpec,
    "recompute": RecomputeSpec,
    "schedule": ScheduleSpec,
    "allocator": AllocatorSpec,
    "hardware": HardwareSpec,
    "framework": FrameworkSpec,
    "offload": OffloadSpec,
}
MODEL_KEYS = ("preset", "hf_config", "trace", "profile")
#: a run's name: it becomes the folder ``runs/NAME``, so it can neither climb out of ``runs/``
#: (no "/", no leading ".") nor exceed what file systems take
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def default_name(path: Path) -> str:
    """The run file's stem made a valid run name (other characters become "-")."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", path.stem).lstrip("._-")[:100]
    return name or "run"

TOP_LEVEL = ("name",)


def parse_override(text: str) -> tuple[str, str, Any]:
    """``section.key=value`` → (section, key, value); value parsed as a TOML literal."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise SpecError([("--set", f"{text!r} is not section.key=value (e.g. parallel.tp=4)")])
    lhs, raw = text.split("=", 1)
    section, key = lhs.strip().split(".", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()  # a bare word is a string: --set schedule.kind=gpipe
    return section, key, value


def _split_key(key: str, value: Any) -> tuple[str, str, Any]:
    if not isinstance(key, str) or "." not in key:
        raise SpecError([("overrides", f"{key!r} is not section.key (e.g. parallel.tp)")])
    section, name = key.split(".", 1)
    return section, name, value


def world_of(parallel: Any) -> int:
    """How many GPUs a ``[parallel]`` table spans (pp · tp · cp · dp; experts share those ranks), as far as its
    values are integers: whether a GPU no preset holds must say how they connect."""
    if not isinstance(parallel, dict):
        return 1
    n = 1
    for key in ("pp", "tp", "cp", "dp"):
        v = parallel.get(key, 1)
        n *= v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 1
    return n


def read_toml(path: Path) -> dict[str, Any]:
    text = read_user_text(path, "a run file (.toml)")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: invalid TOML: {exc}") from None


def _resolve_model(data: dict[str, Any], base: Path, problems: list,
                   traces: list[CapturedTrace] | None = None,
                   notes: list[str] | None = None, *, vision: bool = False) -> tuple[ModelSpec | None, str, str]:
    """(model, profile, source) of a [model] section; a trace it reads is appended to ``traces``;
    ``vision``: a vision-language hf_config is read as its language model (serving)."""
    sources = [k for k in ("preset", "hf_config", "trace") if k in data]
    profile = data.get("profile", "megatron")
    if not isinstance(profile, str) or profile not in PROFILES:
        problems.append(("model.profile", f"{profile!r} is not valid; use one of {', '.join(PROFILES)}"))
    model: ModelSpec | None = None
    source = ""
    if len(sources) != 1:
        problems.append(("model", "give exactly one of preset, hf_config or trace "
                         f"(found {', '.join(sources) or 'none'}); presets: {', '.join(PRESETS)}"))
        return None, profile, source
    kind = sources[0]
    value = data[kind]
    if not isinstance(value, str):
        problems.append((f"model.{kind}", f"expected a string, got {value!r}"))
        return None, profile, source
    if kind == "preset":
        if value not in PRESETS:
            problems.append(("model.preset", f"unknown preset {value!r}; use one of {', '.join(PRESETS)}"))
            return None, profile, source
        model, source = PRESETS[value], f"preset:{value}"
    elif kind == "hf_config":
        path = (base / value).resolve()
        try:
            model = read_hf_config(path, notes, vision=vision)
        except UserError as exc:
            problems.append(("model.hf_config", str(exc)))
            return None, profile, source
        source = f"hf_config:{value}"
    else:
        path = (base / value).resolve()
        try:
            trace = read_trace(path)
            model = trace_model(trace, name=path.stem)
        except UserError as exc:
            problems.append(("model.trace", str(exc)))
            return None, profile, source
        if traces is not None:
            traces.append(trace)
        source = f"trace:{value}"
    # Model fields by their Hugging Face name override the preset/config.
    fields = {f.name: f for f in dataclasses.fields(ModelSpec)}
    hints = typing.get_type_hints(ModelSpec)
    changes: dict[str, Any] = {}
    for key, raw in data.items():
        if key in MODEL_KEYS:
            continue
        name = ALIASES.get(key, key)
        if name in NO_EXPLICIT_ZERO and raw == 0 and not isinstance(raw, bool):
            problems.append((f"model.{key}", "0 is not valid; leave the key out for the default "
                             f"({fields[name].metadata['doc']})"))
            continue
        if name not in fields or name == "name":
            problems.append((f"model.{key}", "unknown key; use preset, hf_config, trace, profile or a "
                             "model field by its Hugging Face name (e.g. num_layers, hidden_size)"))
            continue
        v, problem = check_value(fields[name], hints[name], raw)
        if problem:
            problems.append((f"model.{key}", problem))
        else:
            changes[name] = v
    return (model.with_(**changes) if changes else model), profile, source


def load_run(path: str | Path, overrides: Sequence[str] | Mapping[str, Any] = ()) -> RunSpec:
    """Read, override, resolve and validate a run file; raise SpecError listing every problem.
    ``overrides`` are ``--set`` texts (``"parallel.tp=4"``) or a mapping of the same keys to values
    (``{"parallel.tp": 4}``), validated like the file's own."""
    path = Path(path)
    return run_from_data(read_toml(path), path, overrides)


def run_from_data(data: dict[str, Any], path: Path, overrides: Sequence[str] | Mapping[str, Any] = ()) -> RunSpec:
    """:func:`load_run` on run-file data already parsed (``path`` names it and anchors relative paths)."""
    source = str(path)
    problems: list[tuple[str, str]] = []
    try:
        pairs = ([_split_key(k, v) for k, v in overrides.items()] if isinstance(overrides, Mapping)
                 else [parse_override(text) for text in overrides])
        for section, key, value in pairs:
            data.setdefault(section, {})
            if not isinstance(data[section], dict):
                problems.append((f"--set {section}", "is not a section"))
                continue
            data[section][key] = value
    except SpecError as exc:
        raise exc.with_source(source) from None

    if "serving" in data:  # an inference deployment, not a training job (DESIGN §12)
        raise UserError(f"{path}: has a [serving] section, which describes an inference deployment; "
                        f"use `timeline serve {path}`")
    for key, value in data.items():
        if key in TOP_LEVEL:
            continue
        if key != "model" and key not in SECTIONS:
            problems.append((key, f"unknown section; valid: model, {', '.join(SECTIONS)}"))
        elif not isinstance(value, dict):
            problems.append((key, "must be a [section] table"))
    base = path.resolve().parent
    traces: list[CapturedTrace] = []
    notes: list[str] = []
    model, profile, model_source = None, "megatron", ""
    if "model" not in data:
        problems.append(("model", f"missing [model] section; e.g. preset = \"deepseek-v3\" "
                         f"(presets: {', '.join(PRESETS)})"))
    elif isinstance(data["model"], dict):
        model, profile, model_source = _resolve_model(data["model"], base, problems, traces, notes)

    sections: dict[str, Any] = {}
    for name, cls in SECTIONS.items():
        values = dict(data.get(name, {}) or {}) if isinstance(data.get(name, {}), dict) else {}
        if name == "parallel":
            tp = values.get("tp", 1)
            if isinstance(tp, int) and not isinstance(tp, bool):  # a bad tp is reported once, as tp
                values.setdefault("sp", tp > 1)
                values.setdefault("etp", tp)
        if name == "training" and traces and traces[0].is_step:
            values.setdefault("num_microbatches", 1)  # the step function runs its own loop, if any
        if name == "hardware":
            values.setdefault("gpu", "h800")
            found = fill_gpu(values, world_of(data.get("parallel")))
            problems += found
            if found:
                continue
        sections[name] = build_section(cls, name, values, problems)

    name_value = data.get("name", default_name(path))
    if not isinstance(name_value, str) or not NAME_RE.fullmatch(name_value):
        problems.append(("name", f"{name_value!r} is not a run name: use letters, digits, '.', '_' and '-', "
                         "starting with a letter or digit, at most 100 characters (it names the folder "
                         "runs/NAME)"))
    if problems:
        raise SpecError(problems, source)
    assert model is not None  # a missing model is one of the problems above
    run = RunSpec(name=name_value, source=str(path.resolve()), model=model, profile=profile,
                  model_source=model_source, trace=traces[0] if traces else None, notes=tuple(notes),
                  **sections)
    problems = validate_run(run, LIMITS) + trace_problems(run, str(data["model"]["trace"]) if traces else "")
    if problems:
        raise SpecError(problems, source)
    if run.schedule.kind == "csv" and run.schedule.csv:  # a relative path is relative to the run file's folder
        rows = read_csv((base / run.schedule.csv).resolve())
        run = dataclasses.replace(run, csv_rows=tuple(tuple(row) for row in rows))
    return run
