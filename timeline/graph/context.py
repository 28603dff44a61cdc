"""The slice of a run a layer builder needs: model, sharding degrees, dtype and profile."""

from __future__ import annotations

from dataclasses import dataclass, replace

from timeline.graph.profiles import PARAMETER_PROFILES, Profile
from timeline.spec.model import ModelSpec
from timeline.spec.run import RunSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildCtx:
    model: ModelSpec
    profile: Profile
    tp: int = 1
    ep: int = 1
    etp: int = 1
    dtype: str = "bf16"

    @classmethod
    def from_run(cls, run: RunSpec) -> BuildCtx:
        p = run.parallel
        return cls(model=run.model, profile=PARAMETER_PROFILES[run.profile], tp=p.tp, ep=p.ep, etp=p.etp,
                   dtype=run.training.dtype)

    def unsharded(self) -> BuildCtx:
        """The model as its authors count it: no parallelism, no vocabulary padding."""
        return BuildCtx(model=self.model, profile=replace(self.profile, vocab_pad=1), dtype=self.dtype)

    @property
    def padded_vocab(self) -> int:
        """Vocabulary rows after the profile's padding, divisible by tp."""
        multiple = self.profile.vocab_pad * self.tp
        v = self.model.vocab_size
        if multiple > 1:
            return -(-v // multiple) * multiple
        return v
