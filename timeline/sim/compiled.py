"""Per-(chunk, phase) templates compiled to numpy arrays, ready to be shifted in time.

A phase's ops run back to back; op ``k`` allocates its outputs at its start and frees its
storages at its end, and at equal times the frees of op ``k`` come before the allocations of
op ``k + 1`` (PyTorch releases an op's dead inputs before the next op allocates). The arrays
hold, per memory event: time offset from the action start, +1/−1, bytes, category code,
tensor-name index and op index. This module does not run a schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from timeline.graph.ops import OffloadGroup, Op
from timeline.graph.tensors import CATEGORIES
from timeline.sim.cost import CostModel

CAT_CODE = {c: i for i, c in enumerate(CATEGORIES)}


@dataclass(frozen=True, slots=True)
class OffloadedTensor:
    """A :class:`timeline.graph.offload.OffloadItem` in a compiled forward phase's indices: ``tensor`` into its
    ``tensor_names``, ``free_op`` into its ops; ``needs`` into the chunk's full-backward (``B``) phase's ops;
    ``partners`` into the phase's ``offload`` groups; ``size`` bytes and ``cat`` code of a reload."""

    tensor: int
    size: int
    cat: int
    copy: bool
    tag: int
    free_op: int
    partners: tuple[int, ...]
    needs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OffloadedGroup:
    """A :class:`timeline.graph.offload.OffloadGroup` in compiled indices: ``start`` and ``commit`` into the
    forward phase's ops, ``start_bwd`` into the full-backward phase's."""

    name: str
    start: int
    commit: int
    start_bwd: int
    items: tuple[OffloadedTensor, ...]


@dataclass(frozen=True, slots=True)
class CompiledPhase:
    duration_us: float
    # ops
    op_names: tuple[str, ...]
    op_streams: tuple[str, ...]
    op_layers: tuple[int, ...]  # -1 where the op belongs to no decoder layer
    op_recompute: tuple[bool, ...]
    op_flops: np.ndarray  # float64
    op_start: np.ndarray  # float64, µs from the action start
    op_end: np.ndarray
    # memory events
    ev_offset: np.ndarray  # float64
    ev_sign: np.ndarray  # int8: +1 alloc, -1 free
    ev_size: np.ndarray  # int64 requested bytes
    ev_cat: np.ndarray  # int8 category code
    ev_tensor: np.ndarray  # int32 index into tensor_names
    ev_op: np.ndarray  # int32 index into op_names
    tensor_names: tuple[str, ...]
    #: a forward phase's fine-grained activation offloading groups (:func:`offloaded_groups`)
    offload: tuple[OffloadedGroup, ...] = ()


def compile_phase(ops: tuple[Op, ...] | list[Op], cost: CostModel,
                  sizes: dict[str, tuple[int, int]] | None = None) -> CompiledPhase:
    """Lay ``ops`` end to end. ``sizes`` maps storage id → (bytes, category code) for storages
    this phase frees but an earlier phase allocated; it is updated with this phase's allocations."""
    sizes = {} if sizes is None else sizes
    names: list[str] = []
    index: dict[str, int] = {}

    def tensor_index(name: str) -> int:
        if name not in index:
            index[name] = len(names)
            names.append(name)
        return index[name]

    starts, ends = [], []
    offs, signs, szs, cats, tens, opi = [], [], [], [], [], []
    t = 0.0
    for k, op in enumerate(ops):
        d = cost.op_us(op)
        starts.append(t)
        for td in op.allocs:
            sizes[td.storage] = (td.size_bytes, CAT_CODE[td.category])
            offs.append(t); signs.append(1); szs.append(td.size_bytes)  # noqa: E702
            cats.append(CAT_CODE[td.category]); tens.append(tensor_index(td.storage)); opi.append(k)  # noqa: E702
        t += d
        ends.append(t)
        for storage in op.frees:
            size, cat = sizes[storage]
            offs.append(t); signs.append(-1); szs.append(size)  # noqa: E702
            cats.append(cat); tens.append(tensor_index(storage)); opi.append(k)  # noqa: E702
    return CompiledPhase(
        duration_us=t,
        op_names=tuple(op.name for op in ops),
        op_streams=tuple(op.stream for op in ops),
        op_layers=tuple(-1 if op.layer is None else op.layer for op in ops),
        op_recompute=tuple(op.recompute for op in ops),
        op_flops=np.array([op.flops for op in ops], dtype=np.float64),
        op_start=np.array(starts, dtype=np.float64),
        op_end=np.array(ends, dtype=np.float64),
        ev_offset=np.array(offs, dtype=np.float64),
        ev_sign=np.array(signs, dtype=np.int8),
        ev_size=np.array(szs, dtype=np.int64),
        ev_cat=np.array(cats, dtype=np.int8),
        ev_tensor=np.array(tens, dtype=np.int32),
        ev_op=np.array(opi, dtype=np.int32),
        tensor_names=tuple(names),
    )


def offloaded_groups(groups: tuple[OffloadGroup, ...], forward: tuple[Op, ...] | list[Op],
                     ph: CompiledPhase) -> tuple[OffloadedGroup, ...]:
    """``groups`` (a template's offload groups over its ops ``forward``) in the
    indices of ``ph``, the template's compiled forward phase; an item whose storage the phase never allocates
    (none is known) is left out."""
    defs = {td.storage: td for op in forward for td in op.allocs}
    index = {name: k for k, name in enumerate(ph.tensor_names)}
    out = []
    for g in groups:
        items = tuple(OffloadedTensor(tensor=index[it.storage], size=defs[it.storage].size_bytes,
                                      cat=CAT_CODE[defs[it.storage].category], copy=it.copy, tag=it.tag,
                                      free_op=it.free_after,
                                      partners=it.partners, needs=it.needs)
                      for it in g.items if it.storage in index and it.storage in defs)
        out.append(OffloadedGroup(name=g.name, start=g.start, commit=g.commit, start_bwd=g.start_bwd, items=items))
    return tuple(out)
