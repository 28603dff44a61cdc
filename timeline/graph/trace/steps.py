"""Lower a whole-step trace (``timeline capture --step``) into ops per simulated iteration.

A step trace holds the construction (``init``) and K captured steps, every device storage with
its birth, death and role. Iteration ``i`` runs captured step ``min(i + 1, K)``: the steps the
capture saw run as they ran (the first one creates gradients and optimizer state lazily), and
later iterations repeat the last one. A repeated step frees what the previous iteration left for
it: each storage the last step frees but an earlier step made (``C``) stands for the storage of
the same role — the same parameter's gradient, the same optimizer state — or else, in creation
order, the one the last step makes and leaves alive (``S``), as made by the previous iteration.
A last step whose ``C`` and ``S`` do not pair up is not a steady state (memory would grow or shrink
every repetition) and is refused with the fix: capture more steps.

Categories come from roles and lifetimes: parameters and buffers ``weights``, ``.grad`` tensors
``grads``, optimizer state ``optimizer``; a forward storage freed in a backward ``activations``;
everything else ``temporary``. Every byte is a captured storage's; nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from timeline.errors import UserError
from timeline.graph.ops import Op
from timeline.graph.tensors import Category, TensorDef
from timeline.spec.trace import CapturedTrace, TraceOp

ROLE_CATEGORY = {"param": Category.WEIGHTS, "buffer": Category.WEIGHTS, "grad": Category.GRADS,
                 "state": Category.OPTIMIZER}
#: span kinds of captured phases (the optimizer step and zero_grad are the iteration's "step")
PHASE_KIND = {"init": "init", "F": "F", "B": "B", "O": "step", "Z": "step"}


@dataclass(frozen=True, slots=True)
class PhaseRun:
    """Consecutive ops of one phase within an iteration."""

    kind: str  # init | F | B | step
    ops: tuple[Op, ...]


def _category(trace: CapturedTrace, s: int) -> Category:
    st = trace.storages[s]
    role = ROLE_CATEGORY.get(st.role.split(":")[0])
    if role is not None:
        return role
    if st.alloc_op >= 0 and st.free_op >= 0:
        born, died = trace.ops[st.alloc_op], trace.ops[st.free_op]
        if born.phase == "F" and died.phase == "B" and born.step == died.step:
            return Category.ACTIVATIONS
    return Category.TEMPORARY


def _module(trace: CapturedTrace, s: int) -> str:
    role = trace.storages[s].role
    return role.split(":")[1] if ":" in role else "step"


def label(trace: CapturedTrace, s: int) -> str:
    """A storage's tensor name: its role (``grad:layers.0.attn.q_proj.weight#812``) or the module and
    op that made it (``layers.0.attn.q_proj:mm#812``); the id keeps names unique (a role has one
    storage per step, and the old and new optimizer state of a step overlap)."""
    st = trace.storages[s]
    if st.role:
        return f"{st.role}#{s}"
    if st.alloc_op < 0:
        return f"s{s}"
    op = trace.ops[st.alloc_op]
    short = op.name.removeprefix("aten.").split(".")[0]
    return f"{op.module or 'step'}:{short}#{s}"


def _step_of(trace: CapturedTrace, s: int) -> int:
    a = trace.storages[s].alloc_op
    return trace.ops[a].step if a >= 0 else 0


def carry_map(trace: CapturedTrace) -> dict[int, int]:
    """For the last captured step: each storage it frees that an earlier step made → the storage
    of the last step that plays its part in the next repetition."""
    k = trace.num_steps
    last = [o for o in trace.ops if o.step == k]
    made = [s for o in last for s in o.allocs]
    freed = {s for o in last for s in o.frees}
    survivors = [s for s in made if s not in freed and trace.storages[s].nbytes]
    carried = [s for o in last for s in o.frees if _step_of(trace, s) < k and trace.storages[s].nbytes]
    out: dict[int, int] = {}
    by_role = {trace.storages[s].role: s for s in survivors if trace.storages[s].role}
    rest = []
    for s in carried:
        role = trace.storages[s].role
        if role and role in by_role:
            out[s] = by_role.pop(role)
        else:
            rest.append(s)
    left = [s for s in survivors if s not in set(out.values())]
    if len(rest) != len(left):
        raise UserError(f"the last captured step (step {k}) is not a steady state: it frees {len(carried)} "
                        f"tensors earlier steps made and leaves {len(survivors)} of its own alive, which do not "
                        "pair up, so repeating it would grow or shrink memory each iteration; capture more steps "
                        f"(--steps {k + 1}) or simulate at most {k} iterations")
    out.update(zip(rest, left, strict=True))
    return out


def _runs(ops: list[Op], kinds: list[str]) -> list[PhaseRun]:
    out: list[PhaseRun] = []
    start = 0
    for i in range(1, len(ops) + 1):
        if i == len(ops) or kinds[i] != kinds[start]:
            if i > start:
                out.append(PhaseRun(kind=kinds[start], ops=tuple(ops[start:i])))
            start = i
    return out


def iteration_runs(trace: CapturedTrace, iteration: int, carry: dict[int, int]) -> list[PhaseRun]:
    """Phase runs of simulated ``iteration`` (−1: construction; 0, 1, …: training steps)."""
    k = trace.num_steps
    step = 0 if iteration < 0 else min(iteration + 1, k)
    repeat = iteration + 1 > k

    def name(s: int) -> str:
        if not repeat or _step_of(trace, s) < k:
            if repeat and s in carry:  # made by the previous iteration: step K itself or a repetition
                prev = iteration - 1  # iterations are 0-based: step K ran as iteration K − 1
                return label(trace, carry[s]) if prev == k - 1 else f"{label(trace, carry[s])}@{prev}"
            return label(trace, s)
        return f"{label(trace, s)}@{iteration}"

    ops: list[Op] = []
    kinds: list[str] = []
    for o in (o for o in trace.ops if o.step == step and (iteration >= 0) == (o.phase != "init")):
        op = _op(trace, o, name)
        if op is not None:
            ops.append(op)
            kinds.append(PHASE_KIND[o.phase])
    return _runs(ops, kinds)


def _op(trace: CapturedTrace, o: TraceOp, name: Callable[[int], str]) -> Op | None:
    allocs = tuple(TensorDef(name=name(s), shape=(trace.storages[s].nbytes,), dtype="uint8",
                             category=_category(trace, s), module=_module(trace, s), storage=name(s))
                   for s in o.allocs if trace.storages[s].nbytes)
    frees = tuple(name(s) for s in o.frees if trace.storages[s].nbytes)
    if not allocs and not frees and not o.flops:
        return None
    return Op(name=o.name.removeprefix("aten."), module="", layer=None, flops=o.flops,
              bytes_moved=float(sum(t.size_bytes for t in allocs)), allocs=allocs, frees=frees)
