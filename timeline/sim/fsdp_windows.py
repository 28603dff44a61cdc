"""Megatron-FSDP's gathered parameter groups and gradient buckets as events, from a device's
:class:`~timeline.sim.megatron_fsdp.FsdpPlan` (the rules and their sources are that module's):

- per action, a staircase over the FSDP units its ops run: each unit's first op requests its groups and the
  prefetch the budget allows (:func:`requested`), gathering what is not gathered yet; its last op releases it;
  a backward's units take their gradient bucket at their first op and queue it for reduction at their last,
  popping the queue's oldest while it holds more than its capacity; the action's end drains the queue;
- per iteration, the groups outside the units from the iteration's first action to its step, and after each
  step what ``start_param_sync`` gathers, kept until the next iteration's first action (or released at once
  where ``calc_params_l2_norm`` stops the communication).

A forward (F) gathers; an input-gradient backward (I) gathers; a weight-gradient one (W) takes gradient buckets; a
full backward (B) both. The gathers allocate on the all-gather side stream (:data:`AG_STREAM`), so the caching
allocator serves them from that stream's own segments. Nothing here decides sizes or budgets.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from timeline.graph.fsdp_buffers import UNIT_PATTERN
from timeline.sim.compiled import CompiledPhase
from timeline.sim.engine import Span, span_offsets
from timeline.sim.megatron_fsdp import FsdpChunk, FsdpPlan

#: (time µs, +1 alloc / −1 free, bytes, tensor name)
Event = tuple[float, int, int, str]

#: the allocator stream of the all-gathered buckets: ``AllGatherPipeline.all_gather_params`` fetches them inside
#: ``torch.cuda.stream(self.ag_stream)`` (``MegatronFSDP``'s ``side_stream_for_param_gather``), so they come from
#: that stream's pool; gradient buckets are fetched by ``_grad_acc`` on the compute stream (0). An id of its own: 1
#: and 2 are :mod:`timeline.sim.graph_capture`'s private pool and TE's warm-up stream (an ordinary stream's cached
#: blocks are released by ``empty_cache``, a private pool's are not: :data:`timeline.sim.memory.PRIVATE_POOLS`)
AG_STREAM = 3


def stream_of(name: str) -> int:
    """The allocator stream an event of this module's names allocates on."""
    return 0 if name.startswith("fsdp.grad_bucket.") else AG_STREAM


def requested(chunk: FsdpChunk, index: int, step: int) -> list[int]:
    """The groups a request for group ``index`` gathers: it, then the next ones in bucket order (``step`` +1
    forward, −1 backward) while the budget allows (``AllGatherPipeline.all_gather_params``)."""
    n = len(chunk.groups)
    out, base, j = [index], chunk.groups[index].elements, index + step
    if chunk.prefetch_elements is None:
        return out + ([j] if 0 <= j < n else [])
    while 0 <= j < n:
        held = sum(chunk.groups[k].elements for k in out)
        if (held if chunk.prefetch_counts_requested else held - base) >= chunk.prefetch_elements:
            break
        out.append(j)
        j += step
    return out


def unit_ops(ph: CompiledPhase) -> dict[str, tuple[int, int]]:
    """Per FSDP unit whose ops the phase runs, (its first op, its last op)."""
    out: dict[str, tuple[int, int]] = {}
    for k, name in enumerate(ph.op_names):
        m = UNIT_PATTERN.match(name)
        if m:
            first, _ = out.get(m.group(1), (k, k))
            out[m.group(1)] = (first, k)
    return out


def action_events(plan: FsdpPlan, sp: Span, ph: CompiledPhase,
                  units: dict[str, tuple[int, int]] | None = None) -> list[Event]:
    """The gathers and gradient buckets of one action, in the order they happen (``units``: the phase's
    :func:`unit_ops`, where the caller keeps them)."""
    chunk = plan.chunk(sp.stage)
    if chunk is None:
        return []
    index = {g.unit: k for k, g in enumerate(chunk.groups) if g.unit}
    found = unit_ops(ph) if units is None else units
    ops = sorted((first, last, index[u]) for u, (first, last) in found.items() if u in index)
    if not ops:
        return []
    firsts = np.array([f for f, _, _ in ops])
    lasts = np.array([last for _, last, _ in ops])
    starts = (sp.start_us + span_offsets(sp, ph.op_start[firsts], firsts)).tolist()
    ends = (sp.start_us + span_offsets(sp, ph.op_end[lasts], lasts)).tolist()
    backward = sp.kind in ("B", "I", "W")
    windows = [(t0, t1, k) for t0, t1, (_, _, k) in zip(starts, ends, ops, strict=True)]
    out: list[Event] = []
    if sp.kind != "W":
        out += _gathers(chunk, windows, sp, step=-1 if backward else 1, lead=not backward and ops[0][0] > 0)
    if sp.kind in ("B", "W"):
        out += _grad_buckets(chunk, windows, sp, ph)
    return sorted(out, key=lambda e: e[0])  # stable: at one instant, in the order made


