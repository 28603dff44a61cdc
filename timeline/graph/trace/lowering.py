"""Lower a captured op trace (:class:`~timeline.spec.trace.CapturedTrace`) into chunk templates.

The capture holds the ops of a model with L decoder layers: a *pre* region (embedding, rotary
tables), the layers, and a *post* region (final norm, head, loss), each forward and backward.
A run with ``num_hidden_layers = N ≥ L`` takes run layer ``k`` from captured layer
``min(k, L − 1)``: the last captured layer repeats. Storages are renamed per run layer; the ones
that cross a layer boundary (hidden state in/out and their gradients, recorded at capture) are
joined to the neighbouring run layer's, and storages of the pre/post regions that layers read
(the rotary cos/sin) stay shared. A virtual stage (chunk) takes its layers' ops, plus the pre
region on the first chunk and the post region on the last; P2P ops receive the hidden state
(forward) or its gradient (backward) that another chunk made, and free what leaves the chunk.

Categories follow lifetimes: a forward allocation that lives into the backward is
``activations`` (autograd saved it), every other one ``temporary``; full recompute (rewritten by
:mod:`~timeline.graph.trace.recompute`) adds ``recompute``. Op timing, FLOPs and allocation order
are the capture's. ``backward`` is the captured backward; ``backward_i``/``backward_w`` split it
into input- and weight-gradient work (:mod:`~timeline.graph.trace.split`). Nothing here imports
torch or reads files; the trace rides on ``run.trace``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from timeline.errors import UserError
from timeline.graph.ops import ChunkTemplate, Op, SavedTensor
from timeline.graph.tensors import DTYPE_BYTES, Category, TensorDef
from timeline.graph.trace.collectives import comm_group, with_collectives
from timeline.graph.trace.recompute import Row, apply_full_recompute, recompute_groups
from timeline.graph.trace.shard import Sizer, tp_collectives
from timeline.graph.trace.split import split_frees, weight_grad_ops
from timeline.spec.run import RecomputeSpec
from timeline.spec.trace import CapturedTrace, TraceOp, check_one_stack
from timeline.spec.trace_shard import TraceShard

#: torch dtype names → TensorDef dtypes
DTYPES = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16", "int64": "int64", "int32": "int32",
          "int16": "int16", "uint8": "uint8", "bool": "bool"}


@dataclass(frozen=True, slots=True)
class Regions:
    """The captured ops split by region, and which region created each storage."""

    pre_f: tuple[TraceOp, ...]
    post_f: tuple[TraceOp, ...]
    post_b: tuple[TraceOp, ...]
    pre_b: tuple[TraceOp, ...]
    layer_f: dict[int, tuple[TraceOp, ...]]
    layer_b: dict[int, tuple[TraceOp, ...]]
    owner: dict[int, int | str]  # storage → "pre" | "post" | captured layer index


@lru_cache(maxsize=8)
def regions(trace: CapturedTrace) -> Regions:
    check_one_stack(trace)
    parts: dict[tuple[str, int | str], list[TraceOp]] = {}
    owner: dict[int, int | str] = {}
    for phase in ("F", "B"):
        ops = [o for o in trace.ops if o.phase == phase]
        in_layers = [i for i, o in enumerate(ops) if o.layer >= 0]
        first, last = (in_layers[0], in_layers[-1]) if in_layers else (len(ops), -1)
        current = -1
        for i, o in enumerate(ops):
            if o.layer >= 0:
                current = o.layer
            edge = "pre" if (i < first) == (phase == "F") else "post"
            key: int | str = o.layer if o.layer >= 0 else (current if first <= i <= last else edge)
            parts.setdefault((phase, key), []).append(o)
            for s in o.allocs:
                owner[s] = key
    layers = sorted({k for (_, k) in parts if isinstance(k, int)})
    return Regions(pre_f=tuple(parts.get(("F", "pre"), ())), post_f=tuple(parts.get(("F", "post"), ())),
                   post_b=tuple(parts.get(("B", "post"), ())), pre_b=tuple(parts.get(("B", "pre"), ())),
                   layer_f={c: tuple(parts.get(("F", c), ())) for c in layers},
                   layer_b={c: tuple(parts.get(("B", c), ())) for c in layers}, owner=owner)


class Namer:
    """Names a captured storage as seen from run layer ``k`` (or the "pre"/"post" regions)."""

    def __init__(self, trace: CapturedTrace, num_layers: int) -> None:
        self.trace, self.n, self.l_cap = trace, num_layers, len(trace.layers)
        self.owner = regions(trace).owner
        self.bound = {ly.index: ly for ly in trace.layers}

    def cap(self, k: int) -> int:
        return min(k, self.l_cap - 1)

    def name(self, s: int, k: int | str) -> str | None:
        """``k``: a run layer, or "pre"/"post" for the regions before and after the layers."""
        own = self.owner.get(s)
        if own is None:
            return None  # parameters, gradients, inputs: static or outside the device's activations
        if isinstance(k, str):
            if own in ("pre", "post"):
                return self.label(s)
            c = int(own)  # pre touches the first layers, post the last ones
            return self.name(s, c if k == "pre" else self.n - self.l_cap + c)
        c = self.cap(k)
        b = self.bound[c]
        if s == b.grad_out and own != c:
            return self.name(self.bound[self.cap(k + 1)].grad_in, k + 1) if k + 1 < self.n else self.name(s, "post")
        if s == b.hidden_in and own != c:
            return self.name(self.bound[self.cap(k - 1)].hidden_out, k - 1) if k > 0 else self.name(s, "pre")
        if own == c:
            return self.label(s, k)
        if own in ("pre", "post"):
            return self.label(s)
        for j in (k - 1, k + 1):
            if 0 <= j < self.n and self.cap(j) == own:
                return self.name(s, j)
        if self.n == self.l_cap:  # every layer captured: run layer = captured layer, shared state is fine
            return self.label(s, int(own))
        raise UserError(f"captured layer {c} reads storage {s} of layer {own}, which is not its hidden-state "
                        "input; layers that share state cannot be repeated — capture all layers instead "
                        f"(num_layers = {self.l_cap})")

    def label(self, s: int, k: int | None = None) -> str:
        """A storage's tensor name: the module path and op that made it, as run layer ``k`` (the captured
        layer's index renamed), and the storage id, which keeps names unique (``model.layers.3.mlp:mul#75``)."""
        a = self.trace.storages[s].alloc_op
        op = self.trace.ops[a] if a >= 0 else None
        module = (op.module if op is not None else "") or "model"
        short = op.name.removeprefix("aten.").split(".")[0] if op is not None else "tensor"
        if k is not None and (c := self.cap(k)) != k:
            renamed = _layer_module(module, c, k)
            module = renamed if renamed != module else f"{module}@{k}"  # a path without the layer index
        return f"{module}:{short}#{s}"


