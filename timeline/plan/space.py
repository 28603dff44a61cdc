"""The candidate space of ``timeline plan``: which layouts, batch shapes, schedules and recompute
policies a job on N GPUs could run, each made a whole run and checked by run-level validation.

A space is a table of run-file keys with lists of values (``"parallel.tp" = [1, 2, 4]``,
``"recompute" = ["none", "full:uniform:1"]``); ``"auto"`` (or a key left out) means the default
for that key. Derived per candidate, never searched: ``dp = N / (tp·pp·cp)``,
``num_microbatches = G / (micro_batch_size · dp)`` (Megatron's rule) and the layer layout
(:func:`remainder_layout`). A candidate that cannot run is kept, with the first problem
validation finds as its reason. This module derives each candidate's edits of the base run (the
planner's door applies them); it neither bounds nor simulates.
"""

from __future__ import annotations

import dataclasses
import itertools
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from timeline.errors import UserError
from timeline.spec.fields import check_value
from timeline.spec.model import ModelSpec
from timeline.spec.recompute import parse_recompute
from timeline.spec.run import (
    AllocatorSpec,
    HardwareSpec,
    ParallelSpec,
    RecomputeSpec,
    ScheduleSpec,
    TrainingSpec,
)

#: the searched dimensions, in the order of the canonical candidate string
SEARCHED = ("parallel.tp", "parallel.pp", "parallel.vpp", "parallel.cp", "parallel.ep", "parallel.etp",
            "training.micro_batch_size", "schedule.kind", "recompute")
SHORT = {"parallel.tp": "tp", "parallel.pp": "pp", "parallel.vpp": "vpp", "parallel.cp": "cp", "parallel.ep": "ep",
         "parallel.etp": "etp", "training.micro_batch_size": "mbs", "schedule.kind": "schedule",
         "recompute": "recompute"}
DEFAULT_SCHEDULES = ("1f1b", "interleaved", "dualpipe", "dualpipev")
#: keys the plan derives; a space may not search them
DERIVED = ("parallel.dp", "parallel.layout", "training.num_microbatches")
_SECTIONS: dict[str, type] = {"parallel": ParallelSpec, "training": TrainingSpec, "schedule": ScheduleSpec,
                              "allocator": AllocatorSpec, "hardware": HardwareSpec}


def divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def remainder_layout(layers: int, chunks: int) -> tuple[int, ...] | None:
    """Decoder layers per virtual stage when ``chunks`` does not divide ``layers``: every middle
    stage gets ⌈layers / chunks⌉ and the first and last share the rest, the first taking the
    larger half (the last also holds the head, loss and MTP) — Megatron's
    ``decoder_first/last_pipeline_num_layers``. An even split when it divides; None when the
    middle stages alone need more layers than the model has."""
    if layers % chunks == 0:
        return (layers // chunks,) * chunks
    if chunks == 1:
        return (layers,)
    middle = -(-layers // chunks)
    rest = layers - middle * (chunks - 2)
    if rest < 0:
        return None
    return (rest - rest // 2,) + (middle,) * (chunks - 2) + (rest // 2,)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One point of the space: the searched settings (key, value) in :data:`SEARCHED` order, then
    any other keys the space lists, sorted; the string names it everywhere."""

    settings: tuple[tuple[str, Any], ...]

    def get(self, key: str) -> Any:
        return dict(self.settings)[key]

    @property
    def name(self) -> str:
        return " ".join(f"{SHORT.get(k, k)}={value_text(v)}" for k, v in self.settings)


def value_text(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


@dataclass(frozen=True, slots=True, kw_only=True)
class Space:
    world_size: int
    global_batch: int
    values: tuple[tuple[str, tuple[Any, ...]], ...]  # every key, its values in the order given
    #: the default layouts: only factorisations (tp·pp·cp divides N, ep·etp divides N/pp = dp·tp·cp)
    factorised: bool = False

    @property
    def size(self) -> int:
        return sum(1 for _ in candidates(self))


def default_values(model: ModelSpec, key: str, world: int, selective: tuple[str, ...]) -> tuple[Any, ...]:
    """The default space's values of ``key`` (see the module docstring of :mod:`timeline.plan`)."""
    if key in ("parallel.tp", "parallel.pp", "parallel.cp", "parallel.ep", "parallel.etp"):
        if key == "parallel.ep" and not model.is_moe:
            return (1,)
        if key == "parallel.etp" and not model.is_moe:
            return ("tp",)  # dense: expert TP is meaningless; keep Megatron's etp = tp
        return divisors(world)
    if key == "parallel.vpp":
        return (1, 2)
    if key == "training.micro_batch_size":
        return (1, 2)
    if key == "schedule.kind":
        return DEFAULT_SCHEDULES
    if key == "recompute":
        return ("none", *selective, "full:uniform:1")
    raise UserError(f"space key {key!r} has no default; give its values")


def build_space(model: ModelSpec, table: dict[str, Any], *, world: int, global_batch: int,
                selective: tuple[str, ...], where: str = "--space") -> Space:
    """The space of ``table`` (a SPACE.toml's ``[space]``, or {} for the default one) for ``model``."""
    values: dict[str, tuple[Any, ...]] = {}
    for key in SEARCHED:
        raw = table.get(key, "auto")
        values[key] = default_values(model, key, world, selective) if raw == "auto" else _values(key, raw, where)
    for key, raw in table.items():
        if key in SEARCHED:
            continue
        if key in DERIVED:
            raise UserError(f"{where}: {key} is derived by the plan (dp = N/(tp·pp·cp), num_microbatches = "
                            "G/(micro_batch_size·dp), the remainder layout); remove it")
        values[key] = _values(key, raw, where)
    layout_keys = ("parallel.tp", "parallel.pp", "parallel.cp", "parallel.ep", "parallel.etp")
    factorised = all(table.get(k, "auto") == "auto" for k in layout_keys)
    return Space(world_size=world, global_batch=global_batch, values=tuple(values.items()), factorised=factorised)


def _values(key: str, raw: Any, where: str) -> tuple[Any, ...]:
    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise UserError(f"{where}: {key} lists no values; give at least one or \"auto\"")
    if key == "recompute":
        for text in items:
            if not isinstance(text, str):
                raise UserError(f"{where}: recompute value {text!r} is not a policy string")
            parse_recompute(text)
        return tuple(items)
    section, _, name = key.partition(".")
    cls = _SECTIONS.get(section)
    fields = {f.name: f for f in dataclasses.fields(cls)} if cls else {}
    if name not in fields:
        raise UserError(f"{where}: {key!r} is not a run-file key the plan can vary; use section.key of "
                        f"{', '.join(_SECTIONS)} (e.g. \"parallel.tp\") or \"recompute\"")
    hint = typing.get_type_hints(cls)[name]
    out = []
    for item in items:
        if key == "parallel.etp" and item == "tp":
            out.append(item)
            continue
        v, problem = check_value(fields[name], hint, item)
        if problem:
            raise UserError(f"{where}: {key}: {problem}")
        out.append(v)
    return tuple(out)


def candidates(space: Space) -> Iterator[Candidate]:
    """Every point of the space, in the order of its keys and values."""
    keys = [k for k, _ in space.values]
    extra = sorted(range(len(keys)), key=lambda i: keys[i])
    n = space.world_size
    for combo in itertools.product(*(vs for _, vs in space.values)):
        if space.factorised:
            tp, pp, _, cp, ep, etp = combo[:6]
            if n % (tp * pp * cp) or (n // pp) % (ep * (tp if etp == "tp" else etp)):
                continue
        searched = tuple((keys[i], combo[i]) for i in range(len(SEARCHED)))
        others = tuple((keys[i], combo[i]) for i in extra if i >= len(SEARCHED))
        yield Candidate(searched + others)


@dataclass(frozen=True, slots=True)
class Edits:
    """What a candidate changes in the base run: its recompute policy and, per run-file section,
    the fields it sets (the derived dp, num_microbatches and layout included). The planner's door
    (:func:`timeline.plan.search.plan`) applies them to the base run and validates the result."""

    recompute: RecomputeSpec
    sections: dict[str, dict[str, Any]]


def candidate_edits(cand: Candidate, space: Space, num_layers: int) -> tuple[Edits | None, str, str]:
    """(edits, "", "") for a candidate of a ``num_layers``-layer model whose derived counts work,
    else (None, key, problem): the derived dp, num_microbatches and layout."""
    s = dict(cand.settings)
    tp, pp, cp, vpp = s["parallel.tp"], s["parallel.pp"], s["parallel.cp"], s["parallel.vpp"]
    etp = tp if s["parallel.etp"] == "tp" else s["parallel.etp"]
    if space.world_size % (tp * pp * cp):
        return None, "parallel.dp", f"tp·pp·cp = {tp * pp * cp} does not divide the world size {space.world_size}"
    dp = space.world_size // (tp * pp * cp)
    mbs = s["training.micro_batch_size"]
    if space.global_batch % (mbs * dp):
        return None, "training.num_microbatches", (f"the global batch {space.global_batch} is not a multiple of "
                                                   f"micro_batch_size·dp = {mbs * dp}")
    layout = remainder_layout(num_layers, pp * vpp)
    if layout is None:
        return None, "parallel.layout", f"{num_layers} layers cannot fill pp·vpp = {pp * vpp} virtual stages"
    sections: dict[str, dict[str, Any]] = {"parallel": {}, "training": {}, "schedule": {}, "allocator": {},
                                           "hardware": {}}
    for k, v in cand.settings:
        if k == "recompute":
            continue
        sec, _, name = k.partition(".")
        sections[sec][name] = v
    # the space does not place MTP apart from the loss: a base run's parallel.mtp_stage names a stage of its
    # own layout, so every candidate builds MTP with the loss
    sections["parallel"].update(tp=tp, pp=pp, cp=cp, vpp=vpp, etp=etp, dp=dp, layout=layout, mtp_stage=None,
                                sp=sections["parallel"].get("sp", tp > 1))
    sections["training"]["num_microbatches"] = space.global_batch // (mbs * dp)
    return Edits(recompute=parse_recompute(s["recompute"]), sections=sections), "", ""
