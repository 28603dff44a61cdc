"""The slice of a run a layer builder needs: model, sharding degrees, dtype and framework."""

from __future__ import annotations

from dataclasses import dataclass, replace

from timeline.graph.framework import Framework, framework
from timeline.graph.profiles import Profile
from timeline.graph.saved import SavedTable
from timeline.spec.model import ModelSpec
from timeline.spec.run import RunSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildCtx:
    model: ModelSpec
    framework: Framework
    tp: int = 1
    ep: int = 1
    etp: int = 1
    dtype: str = "bf16"

    @classmethod
    def from_run(cls, run: RunSpec) -> BuildCtx:
        """The run's context; the one place a run's profile name is looked up."""
        p = run.parallel
        fw = framework(run.profile).configured(run.framework)
        if fw.params.vocab_pad > 1:  # Megatron: --make-vocab-size-divisible-by ([framework]; 128 by default)
            fw = replace(fw, params=replace(fw.params, vocab_pad=run.framework.make_vocab_size_divisible_by))
        return cls(model=run.model, framework=fw, tp=p.tp, ep=p.ep, etp=p.etp, dtype=run.training.dtype)

    @property
    def profile(self) -> Profile:
        """The framework's parameter rules."""
        return self.framework.params

    @property
    def table(self) -> SavedTable:
        """The framework's saved-tensor table."""
        return self.framework.saved

    def unsharded(self) -> BuildCtx:
        """The model as its authors count it: no parallelism, no vocabulary padding."""
        fw = replace(self.framework, params=replace(self.profile, vocab_pad=1))
        return BuildCtx(model=self.model, framework=fw, dtype=self.dtype)

    @property
    def padded_vocab(self) -> int:
        """Vocabulary rows after the profile's padding, divisible by tp."""
        multiple = self.profile.vocab_pad * self.tp
        v = self.model.vocab_size
        if multiple > 1:
            return -(-v // multiple) * multiple
        return v
