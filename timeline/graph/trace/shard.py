"""The captured activations of a trace sized for one TP/EP rank: a sharding kind per storage.

Each storage an op allocates gets a kind by dataflow, in capture order, from the parameters'
rules (:mod:`timeline.spec.trace_shard`) and Megatron's tensor-parallel layers:

- ``C`` (per head or per FFN column, ``1/tp``): the output of a column-parallel GEMM in the
  forward (``ColumnParallelLinear``: q/k/v, gate/up) and the input gradient of a row-parallel one
  in the backward (``RowParallelLinear`` takes its input split by columns);
- ``R`` (``[s, b, h]`` token rows, ``1/tp`` under SP, whole without): the output of a row-parallel
  GEMM (all-reduced, or reduce-scattered under SP), of the vocabulary-parallel embedding, and the
  input gradient of a column-parallel GEMM; routed expert rows are ``R`` too: each EP rank
  receives ``T·top_k`` rows of ``T = b·s/tp`` tokens under SP (``b·s`` without), balanced routing
  (:mod:`timeline.graph.families.moe`), and the captured single-device experts saw ``b·s·top_k``;
- ``V`` (logits, ``[…, V]`` → ``[…, padded V / tp]``): the output layer's, and what the loss
  derives from them while the vocabulary dim stays; ``T`` (tokens, whole): what the loss reduces
  over the vocabulary (Megatron's ``_VocabParallelCrossEntropy`` all-reduces per-token max and sum);
- ``W:name`` (a weight gradient: the parameter's local share): a storage accumulated into a
  parameter's ``.grad`` (or cast into it);
- ``N`` (unchanged): the rest — rotary tables, RNG state, per-expert counts, scalars.

Other ops take the widest kind of their inputs (``V`` > ``C`` > ``R`` > ``T`` > ``N``); an output
of ``C`` or ``R`` whose element count is not a multiple of the captured tokens ``b·s`` carries no
split dim and stays ``N``; an op of a decoder layer with no sized inputs whose output is a multiple
of ``b·s`` (an ``arange`` over the routed rows) is ``R``. Which tensors autograd saves, their dtypes
and lifetimes stay as captured; only sizes change. Nothing here imports torch.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache

from timeline.graph.trace.split import MOVES
from timeline.spec.trace import CapturedTrace, TraceOp
from timeline.spec.trace_shard import TraceShard, expert_part, local_shape, param_role

#: ops whose output is a matrix product of a parameter (or a lookup in one)
GEMMS = frozenset({"mm", "addmm", "bmm", "matmul", "linear", "_grouped_mm", "baddbmm", "embedding"})
_ORDER = {"V": 5, "C": 4, "X": 3, "R": 2, "T": 1, "N": 0}
#: parameter role → kind of a GEMM's output: (forward, backward); experts by their part (fc1 / fc2)
_GEMM_KIND = {"column": ("C", "R"), "row": ("R", "C"), "vocab": ("R", "R"), "expert_column": ("X", "R"),
              "expert_row": ("R", "X")}


def _base(name: str) -> str:
    return name.removeprefix("aten.").split(".")[0]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _grad_params(trace: CapturedTrace) -> dict[int, str]:
    """Gradient storage → parameter name: the capture registers ``.grad`` in ``model.parameters()`` order."""
    grads = sorted(s for s, st in trace.storages.items() if st.kind == "grad")
    trainable = [p.name for p in trace.params if p.trainable]
    return dict(zip(grads, trainable, strict=True)) if len(grads) == len(trainable) else {}


def _weight_grads(trace: CapturedTrace) -> dict[int, str]:
    """Storages accumulated (or cast) into a parameter's gradient → that parameter."""
    gp = _grad_params(trace)
    out: dict[int, str] = {}
    for o in reversed(trace.ops):
        into = [gp[s] for s in o.inputs if s in gp] + [out[t.storage] for t in o.outputs if t.storage in out]
        if not into:
            continue
        if any(s in gp for s in o.inputs) or _base(o.name) in MOVES:
            for s in o.inputs:
                if s not in gp and trace.storages[s].kind == "op":
                    out.setdefault(s, into[0])
    return out


