"""Dense feed-forward blocks: SwiGLU (gate, up, down) or GPT's GeLU MLP (fc1, fc2 with
biases). Column-parallel in, row-parallel out over ``split`` ranks (TP, or ETP for experts). GPT-OSS's
experts carry biases (``expert_linear_bias``): gate and up biases split with their columns, the down
bias whole on every expert-TP rank (a row-parallel bias is added after the reduction).
:func:`mlp_ffn` reads the local FFN width back off the built parameters, for the op builders."""

from __future__ import annotations

from collections.abc import Mapping

from timeline.graph.context import BuildCtx
from timeline.graph.tensors import TensorDef, param


def mlp_params(ctx: BuildCtx, prefix: str, ffn: int, *, split: int, module: str = "mlp",
               expert: bool = False, in_moe: bool = False) -> list[TensorDef]:
    m, dt, h = ctx.model, ctx.dtype, ctx.model.hidden_size
    kw = {"module": module, "dtype": dt, "expert": expert, "in_moe": in_moe}
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


def mlp_down(params: Mapping[str, TensorDef], prefix: str) -> TensorDef | None:
    """The down projection (``down_proj`` or ``fc2``) of the MLP built under ``prefix``, if any."""
    return params.get(f"{prefix}.down_proj.weight") or params.get(f"{prefix}.fc2.weight")


def mlp_ffn(params: Mapping[str, TensorDef], prefix: str) -> int:
    """Local FFN width of the MLP built under ``prefix``: the columns its down projection reads."""
    down = mlp_down(params, prefix)
    if down is None:
        raise KeyError(f"no MLP parameters under {prefix!r}")
    return down.shape[1]
