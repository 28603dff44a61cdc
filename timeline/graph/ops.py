"""Ops and per-chunk templates: what each op allocates, keeps for backward, and frees.

An :class:`Op` is one operator of a (chunk, phase) template. It allocates its output tensors
when it starts and frees the listed storages when it ends. A *template* is the ordered op
list of one phase of one virtual stage for one micro-batch: the simulator shifts it in time
and renames tensors per micro-batch; it never invents tensors of its own.

Categories (DESIGN §4): a forward output kept until the backward is ``activations``; one
re-created by recomputation is ``recompute``; transient forward intermediates, activation
gradients and workspaces are ``temporary``; collective buffers are ``comm``.

Phases: ``F`` forward; ``B`` full backward = ``I`` then ``W``; ``I`` input-gradient backward
(frees most saved tensors); ``W`` weight-gradient (frees what only weight gradients need,
e.g. GEMM inputs kept for dW). A full backward may run the I template then the W template, or
``ChunkTemplate.backward``, which interleaves each op's W right after its I.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from timeline.graph.tensors import TensorDef


@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    name: str  # e.g. "layers.7.self_attn.core_attn"
    module: str  # module path, e.g. "layers.7.self_attn"
    layer: int | None  # global decoder layer (MTP layers continue the numbering); None for embedding/head
    kind: str = "compute"  # compute | collective | p2p
    stream: str = "compute"  # compute | tp | ep | dp | pp  (communication streams)
    flops: float = 0.0
    bytes_moved: float = 0.0  # HBM traffic (compute) or bytes on the wire (communication)
    allocs: tuple[TensorDef, ...] = ()  # allocated when the op starts
    frees: tuple[str, ...] = ()  # storage ids released when the op ends
    recompute: bool = False  # re-executed forward work inside a backward


class OpCost(NamedTuple):
    """What an op's duration reads (:meth:`timeline.sim.cost.CostModel.op_us`), without its tensors:
    a probe's per-layer costs come from these (:func:`timeline.graph.analytic.analytic_costs`)."""

    layer: int | None
    kind: str
    stream: str
    flops: float
    bytes_moved: float

    @classmethod
    def of(cls, op: Op) -> OpCost:
        return cls(op.layer, op.kind, op.stream, op.flops, op.bytes_moved)


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedTensor:
    """One tensor a forward keeps for its backward: what ``--tensors`` lists per layer."""

    tensor: TensorDef
    op: str  # the (first) forward op that saves it; a checkpoint's kept input names the region
    layer: int  # -1 outside decoder layers
    source: str  # the saved-tensor rule's citation


@dataclass(frozen=True, slots=True)
class OffloadItem:
    """One saved tensor a group offloads: its storage; whether the reload is a copy beside a GPU original
    (else the storage itself moves: freed after forward op ``free_after`` and allocated again by the reload);
    the other groups of the chunk (indices) that saved it too — it moves only where all of them offload,
    else the GPU keeps it and this group's reload is a copy; the backward ops (indices into the fused
    backward) that read the reloaded tensor, in order. One item per autograd node that saved the tensor: each
    save is a tag of its own, copied to the host and reloaded apart (``tensor_push`` / ``tensor_pop``)."""

    storage: str
    copy: bool
    tag: int  # which of the tensor's saves (its autograd nodes) in the chunk: a copy's reload is named by it
    free_after: int
    partners: tuple[int, ...]
    needs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OffloadGroup:
    """One group of one decoder layer: its name, the forward op that starts it and the one after which it is
    committed, the backward op (index into the fused backward) after which its start's backward runs (a bulk
    reload: ``FineGrainedOffloadingGroupStartFunction.backward``), and what it offloads."""

    name: str
    layer: int
    start: int
    commit: int
    start_bwd: int
    items: tuple[OffloadItem, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkTemplate:
    """Op templates of one virtual stage for one micro-batch.

    Invariants (tested): every storage allocated in ``forward`` is freed either in ``forward``
    (transient) or in ``backward_i``/``backward_w`` (saved); every storage allocated in a
    backward template is freed in that same template or a later one (``backward_w``).
    """

    chunk: int
    forward: tuple[Op, ...]
    backward_i: tuple[Op, ...]
    backward_w: tuple[Op, ...]
    #: bytes one micro-batch's forward leaves saved until its backward, per global layer index
    #: (key -1: embedding, head, loss and anything outside decoder layers)
    layer_activation_bytes: dict[int, int] = field(default_factory=dict)
    #: a plain full backward ``B``: each op's W right after its I (same storages as I + W)
    backward: tuple[Op, ...] = ()
    #: every tensor the forward keeps for the backward, in forward order
    saved: tuple[SavedTensor, ...] = ()
    #: fine-grained activation offloading's groups (:class:`OffloadGroup`, :mod:`timeline.graph.offload`; forward op
    #: indices into ``forward``, backward ones into ``backward``), in the order their contexts start
    offload: tuple[OffloadGroup, ...] = ()

    @property
    def activation_bytes(self) -> int:
        return sum(self.layer_activation_bytes.values())
