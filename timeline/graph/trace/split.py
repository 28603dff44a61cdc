"""Input- and weight-gradient work of a captured backward, for zero-bubble schedules (``I`` / ``W``).

:func:`weight_grad_ops` finds the captured backward ops that only compute a weight's gradient
through a GEMM: working back from each in-place accumulation into a parameter's ``.grad``
storage, the ops whose outputs flow nowhere else, through data moves (transposes, views, copies)
to the dW ``mm``/``_grouped_mm`` that starts the chain. A chain that meets another computing op
(a norm's weight, the embedding's scatter, a bias's sum) stays with the input gradient, as the
analytic path splits only GEMMs.

:func:`split_frees` places each storage's free in the order ``I`` ops, then ``W`` ops: a storage a
W op reads (a GEMM input kept for dW, an output gradient) or allocates is freed after its last W
op; any other at its captured free, moved back to the I op before it when a W op freed it. The
captured interleaving itself remains the plain backward ``B``. Nothing here builds ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from timeline.spec.trace import CapturedTrace

#: aten ops whose backward computes a weight gradient as a matrix product
GEMMS = frozenset({"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "_grouped_mm"})
#: ops that only move, cast or re-view data: between a dW GEMM and the accumulation into ``.grad``
MOVES = frozenset({"t", "transpose", "permute", "view", "_unsafe_view", "reshape", "expand", "squeeze",
                   "unsqueeze", "detach", "alias", "as_strided", "clone", "contiguous", "_to_copy", "copy_"})


def _base(name: str) -> str:
    return name.removeprefix("aten.").split(".")[0]


@lru_cache(maxsize=8)
def weight_grad_ops(trace: CapturedTrace) -> frozenset[int]:
    """Indices of the captured backward ops that belong to weight-gradient (``W``) work."""
    grads = {s for s, st in trace.storages.items() if st.kind == "grad"}
    bwd = [o for o in trace.ops if o.phase == "B"]
    only_w: dict[int, bool] = {}  # storage → every later reader is a weight-gradient candidate
    cand: set[int] = set()
    for o in reversed(bwd):
        outs = {t.storage for t in o.outputs}
        if outs and all(s in grads or only_w.get(s, True) for s in outs):
            cand.add(o.index)
        for s in o.inputs:
            only_w[s] = only_w.get(s, True) and o.index in cand
    writers: dict[int, list[int]] = {}
    for o in bwd:
        for t in o.outputs:
            writers.setdefault(t.storage, []).append(o.index)
    w: set[int] = set()
    for sink in (o for o in bwd if o.index in cand and any(t.storage in grads for t in o.outputs)):
        chain, todo, gemm = {sink.index}, [sink.index], False
        while todo:
            op = trace.ops[todo.pop()]
            if _base(op.name) in GEMMS:
                gemm = True
                continue  # its operands (output gradient, saved input) are not weight-gradient work
            if op.index != sink.index and _base(op.name) not in MOVES:
                break  # a computing op that is not a GEMM: a norm weight, an embedding, a bias
            for s in op.inputs:
                if s in grads:
                    continue  # another accumulation into the same gradient is its own chain
                for j in writers.get(s, ()):
                    if j < op.index and j in cand and j not in chain:
                        chain.add(j)
                        todo.append(j)
        else:
            if gemm:
                w |= chain
    return frozenset(w)


def split_frees(is_w: Sequence[bool], allocs: Sequence[Sequence[str]], reads: Sequence[Sequence[str]],
                frees: Sequence[Sequence[str]]) -> list[list[str]]:
    """Per backward row (captured order), what it frees when the I rows run first, then the W rows."""
    n = len(is_w)
    order = [i for i in range(n) if not is_w[i]] + [i for i in range(n) if is_w[i]]
    pos = {i: p for p, i in enumerate(order)}
    prev_i: list[int] = []  # per row, position of the last I row at or before it (−1: none)
    last = -1
    for i in range(n):
        if not is_w[i]:
            last = pos[i]
        prev_i.append(last)
    w_touch: dict[str, int] = {}
    for i in range(n):
        if is_w[i]:
            for name in (*allocs[i], *reads[i]):
                w_touch[name] = max(w_touch.get(name, -1), pos[i])
    out: list[list[str]] = [[] for _ in range(n)]
    for i in range(n):
        for name in frees[i]:
            p = max(prev_i[i], w_touch.get(name, -1), 0)
            out[order[p]].append(name)
    return out