def _tensor(trace: CapturedTrace, op: TraceOp, s: int, name: str, module: str, cat: Category,
            sizer: Sizer | None = None, scale: int = 1) -> TensorDef:
    """``scale``: a collective's buffer holds ``scale`` ranks' shares (its cut dim × ``scale``)."""
    nbytes = trace.storages[s].nbytes
    out = next((t for t in op.outputs if t.storage == s), None)
    shape: tuple[int, ...] = (nbytes if sizer is None else sizer.nbytes(s, nbytes),)
    dtype = "uint8"
    if out is not None and out.dtype in DTYPES:
        n = 1
        for d in out.shape:
            n *= d
        if n * DTYPE_BYTES[DTYPES[out.dtype]] == nbytes:
            shape, dtype = (out.shape if sizer is None else sizer.shape(s, out.shape)), DTYPES[out.dtype]
    if scale > 1:
        dims = list(shape)
        ref = out.shape if out is not None and len(out.shape) == len(dims) else tuple(dims)
        cut = next((i for i, (a, b) in enumerate(zip(dims, ref, strict=True)) if a != b), 0)
        dims[cut] *= scale
        shape = tuple(dims)
    return TensorDef(name=name, shape=tuple(shape), dtype=dtype, category=cat, module=module, storage=name)


def _p2p(r: Row) -> bool:
    """A pipeline send/receive row (TP and expert-TP collectives are named "tp.…" / "etp.…")."""
    return isinstance(r.op, str) and not r.op.startswith(("tp.", "etp."))


def _layer_module(module: str, c: int, k: int) -> str:
    return module.replace(f"layers.{c}.", f"layers.{k}.").replace(f"layers.{c}", f"layers.{k}") if c != k else module


Placed = list[tuple[TraceOp, int | str]]


def chunk_op_lists(trace: CapturedTrace, num_layers: int, layers: range, first: bool,
                   last: bool) -> tuple[Placed, Placed]:
    """(forward, backward) captured ops of a chunk, each with the run layer it runs as ("pre"/"post")."""
    r = regions(trace)
    nm = Namer(trace, num_layers)
    fwd: Placed = [(o, "pre") for o in r.pre_f] if first else []
    bwd: Placed = [(o, "post") for o in r.post_b] if last else []
    for k in layers:
        fwd += [(o, k) for o in r.layer_f[nm.cap(k)]]
    for k in reversed(layers):
        bwd += [(o, k) for o in r.layer_b[nm.cap(k)]]
    if last:
        fwd += [(o, "post") for o in r.post_f]
    if first:
        bwd += [(o, "pre") for o in r.pre_b]
    return fwd, bwd


