"""``from-megatron``'s context-parallel exchange: ``--cp-comm-type`` and ``--hierarchical-context-parallel-sizes``
→ ``[framework] cp_comm_type`` / ``cp_a2a_size`` (the attention family's rules:
:mod:`timeline.graph.families.cp_a2a`). Nothing here simulates."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from timeline.errors import UserError

if TYPE_CHECKING:
    from timeline.io.megatron_map import ArgReader, Conversion


def cp_comm(a: ArgReader, c: Conversion, cp: int) -> None:
    """``--cp-comm-type`` (arguments.py: nargs '+', default ['p2p']; one for all layers or, per
    ``TransformerConfig.__post_init__``, one per layer) → ``framework.cp_comm_type``, and for a2a+p2p
    ``--hierarchical-context-parallel-sizes`` (its first group is TE's all-to-all group,
    ``extensions/transformer_engine.py: TEDotProductAttention``) → ``framework.cp_a2a_size``; arguments.py
    asserts that the sizes multiply to cp and are given with a2a+p2p. TE's all-gather exchange
    (``AttnFuncWithCPAndKVAllGather``: each rank gathers the whole K and V) is refused. With cp = 1 no type
    communicates anything."""
    value = a.value("--cp-comm-type")
    sizes = a.value("--hierarchical-context-parallel-sizes")
    if value is None or cp == 1:
        return
    kinds = [str(k) for k in (value if isinstance(value, list | tuple) else str(value).split())]
    unknown = sorted(set(kinds) - {"p2p", "a2a", "a2a+p2p", "allgather", "all_gather"})
    if unknown:
        raise UserError(f"--cp-comm-type {' '.join(unknown)}: use p2p, a2a, allgather or a2a+p2p")
    if {"allgather", "all_gather"} & set(kinds):
        raise UserError("--cp-comm-type allgather: the whole K and V each rank gathers (context_parallel.py: "
                        "AttnFuncWithCPAndKVAllGather) are not modelled; use p2p, a2a or a2a+p2p")
    layers = a.need("--num-layers")
    if len(kinds) not in (1, layers):
        raise UserError(f"--cp-comm-type: {len(kinds)} values; give one, or one per layer ({layers}) as Megatron-LM "
                        "requires (transformer_config.py)")
    if len(kinds) > 1 and a.int("--mtp-num-layers"):
        raise UserError("--cp-comm-type with one value per layer and --mtp-num-layers: the MTP layers' exchange is "
                        "not modelled; give one value")
    c.put("framework.cp_comm_type", kinds, "--cp-comm-type")
    if "a2a+p2p" in kinds:
        parts = sizes if isinstance(sizes, list | tuple) else str(sizes or "").replace(",", " ").strip("[]").split()
        try:
            groups = [int(x) for x in parts]
        except ValueError:
            raise UserError(f"--hierarchical-context-parallel-sizes {sizes!r}: expected integers") from None
        if not groups or math.prod(groups) != cp:
            raise UserError(f"--hierarchical-context-parallel-sizes {sizes!r}: Megatron-LM needs sizes that multiply "
                            f"to --context-parallel-size {cp} with a2a+p2p (arguments.py)")
        c.put("framework.cp_a2a_size", groups[0], "--hierarchical-context-parallel-sizes")
