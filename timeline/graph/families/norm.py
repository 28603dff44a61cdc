"""RMSNorm (weight) and LayerNorm (weight and bias); replicated across TP.

Forward ops (:func:`forward`): the norm over the last dim, keeping its fp32 ``rsigma`` (and ``mu``) as extras.
"""

from __future__ import annotations

from timeline.graph.context import BuildCtx
from timeline.graph.families.common import NONE, Tags, rows, upcast
from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef, param


def params(ctx: BuildCtx, prefix: str, width: int, module: str = "norm",
           kind: str | None = None) -> list[TensorDef]:
    kind = kind or ctx.model.norm
    out = [param(f"{prefix}.weight", (width,), module=module, dtype=ctx.dtype)]
    if kind == "layernorm":
        out.append(param(f"{prefix}.bias", (width,), module=module, dtype=ctx.dtype))
    return out


def forward(b: Builder, name: str, x: TensorDef, layer: int | None, *, kind: str | None = None,
            rule: str | None = None, cols: int | None = None, groups: int = 1, tags: Tags = NONE,
            final: bool = False) -> TensorDef:
    """RMSNorm / LayerNorm over the last dim; extras rsigma (and mu) in fp32, one per row.

    ``cols`` normalises only the first ``cols`` columns of ``x`` (a split view of a wider tensor,
    which the norm then keeps alive whole); ``groups`` normalises each row in that many equal parts
    (a per-head norm: one rsigma per row and head). Under a table with ``upcast_fp32`` (HF's Python
    RMSNorm) a 16-bit input is first copied to fp32 by its own op, the norm reads the copy, and
    the 16-bit normalised tensor is an extra (fp32 where the model has ``norm_output_fp32``); a table with
    ``rmsnorm_ops`` (Megatron's legacy RMSNorm) does the same under its own rule, as does the model's last norm
    (``final``) under ``final_rmsnorm_ops`` (the legacy model's layers in TE modules, its final norm its own)."""
    kind = kind or b.model.norm
    torch_ops = b.table.rmsnorm_ops or (final and b.table.final_rmsnorm_ops)
    y = b.tensor(f"{name}.out", x.shape if cols is None else (rows(x), cols))
    extras = {"rsigma": b.tensor(f"{name}.rsigma", (rows(x) * groups,), "fp32")}
    if kind == "layernorm":
        extras["mu"] = b.tensor(f"{name}.mu", (rows(x) * groups,), "fp32")
    elif b.table.upcast_fp32 or torch_ops:  # normed: x·rsqrt, cast back before the weight — or
        # after it (GPT-OSS)
        extras["normed"] = b.tensor(f"{name}.normed", x.shape,
                                    "fp32" if b.table.model_code and b.model.norm_output_fp32 else None)
        if b.table.model_code and b.model.norm_weight_offset and kind == "rmsnorm":
            extras["weight_offset"] = b.tensor(f"{name}.weight_offset", (x.shape[-1] if cols is None else cols,),
                                               "fp32")
        x = upcast(b, f"{name}.upcast", x, layer, tags=tags)
    if rule is None and kind == "rmsnorm" and torch_ops:
        rule = "rmsnorm_ops"
    b.op(name, rule or kind, layer, {"x": x}, {"y": y}, extras=extras, flops=5.0 * y.shape[0] * y.shape[1],
         tags=tags)
    return y
