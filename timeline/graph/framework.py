"""A framework: how one implementation lays out parameters and saves tensors (DESIGN §5).

A :class:`Framework` joins a profile's two rule tables — its parameter rules
(:class:`~timeline.graph.profiles.Profile`: which modules exist, how TP splits them, how their
states shard) and its saved-tensor table (:class:`~timeline.graph.saved.SavedTable`: what each op
keeps and how the framework structures its ops). Each fact is stated in exactly one of the two,
with its source; :data:`FRAMEWORKS` is the one registry, looked up once per run by
:meth:`timeline.graph.context.BuildCtx.from_run`. Lifecycle facts run validation needs are in
:mod:`timeline.spec.profiles`. This module decides nothing itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from timeline.graph import profiles
from timeline.graph.profiles import Profile
from timeline.graph.saved import SavedTable, hf, megatron, megatron_gptoss, paper


@dataclass(frozen=True, slots=True, kw_only=True)
class Framework:
    name: str
    params: Profile  # parameter layout and state rules
    saved: SavedTable  # saved-tensor rules and op structure


#: profile name → its framework; a new profile's two tables register here (a test checks every
#: profile run validation accepts has one)
FRAMEWORKS: dict[str, Framework] = {
    f.name: f for f in (
        Framework(name="paper", params=profiles.PAPER, saved=paper.TABLE),
        # the GPT-OSS rules (Megatron-Core 0.15, TE 2.8) join the megatron table under names of their own
        Framework(name="megatron", params=profiles.MEGATRON, saved=megatron_gptoss.extend(megatron.TABLE)),
        Framework(name="hf", params=profiles.HF, saved=hf.TABLE),
    )
}


def framework(profile: str) -> Framework:
    """The framework of ``profile`` (every profile of :data:`timeline.spec.profiles.PROFILES` has one)."""
    return FRAMEWORKS[profile]
