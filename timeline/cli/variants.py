"""Variants of a run under other recompute policies (``--recompute``), each validated as a whole run.

The grammar's names and the split of a variant list are :mod:`timeline.compare.variants`'; this
module derives the runs, where the command line holds the run it read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from timeline.compare.variants import Variant, recompute_name, split_policies
from timeline.errors import SpecError
from timeline.profiles import LIMITS
from timeline.spec.recompute import parse_recompute
from timeline.spec.run import RecomputeSpec, RunSpec
from timeline.spec.validate import validate_run


def with_recompute(run: RunSpec, spec: RecomputeSpec, *, context: str | None = None) -> RunSpec:
    """``run`` under ``spec``, validated as a whole run (e.g. ``moe_act`` needs a MoE model).

    A problem names ``context`` (default ``--recompute POLICY``), where the policy came from;
    a problem the run has under any policy is reported without it."""
    out = replace(run, recompute=spec)
    problems = validate_run(out, LIMITS)
    if problems:
        label = context or f"--recompute {recompute_name(spec)}"
        base = set(validate_run(replace(run, recompute=RecomputeSpec()), LIMITS))
        raise SpecError([(k, m if (k, m) in base else f"{m} (in {label})") for k, m in problems], run.source)
    return out


def policy_variants(run: RunSpec, texts: Sequence[str], *, prefix: str = "") -> list[Variant]:
    """One variant of ``run`` per policy in ``texts`` (grammar), named by its policy."""
    out = []
    for text in split_policies(texts):
        spec = parse_recompute(text)
        out.append(Variant(name=prefix + recompute_name(spec), run=with_recompute(run, spec)))
    return out
