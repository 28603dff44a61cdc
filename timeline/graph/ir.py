"""The forward IR the op builders write: forward ops over per-device tensors, before profiles.

A :class:`FOp` is one forward operator with named input, output and *extra* slots. Extras are
side tensors an implementation may keep for its backward (a dropout mask, an fp32 ``rsigma``,
flash attention's log-sum-exp); they exist only if the profile's saved-tensor table saves them.
*Scratch* slots are tensors only the op's backward allocates (a kernel's fp32 accumulators), freed
when that backward returns, if the table's rule names them.
Input slots whose name starts with ``_`` are references, not dataflow (e.g. ``_save``: the
sequence-parallel shard a column-parallel linear saves instead of its gathered input).

:class:`Builder` collects the ops of one chunk in forward order and knows the per-device token
counts (:class:`Dims`) and the chunk's parameter TensorDefs (``Builder.params``), off which
the op builders read every local width (heads, FFN columns, experts, vocabulary). This module
does not decide what is saved (``timeline.profiles``), what is recomputed
(``timeline.graph.recompute``) or how backward looks (``timeline.graph.backward``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from timeline.graph.context import BuildCtx
from timeline.graph.tensors import Category, TensorDef
from timeline.spec.run import ParallelSpec, TrainingSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Dims:
    """Per-device token counts: ``t_full`` rows inside TP regions, ``t_sp`` between them."""

    b: int
    s: int
    tp: int
    cp: int
    sp: bool
    ep: int
    etp: int
    dtype: str

    @property
    def s_local(self) -> int:
        return self.s // self.cp

    @property
    def t_full(self) -> int:
        return self.b * self.s // self.cp

    @property
    def t_sp(self) -> int:
        return self.t_full // self.tp if self.sp else self.t_full

    @classmethod
    def of(cls, parallel: ParallelSpec, training: TrainingSpec) -> Dims:
        """The token counts of a run with these parallel and training sections."""
        return cls(b=training.micro_batch_size, s=training.seq_len, tp=parallel.tp, cp=parallel.cp,
                   sp=parallel.sp and parallel.tp > 1, ep=parallel.ep, etp=parallel.etp, dtype=training.dtype)


@dataclass(slots=True, kw_only=True)
class FOp:
    name: str
    module: str
    layer: int | None
    rule: str  # key into the profile's saved-tensor table
    inputs: dict[str, TensorDef]
    outputs: dict[str, TensorDef]
    extras: dict[str, TensorDef] = field(default_factory=dict)
    kind: str = "compute"
    stream: str = "compute"
    flops: float = 0.0
    wflops: float = 0.0  # weight-gradient FLOPs; > 0 means the op has a W part
    tags: frozenset[str] = frozenset()  # recompute module names this op belongs to
    #: backward-only tensors with shapes of their own (a kernel's workspaces), which exist only if the
    #: profile's rule names them as ``backward_scratch`` (``"scratch:SLOT"``)
    scratch: dict[str, TensorDef] = field(default_factory=dict)
    #: storages of outputs the op writes into a persistent buffer the profile's workspaces hold (Megatron's
    #: GlobalMemoryBuffer): no allocation of their own, forward or in the weight gradient's re-gather
    buffered: frozenset[str] = frozenset()
    #: the op's weights take no gradient (a frozen module: LLaVA's --freeze-LM / --freeze-ViT): no weight-gradient
    #: part, and what its rule keeps only for one (``SaveRule.wgrad``) is not kept
    frozen: bool = False
    #: a frozen op that keeps what its rule keeps for the weight gradient anyway, until its input gradient (TE's
    #: LayerNormLinear before v1.6 keeps its norm output whatever the weight)
    frozen_keeps: bool = False
    #: nothing the op reads or holds takes a gradient: autograd records no node for it (it keeps nothing, has no
    #: backward, and its outputs take no gradient)
    no_grad: bool = False

    def dataflow_inputs(self) -> list[TensorDef]:
        return [t for k, t in self.inputs.items() if not k.startswith("_")]


class Builder:
    """Collects one chunk's forward ops; layer builders call :meth:`tensor` and :meth:`op`, and read
    the chunk's parameters (``params``: every parameter TensorDef the chunk's graph holds)."""

    def __init__(self, ctx: BuildCtx, dims: Dims, training: TrainingSpec, params: Iterable[TensorDef]) -> None:
        #: the run's training section (MoE routing: ``routing``, ``capacity_factor``, …)
        self.training = training
        self.model = ctx.model
        self.ctx = ctx
        #: the profile's op-structure switches (:class:`timeline.profiles.base.Structure`)
        self.table = ctx.structure
        #: the chunk's parameter TensorDefs by name (``layers.3.mlp.down_proj.weight``)
        self.params: dict[str, TensorDef] = {t.name: t for t in params}
        self.dims = dims
        self.ops: list[FOp] = []
        self._names: set[str] = set()
        #: tensors built once per chunk and read by every layer (HF RoPE ``cos``/``sin``)
        self.shared: dict[str, TensorDef] = {}

    def tensor(self, name: str, shape: tuple[int, ...], dtype: str | None = None, *,
               comm: bool = False) -> TensorDef:
        if name in self._names:
            raise ValueError(f"duplicate tensor name {name}")
        self._names.add(name)
        cat = Category.COMM if comm else Category.TEMPORARY
        module = name.rsplit(".", 1)[0]
        return TensorDef(name=name, shape=tuple(int(x) for x in shape), dtype=dtype or self.dims.dtype,
                         category=cat, module=module, storage=name)

    def op(self, name: str, rule: str, layer: int | None, inputs: dict[str, TensorDef],
           outputs: dict[str, TensorDef], *, extras: dict[str, TensorDef] | None = None, kind: str = "compute",
           stream: str = "compute", flops: float = 0.0, wflops: float = 0.0,
           tags: frozenset[str] | set[str] = frozenset(), scratch: dict[str, TensorDef] | None = None,
           buffered: frozenset[str] = frozenset()) -> FOp:
        module = name.rsplit(".", 1)[0] if "." in name else name
        op = FOp(name=name, module=module, layer=layer, rule=rule, inputs=inputs, outputs=outputs,
                 extras=extras or {}, kind=kind, stream=stream, flops=flops, wflops=wflops,
                 tags=frozenset(tags), scratch=scratch or {}, buffered=buffered)
        self.ops.append(op)
        return op