@lru_cache(maxsize=8)
def storage_kinds(trace: CapturedTrace, experts: int) -> dict[int, str]:
    """Each op-allocated storage's sharding kind (see the module docstring)."""
    role = {p.storage: (p.name, param_role(p, experts)) for p in trace.params}
    wgrad = _weight_grads(trace)
    tokens = max(1, trace.micro_batch_size * trace.seq_len)
    vocab = next((p.shape[0] for p in trace.params if param_role(p, experts) == "vocab" and p.shape), 0)
    kinds: dict[int, str] = {}
    for o in trace.ops:
        if not o.allocs:
            continue
        gemm = _gemm_kind(o, role)
        acts = [kinds[s] for s in o.inputs if s in kinds and not kinds[s].startswith("W")]
        wide = max(acts, key=_ORDER.__getitem__, default="")
        for t in o.outputs:
            s = t.storage
            if s not in o.allocs or s in kinds:
                continue
            if s in wgrad:
                kinds[s] = f"W:{wgrad[s]}"
                continue
            k = gemm or wide
            n = _numel(t.shape)
            if k == "V" and (not t.shape or t.shape[-1] != vocab):
                k = "T"
            elif k in ("C", "X", "R") and (n < tokens or n % tokens):
                k = "N"
            elif not k:
                k = "R" if o.layer >= 0 and n >= tokens and not n % tokens else "N"
            kinds[s] = k
    for o in trace.ops:  # the rows the experts' fc1 reads: received and all-gathered over etp
        if o.phase == "F" and _gemm_kind(o, role) == "X":
            for s in o.inputs:
                if kinds.get(s) == "R":
                    kinds[s] = "E"
    return kinds


def _gemm_kind(o: TraceOp, role: dict[int, tuple[str, str]]) -> str:
    """The kind of a parameter GEMM's output ("" for other ops or a replicated parameter)."""
    if _base(o.name) not in GEMMS:
        return ""
    params = [role[s] for s in o.inputs if s in role]
    name, r = next(((n, x) for n, x in params if x in ("column", "row", "vocab", "expert")), ("", ""))
    if not r:
        return ""
    if r == "vocab" and _base(o.name) != "embedding":
        return "V" if o.phase == "F" else "R"  # the output layer: logits, then the gradient of its input
    if r == "expert":
        r = f"expert_{expert_part(name)}"
    return _GEMM_KIND[r][0 if o.phase == "F" else 1]


#: ops whose TP-split operand makes them tensor-parallel GEMMs (with the embedding's weight gradient)
TP_OPS = GEMMS | {"embedding_dense_backward"}
_TP_ROLES = ("column", "row", "vocab")


#: a GEMM's collectives: (``R`` inputs it all-gathers first, ``R`` outputs it makes as partial sums that a
#: reduce-scatter cuts, the group: "tp" or "etp")
Collectives = tuple[tuple[int, ...], tuple[int, ...], str]


@lru_cache(maxsize=8)
def tp_collectives(trace: CapturedTrace, experts: int) -> dict[int, Collectives]:
    """Each tensor-parallel GEMM's collectives, by op index: "tp" ones happen under SP, "etp" ones under
    expert tensor parallelism.

    Megatron's ``ColumnParallelLinear`` under SP all-gathers its input (and again in the backward, for the
    weight gradient: it saved the shard) and reduce-scatters its input gradient; ``RowParallelLinear``
    reduce-scatters its output and all-gathers the output gradient; ``VocabParallelEmbedding``
    reduce-scatters its output (megatron/core/tensor_parallel/layers.py, mappings.py). An op is
    tensor-parallel when it reads a column-, row- or vocabulary-parallel parameter or makes its gradient.
    The experts' fc2 (down) reduce-scatters its output over etp and all-gathers its output gradient, fc1's
    input gradient is reduce-scattered (:mod:`timeline.graph.families.moe`: the expert-TP all-gather of the
    received rows, which fc1 keeps, and the reduce-scatter after fc2)."""
    role = {p.storage: param_role(p, experts) for p in trace.params}
    by_name = {p.name: param_role(p, experts) for p in trace.params}
    kinds = storage_kinds(trace, experts)
    out: dict[int, Collectives] = {}
    for o in trace.ops:
        if _base(o.name) not in TP_OPS:
            continue
        makes = [k[2:] for s in o.allocs if (k := kinds.get(s, "")).startswith("W:")]
        roles = {role[s] for s in o.inputs if s in role} | {by_name[n] for n in makes}
        group = "tp" if roles & set(_TP_ROLES) else "etp" if "expert" in roles else ""
        if not group:
            continue
        gathers = tuple(s for s in dict.fromkeys(o.inputs) if kinds.get(s) == "R")
        partials = tuple(s for s in o.allocs if kinds.get(s) == "R")
        if gathers or partials:
            out[o.index] = (gathers, partials, group)
    return out


