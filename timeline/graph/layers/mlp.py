"""Dense feed-forward blocks: SwiGLU (gate, up, down) or GPT's GeLU MLP (fc1, fc2 with
biases). Column-parallel in, row-parallel out over ``split`` ranks (TP, or ETP for experts)."""

from __future__ import annotations

from timeline.graph.context import BuildCtx
from timeline.graph.tensors import TensorDef, param


def mlp_params(ctx: BuildCtx, prefix: str, ffn: int, *, split: int, module: str = "mlp",
               expert: bool = False) -> list[TensorDef]:
    m, dt, h = ctx.model, ctx.dtype, ctx.model.hidden_size
    kw = {"module": module, "dtype": dt, "expert": expert}
    if m.gated_mlp:
        return [
            param(f"{prefix}.gate_proj.weight", (ffn, h), split=split, **kw),
            param(f"{prefix}.up_proj.weight", (ffn, h), split=split, **kw),
            param(f"{prefix}.down_proj.weight", (h, ffn), split=split, dim=1, **kw),
        ]
    out = [param(f"{prefix}.fc1.weight", (ffn, h), split=split, **kw),
           param(f"{prefix}.fc2.weight", (h, ffn), split=split, dim=1, **kw)]
    if m.linear_bias:
        out += [param(f"{prefix}.fc1.bias", (ffn,), split=split, **kw),
                param(f"{prefix}.fc2.bias", (h,), **kw)]
    return out
