"""The slice of a run a layer builder needs: model, sharding degrees, dtype and the profile's rules."""

from __future__ import annotations

from dataclasses import dataclass, replace

from timeline.profiles import Profile, profile
from timeline.profiles.base import ParamRules, SaveRules, Structure
from timeline.spec.framework import FrameworkSpec
from timeline.spec.model import ModelSpec
from timeline.spec.run import ParallelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildCtx:
    model: ModelSpec
    rules: Profile  # the run's profile, its structure configured by the run's ``[framework]``
    tp: int = 1
    ep: int = 1
    etp: int = 1
    dtype: str = "bf16"
    sms: int = 0  # the device's streaming multiprocessors (spec/hardware.py SM_COUNTS; 0: not known)
    sm: int = 0  # the device's compute capability × 10 (``[hardware] sm``; 0: not known)
    pytorch: str = ""  # the PyTorch version kernels are chosen by (``[framework] pytorch``)
    encoder_pp: int = 0  # a LLaVA model's ViT on a pipeline stage of its own (``[parallel] encoder_pp``)

    @classmethod
    def of(cls, model: ModelSpec, profile_name: str, framework: FrameworkSpec, parallel: ParallelSpec,
           dtype: str, sms: int = 0, sm: int = 0) -> BuildCtx:
        """A run's context (its model, ``model.profile``, ``[framework]``, ``[parallel]``, weight
        dtype, the device's SM count and compute capability); the one place a profile name is looked
        up for the graph."""
        p = parallel
        rules = profile(profile_name).configured(framework)
        if rules.params.vocab_pad > 1:  # Megatron: --make-vocab-size-divisible-by ([framework]; 128 by default)
            rules = replace(rules, params=replace(rules.params, vocab_pad=framework.make_vocab_size_divisible_by))
        return cls(model=model, rules=rules, tp=p.tp, ep=p.ep, etp=p.etp, dtype=dtype, sms=sms, sm=sm,
                   pytorch=framework.pytorch, encoder_pp=p.encoder_pp)

    @property
    def profile(self) -> ParamRules:
        """The profile's parameter rules."""
        return self.rules.params

    @property
    def structure(self) -> Structure:
        """The profile's op-structure switches."""
        return self.rules.structure

    @property
    def saved(self) -> SaveRules:
        """The profile's saved-tensor rules."""
        return self.rules.saved

    def unsharded(self) -> BuildCtx:
        """The model as its authors count it: no parallelism, no vocabulary padding."""
        rules = replace(self.rules, params=replace(self.profile, vocab_pad=1))
        return BuildCtx(model=self.model, rules=rules, dtype=self.dtype)

    @property
    def padded_vocab(self) -> int:
        """Vocabulary rows after the profile's padding, divisible by tp."""
        multiple = self.profile.vocab_pad * self.tp
        v = self.model.vocab_size
        if multiple > 1:
            return -(-v // multiple) * multiple
        return v