class Sizer:
    """Local shapes and bytes of a trace's storages and parameters under ``shard``."""

    def __init__(self, trace: CapturedTrace, shard: TraceShard) -> None:
        self.shard = shard
        self.kinds = storage_kinds(trace, shard.experts)
        self.params = {p.name: p for p in trace.params}
        self.vocab = shard.vocab
        self.seq = trace.seq_len

    def factor(self, kind: str) -> Fraction:
        """Local / captured bytes of a kind (``V`` and ``W`` are sized by shape)."""
        sh = self.shard
        if kind == "E":  # the tokens' rows over etp (Megatron's expert-TP all-gather of the received rows)
            return self.factor("R") * sh.etp
        if kind == "C" or (kind in ("R", "X") and sh.sp):
            return Fraction(1, sh.tp)
        if kind.startswith("W:"):
            p = self.params[kind[2:]]
            local = local_shape(p, sh)
            return Fraction(_numel(local) if local else 0, max(1, _numel(p.shape)))
        if kind == "V":
            return Fraction(sh.vocab_local, max(1, sh.vocab))
        return Fraction(1)

    def storage_factor(self, s: int) -> Fraction:
        return self.factor(self.kinds.get(s, "N"))

    def shape(self, s: int, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The local shape of storage ``s``'s tensor of captured ``shape`` (one dim cut; bytes follow the factor)."""
        kind = self.kinds.get(s, "N")
        f = self.factor(kind)
        if f == 1 or not shape:
            return shape
        dims = list(shape)
        if kind == "V" and dims[-1] == self.vocab:
            dims[-1] = self.shard.vocab_local
            return tuple(dims)
        if kind.startswith("W:"):
            p = self.params[kind[2:]]
            local = local_shape(p, self.shard) or tuple(0 for _ in p.shape)
            if tuple(dims) == p.shape:
                return local
            if tuple(reversed(dims)) == p.shape:
                return tuple(reversed(local))
        if kind == "X":  # the experts' rows (× etp over the expert-TP group), their FFN columns / etp
            etp, rows = self.shard.etp, dims[0] * self.factor("R") * self.shard.etp
            ffn = [i for i in range(1, len(dims)) if dims[i] in (self.shard.ffn, 2 * self.shard.ffn)]
            if rows.denominator == 1 and (etp == 1 or (ffn and dims[ffn[-1]] % etp == 0)):
                dims[0] = int(rows)
                if etp > 1:
                    dims[ffn[-1]] //= etp
                return tuple(dims)
        # token rows cut the sequence (Megatron's [s, b, h] under SP) where a dim is it; per-head/per-column
        # tensors the last dim that is a head count or a projection/FFN width; the rest their last dim
        last = list(reversed(range(len(dims))))
        order = sorted(range(len(dims)), key=lambda i: dims[i] != self.seq) if kind in ("R", "E") else \
            sorted(last, key=lambda i: dims[i] not in self.shard.split_dims)
        for i in order:
            if (dims[i] * f).denominator == 1:
                dims[i] = int(dims[i] * f)
                return tuple(dims)
        n = _numel(shape) * f  # no single dim takes the factor: the local elements as one flat dim
        return (-(-n.numerator // n.denominator),)

    def nbytes(self, s: int, nbytes: int) -> int:
        """Local bytes of a storage of ``nbytes`` captured bytes (rounded up where a share is uneven)."""
        f = self.storage_factor(s) * nbytes
        return -(-f.numerator // f.denominator)

    def flops_factor(self, o: TraceOp) -> Fraction:
        """The share of an op's FLOPs one rank runs: that of its narrowest activation input or output."""
        fs = [self.storage_factor(s) for s in (*o.inputs, *o.allocs)
              if s in self.kinds and not self.kinds[s].startswith("W")]
        return min(fs, default=Fraction(1))
