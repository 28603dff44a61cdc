"""Which forward tensors are saved, by whom, and which recompute regions drop and re-create.

Reads the forward ops of a chunk, the profile's saved-tensor table and the recompute regions,
and answers: the storages kept from forward to backward (``activations``) with the op and layer
they are attributed to, the storages each region drops, the backward needs of every op
(input-gradient or weight-gradient), and where each region's recompute runs (its *anchor*: the
last forward op whose backward needs something the region dropped). Builds no ops itself.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

from timeline.graph.ir import FOp
from timeline.graph.recompute import Region
from timeline.graph.tensors import Category, TensorDef
from timeline.profiles.base import SaveRules

NON_DIFF = frozenset({"int64", "int32", "int16", "uint8", "bool"})


@dataclass(slots=True)
class Saver:
    op: int  # forward op index (the region's first op for a checkpoint input)
    wgrad: bool  # only the weight gradient reads it
    keep: bool = False  # kept even inside a recomputed region
    source: str = ""
    region: int | None = None  # set for a checkpoint's kept input


@dataclass(slots=True)
class Analysis:
    ops: list[FOp]
    regions: list[Region]
    tensors: dict[str, TensorDef] = field(default_factory=dict)  # storage -> tensor
    producer: dict[str, int] = field(default_factory=dict)
    consumers: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    savers: dict[str, list[Saver]] = field(default_factory=lambda: defaultdict(list))
    dropped: dict[str, int] = field(default_factory=dict)  # storage -> region index
    no_grad: set[str] = field(default_factory=set)  # storages made by ops autograd records nothing of (FOp.no_grad)
    anchor: dict[int, int] = field(default_factory=dict)  # region index -> forward op index
    region_of: dict[int, int] = field(default_factory=dict)  # op index -> region index
    scratch: dict[int, list[TensorDef]] = field(default_factory=dict)  # op index -> its backward's scratch
    #: op index -> (input storage, output storage): the backward writes the input's gradient into the output
    #: gradient (SaveRule.grad_in_place)
    in_place: dict[int, tuple[str, str]] = field(default_factory=dict)

    @property
    def kept(self) -> list[str]:
        """Storages saved from forward to backward, in forward order of their first saver."""
        keys = [s for s in self.savers if s not in self.dropped]
        return sorted(keys, key=lambda s: (self.savers[s][0].op, self.producer.get(s, -1), s))


def _slot(op: FOp, slot: str) -> TensorDef | None:
    """The tensor a rule's ``"in:KEY"`` / ``"out:KEY"`` / ``"extra:KEY"`` / ``"scratch:KEY"`` names on ``op``."""
    where, key = slot.split(":")
    return {"in": op.inputs, "out": op.outputs, "extra": op.extras, "scratch": op.scratch}[where].get(key)


def _slots(op: FOp, slot: str) -> list[TensorDef]:
    """The tensors ``slot`` names on ``op``: one (or none) for ``"extra:KEY"``; for ``"extra:KEY*"`` every
    one whose key starts with ``KEY``, in the op's order (a per-step list whose length the op builder set)."""
    if not slot.endswith("*"):
        t = _slot(op, slot)
        return [] if t is None else [t]
    where, prefix = slot[:-1].split(":")
    table = {"in": op.inputs, "out": op.outputs, "extra": op.extras, "scratch": op.scratch}[where]
    return [t for k, t in table.items() if k.startswith(prefix)]


def analyse(ops: list[FOp], table: SaveRules, regions: list[Region]) -> Analysis:
    a = Analysis(ops=ops, regions=regions)
    for i, op in enumerate(ops):
        for t in op.inputs.values():
            a.consumers[t.storage].append(i)
            a.tensors.setdefault(t.storage, t)
        for t in (*op.outputs.values(), *op.extras.values()):
            a.producer[t.storage] = i
            a.tensors[t.storage] = t
            if op.no_grad:
                a.no_grad.add(t.storage)
        rule = table.rule(op.rule)
        if op.no_grad:  # no autograd node: nothing kept, no backward
            continue
        for slot in rule.saves:
            if op.frozen and slot in rule.wgrad and not op.frozen_keeps:  # only for a weight gradient it has not
                continue
            for slot_t in _slots(op, slot):
                a.savers[slot_t.storage].append(Saver(op=i, wgrad=slot in rule.wgrad and op.wflops > 0 and not op.frozen,
                                                 keep=slot in rule.keep_under_recompute, source=rule.source))
        if rule.grad_in_place:
            src, dst = (_slot(op, slot) for slot in rule.grad_in_place)
            if src is not None and dst is not None and src.shape == dst.shape and src.dtype == dst.dtype:
                a.in_place[i] = (src.storage, dst.storage)
        for slot in rule.backward_scratch:
            like = _slot(op, slot)
            if like is not None:
                name = f"{op.name}.backward_scratch.{slot.split(':')[1]}"
                a.scratch.setdefault(i, []).append(replace(like, name=name, storage=name, category=Category.TEMPORARY))
    for r, reg in enumerate(regions):
        members = set(reg.ops)
        for i in reg.ops:
            a.region_of[i] = r
        for s, sv in a.savers.items():
            p = a.producer.get(s)
            if p in members and not any(x.keep for x in sv) and \
                    (reg.discard_output or all(x.op in members for x in sv)):
                a.dropped[s] = r
    for r, reg in enumerate(regions):  # a checkpoint keeps its inputs (unless another region re-creates them)
        members = set(reg.ops)
        if reg.distributed is not None:  # it keeps a 1/tp chunk of its input instead; the gather re-creates it
            whole, chunk = reg.distributed
            a.dropped[whole.storage] = r
            a.savers[chunk.storage].append(Saver(op=a.producer[chunk.storage], wgrad=False, region=r, source=(
                "distributed checkpoint input (megatron/core/tensor_parallel/random.py: CheckpointFunction, "
                "split_tensor_into_1d_equal_chunks)")))
        for i in reg.ops:
            for t in ops[i].inputs.values():
                p = a.producer.get(t.storage)
                if p not in members and t.storage not in a.dropped and \
                        not any(x.region == r for x in a.savers.get(t.storage, ())):
                    # a tensor built once for all layers (op tagged "shared", e.g. RoPE cos/sin) is
                    # attributed to its producer, not to the first checkpoint that keeps it
                    at = p if p is not None and "shared" in ops[p].tags else reg.ops[0]
                    a.savers[t.storage].append(Saver(op=at, wgrad=False, region=r,
                                                     source="checkpoint input (megatron/core/tensor_parallel/random.py)"))
    for s in a.savers:
        a.savers[s].sort(key=lambda x: x.op)
    _anchors(a)
    return a


def _anchors(a: Analysis) -> None:
    for r, reg in enumerate(a.regions):
        needs = [x.op for s, rr in a.dropped.items() if rr == r for x in a.savers[s]]
        a.anchor[r] = max([*reg.ops, *needs])
    changed = True
    while changed:  # a region whose recompute consumes another's dropped tensors needs that one first
        changed = False
        for s, r in a.dropped.items():
            for c in a.consumers.get(s, ()):
                r2 = a.region_of.get(c)
                if r2 is not None and r2 != r and a.anchor[r2] > a.anchor[r]:
                    a.anchor[r] = a.anchor[r2]
                    changed = True


def differentiable(t: TensorDef) -> bool:
    return t.dtype not in NON_DIFF