def trace_chunk_template(trace: CapturedTrace, chunk: int, ranges: list[range], *, num_layers: int,
                         recompute: RecomputeSpec, pp_rank: int, shard: TraceShard | None = None) -> ChunkTemplate:
    """The forward and backward op templates of virtual stage ``chunk`` (of ``ranges``) for one micro-batch
    of the traced model with ``num_layers`` decoder layers, under full or no ``recompute``.

    ``pp_rank`` picks the entry of a per-rank ``recompute.num_layers``; ``shard`` (TP/EP > 1) sizes every
    tensor and op for one rank (:mod:`~timeline.graph.trace.shard`).
    """
    nm = Namer(trace, num_layers)
    layers = ranges[chunk]
    first, last = chunk == 0, chunk == len(ranges) - 1
    fwd, bwd = chunk_op_lists(trace, num_layers, layers, first, last)
    recv_in = None if first else nm.name(nm.bound[nm.cap(layers.start)].hidden_in, layers.start)
    recv_grad = None if last else nm.name(nm.bound[nm.cap(layers.stop - 1)].grad_out, layers.stop - 1)
    rename = {x: y for x, y in ((recv_in, f"c{chunk}.recv_input"), (recv_grad, f"c{chunk}.recv_grad")) if x}

    def names(o: TraceOp, k: int | str, ids: tuple[int, ...]) -> list[tuple[int, str]]:
        out = []
        for s in ids:
            if not trace.storages[s].nbytes:
                continue  # empty outputs (flash attention's unused cum_seq/debug tensors) hold no memory
            n = nm.name(s, k)
            if n is not None:
                out.append((s, rename.get(n, n)))
        return out

    def row(ph: str, o: TraceOp, k: int | str) -> Row:
        return Row(phase=ph, op=o, k=k, allocs=names(o, k, o.allocs), frees=[n for _, n in names(o, k, o.frees)],
                   reads=[n for _, n in names(o, k, o.inputs)])

    rows: list[Row] = []
    if recv_in:
        hin = nm.bound[nm.cap(layers.start)].hidden_in
        rows.append(Row(phase="F", op="recv_forward", k="pp", allocs=[(hin, rename[recv_in])], frees=[]))
    rows += [row("F", o, k) for o, k in fwd]
    rows.append(Row(phase="F", op="send_forward", k="pp", allocs=[], frees=[]))
    if recv_grad:
        gout = nm.bound[nm.cap(layers.stop - 1)].grad_out
        rows.append(Row(phase="B", op="recv_backward", k="pp", allocs=[(gout, rename[recv_grad])], frees=[]))
    rows += [row("B", o, k) for o, k in bwd]
    rows.append(Row(phase="B", op="send_backward", k="pp", allocs=[], frees=[]))
    sizer = Sizer(trace, shard) if shard is not None and shard.sharded else None
    comm = [g for g, on in (("tp", sizer.shard.sp), ("etp", sizer.shard.etp > 1))
            if on] if sizer is not None else []
    if sizer is not None and comm:
        def name_of(s: int, k: int | str) -> str | None:
            n = nm.name(s, k)
            return rename.get(n, n) if n is not None else None

        rows = with_collectives(rows, tp_collectives(trace, sizer.shard.experts), comm, name_of,
                                weight_grad_ops(trace))

    inputs: dict[str, int] = {}
    recomputed: set[str] = set()
    groups = recompute_groups(recompute, layers, pp_rank)
    if groups:
        def hidden(k: int, key: str) -> str | None:  # None: not made on the device (a module input)
            b = nm.bound[nm.cap(k)]
            s = b.hidden_in if key == "in" else b.hidden_out
            n = nm.name(s, k) if s >= 0 else None
            return rename.get(n, n) if n is not None else None

        rows, inputs, recomputed = apply_full_recompute(
            rows, groups, lambda k: hidden(k, "in"), lambda k: hidden(k, "out"),
            lambda s: trace.storages[s].saved, lambda s: trace.storages[s].free_op < 0)
    return _template(trace, chunk, rows, inputs, recomputed, sizer)


