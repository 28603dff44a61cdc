"""Eager attention with learned sinks (GPT-OSS under Hugging Face), op by op.

transformers' ``GptOssPreTrainedModel`` sets ``_supports_sdpa = False``: its default, eager
attention (``models/gpt_oss/modeling_gpt_oss.py eager_attention_forward``), materialises the
logits ``q·kᵀ`` of every head, scales them, adds the causal (or sliding-window) mask, concatenates
each head's sink logit as an extra key column, subtracts the row maximum, takes the softmax over
``s + 1`` columns and drops the sink column (a view) before the product with V. A sliding window
only changes the mask: eager attention computes and keeps the whole ``s × s`` block either way.
Key and value heads are repeated to every query head (``repeat_kv``; for MHA the value is still
copied, by ``matmul``'s reshape of its transposed view), and the context is transposed back by a
``.contiguous()`` copy that ``o_proj`` keeps. What each op keeps is the table's business (rules
``attn_scores``, ``logits_max``, ``softmax``, ``attn_dropout``, ``attn_v``); this module only lays out the ops.
Eager attention needs the masks as tensors: :func:`attention_masks` builds them once per chunk, as
``GptOssModel.forward`` builds ``causal_mask_mapping`` (a full and a sliding-window mask, each
``(b, 1, s, s)`` in the model's dtype, whatever the layers use); a checkpointed layer keeps its mask.

Gemma-2 (``_supports_sdpa = False`` too) runs the same eager attention without sinks, with its logits
soft-capped (``tanh``) and an fp32 softmax cast back before ``·V``: :func:`eager_attention`.
"""

from __future__ import annotations

from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef

CORE = frozenset({"core_attn"})


def attention_masks(b: Builder) -> None:
    """The ``full_attention`` and ``sliding_attention`` masks (``masking_utils.create_causal_mask`` and
    ``create_sliding_window_causal_mask`` for eager attention: additive masks in the model's dtype), built by
    one op tagged ``shared`` so a checkpoint that keeps them counts them outside the layers."""
    d = b.dims
    masks = {kind: b.tensor(f"causal_mask.{kind}", (d.b, 1, d.s_local, d.s)) for kind in ("full", "sliding")}
    b.op("causal_mask", "mask", None, {}, masks, tags=frozenset({"shared"}))
    b.shared.update({f"mask_{kind}": t for kind, t in masks.items()})


def _repeat_kv(b: Builder, name: str, k: TensorDef, v: TensorDef, layer: int, rows: int,
               width: int) -> tuple[TensorDef, TensorDef]:
    """k and v as eager attention's matmuls read them: ``repeat_kv``'s expand + reshape copies both to every query
    head; for MHA ``torch.matmul`` still copies the transposed ``(b, h, s, d)`` value view to ``(b·h, s, d)``."""
    if k.shape[1] < width:
        ke, ve = b.tensor(f"{name}.k_expanded", (rows, width)), b.tensor(f"{name}.v_expanded", (rows, width))
        b.op(f"{name}.repeat_kv", "copy", layer, {"k": k, "v": v}, {"k": ke, "v": ve}, tags=CORE)
        return ke, ve
    ve = b.tensor(f"{name}.v_expanded", (rows, width))
    b.op(f"{name}.v_contiguous", "copy", layer, {"v": v}, {"v": ve}, tags=CORE)
    return k, ve


def _times_v(b: Builder, name: str, probs: TensorDef, v: TensorDef, layer: int, out_shape: tuple[int, int],
             mm: float) -> TensorDef:
    """Dropout on the (b, h, s, s) probabilities where the model has it (a new tensor and its bool mask), ·V,
    and the transposed context copied ``.contiguous()`` for ``o_proj`` (returned)."""
    if b.model.attention_dropout > 0:
        s2 = (b.dims.b, probs.shape[1], b.dims.s_local, b.dims.s)
        dropped = b.tensor(f"{name}.dropout.out", s2)
        b.op(f"{name}.dropout", "attn_dropout", layer, {"x": probs}, {"y": dropped},
             extras={"mask": b.tensor(f"{name}.dropout.mask", s2, "bool")},
             flops=float(s2[0] * s2[1] * s2[2] * s2[3]), tags=CORE)
        probs = dropped
    ctx = b.tensor(f"{name}.pv_out", out_shape)
    b.op(f"{name}.pv", "attn_v", layer, {"p": probs, "v": v}, {"y": ctx}, flops=mm, tags=CORE)
    out = b.tensor(f"{name}.out", out_shape)
    b.op(f"{name}.transpose", "copy", layer, {"x": ctx}, {"y": out}, tags=CORE)
    return out


