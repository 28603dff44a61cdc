"""Dense feed-forward blocks: SwiGLU (gate, up, down) or GPT's GeLU MLP (fc1, fc2 with
biases). Column-parallel in, row-parallel out over ``split`` ranks (TP, or ETP for experts). GPT-OSS's
experts carry biases (``expert_linear_bias``): gate and up biases split with their columns, the down
bias whole on every expert-TP rank (a row-parallel bias is added after the reduction).
:func:`local_ffn` reads the local FFN width back off the built parameters, for the op builders.

Forward ops (:func:`forward`): norm, fc1 (GeLU, or SwiGLU's fused gate+up), activation, fc2 — the ``mlp``
recompute module (with the norm when it is fused into fc1, as in Transformer Engine). Under a
table with ``split_gate_up`` (HF ``LlamaMLP``) SwiGLU's gate and up are two linears, two tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from timeline.graph.context import BuildCtx
from timeline.graph.families import norm
from timeline.graph.families.common import Tags, column_linear, row_linear
from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef, param
from timeline.spec.hf_activations import HF_ACTIVATIONS


def params(ctx: BuildCtx, prefix: str, ffn: int, *, split: int, module: str = "mlp",
               expert: bool = False, in_moe: bool = False, width: int = 0) -> list[TensorDef]:
    """The MLP's weights (and biases) of local width ``ffn``, reading and writing ``width`` (0: the hidden
    size; a latent MoE's routed experts: ``ModelSpec.routed_width``)."""
    m, dt, h = ctx.model, ctx.dtype, width or ctx.model.hidden_size
    kw: dict[str, Any] = {"module": module, "dtype": dt, "expert": expert, "in_moe": in_moe}
    if m.gated_mlp:
        out = [
            param(f"{prefix}.gate_proj.weight", (ffn, h), split=split, **kw),
            param(f"{prefix}.up_proj.weight", (ffn, h), split=split, **kw),
            param(f"{prefix}.down_proj.weight", (h, ffn), split=split, dim=1, **kw),
        ]
        if expert and m.expert_linear_bias:
            out += [param(f"{prefix}.gate_proj.bias", (ffn,), split=split, **kw),
                    param(f"{prefix}.up_proj.bias", (ffn,), split=split, **kw),
                    param(f"{prefix}.down_proj.bias", (h,), **kw)]
        return out
    out = [param(f"{prefix}.fc1.weight", (ffn, h), split=split, **kw),
           param(f"{prefix}.fc2.weight", (h, ffn), split=split, dim=1, **kw)]
    if m.linear_bias:
        out += [param(f"{prefix}.fc1.bias", (ffn,), split=split, **kw),
                param(f"{prefix}.fc2.bias", (h,), **kw)]
    return out


def down(params: Mapping[str, TensorDef], prefix: str) -> TensorDef | None:
    """The down projection (``down_proj`` or ``fc2``) of the MLP built under ``prefix``, if any."""
    return params.get(f"{prefix}.down_proj.weight") or params.get(f"{prefix}.fc2.weight")


def local_ffn(params: Mapping[str, TensorDef], prefix: str) -> int:
    """Local FFN width of the MLP built under ``prefix``: the columns its down projection reads."""
    w = down(params, prefix)
    if w is None:
        raise KeyError(f"no MLP parameters under {prefix!r}")
    return w.shape[1]


MLP: Tags = frozenset({"mlp"})


