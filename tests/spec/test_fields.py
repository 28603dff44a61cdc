"""Field-level rules (``spec/fields.py``): TOML values coerced to each annotation, range and
choice rules, and section building that reports every problem with its key path."""

from __future__ import annotations

import dataclasses

import pytest

from timeline.spec.fields import build_section, check_value, spec_field
from timeline.spec.run import AllocatorSpec, HardwareSpec, ParallelSpec, RecomputeSpec, TrainingSpec


def check(cls: type, key: str, value):
    import typing

    return check_value({f.name: f for f in dataclasses.fields(cls)}[key], typing.get_type_hints(cls)[key], value)


@pytest.mark.parametrize(("cls", "key", "value", "expected"), [
    (ParallelSpec, "tp", 4, 4),
    (ParallelSpec, "sp", True, True),
    (HardwareSpec, "capacity_gib", 80, 80.0),  # an integer where a number is expected becomes a float
    (ParallelSpec, "layout", [2, 3], (2, 3)),  # lists become tuples (frozen specs)
    (ParallelSpec, "layout", None, None),
    (RecomputeSpec, "num_layers", 2, 2),
    (RecomputeSpec, "num_layers", [1, 0], (1, 0)),  # int or a list of ints
    (AllocatorSpec, "roundup_power2_divisions", {"1MB": 4, ">": 8}, (("1MB", 4), (">", 8))),  # sorted items
    (TrainingSpec, "dtype", "fp16", "fp16"),
])
def test_values_coerce(cls, key, value, expected):
    got, problem = check(cls, key, value)
    assert problem is None and got == expected and type(got) is type(expected)


@pytest.mark.parametrize(("cls", "key", "value", "words"), [
    (ParallelSpec, "tp", "2", "expected an integer, got '2'"),
    (ParallelSpec, "tp", True, "expected an integer"),  # a bool is not an int here
    (ParallelSpec, "sp", 1, "expected true or false"),
    (HardwareSpec, "capacity_gib", "80", "expected a number"),
    (ParallelSpec, "layout", [1, "a"], "expected a list of an integer"),
    (AllocatorSpec, "roundup_power2_divisions", "4", "expected an integer or a table"),
])
def test_wrong_types_say_what_is_expected(cls, key, value, words):
    got, problem = check(cls, key, value)
    assert got is None and problem is not None and words in problem


@pytest.mark.parametrize(("cls", "key", "value", "words"), [
    (ParallelSpec, "tp", 0, "must be positive, got 0"),
    (ParallelSpec, "layout", [2, -1], "must be ≥ 0, got -1"),  # every list item is checked
    (TrainingSpec, "routing_skew", 0.5, "must be ≥ 1.0, got 0.5"),
    (HardwareSpec, "efficiency", 1.5, "must be ≤ 1.0, got 1.5"),
    (TrainingSpec, "zero", 4, "4 is not valid; use one of 0, 1, 2, 3"),
    (TrainingSpec, "dtype", "int4", "use one of 'fp32', 'bf16', 'fp16', 'fp8'"),
    (RecomputeSpec, "modules", ["core_attn", "ffn"], "'ffn' is not valid; use one of 'core_attn'"),
])
def test_range_and_choice_rules_say_what_is_valid(cls, key, value, words):
    got, problem = check(cls, key, value)
    assert got is None and problem is not None and words in problem


def test_build_section_reports_every_problem_with_its_key():
    problems: list[tuple[str, str]] = []
    assert build_section(ParallelSpec, "parallel", {"tp": 0, "layouts": 2, "pp": "x", "color": 1}, problems) is None
    keys = [k for k, _ in problems]
    assert keys == ["parallel.tp", "parallel.layouts", "parallel.pp", "parallel.color"]
    msgs = dict(problems)
    assert "did you mean 'layout'?" in msgs["parallel.layouts"]
    assert "valid keys: pp, vpp, tp" in msgs["parallel.color"]


def test_build_section_builds_the_frozen_spec():
    problems: list[tuple[str, str]] = []
    spec = build_section(ParallelSpec, "parallel", {"tp": 2, "layout": [1, 1]}, problems)
    assert problems == [] and spec == ParallelSpec(tp=2, layout=(1, 1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.tp = 4  # type: ignore[misc]


def test_mutable_defaults_are_refused():
    with pytest.raises(TypeError):
        spec_field([1])
