"""Context parallelism by all-to-all (``--cp-comm-type a2a``, and the a2a half of ``a2a+p2p``): attention
runs on the whole sequence with the heads scattered over the CP ranks, between two all-to-alls.

Transformer Engine (``NVIDIA/TransformerEngine@release_v2.6…v2.10:transformer_engine/pytorch/attention/
dot_product_attention/context_parallel.py``): ``AttnFuncWithCPAndQKVOA2A.forward`` (and
``AttnFuncWithCPAndKVP2P.forward`` over the first of a list of CP groups, for a2a+p2p) calls
``flash_attn_a2a_communicate([q, k, v], before_attn=True)``: per tensor a contiguous ``[cp, …]`` copy
(``x.movedim(-3, 0).contiguous()``, held in ``a2a_inputs`` until it returns), the ``all_to_all_single``
output (``torch.empty_like``) and the sequence chunks put in order by ``reorder_seq_chunks_for_a2a_before_attn``
(``torch.index_select``: a new tensor, the one attention reads and the function saves as ``q_part``,
``k_part``, ``v_part``); after attention ``flash_attn_a2a_communicate(out_, before_attn=False)`` reorders
the output (``index_select``), all-to-alls it (``empty_like``) and makes it contiguous again
(``movedim(…).contiguous()``), the tensor returned; ``out_part`` (the output before the exchange) is saved.
A tensor of ``[rows, cols]`` on a rank becomes ``[rows·a2a, cols/a2a]``: the same bytes. The backward runs
the same exchanges on the gradients (``AttnFuncWithCPAndQKVOA2A.backward``), which the op graph derives
from these ops (each copy's and exchange's input gradient).
"""

from __future__ import annotations

from collections.abc import Mapping

from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef

#: the layers' ops of these kinds belong to core attention (selective recompute's ``core_attn``)
CORE = frozenset({"core_attn"})


def group(b: Builder, layer: int | None) -> int:
    """The all-to-all group of layer ``layer``'s attention: cp for ``a2a``, the hierarchical first size for
    ``a2a+p2p``, 1 for ``p2p`` (and without context parallelism). One entry of the table's ``cp_comm`` stands
    for every layer; a list has one per decoder layer (Megatron's ``cp_comm_type[layer_number - 1]``)."""
    kinds = b.table.cp_comm
    if b.dims.cp == 1:
        return 1
    kind = kinds[0] if len(kinds) == 1 or layer is None else kinds[layer]
    return {"a2a": b.dims.cp, "a2a+p2p": b.table.cp_a2a}.get(kind, 1)


def _copies(b: Builder, name: str, layer: int | None, xs: dict[str, TensorDef],
            shapes: Mapping[str, tuple[int, ...]]) -> dict[str, TensorDef]:
    outs = {k: b.tensor(f"{name}.{k}", shapes[k], x.dtype) for k, x in xs.items()}
    b.op(name, "copy", layer, xs, outs, tags=CORE)
    return outs


def scatter_heads(b: Builder, name: str, layer: int | None, qkv: dict[str, TensorDef],
                  shapes: Mapping[str, tuple[int, ...]], a2a: int) -> dict[str, TensorDef]:
    """q, k, v ``[rows, cols]`` (``shapes``: each one's own width where it is a view of a wider tensor) →
    ``[rows·a2a, cols/a2a]``: the send copies, the exchange, the reordered tensors attention reads."""
    send = _copies(b, f"{name}.cp_a2a.send", layer, qkv, shapes)
    gathered = {k: (shape[0] * a2a, shape[1] // a2a) for k, shape in shapes.items()}
    recv = {k: b.tensor(f"{name}.cp_a2a.recv_{k}", gathered[k], x.dtype) for k, x in send.items()}
    b.op(f"{name}.cp_a2a", "comm", layer, send, recv, kind="collective", stream="cp", tags=CORE)
    return _copies(b, f"{name}.cp_a2a.reorder", layer, recv, gathered)


def gather_heads(b: Builder, name: str, layer: int | None, out: TensorDef, a2a: int) -> TensorDef:
    """Attention's output ``[rows·a2a, cols]`` → ``[rows, cols·a2a]``: reordered, exchanged, made contiguous."""
    rows, cols = out.shape
    local = (rows // a2a, cols * a2a)
    send = _copies(b, f"{name}.cp_a2a_out.reorder", layer, {"y": out}, {"y": out.shape})["y"]
    recv = b.tensor(f"{name}.cp_a2a_out.recv", local, out.dtype)
    b.op(f"{name}.cp_a2a_out", "comm", layer, {"y": send}, {"y": recv}, kind="collective", stream="cp", tags=CORE)
    return _copies(b, f"{name}.cp_a2a_out.contiguous", layer, {"y": recv}, {"y": local})["y"]
