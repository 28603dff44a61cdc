"""A captured operator trace as plain data: what ``timeline capture`` records and the graph lowers.

One forward and backward of a PyTorch module, run once on fake tensors, as the ordered list of
aten ops it dispatched. Every storage is named by an integer id; an op lists the storages it
allocated (its new outputs), read, and those that died right after it. Storages that existed
before the capture (parameters, buffers, inputs, gradients) belong to no op. Decoder layers are
recorded with the storages that cross their boundary (hidden state in and out, and their
gradients), which is what lets the lowering repeat a captured layer.

This module holds data only: no torch, no file I/O (``timeline.io.trace_file`` reads and writes
it; ``timeline.capture`` records it; ``timeline.graph.trace.lowering`` turns it into templates).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from timeline.errors import UserError

#: bumped when a column is renamed or removed (added columns keep it)
TRACE_SCHEMA = "timeline.trace/1"

#: why a captured trace cannot be recomputed selectively (run-file check and lowering say the same)
NO_SELECTIVE = ("selective recompute names modules (core_attn, mlp, …) that a captured trace does not delimit; "
                "use policy = \"full\" (whole decoder layers) or \"none\", or capture a module that "
                "checkpoints those parts itself")


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceTensor:
    """One output tensor of an op (a view shares its storage with its base)."""

    storage: int
    shape: tuple[int, ...]
    dtype: str  # torch name without the prefix: "bfloat16", "float32", "int64", "bool"
    nbytes: int  # bytes of this tensor's elements (the storage may be larger)


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceOp:
    index: int
    name: str  # aten overload, e.g. "aten.mm.default"
    module: str  # deepest module path running it, e.g. "model.layers.0.mlp.up_proj" ("" outside modules)
    phase: str  # "F" forward (incl. loss) | "B" backward; whole steps add "O" (optimizer.step),
    #           "Z" (zero_grad) and "init" (building the model, optimizer and batch)
    layer: int  # decoder layer index, −1 outside decoder layers
    flops: float
    outputs: tuple[TraceTensor, ...]
    allocs: tuple[int, ...]  # storages this op created
    inputs: tuple[int, ...]  # storages it read (tensor arguments, in order, deduplicated)
    frees: tuple[int, ...]  # storages that died right after it
    saves: tuple[int, ...] = ()  # storages autograd saved for backward while running it
    step: int = 0  # whole-step captures: 0 while the --step function builds, then 1…K per step call


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceStorage:
    id: int
    nbytes: int
    kind: str  # op | param | buffer | grad | input | external
    alloc_op: int = -1  # op that created it (kind "op")
    free_op: int = -1  # op after which it died; −1: alive when the capture ended
    saved: bool = False  # autograd saved it during the forward (saved-tensor hooks)
    saved_by: str = ""  # module path of its first saver
    #: whole-step captures: what the storage is to the training loop, "param:NAME", "buffer:NAME",
    #: "grad:NAME" (a parameter's .grad), "state:NAME:KEY" (optimizer state), "" for the rest
    role: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceParam:
    name: str  # e.g. "model.layers.0.self_attn.q_proj.weight"
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    layer: int  # −1 outside decoder layers
    trainable: bool  # False for buffers
    storage: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceLayer:
    """A decoder layer's boundary storages (−1 where none was seen)."""

    index: int
    module: str
    hidden_in: int
    hidden_out: int
    grad_in: int = -1  # gradient w.r.t. hidden_in, made by this layer's backward
    grad_out: int = -1  # gradient w.r.t. hidden_out, this layer's backward consumes it


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class CapturedTrace:
    """One captured forward + backward. ``provenance`` holds versions, config and shapes."""

    ops: tuple[TraceOp, ...]
    storages: dict[int, TraceStorage]
    params: tuple[TraceParam, ...]
    layers: tuple[TraceLayer, ...]
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def is_step(self) -> bool:
        """A whole training step (``timeline capture --step``): init, then steps 1…K."""
        return self.provenance.get("kind") == "step"

    @property
    def num_steps(self) -> int:
        return int(self.provenance.get("steps", 0))

    @property
    def micro_batch_size(self) -> int:
        return int(self.provenance.get("micro_batch_size", 0))

    @property
    def seq_len(self) -> int:
        return int(self.provenance.get("seq_len", 0))


def check_one_stack(trace: CapturedTrace) -> None:
    """The lowering repeats one stack of decoder layers: every op tagged layer ``k`` must run in the captured
    layer ``k``'s module. A second stack of repeated blocks (T5's ``decoder.block.N`` beside
    ``encoder.block.N``, a vision tower's ``blocks.N`` beside ``model.layers.N``) tags its ops with the
    same indices; it cannot be placed, so it is refused in one line naming the module and op."""
    stack = {ly.index: ly.module for ly in trace.layers}
    for o in trace.ops:
        if o.layer < 0:
            continue
        home = stack.get(o.layer)
        if home is None or not (o.module == home or o.module.startswith(home + ".")):
            raise UserError(f"captured op {o.name} (#{o.index}) of module {o.module!r} belongs to a second stack of "
                            f"repeated blocks beside the decoder layers ({stack.get(0, '?')} …): the trace "
                            "lowering lays out one stack of layers; capture the whole training step instead "
                            "(timeline capture --step), which runs any module tree on one device")