def activation(b: Builder, name: str, x: TensorDef, layer: int | None, ffn: int, *, rule: str | None = None,
               probs: TensorDef | None = None, up: TensorDef | None = None, tags: Tags = MLP) -> TensorDef:
    """GeLU on ``x`` or SwiGLU on the fused gate+up output (or on gate ``x`` and ``up``); ``ffn`` is the
    local width. A model with ``swiglu_limit`` > 0 runs the clamped SwiGLU (rule ``clamped_swiglu``, or
    ``clamped_weighted_swiglu`` with routing probs), whose intermediates are extras the table may keep."""
    hf_act = HF_ACTIVATIONS.get(b.model.hidden_act) if b.table.model_code else None
    if hf_act is not None and hf_act.identity and up is None:
        return x  # LinearActivation: the down projection reads (and keeps) the up projection's output
    y = b.tensor(f"{name}.out", (x.shape[0], ffn))
    inputs = {"x": x} if up is None else {"x": x, "up": up}
    extras = {}
    if hf_act is not None and not hf_act.plain and rule is None and b.model.swiglu_limit == 0:
        # the family's modelling code calls ACT2FN[hidden_act]: what its expression keeps (spec/hf_activations.py)
        gated = b.model.gated_mlp
        rule = f"{'gated' if gated else 'act'}_{b.model.hidden_act}"
        for extra in hf_act.intermediates:
            extras[extra] = b.tensor(f"{name}.{extra}", (x.shape[0], ffn))
        for extra in hf_act.masks:
            extras[extra] = b.tensor(f"{name}.{extra}", (x.shape[0], ffn), "bool")
        for extra in hf_act.scalars:
            extras[extra] = b.tensor(f"{name}.{extra}", (1,))
        if gated and not hf_act.identity:  # act(gate) · up keeps act(gate) and up
            extras["silu"] = b.tensor(f"{name}.silu", (x.shape[0], ffn))
    elif b.model.gated_mlp and b.model.swiglu_limit > 0:  # GPT-OSS: clamp, gate·sigmoid(alpha·gate), (up + 1)
        rule = f"clamped_{rule or 'swiglu'}"
        if probs is not None:
            inputs["probs"] = probs
        for extra in ("gate_clamped", "sigmoid", "glu", "up_offset"):  # HF's eager intermediates
            extras[extra] = b.tensor(f"{name}.{extra}", (x.shape[0], ffn))
        # Megatron's fused path: the clamped (gate, up) concatenation and the offset as a 0-d tensor
        extras["clamped"] = b.tensor(f"{name}.clamped", (x.shape[0], 2 * ffn))
        extras["linear_offset"] = b.tensor(f"{name}.linear_offset", (1,))
    elif b.model.gated_mlp:
        if b.table.swiglu_ops and rule == "weighted_swiglu":  # the unfused glu, then `* permuted_probs`
            rule = "weighted_swiglu_ops"
            extras["glu"] = b.tensor(f"{name}.glu", (x.shape[0], ffn))
        rule = rule or ("swiglu_ops" if b.table.swiglu_ops else "swiglu")
        if probs is not None:
            inputs["probs"] = probs
        if b.table.swiglu_extra or b.table.swiglu_ops:
            extras["silu"] = b.tensor(f"{name}.silu", (x.shape[0], ffn))
    elif probs is not None and b.model.hidden_act == "relu2" and b.table.moe_squared_relu_fused:
        inputs["probs"] = probs  # fused_weighted_squared_relu.py: one Function keeping its input and the probs
        rule = "weighted_squared_relu"
    elif probs is not None:  # Megatron experts, unfused: activation_func(x) * probs (the mul keeps both)
        inputs["probs"] = probs
        if rule != "weighted_act_compiled":  # (compiled: the activation is recomputed in the backward)
            rule = "weighted_act"
            extras["act"] = b.tensor(f"{name}.act", (x.shape[0], ffn))
    elif b.model.hidden_act == "relu2" and not b.table.te_activation_func:  # Megatron --squared-relu: torch.pow(F.relu(x), 2)
        rule = "squared_relu"
        extras["relu"] = b.tensor(f"{name}.relu", (x.shape[0], ffn))
    else:
        rule = "gelu"
    b.op(name, rule, layer, inputs, {"y": y}, extras=extras, flops=8.0 * x.shape[0] * ffn, tags=tags)
    return y


def pre_norm(m: Any) -> str:
    """The pre-MLP norm's name: ``post_attention_layernorm`` (Llama's), ``pre_feedforward_layernorm`` where the
    layer also norms each sub-block's output (Gemma-2)."""
    return "pre_feedforward_layernorm" if m.sandwich_norms else "post_attention_layernorm"


def forward(b: Builder, prefix: str, x: TensorDef, layer: int) -> TensorDef:
    """Pre-MLP norm and the dense MLP on the layer's residual stream ``x``."""
    fused = b.table.fused_norm_linear
    ln = norm.forward(b, f"{prefix}.{pre_norm(b.model)}", x, layer,
              tags=MLP if fused else frozenset({"layernorm"}))
    return project(b, prefix, ln, layer)


def project(b: Builder, prefix: str, ln: TensorDef, layer: int | None) -> TensorDef:
    """The dense MLP on already normalised rows ``ln`` (its own pre-norm's output, or the input norm's in a
    parallel-residual layer)."""
    m = b.model
    p = f"{prefix}.mlp"
    ffn = local_ffn(b.params, p)
    if m.gated_mlp and b.table.split_gate_up:
        gate, up = split_gate_up(b, p, ln, ffn, layer, MLP)
        act = activation(b, f"{p}.act", gate, layer, ffn, up=up)
    else:
        fc1 = column_linear(b, f"{p}.linear_fc1", ln, (2 if m.gated_mlp else 1) * ffn, layer, tags=MLP)
        act = activation(b, f"{p}.act", fc1, layer, ffn)
    return row_linear(b, f"{p}.linear_fc2", act, m.hidden_size, layer, tags=MLP)


def split_gate_up(b: Builder, p: str, x: TensorDef, ffn: int, layer: int | None, tags: Tags) -> tuple[TensorDef, TensorDef]:
    """``gate_proj(x)`` and ``up_proj(x)`` as two column-parallel linears (both save ``x``)."""
    return (column_linear(b, f"{p}.gate_proj", x, ffn, layer, tags=tags),
            column_linear(b, f"{p}.up_proj", x, ffn, layer, tags=tags))

