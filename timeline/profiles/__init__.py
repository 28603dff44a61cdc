"""Profiles: how one framework builds and trains a model, one module per profile (DESIGN §5).

Each of :mod:`~timeline.profiles.megatron`, :mod:`~timeline.profiles.paper` and
:mod:`~timeline.profiles.hf` defines ``PROFILE``, a :class:`~timeline.profiles.base.Profile`
holding that framework's parameter rules, saved-tensor rules, op structure, lifecycle and limits
(the types are in :mod:`timeline.profiles.base`). :data:`PROFILES` is the one registry: the graph
looks a run's profile up once (``BuildCtx.of``), the simulator reads its lifecycle, run
validation its limits. This package sits just above ``spec`` and imports nothing else of timeline.

Adding a profile: write ``profiles/<name>.py`` defining ``PROFILE`` and list it in :data:`PROFILES`.
"""

from __future__ import annotations

from timeline.profiles import hf, megatron, paper
from timeline.profiles.base import (
    Lifecycle,
    Limits,
    ParamRules,
    Profile,
    RunLimits,
    SaveRule,
    SaveRules,
    Structure,
)

__all__ = ["LIMITS", "PROFILES", "Lifecycle", "Limits", "ParamRules", "Profile", "RunLimits", "SaveRule", "SaveRules",
           "Structure", "lifecycle", "profile"]

#: profile name → its rules, megatron (the default) first, as ``model.profile`` lists them
PROFILES: dict[str, Profile] = {p.name: p for p in (megatron.PROFILE, paper.PROFILE, hf.PROFILE)}
#: profile name → the limits run validation reads (``validate_run(run, LIMITS)``)
LIMITS: dict[str, RunLimits] = {name: RunLimits.of(p.limits, p.params) for name, p in PROFILES.items()}


def profile(name: str) -> Profile:
    """The profile called ``name`` (one of :data:`PROFILES`)."""
    return PROFILES[name]


def lifecycle(name: str) -> Lifecycle:
    """When the static state of profile ``name`` comes into being."""
    return PROFILES[name].lifecycle
