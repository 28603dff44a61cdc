"""Profiles: how one framework builds and trains a model, one module per profile (DESIGN §5).

Each of :mod:`~timeline.profiles.megatron`, :mod:`~timeline.profiles.paper` and
:mod:`~timeline.profiles.hf` defines ``PROFILE``, a :class:`~timeline.profiles.base.Profile`
holding that framework's parameter rules, saved-tensor rules, op structure, lifecycle and limits
(the types are in :mod:`timeline.profiles.base`). :data:`PROFILES` is the one registry: the graph
looks a run's profile up once (``BuildCtx.from_run``), the simulator reads its lifecycle, run
validation its limits. This package sits just above ``spec`` and imports nothing else of timeline.

Adding a profile: write ``profiles/<name>.py`` defining ``PROFILE`` and list it in :data:`PROFILES`.
"""

from __future__ import annotations

from timeline.profiles import hf, megatron, paper
from timeline.profiles.base import Lifecycle, Limits, ParamRules, Profile, SaveRule, SaveRules, Structure
from timeline.spec.run import RunSpec
from timeline.spec.validate import validate_run

__all__ = ["PROFILES", "Lifecycle", "Limits", "ParamRules", "Profile", "SaveRule", "SaveRules", "Structure",
           "lifecycle", "profile", "run_problems"]

#: profile name → its rules, megatron (the default) first, as ``model.profile`` lists them
PROFILES: dict[str, Profile] = {p.name: p for p in (megatron.PROFILE, paper.PROFILE, hf.PROFILE)}


def profile(name: str) -> Profile:
    """The profile called ``name`` (one of :data:`PROFILES`)."""
    return PROFILES[name]


def lifecycle(name: str) -> Lifecycle:
    """When the static state of profile ``name`` comes into being."""
    return PROFILES[name].lifecycle


def run_problems(run: RunSpec) -> list[tuple[str, str]]:
    """Every problem of ``run`` (:func:`timeline.spec.validate.validate_run`), its profile's limits included."""
    known = PROFILES.get(run.profile)
    return validate_run(run, limits=known.limits if known else None, profiles=tuple(PROFILES))
