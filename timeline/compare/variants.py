"""Variants of a run: the same job under another recompute policy, named in the CLI grammar.

The grammar (DESIGN §3) is parsed by :func:`timeline.spec.recompute.parse_recompute`; this
module adds the inverse (:func:`recompute_name`), the split of a comma-separated variant list
(``none,full:block:2,1,selective:mlp`` — a comma followed by a digit continues per-rank
``NUM_LAYERS``), and the re-validated run of each variant. It does not simulate.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from timeline.errors import SpecError
from timeline.profiles import run_problems
from timeline.spec.recompute import parse_recompute
from timeline.spec.run import RecomputeSpec, RunSpec

_SPLIT = re.compile(r",(?=\s*[A-Za-z])")


@dataclass(frozen=True, slots=True, kw_only=True)
class Variant:
    """One job to simulate: a display name and its run (which carries its CSV schedule rows, if any)."""

    name: str
    run: RunSpec


def recompute_name(spec: RecomputeSpec) -> str:
    """The grammar form of ``spec``: ``none``, ``selective:a+b``, ``full:block:2`` or ``full:block:2,1``."""
    if spec.policy == "none":
        return "none"
    if spec.policy == "selective":
        return "selective:" + "+".join(spec.modules)
    n = spec.num_layers
    return f"full:{spec.method}:" + (str(n) if isinstance(n, int) else ",".join(map(str, n)))


def split_policies(texts: Sequence[str]) -> list[str]:
    """Every policy named in ``--recompute`` values (each may list several, comma-separated)."""
    return [p.strip() for text in texts for p in _SPLIT.split(text) if p.strip()]


def with_recompute(run: RunSpec, spec: RecomputeSpec, *, context: str | None = None) -> RunSpec:
    """``run`` under ``spec``, validated as a whole run (e.g. ``moe_act`` needs a MoE model).

    A problem names ``context`` (default ``--recompute POLICY``), where the policy came from;
    a problem the run has under any policy is reported without it."""
    out = replace(run, recompute=spec)
    problems = run_problems(out)
    if problems:
        label = context or f"--recompute {recompute_name(spec)}"
        base = set(run_problems(replace(run, recompute=RecomputeSpec())))
        raise SpecError([(k, m if (k, m) in base else f"{m} (in {label})") for k, m in problems], run.source)
    return out


def policy_variants(run: RunSpec, texts: Sequence[str], *, prefix: str = "") -> list[Variant]:
    """One variant of ``run`` per policy in ``texts`` (grammar), named by its policy."""
    out = []
    for text in split_policies(texts):
        spec = parse_recompute(text)
        out.append(Variant(name=prefix + recompute_name(spec), run=with_recompute(run, spec)))
    return out
