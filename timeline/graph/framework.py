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

from collections.abc import Callable
from dataclasses import dataclass, replace

from timeline.graph import profiles
from timeline.graph.profiles import Profile
from timeline.graph.saved import SavedTable, hf, megatron, megatron_gptoss, paper
from timeline.spec.framework import FrameworkSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Framework:
    name: str
    params: Profile  # parameter layout and state rules
    saved: SavedTable  # saved-tensor rules and op structure
    #: the saved-tensor table as a run's ``[framework]`` section configures it (None: the table as it is)
    configure: Callable[[SavedTable, FrameworkSpec], SavedTable] | None = None

    def configured(self, spec: FrameworkSpec) -> Framework:
        """This framework with its table configured by ``spec``."""
        if self.configure is None:
            return self
        return replace(self, saved=self.configure(self.saved, spec))


#: profile name → its framework; a new profile's two tables register here (a test checks every
#: profile run validation accepts has one)
FRAMEWORKS: dict[str, Framework] = {
    f.name: f for f in (
        Framework(name="paper", params=profiles.PAPER, saved=paper.TABLE),
        # the GPT-OSS rules (Megatron-Core 0.15, TE 2.8) join the megatron table under names of their own
        Framework(name="megatron", params=profiles.MEGATRON, saved=megatron_gptoss.extend(megatron.TABLE),
                  configure=megatron.configure),
        Framework(name="hf", params=profiles.HF, saved=hf.TABLE),
    )
}


def framework(profile: str) -> Framework:
    """The framework of ``profile`` (every profile of :data:`timeline.spec.profiles.PROFILES` has one)."""
    return FRAMEWORKS[profile]
