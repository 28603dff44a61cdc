"""One decoder layer: attention (MHA/GQA or MLA) and MLP (dense or MoE) sub-blocks, each
followed by dropout (where the profile has it) and a residual add. Ops carry a ``sub:attn`` or
``sub:ffn`` tag so full recompute can checkpoint the sub-blocks apart (paper profile)."""

from __future__ import annotations

from timeline.graph.ir import Builder
from timeline.graph.ops_layers.attention import attention
from timeline.graph.ops_layers.common import add, dropout
from timeline.graph.ops_layers.mla import mla
from timeline.graph.ops_layers.mlp import mlp
from timeline.graph.ops_layers.moe import moe as moe_block
from timeline.graph.tensors import TensorDef


def _tag(b: Builder, start: int, tag: str) -> None:
    for op in b.ops[start:]:
        op.tags = op.tags | {tag}


def decoder_layer(b: Builder, layer: int, prefix: str, x: TensorDef, *, moe: bool) -> TensorDef:
    start = len(b.ops)
    a = (mla if b.model.is_mla else attention)(b, prefix, x, layer)
    a = dropout(b, f"{prefix}.self_attn.dropout", a, layer)
    h = add(b, f"{prefix}.attn_residual", a, x, layer)
    _tag(b, start, "sub:attn")
    start = len(b.ops)
    if moe:
        f = moe_block(b, prefix, h, layer)
        if b.table.model_dropout:  # Megatron: the MoE layer's output goes through bias-dropout-add too
            f = dropout(b, f"{prefix}.mlp.dropout", f, layer)
    else:
        f = dropout(b, f"{prefix}.mlp.dropout", mlp(b, prefix, h, layer), layer)
    out = add(b, f"{prefix}.mlp_residual", f, h, layer, out=f"{prefix}.output")
    _tag(b, start, "sub:ffn")
    return out

