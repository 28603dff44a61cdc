"""Run-level rules of the ``[framework]`` context-parallel exchange (``cp_comm_type``, ``cp_a2a_size``), as
Megatron-Core and Transformer Engine check them: one type for all layers or one per layer
(``megatron/core/transformer/transformer_config.py: TransformerConfig.__post_init__``); an all-to-all
scatters the local query and key/value heads over its group (``transformer_engine/pytorch/attention/
dot_product_attention/context_parallel.py: AttnFuncWithCPAndQKVOA2A.forward`` asserts "The number of
attention heads needs to be divisible by CP size!"), whose size divides cp; only TE's flash and fused
backends run it (``UnfusedDotProductAttention`` has no context parallelism). Returns (key path,
message) pairs; it decides no bytes."""

from __future__ import annotations

from timeline.spec.framework import FrameworkSpec
from timeline.spec.model import ModelSpec
from timeline.spec.run import ParallelSpec


def cp_comm_problems(fw: FrameworkSpec, m: ModelSpec, par: ParallelSpec) -> list[tuple[str, str]]:
    """The problems of ``fw``'s context-parallel exchange for this model and layout (none at cp = 1)."""
    kinds = fw.cp_comm_type
    if par.cp == 1 or kinds == ("p2p",):
        return []
    out = []
    if len(kinds) not in (1, m.num_hidden_layers):
        out.append(("framework.cp_comm_type", f"has {len(kinds)} entries; give one, or one per layer "
                    f"({m.num_hidden_layers})"))
    if fw.transformer_impl != "transformer_engine" or fw.attention_backend in ("unfused", "local"):
        out.append(("framework.cp_comm_type", f"{'/'.join(sorted(set(kinds)))} runs in Transformer Engine's flash or "
                    "fused attention only; use p2p or attention_backend = \"flash\" / \"fused\""))
    groups = {"a2a": par.cp, "a2a+p2p": fw.cp_a2a_size}
    for kind in sorted(set(kinds) & set(groups)):
        g = groups[kind]
        heads = m.num_attention_heads // par.tp
        kv = heads if m.is_mla else m.kv_heads // par.tp
        if kind == "a2a+p2p" and (par.cp % g or g < 2):
            out.append(("framework.cp_a2a_size", f"{g} must be at least 2 and divide cp = {par.cp} (the a2a group of "
                        "a2a+p2p)"))
        elif heads % g or kv % g:
            out.append(("framework.cp_comm_type", f"{kind} scatters the {heads} local query and {kv} key/value heads "
                        f"over {g} ranks; both must be divisible by it"))
    return out
