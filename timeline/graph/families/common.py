"""Shared op builders of the layer families: linears, TP/SP collectives, dropout and residual adds.

A column-parallel linear under sequence parallelism all-gathers its input (a ``comm`` buffer)
and saves the local shard (``_save``); a row-parallel linear's output is reduce-scattered (SP)
or all-reduced in place (TP only). This module does not know which profile saves what.
"""

from __future__ import annotations

from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef

Tags = frozenset[str]
NONE: Tags = frozenset()


def rows(t: TensorDef) -> int:
    return t.shape[0]


def upcast(b: Builder, name: str, x: TensorDef, layer: int | None, *, tags: Tags = NONE) -> TensorDef:
    """``x.to(torch.float32)``: a copy op for a 16-bit ``x``, the tensor itself when already fp32."""
    if x.dtype == "fp32":
        return x
    y = b.tensor(f"{name}.out", x.shape, "fp32")
    b.op(name, "upcast", layer, {"x": x}, {"y": y}, tags=tags)
    return y


def all_gather(b: Builder, name: str, x: TensorDef, layer: int | None, group: int, *, stream: str = "tp",
               tags: Tags = NONE, buffered: bool = False) -> TensorDef:
    """Sequence all-gather over ``group`` ranks (no-op for a group of one); ``buffered``: into a
    persistent buffer (no allocation: :attr:`~timeline.graph.ir.FOp.buffered`)."""
    if group == 1:
        return x
    y = b.tensor(f"{name}.gathered", (rows(x) * group, *x.shape[1:]), x.dtype, comm=True)
    b.op(f"{name}.all_gather", "comm", layer, {"x": x}, {"y": y}, kind="collective", stream=stream, tags=tags,
         buffered=frozenset({y.storage}) if buffered else frozenset())
    return y


def sp_gather(b: Builder, name: str, x: TensorDef, layer: int | None, tags: Tags = NONE, *,
              buffered: bool = False) -> TensorDef:
    return all_gather(b, name, x, layer, b.dims.tp if b.dims.sp else 1, tags=tags, buffered=buffered)


def linear(b: Builder, name: str, x: TensorDef, out_cols: int, layer: int | None, *, save: TensorDef | None = None,
           out_name: str = "out", comm_out: bool = False, rule: str = "linear", out_dtype: str | None = None,
           tags: Tags = NONE, refs: dict[str, TensorDef] | None = None) -> TensorDef:
    """``y = x·Wᵀ`` (in ``out_dtype``, default the activations'); saves ``save`` (default: ``x``) for the
    weight gradient. ``refs`` (keys starting with ``_``) are tensors the caller still holds while the
    linear runs: references, not dataflow, that end no earlier than this op."""
    y = b.tensor(f"{name}.{out_name}", (rows(x), out_cols), out_dtype, comm=comm_out)
    f = 2.0 * rows(x) * x.shape[1] * out_cols
    b.op(name, rule, layer, {"x": x, "_save": save or x, **(refs or {})}, {"y": y}, flops=f, wflops=f, tags=tags)
    return y


def column_linear(b: Builder, name: str, x: TensorDef, out_cols: int, layer: int | None, *,
                  tags: Tags = NONE, buffered: bool = False, refs: dict[str, TensorDef] | None = None) -> TensorDef:
    """Column-parallel linear: SP all-gather of ``x`` (into a persistent buffer when ``buffered``),
    local shard saved; ``refs`` as :func:`linear`'s."""
    full = sp_gather(b, name, x, layer, tags, buffered=buffered)
    return linear(b, name, full, out_cols, layer, save=x, tags=tags, refs=refs)


def row_linear(b: Builder, name: str, x: TensorDef, out_cols: int, layer: int | None, *,
               tags: Tags = NONE, refs: dict[str, TensorDef] | None = None) -> TensorDef:
    """Row-parallel linear: reduce-scatter (SP) or all-reduce (TP) of the partial sums; ``refs`` as
    :func:`linear`'s."""
    d = b.dims
    if d.tp > 1 and d.sp:
        y = linear(b, name, x, out_cols, layer, out_name="partial", comm_out=True, tags=tags, refs=refs)
        out = b.tensor(f"{name}.out", (rows(y) // d.tp, out_cols))
        b.op(f"{name}.reduce_scatter", "comm", layer, {"x": y}, {"y": out}, kind="collective", stream="tp",
             tags=tags)
        return out
    y = linear(b, name, x, out_cols, layer, tags=tags, refs=refs)
    if d.tp > 1:
        b.op(f"{name}.all_reduce", "comm", layer, {"x": y}, {}, kind="collective", stream="tp", tags=tags)
    return y


def dropout(b: Builder, name: str, x: TensorDef, layer: int | None, *, rule: str = "dropout",
            tags: Tags = NONE, refs: dict[str, TensorDef] | None = None) -> TensorDef:
    """Dropout with a 1-byte mask, where the profile has dropout (or, under ``model_code`` for a
    model with ``residual_dropout``, where its ``hidden_dropout`` > 0); otherwise the identity.
    ``refs`` as :func:`linear`'s (a bias the fused bias-dropout-add reads)."""
    m = b.model
    from_model = (b.table.model_code and m.residual_dropout) or b.table.model_dropout
    if not (b.table.dropout or (from_model and m.hidden_dropout > 0)):
        return x
    y = b.tensor(f"{name}.out", x.shape)
    b.op(name, rule, layer, {"x": x, **(refs or {})}, {"y": y},
         extras={"mask": b.tensor(f"{name}.mask", x.shape, "uint8")}, flops=float(x.shape[0] * x.shape[1]), tags=tags)
    return y


def add(b: Builder, name: str, x: TensorDef, residual: TensorDef, layer: int | None, *, out: str | None = None,
        tags: Tags = NONE, refs: dict[str, TensorDef] | None = None) -> TensorDef:
    """``x + residual``; ``refs`` as :func:`linear`'s."""
    y = b.tensor(out or f"{name}.out", x.shape)
    b.op(name, "add", layer, {"x": x, "residual": residual, **(refs or {})}, {"y": y},
         flops=float(x.shape[0] * x.shape[1]), tags=tags)
    return y
