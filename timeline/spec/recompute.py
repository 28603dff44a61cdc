"""The ``--recompute`` grammar: a policy written on one line, read into a
:class:`~timeline.spec.run.RecomputeSpec`.

``none`` | ``selective`` (= ``selective:core_attn``, Megatron's default ``--recompute-modules``, as
``[recompute] modules`` defaults) | ``selective:MOD[+MOD…]`` | ``full:uniform|block:NUM_LAYERS[,NUM…]``
(one ``NUM_LAYERS`` per pipeline rank, or one for all). What each policy checkpoints is decided by
:mod:`timeline.graph.recompute`; :func:`recompute_name` in ``compare`` writes a spec back.
"""

from __future__ import annotations

from timeline.errors import UserError
from timeline.spec.run import RECOMPUTE_MODULES, RecomputeSpec

FORMS = "none | selective (= selective:core_attn) | selective:MOD[+MOD…] | full:uniform|block:NUM_LAYERS[,NUM…]"
#: ``selective`` alone: Megatron's default ``--recompute-modules`` (as ``[recompute] modules`` defaults)
DEFAULT_SELECTIVE = ("core_attn",)


def parse_recompute(text: str) -> RecomputeSpec:
    """``none`` | ``selective[:MOD[+MOD…]]`` | ``full:METHOD:NUM_LAYERS`` → RecomputeSpec; ``selective``
    alone is ``selective:core_attn``, as ``policy = "selective"`` in a run file is."""
    parts = text.strip().split(":")
    bad = UserError(f"--recompute {text!r} is not valid; use {FORMS} (modules: {', '.join(RECOMPUTE_MODULES)})")
    if parts == ["none"]:
        return RecomputeSpec(policy="none")
    if parts == ["selective"]:
        return RecomputeSpec(policy="selective", modules=DEFAULT_SELECTIVE)
    if parts[0] == "selective" and len(parts) == 2 and parts[1]:
        mods = tuple(parts[1].split("+"))
        if any(m not in RECOMPUTE_MODULES for m in mods):
            raise bad
        return RecomputeSpec(policy="selective", modules=mods)
    if parts[0] == "full" and len(parts) == 3 and parts[1] in ("uniform", "block"):
        try:
            nums = tuple(int(n) for n in parts[2].split(","))
        except ValueError:
            raise bad from None
        if not nums or any(n < 0 for n in nums):
            raise bad
        return RecomputeSpec(policy="full", method=parts[1], num_layers=nums[0] if len(nums) == 1 else nums)
    raise bad
