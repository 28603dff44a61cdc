"""One decoder layer's forward ops: attention (MHA/GQA or MLA) and MLP (dense or MoE) sub-blocks, each
followed by dropout (where the profile has it) and a residual add. Ops carry a ``sub:attn`` or
``sub:ffn`` tag so full recompute can checkpoint the sub-blocks apart (paper profile).

A hybrid model's layer runs the one sub-block its pattern names (``M`` the Mamba mixer, ``*`` attention,
``-`` MLP, ``E`` MoE), each with its bias-dropout-add (Megatron-LM ``ssm/mamba_layer.py: MambaLayer.forward``
``mamba_bda``; ``ssm/mlp_layer.py: MLPLayer`` and the attention-only ``TransformerLayer`` of
``models/mamba/mamba_layer_specs.py: mamba_stack_spec``)."""

from __future__ import annotations

from timeline.graph.families import attention, gdn, mamba, mla, mlp, norm, switch_mlp
from timeline.graph.families import moe as moe_block
from timeline.graph.families.common import add, dropout
from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef


def _tag(b: Builder, start: int, tag: str) -> None:
    for op in b.ops[start:]:
        op.tags = op.tags | {tag}


def forward(b: Builder, layer: int, prefix: str, x: TensorDef, *, moe: bool) -> TensorDef:
    kind = b.model.layer_kind(layer)
    if kind == "M":
        start = len(b.ops)
        y = dropout(b, f"{prefix}.mixer.dropout", mamba.forward(b, prefix, x, layer), layer)
        out = add(b, f"{prefix}.mixer_residual", y, x, layer, out=f"{prefix}.output")
        _tag(b, start, "sub:attn")
        return out
    if kind in "-E":
        return ffn(b, layer, prefix, x, moe=moe)
    start = len(b.ops)
    if b.model.parallel_residual:
        return _parallel(b, layer, prefix, x)
    mixer = (gdn.train_forward if b.table.gdn == "megatron" else gdn.forward) if b.model.is_linear_attention(layer) \
        else mla.forward if b.model.is_mla else attention.forward
    a = mixer(b, prefix, x, layer)
    if b.model.sandwich_norms:  # Gemma2DecoderLayer: post_attention_layernorm(attention output), then the add
        a = norm.forward(b, f"{prefix}.post_attention_layernorm", a, layer)
    a = dropout(b, f"{prefix}.self_attn.dropout", a, layer)
    if kind == "*":
        h = add(b, f"{prefix}.attn_residual", a, x, layer, out=f"{prefix}.output")
        _tag(b, start, "sub:attn")
        return h
    h = add(b, f"{prefix}.attn_residual", a, x, layer)
    _tag(b, start, "sub:attn")
    return ffn(b, layer, prefix, h, moe=moe)


def _parallel(b: Builder, layer: int, prefix: str, x: TensorDef) -> TensorDef:
    """Phi's layer (transformers ``PhiDecoderLayer.forward``, vLLM ``PhiLayer.forward``): one input norm,
    attention and the dense MLP on its output, each through its residual dropout, then ``attn + mlp +
    residual`` as two adds (the first sum a temporary)."""
    start = len(b.ops)
    ln = attention.input_norm(b, prefix, x, layer)
    a = dropout(b, f"{prefix}.self_attn.dropout", attention.attend(b, prefix, ln, layer), layer)
    _tag(b, start, "sub:attn")
    start = len(b.ops)
    f = dropout(b, f"{prefix}.mlp.dropout", mlp.project(b, prefix, ln, layer), layer)
    s = add(b, f"{prefix}.parallel_sum", a, f, layer)
    out = add(b, f"{prefix}.mlp_residual", s, x, layer, out=f"{prefix}.output")
    _tag(b, start, "sub:ffn")
    return out


def ffn(b: Builder, layer: int, prefix: str, h: TensorDef, *, moe: bool) -> TensorDef:
    """The MLP (or MoE) sub-block on the residual stream ``h``, with its dropout and residual add."""
    start = len(b.ops)
    if moe and b.table.switch_mlp:  # the legacy SwitchMLP: its weighted bias rows go into the bias-dropout-add
        f, bias = switch_mlp.forward(b, prefix, h, layer)
        refs = {"_bias": bias} if bias is not None else None
        g = dropout(b, f"{prefix}.mlp.dropout", f, layer, refs=refs)
        out = add(b, f"{prefix}.mlp_residual", g, h, layer, out=f"{prefix}.output", refs=refs if g is f else None)
        _tag(b, start, "sub:ffn")
        return out
    if moe:
        f = moe_block.forward(b, prefix, h, layer)
        if b.table.model_dropout:  # Megatron: the MoE layer's output goes through bias-dropout-add too
            f = dropout(b, f"{prefix}.mlp.dropout", f, layer)
    else:
        f = mlp.forward(b, prefix, h, layer)
        if b.model.sandwich_norms:  # post_feedforward_layernorm(MLP output), then the add
            f = norm.forward(b, f"{prefix}.post_feedforward_layernorm", f, layer)
        f = dropout(b, f"{prefix}.mlp.dropout", f, layer)
    out = add(b, f"{prefix}.mlp_residual", f, h, layer, out=f"{prefix}.output")
    _tag(b, start, "sub:ffn")
    return out

