"""RMSNorm (weight) and LayerNorm (weight and bias); replicated across TP."""

from __future__ import annotations

from timeline.graph.context import BuildCtx
from timeline.graph.tensors import TensorDef, param


def norm_params(ctx: BuildCtx, prefix: str, width: int, module: str = "norm",
                kind: str | None = None) -> list[TensorDef]:
    kind = kind or ctx.model.norm
    out = [param(f"{prefix}.weight", (width,), module=module, dtype=ctx.dtype)]
    if kind == "layernorm":
        out.append(param(f"{prefix}.bias", (width,), module=module, dtype=ctx.dtype))
    return out