def eager_sink_attention(b: Builder, name: str, q: TensorDef, k: TensorDef, v: TensorDef, layer: int,
                         heads: int, head_dim: int) -> TensorDef:
    """Softmax([q·kᵀ·scale + mask, sink])[..., :-1]·v for ``heads`` local heads; returns the context
    ``(rows, heads·head_dim)`` as ``o_proj`` reads it (the contiguous copy)."""
    d = b.dims
    rows, width = q.shape[0], heads * head_dim
    k, v = _repeat_kv(b, name, k, v, layer, rows, width)
    s2 = (d.b, heads, d.s_local, d.s)
    cols = (d.b, heads, d.s_local, d.s + 1)
    mm = 2.0 * d.b * heads * d.s_local * d.s * head_dim
    x = b.tensor(f"{name}.scores", s2)
    b.op(f"{name}.qk", "attn_scores", layer, {"q": q, "k": k}, {"y": x}, flops=mm, tags=CORE)
    mask = b.shared.get("mask_sliding" if b.model.is_sliding(layer) else "mask_full")
    for step, rule in (("scaled", "scale"), ("masked", "add")):  # * scaling, + attention_mask
        y = b.tensor(f"{name}.{step}", s2)
        refs = {"_mask": mask} if step == "masked" and mask is not None else {}
        b.op(f"{name}.{step}_op", rule, layer, {"x": x, **refs}, {"y": y},
             flops=float(d.b * heads * d.s_local * d.s), tags=CORE)
        x = y
    combined = b.tensor(f"{name}.with_sinks", cols)
    b.op(f"{name}.sinks_cat", "concat", layer, {"x": x}, {"y": combined}, tags=CORE)
    peak = b.tensor(f"{name}.row_max", (d.b, heads, d.s_local, 1))
    b.op(f"{name}.max", "logits_max", layer, {"x": combined}, {"y": peak},
         extras={"indices": b.tensor(f"{name}.row_max_idx", (d.b, heads, d.s_local, 1), "int64")}, tags=CORE)
    shifted = b.tensor(f"{name}.shifted", cols)
    b.op(f"{name}.sub", "add", layer, {"x": combined, "max": peak}, {"y": shifted}, tags=CORE)
    probs = b.tensor(f"{name}.softmax", cols)
    b.op(f"{name}.softmax_op", "softmax", layer, {"x": shifted}, {"y": probs},
         flops=5.0 * d.b * heads * d.s_local * (d.s + 1), tags=CORE)
    return _times_v(b, name, probs, v, layer, (rows, width), mm)


def eager_attention(b: Builder, name: str, q: TensorDef, k: TensorDef, v: TensorDef, layer: int, heads: int,
                    head_dim: int) -> TensorDef:
    """Gemma-2's eager attention (``models/gemma2/modeling_gemma2.py eager_attention_forward``, transformers
    5.24): ``q·kᵀ`` on ``repeat_kv``'s copies, ``* scaling``, with ``attn_logit_softcapping`` ``/ cap``, ``tanh``,
    ``* cap``; ``+ attention_mask``; ``softmax(dtype=float32)`` and ``.to(query.dtype)``; ``·V``; the
    transposed context copied ``.contiguous()`` for ``o_proj``. Returns that copy, ``(rows, heads·head_dim)``."""
    d = b.dims
    rows, width = q.shape[0], heads * head_dim
    k, v = _repeat_kv(b, name, k, v, layer, rows, width)
    s2 = (d.b, heads, d.s_local, d.s)
    mm = 2.0 * d.b * heads * d.s_local * d.s * head_dim
    elems = float(d.b * heads * d.s_local * d.s)
    x = b.tensor(f"{name}.scores", s2)
    b.op(f"{name}.qk", "attn_scores", layer, {"q": q, "k": k}, {"y": x}, flops=mm, tags=CORE)
    steps = [("scaled", "scale")]
    if b.model.attn_logit_softcapping > 0:  # / cap, tanh, * cap: TanhBackward0 keeps its result
        steps += [("capped", "scale"), ("tanh", "tanh"), ("uncapped", "scale")]
    steps.append(("masked", "add"))
    mask = b.shared.get("mask_sliding" if b.model.is_sliding(layer) else "mask_full")
    for step, rule in steps:
        y = b.tensor(f"{name}.{step}", s2)
        refs = {"_mask": mask} if step == "masked" and mask is not None else {}
        b.op(f"{name}.{step}_op", rule, layer, {"x": x, **refs}, {"y": y}, flops=elems, tags=CORE)
        x = y
    probs32 = b.tensor(f"{name}.softmax", s2, "fp32")
    b.op(f"{name}.softmax_op", "softmax", layer, {"x": x}, {"y": probs32}, flops=5.0 * elems, tags=CORE)
    probs = b.tensor(f"{name}.probs", s2)
    b.op(f"{name}.probs_cast", "cast", layer, {"x": probs32}, {"y": probs}, tags=CORE)
    return _times_v(b, name, probs, v, layer, (rows, width), mm)