def _gathers(chunk: FsdpChunk, units: list[tuple[float, float, int]], sp: Span, *, step: int,
             lead: bool) -> Iterator[Event]:
    groups = chunk.groups
    live: set[int] = set()

    def gather(t: float, k: int) -> Iterator[Event]:
        for j in requested(chunk, k, step):
            if groups[j].unit and groups[j].weight_bytes and j not in live:
                live.add(j)
                yield t, 1, groups[j].weight_bytes, f"fsdp.unit.{groups[j].label}"

    if lead and not groups[0].unit:  # the embedding's pre-forward requests bucket 0 before the first unit
        yield from gather(sp.start_us, 0)
    for t0, t1, k in units:
        yield from gather(t0, k)
        if k in live:
            live.discard(k)
            yield t1, -1, groups[k].weight_bytes, f"fsdp.unit.{groups[k].label}"
    for j in sorted(live):  # prefetched beyond the action's last unit
        yield sp.end_us, -1, groups[j].weight_bytes, f"fsdp.unit.{groups[j].label}"


def owns(op: str, module: str) -> bool:
    """Whether op ``op`` (a ``.wgrad`` suffix aside) runs module ``module``: the same path, the module inside it
    (``embedding`` runs ``embedding.word_embeddings``), or it at the op's end (``output.output_layer``)."""
    op = op.removesuffix(".wgrad")
    return module == op or module.startswith(op + ".") or op.endswith("." + module)


def _first_op(sp: Span, ph: CompiledPhase, modules: tuple[str, ...]) -> float:
    """When the first op of ``modules`` starts in span ``sp`` (its start where the phase runs none)."""
    for k, name in enumerate(ph.op_names):
        if any(owns(name, m) for m in modules):
            idx = np.array([k])
            return sp.start_us + float(span_offsets(sp, ph.op_start[idx], idx)[0])
    return sp.start_us


def _grad_buckets(chunk: FsdpChunk, units: list[tuple[float, float, int]], sp: Span,
                  ph: CompiledPhase) -> Iterator[Event]:
    groups = chunk.groups
    rest = [g for g in groups if not g.unit and g.grad_bytes]
    for g in rest:
        yield _first_op(sp, ph, g.modules), 1, g.grad_bytes, f"fsdp.grad_bucket.{g.label}"
    queue: list[int] = []
    for t0, t1, k in units:
        if not groups[k].grad_bytes:
            continue
        yield t0, 1, groups[k].grad_bytes, f"fsdp.grad_bucket.{groups[k].label}"
        while queue and (len(queue) > 1 if chunk.queue_elements is None
                         else sum(groups[j].elements for j in queue) > chunk.queue_elements):
            j = queue.pop(0)
            yield t1, -1, groups[j].grad_bytes, f"fsdp.grad_bucket.{groups[j].label}"
        queue.append(k)
    for j in queue:  # the root post-backward hook drains the queue
        yield sp.end_us, -1, groups[j].grad_bytes, f"fsdp.grad_bucket.{groups[j].label}"
    for g in rest:
        yield sp.end_us, -1, g.grad_bytes, f"fsdp.grad_bucket.{g.label}"


def iteration_events(plan: FsdpPlan, spans: list[Span]) -> list[tuple[Event, int]]:
    """(event, index of the span it belongs to) for the groups outside the units (each iteration's first action
    to its step) and what each step's ``start_param_sync`` gathers (to the next iteration's first action, or
    released at once)."""
    rest = [(f"fsdp.gathered.{g.label}", g.weight_bytes) for c in plan.chunks for g in c.groups
            if not g.unit and g.weight_bytes]
    after = [(f"fsdp.gathered.{c.groups[j].label}", c.groups[j].weight_bytes) for c in plan.chunks
             for j in (requested(c, 0, 1) if plan.step_prefetch else [0]) if c.groups[j].weight_bytes]
    first: dict[int, tuple[float, int]] = {}
    for i, sp in enumerate(spans):
        if sp.kind not in ("init", "step") and (sp.iteration not in first or sp.start_us < first[sp.iteration][0]):
            first[sp.iteration] = (sp.start_us, i)
    out: list[tuple[Event, int]] = []
    held = False
    for i, sp in sorted(((i, sp) for i, sp in enumerate(spans) if sp.kind == "step"), key=lambda x: x[1].start_us):
        t0, a0 = first.get(sp.iteration, (sp.start_us, i))
        out += [((t0, -1, size, name), a0) for name, size in after if held]
        out += [((t0, 1, size, name), a0) for name, size in rest]
        out += [((sp.start_us, -1, size, name), i) for name, size in rest]  # finish_grad_sync
        out += [((sp.end_us, 1, size, name), i) for name, size in after]  # start_param_sync
        if plan.released_after_step:
            out += [((sp.end_us, -1, size, name), i) for name, size in after]
        held = not plan.released_after_step
    return out
