"""Variants of a run: the same job under another recompute policy, named in the CLI grammar.

The grammar (DESIGN §3) is parsed by :func:`timeline.spec.recompute.parse_recompute`; this
module adds the inverse (:func:`recompute_name`) and the split of a comma-separated variant list
(``none,full:block:2,1,selective:mlp`` — a comma followed by a digit continues per-rank
``NUM_LAYERS``). The re-validated run of each variant is made where runs are read
(:mod:`timeline.cli.variants`). It does not simulate.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

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
