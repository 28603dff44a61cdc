"""Derive a chunk's backward ops from its forward ops and the saved-tensor analysis.

Walking the forward ops in reverse: each op's input-gradient part (``I``) allocates the
gradients of its differentiable inputs (once per tensor, at its last forward consumer) and
reads the tensors its saver rule keeps (a rule computing the gradient in place,
``SaveRule.grad_in_place``, writes its input's gradient into its output's and allocates none);
its weight-gradient part (``W``, GEMMs only) reads the GEMM input kept for it and the output
gradient, which therefore lives until ``W``. Each
region's recompute ops run just before the backward of its anchor op, re-creating the
dropped tensors (category ``recompute``) and transient intermediates. Every storage is freed
by the last backward op that reads it. ``mode = "split"`` orders all I ops, then all W ops
(zero-bubble); ``"fused"`` runs each op's W right after its I (a plain ``B``).
Weight gradients accumulate into the persistent grads buffer; where the table says a GEMM's W
returns a fresh weight-sized tensor first (``wgrad_transient``), W allocates it and frees it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from timeline.graph.analysis import Analysis, differentiable
from timeline.graph.ir import FOp
from timeline.graph.ops import Op
from timeline.graph.plan_nodes import dw_group, node_keys
from timeline.graph.tensors import Category, TensorDef

HEAVY = frozenset({"flash_attn", "attn_scores", "attn_v"})
P2P_NAMES = {"recv_forward": "send_backward", "send_forward": "recv_backward"}


@dataclass(slots=True)
class Unit:
    phase: str  # I | W | R
    fop: FOp
    index: int
    allocs: list[TensorDef] = field(default_factory=list)
    needs: list[str] = field(default_factory=list)
    frees: list[str] = field(default_factory=list)


def rc_storage(s: str) -> str:
    return f"{s}@recompute"


def grad_of(t: TensorDef, source_dtype: str | None = None) -> TensorDef:
    """The gradient of ``t``; an FP8 tensor's is in ``source_dtype``, the dtype it was quantized from
    (TE's dgrad GEMM writes the activation dtype: ``timeline.graph.families.fp8``)."""
    cat = Category.COMM if t.category == Category.COMM else Category.TEMPORARY
    dtype = source_dtype if t.dtype == "fp8" and source_dtype else t.dtype
    return TensorDef(name=f"grad:{t.name}", shape=t.shape, dtype=dtype, category=cat, module=t.module,
                     storage=f"grad:{t.storage}")


def _source_dtype(a: Analysis, t: TensorDef) -> str | None:
    """The dtype of the first dataflow input of ``t``'s producer (None: no producer or no input)."""
    p = a.producer.get(t.storage)
    ins = a.ops[p].dataflow_inputs() if p is not None else []
    return ins[0].dtype if ins else None


def gather_unit(a: Analysis, r: int) -> Unit | None:
    """Region ``r``'s all-gather of its distributed input (``CheckpointFunction.backward``:
    ``gather_split_1d_tensor`` into a new whole buffer, the chunk released), before its recompute; None where the
    region keeps its input whole."""
    distributed = a.regions[r].distributed
    if distributed is None:
        return None
    whole, chunk = distributed
    d = a.producer[chunk.storage]
    gathered = replace(whole, name=f"{whole.name}@recompute", storage=rc_storage(whole.storage),
                       category=Category.RECOMPUTE)
    return Unit("R", a.ops[d], d, allocs=[gathered], needs=[chunk.storage])


def _recompute_units(a: Analysis, r: int) -> list[Unit]:
    reg = a.regions[r]
    members = set(reg.ops)
    gather = gather_unit(a, r)
    units = [] if gather is None else [gather]
    for i in reg.ops:
        op = a.ops[i]
        u = Unit("R", op, i)
        for t in op.inputs.values():
            p = a.producer.get(t.storage)
            if p in members or t.storage in a.dropped:
                if p in members and t.storage not in a.dropped and t.storage in a.savers:
                    u.needs.append(t.storage)  # kept output of this region (e.g. routing indices)
                else:
                    u.needs.append(rc_storage(t.storage))
            else:
                u.needs.append(t.storage)
        for t in (*op.outputs.values(), *op.extras.values()):
            s = t.storage
            if a.dropped.get(s) == r:
                u.allocs.append(replace(t, name=f"{t.name}@recompute", storage=rc_storage(s),
                                        category=Category.RECOMPUTE))
            elif s not in a.savers and any(c in members for c in a.consumers.get(s, ())):
                u.allocs.append(replace(t, name=f"{t.name}@recompute", storage=rc_storage(s),
                                        category=Category.TEMPORARY))
        units.append(u)
    return units


def _buffered(a: Analysis, t: TensorDef) -> bool:
    """Whether ``t`` lives in a persistent buffer (its producer's :attr:`FOp.buffered`), so the weight
    gradient's re-gather of it reuses that buffer instead of allocating."""
    p = a.producer.get(t.storage)
    return p is not None and t.storage in a.ops[p].buffered


def _resolve(a: Analysis, s: str) -> str:
    return rc_storage(s) if s in a.dropped else s


def _wgrad_transients(op: FOp, wgrad: str) -> list[TensorDef]:
    """The fresh weight gradients an op's W returns: a "linear" op's under ``wgrad`` ("all" | "head"),
    an embedding lookup's dense ones (its ``wgrad`` / ``pos_wgrad`` extras, where the table has them)."""
    emb = [op.extras[k] for k in ("wgrad", "pos_wgrad") if k in op.extras]  # temporaries, as built
    if emb:
        return emb
    one = _linear_wgrad(op, wgrad)
    return [] if one is None else [one]


def _linear_wgrad(op: FOp, wgrad: str) -> TensorDef | None:
    """The fresh weight gradient a "linear" op's W returns under ``wgrad`` ("all" | "head"); a plain
    ``torch.nn.Linear``'s ("torch_linear") always."""
    if op.rule != "torch_linear" and (op.rule not in ("linear", "fp8_linear") or wgrad == "none"
                                      or (wgrad == "head" and not op.name.endswith("output_layer"))):
        return None
    x = op.inputs.get("x")
    if x is None or len(x.shape) != 2:
        return None
    out = sum(t.shape[1] for t in op.outputs.values() if len(t.shape) == 2)
    # an FP8 GEMM input: TE's wgrad GEMM writes the activation dtype, the output's (module/linear.py)
    dtype = next(iter(op.outputs.values())).dtype if x.dtype == "fp8" else x.dtype
    return TensorDef(name=f"{op.name}.wgrad", shape=(out, x.shape[1]), dtype=dtype, category=Category.TEMPORARY,
                     module=x.module, storage=f"{op.name}.wgrad")


def split_sides(units: list[Unit], mode: str) -> tuple[list[Unit], list[Unit]]:
    """:func:`unit_list`'s units as the two sides of ``mode``: ``fused`` keeps each W right after its I
    (all on the I side); ``split`` moves every W, in order, to the W side."""
    if mode == "fused":
        return units, []
    return [u for u in units if u.phase != "W"], [u for u in units if u.phase == "W"]


def unit_list(a: Analysis, wgrad: str = "none") -> list[Unit]:
    """Every backward unit in fused order — walking the forward ops in reverse, each region's
    recompute before its anchor's input gradient, each W right after its I — with no frees placed
    (:func:`place_frees` places them per side)."""
    by_anchor: dict[int, list[int]] = defaultdict(list)
    for r in range(len(a.regions)):
        by_anchor[a.anchor[r]].append(r)
    need_i: dict[int, list[str]] = defaultdict(list)
    need_w: dict[int, list[str]] = defaultdict(list)
    for s, svs in a.savers.items():
        for sv in svs:
            if sv.region is not None:
                continue
            (need_w if sv.wgrad else need_i)[sv.op].append(_resolve(a, s))
    seen_grad: set[str] = set()
    alias: dict[str, str] = {}  # an input gradient computed in place -> the output gradient storage it is
    units: list[Unit] = []
    for i in reversed(range(len(a.ops))):
        op = a.ops[i]
        for r in sorted(by_anchor.get(i, []), key=lambda r: a.regions[r].ops[0]):
            units += _recompute_units(a, r)
        if op.no_grad:  # autograd recorded nothing of it (a frozen module on inputs that take no gradient)
            continue
        u = Unit("I", op, i, needs=list(need_i[i]))
        in_place = a.in_place.get(i)
        for t in op.dataflow_inputs():
            if differentiable(t) and t.storage not in seen_grad and t.storage not in a.no_grad:
                seen_grad.add(t.storage)
                if in_place is not None and in_place[0] == t.storage and _one_consumer(a, t.storage):
                    grad_out = f"grad:{in_place[1]}"
                    alias[f"grad:{t.storage}"] = alias.get(grad_out, grad_out)
                    continue
                src = a.tensors[t.storage]
                u.allocs.append(grad_of(src, _source_dtype(a, src) if src.dtype == "fp8" else None))
        for scratch in a.scratch.get(i, ()):  # freed by this unit, when its backward returns
            u.allocs.append(scratch)
            u.needs.append(scratch.storage)
        has_w = op.wflops > 0 and not op.frozen
        outs = [alias.get(f"grad:{t.storage}", f"grad:{t.storage}") for t in op.outputs.values()]
        if not has_w:
            u.needs += outs
        units.append(u)
        if has_w:
            w = Unit("W", op, i, needs=list(need_w[i]) + outs)
            x, save = op.inputs.get("x"), op.inputs.get("_save")
            if x is not None and save is not None and x.storage != save.storage and not _buffered(a, x):
                w.allocs.append(replace(x, name=f"{op.name}.wgrad_input", storage=f"{op.name}.wgrad_input",
                                        category=Category.COMM))
            for fresh in _wgrad_transients(op, wgrad):  # freed by this unit once added into the grads buffer
                w.allocs.append(fresh)
                w.needs.append(fresh.storage)
            units.append(w)
    return units


def delay_wgrads(units: list[Unit], ops: Sequence[FOp]) -> list[Unit]:
    """``units`` (fused order) under Megatron's ``--delay-wgrad-compute``: each decoder layer's deferred weight
    gradients (:func:`timeline.graph.plan_nodes.dw_group`) move to their node's ``backward_dw`` —
    the ``mlp`` node's right after that node's backward, the ``attn`` node's right after the layer's attention
    backward, and the last layer the backward reaches keeps its ``attn`` ones to the chunk's end, after every
    decoder layer (``model_chunk_schedule_plan.py: TransformerLayerSchedulePlan.run`` /
    ``TransformerModelChunkSchedulePlan.run``, core_v0.14.0 … d98e8a64dd). Their inputs and output gradients
    live until then (:func:`place_frees`)."""
    keys = node_keys([o.name for o in ops], [o.stream for o in ops], [-1 if o.layer is None else o.layer for o in ops])
    groups: dict[tuple[int, str], list[Unit]] = {}
    rest: list[Unit] = []
    for u in units:
        layer, node = keys[u.index]
        group = dw_group(u.fop.name, layer, node) if u.phase == "W" else None
        if group is None:
            rest.append(u)
        else:
            groups.setdefault((layer, group), []).append(u)
    if not groups:
        return units
    last: dict[tuple[int, str], int] = {}
    for i, u in enumerate(rest):
        last[keys[u.index]] = i
    decoder = [i for i, u in enumerate(rest) if keys[u.index][0] >= 0]
    final_layer = keys[rest[decoder[-1]].index][0] if decoder else None
    after: dict[int, list[Unit]] = {}
    for (layer, group), moved in groups.items():
        node = "mlp" if group == "mlp_dw" else "attn"
        if group == "attn_dw" and layer == final_layer:
            at = decoder[-1]
        else:
            at = last.get((layer, node), last.get((layer, "attn"), decoder[-1] if decoder else len(rest) - 1))
        after.setdefault(at, []).extend(moved)
    position = {id(u): k for k, u in enumerate(units)}
    out: list[Unit] = []
    for i, u in enumerate(rest):
        out.append(u)
        out += sorted(after.get(i, []), key=lambda w: position[id(w)])
    return out


def _one_consumer(a: Analysis, storage: str) -> bool:
    """Whether one forward op alone reads ``storage``: only then is its gradient the one output gradient an
    in-place backward rewrites (a second reader would add into it)."""
    return len(set(a.consumers.get(storage, ()))) == 1


def place_frees(units: list[Unit]) -> None:
    """Each storage the ``units`` (one side after the other) allocate or read is freed by the last
    unit that reads it; an output gradient no unit made is never freed. Replaces earlier frees."""
    for u in units:
        u.frees = []
    last: dict[str, int] = {}
    allocated: set[str] = set()
    for k, u in enumerate(units):
        for t in u.allocs:
            allocated.add(t.storage)
            last.setdefault(t.storage, k)
        for s in u.needs:
            last[s] = k
    for s, k in last.items():
        if s.startswith("grad:") and s not in allocated:
            continue  # an output gradient nobody produced (e.g. of an integer tensor)
        units[k].frees.append(s)


def unit_cost(u: Unit) -> tuple[str, float, int]:
    """A unit's op name, FLOPs and bytes moved (what :func:`to_op` records)."""
    f = u.fop
    if u.phase == "R":
        name, flops = f"{f.name}.recompute", f.flops
    elif u.phase == "W":
        name, flops = f"{f.name}.wgrad", f.wflops
    else:
        name = P2P_NAMES.get(f.name, f.name)
        flops = f.flops * (2.0 if f.rule in HEAVY else 1.0)
    moved = sum(t.size_bytes for t in u.allocs) + sum(t.size_bytes for t in f.inputs.values())
    return name, flops, moved


def to_op(u: Unit) -> Op:
    f = u.fop
    name, flops, moved = unit_cost(u)
    return Op(name=name, module=f.module, layer=f.layer, kind=f.kind, stream=f.stream, flops=flops,
              bytes_moved=float(moved), allocs=tuple(u.allocs), frees=tuple(dict.fromkeys(u.frees)),
              recompute=u.phase == "R")