def _template(trace: CapturedTrace, chunk: int, rows: list[Row], inputs: dict[str, int],
              recomputed: set[str], sizer: Sizer | None = None) -> ChunkTemplate:
    """Ops from rows: frees placed, categories from lifetimes, the backward split into I and W."""
    alloc_phase: dict[str, str] = {}
    freed_in: dict[str, str] = {}
    to_end: set[str] = set()  # alive when the capture ended (held by the autograd graph): to the end of B
    for r in rows:
        for s, n in r.allocs:
            alloc_phase.setdefault(n, r.phase)
            if trace.storages[s].free_op < 0 and not _p2p(r):
                to_end.add(n)
        for n in r.frees:
            if n in alloc_phase and n not in freed_in:
                freed_in[n] = r.phase
    # what the chunk makes but another chunk (or nobody) frees leaves with the P2P send
    end_f = [n for n, ph in alloc_phase.items() if ph == "F" and n not in freed_in and n not in to_end]
    end_b = [n for n, ph in alloc_phase.items() if n not in freed_in and (ph == "B" or n in to_end)]
    kept = {n for n, ph in alloc_phase.items() if ph == "F" and (freed_in.get(n) == "B" or n in end_b)}

    seen_free: set[str] = set()
    for r in rows:
        if r.op == "send_forward":
            r.frees = end_f
        elif r.op == "send_backward":
            r.frees = end_b
        r.frees = [n for n in dict.fromkeys(r.frees) if n in alloc_phase and n not in seen_free]
        seen_free.update(r.frees)
    b_rows = [r for r in rows if r.phase == "B"]
    wgrad = weight_grad_ops(trace)
    is_w = [r.w or (not r.recompute and not isinstance(r.op, str) and r.op.index in wgrad) for r in b_rows]
    split = split_frees(is_w, [[n for _, n in r.allocs] for r in b_rows], [r.reads for r in b_rows],
                        [r.frees for r in b_rows])

    saved: list[SavedTensor] = []
    per_layer: dict[int, int] = {}

    def make(r: Row, frees: list[str]) -> Op | None:
        p2p = _p2p(r)
        if p2p:
            module, layer, name, flops = "pp", None, str(r.op), 0.0
        elif isinstance(r.op, str):  # a TP collective around a GEMM of module r.module
            layer = r.k if isinstance(r.k, int) else None
            module = _layer_module(r.module, min(layer, len(trace.layers) - 1), layer) if layer is not None \
                else r.module
            name, flops = f"{module}:{r.op}", 0.0
        else:
            run_layer = r.k if isinstance(r.k, int) else None
            module = _layer_module(r.op.module, min(run_layer, len(trace.layers) - 1), run_layer) \
                if run_layer is not None else r.op.module
            name = f"{module}:{r.op.name.removeprefix('aten.')}" if module else r.op.name
            layer, flops = run_layer, r.op.flops
            if sizer is not None:
                flops = float(flops * sizer.flops_factor(r.op))
            if r.recompute:
                name += ".recompute"
        tensors = []
        for s, n in r.allocs:
            group = comm_group(n)
            cat = Category.ACTIVATIONS if n in kept else Category.COMM if group else (
                Category.RECOMPUTE if n in recomputed else Category.TEMPORARY)
            src = trace.ops[trace.storages[s].alloc_op] if isinstance(r.op, str) else r.op
            scale = 1 if sizer is None or not group else sizer.shard.tp if group == "tp" else sizer.shard.etp
            tensors.append(_tensor(trace, src, s, n, module or "model", cat, sizer, scale))
        if not tensors and not frees and not flops and not p2p:
            return None  # views, detaches and metadata ops move no memory and take no time
        coll = isinstance(r.op, str) and not p2p
        stream = "pp" if p2p else ("ep" if str(r.op).startswith("etp.") else "tp") if coll else "compute"
        return Op(name=name, module=module, layer=layer, kind="p2p" if p2p else "collective" if coll else "compute",
                  stream=stream, flops=flops,
                  bytes_moved=float(sum(t.size_bytes for t in tensors)), allocs=tuple(tensors),
                  frees=tuple(frees), recompute=r.recompute)

    forward = []
    for r in rows:
        if r.phase != "F":
            continue
        op = make(r, r.frees)
        if op is None:
            continue
        forward.append(op)
        for t in op.allocs:
            if t.storage in kept:
                key = inputs.get(t.storage, r.k if isinstance(r.k, int) else -1)
                label = f"checkpoint:full@{key}" if t.storage in inputs else op.name
                per_layer[key] = per_layer.get(key, 0) + t.size_bytes
                s = next(s for s, n in r.allocs if n == t.storage)
                saved.append(SavedTensor(tensor=t, op=label, layer=key,
                                         source=f"captured: {trace.storages[s].saved_by or 'checkpoint input'}"))
    fused = [op for r in b_rows if (op := make(r, r.frees)) is not None]
    side = {w: [op for r, f, rw in zip(b_rows, split, is_w, strict=True) if rw == w and (op := make(r, f))]
            for w in (False, True)}
    return ChunkTemplate(chunk=chunk, forward=tuple(forward), backward_i=tuple(side[False]),
                         backward_w=tuple(side[True]), layer_activation_bytes=per_layer,
                         backward=tuple(fused), saved=tuple(saved))
