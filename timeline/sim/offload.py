"""When fine-grained activation offloading frees and reloads each saved tensor, per device.

The chunk templates keep every saved tensor from its forward to its backward; this pass adds, per model-chunk
instance (stage, micro-batch, iteration), the frees at each offloaded group's commit and the allocations of
the reloads, as Megatron-LM's ``PipelineOffloadManager`` and ``ChunkOffloadHandler`` order them
(``megatron/core/pipeline_parallel/fine_grained_activation_offload.py``, b97184db56 … d98e8a64dd, read at
f5b2ec0130; the groups: :mod:`timeline.graph.offload`):

- **Which groups offload.** The first iteration is the manager's warm-up: every group offloads
  (``should_bulk_offload``). Its ``reset`` at the end of that iteration (``schedules.py``) runs
  ``post_warmup_callback``: in the first chunk of the backward order holding a group of each name, the last
  group of that name stays on the GPU, for as many names as the most names one chunk holds. From then on a
  group also stays where the chunk is the next to run its backward (``front_backward_chunk``, which skips
  chunks without the name) and no later group of the chunk has its name.
- **When a moved tensor is freed.** After its group's commit (:class:`~timeline.sim.compiled.OffloadedTensor`
  ``free_op``); the D2H copy is taken to keep up with the compute stream (the ``record_stream`` that defers
  the free to the copy's end is not timed).
- **When a reload allocates.** A chunk's offloaded groups form a stack in commit order. After each group's
  start in the backward (``on_group_start_backward`` → ``bulk_reload``) the top group of the chunk's stack is
  reloaded; with the stack empty, the top group of the next chunk in the backward order that has groups,
  once its forward is done (``pre_reload_last_layer``). A tensor read before any bulk reload reached it is
  reloaded then (``tensor_pop``). A reload allocates on the H2D stream. A moved tensor's reload is freed where
  the template frees the tensor; a copy's after its group's last backward reader.

Offloading runs under Megatron-LM's own schedules (1f1b, interleaved, each backward a full ``B``): the checks
refuse the others, and deferred weight gradients (``timeline.spec.validate.offload_problems``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from timeline.sim.compiled import CompiledPhase, OffloadedGroup, OffloadedTensor
from timeline.sim.engine import Span, span_offsets

#: the allocator stream the reloads allocate on (the manager's ``h2d_stream``)
H2D_STREAM = 4
#: a copy reload's tensor name: the saved storage's with this suffix
RELOAD = "@reload"
#: the op name the reload events carry
RELOAD_OP = "offload.reload"

#: an extra event: (time µs, +1/−1, bytes, category code, tensor name, op name, micro-batch, stage, action, iteration,
#: allocator stream)
Event = tuple[float, int, int, int, str, str, int, int, int, int, int]
Instance = tuple[int, int]  # (stage, micro-batch)


@dataclass(slots=True)
class _Chunk:
    """One chunk instance's state within an iteration (a ``ChunkOffloadHandler`` and its groups' tensors)."""

    groups: tuple[OffloadedGroup, ...]
    forward: CompiledPhase
    f_action: int
    b_action: int = -1
    b_ends: np.ndarray | None = None  # each op's end in the backward action, in µs
    offloaded: dict[int, bool] = field(default_factory=dict)  # group index -> offloaded this iteration
    stack: list[int] = field(default_factory=list)  # offloaded groups in commit order (the reload stack)
    #: (group, item) -> "move" | "copy": offloaded and not reloaded yet
    pending: dict[tuple[int, int], str] = field(default_factory=dict)


def _times(sp: Span, ph: CompiledPhase, ends: bool) -> np.ndarray:
    """Each op's start (or end) in span ``sp``, in µs."""
    base = ph.op_end if ends else ph.op_start
    return span_offsets(sp, base, np.arange(len(base))) + sp.start_us


class _Iteration:
    """One iteration of one device: the manager's state as its actions run, and the events it adds."""

    def __init__(self, spans: list[Span], acts: list[int], phase: Callable[[Span], CompiledPhase],
                 events: list[Event], deferred: dict[int, frozenset[str]]) -> None:
        self.spans, self.phase, self.events, self.deferred = spans, phase, events, deferred
        self.chunks: dict[Instance, _Chunk] = {}
        self.bwd_order: list[Instance] = []
        self.done: set[Instance] = set()
        self.position = 0  # the manager's backward index into bwd_order
        for i in sorted(acts, key=lambda i: (spans[i].start_us, i)):
            sp = spans[i]
            x = (sp.stage, sp.microbatch)
            if sp.kind == "F":
                ph = phase(sp)
                self.chunks[x] = _Chunk(groups=ph.offload, forward=ph, f_action=i)
            else:
                self.bwd_order.append(x)
                if x in self.chunks:
                    self.chunks[x].b_action = i

    def run(self, warm: bool, keep: set[tuple[Instance, int]]) -> None:
        timeline: list[tuple[float, int, int, Instance, int, int]] = []  # (t, kind, seq, instance, group, item)
        for x, ch in self.chunks.items():
            if not ch.groups or ch.b_action < 0:  # no full backward of it this iteration (validation refuses that)
                continue
            f = self.spans[ch.f_action]
            ends = _times(f, ch.forward, ends=True)
            for g, grp in enumerate(ch.groups):
                timeline.append((float(ends[grp.commit]), 0, len(timeline), x, g, 0))
            timeline.append((f.end_us, 1, len(timeline), x, -1, 0))
            b = self.spans[ch.b_action]
            bph = self.phase(b)
            starts, ch.b_ends = _times(b, bph, ends=False), _times(b, bph, ends=True)
            timeline.append((b.start_us, 2, len(timeline), x, -1, 0))
            for g, grp in enumerate(ch.groups):
                timeline.append((float(ch.b_ends[grp.start_bwd]), 3, len(timeline), x, g, 0))
                for k, item in enumerate(grp.items):
                    timeline.append((float(starts[item.needs[0]]), 4, len(timeline), x, g, k))
        timeline.sort(key=lambda e: (e[0], e[1], e[2]))
        for t, kind, _, x, g, k in timeline:
            ch = self.chunks[x]
            if kind == 0:  # the group's commit in its forward (should_bulk_offload)
                grp = ch.groups[g]
                off = warm or ((x, g) not in keep and not (
                    self.front(grp.name) == x and
                    not any(h.name == grp.name and h.start > grp.commit for h in ch.groups)))
                ch.offloaded[g] = off
                if off:
                    ch.stack.append(g)
            elif kind == 1:  # the forward is done: what moves and what is copied
                self.done.add(x)
                self.resolve(ch)
            elif kind == 2:  # its first commit backward makes the chunk the current one (pop_backward_chunk)
                name = max(ch.groups, key=lambda h: h.commit).name
                while self.position < len(self.bwd_order) and not self.has(self.bwd_order[self.position], name):
                    self.position += 1
                self.position += 1
            elif kind == 3:  # a group's start in the backward: bulk_reload
                if ch.stack:
                    self.reload(x, ch.stack.pop(), t, ch.b_action)
                else:
                    y = self.front(None)
                    if y is not None and y in self.done and self.chunks[y].stack:
                        self.reload(y, self.chunks[y].stack.pop(), t, ch.b_action)
            elif (g, k) in ch.pending:  # a reader unpacks the tensor: tensor_pop reloads it if nothing did
                self.reload_item(x, g, k, t, ch.b_action)

    def has(self, y: Instance, name: str | None) -> bool:
        ch = self.chunks.get(y)
        return ch is not None and bool(ch.groups) and (name is None or any(g.name == name for g in ch.groups))

    def front(self, name: str | None) -> Instance | None:
        """``front_backward_chunk``: the next chunk in the backward order from the manager's index holding a
        group named ``name`` (None: any group)."""
        return next((y for y in self.bwd_order[self.position:] if self.has(y, name)), None)

    def resolve(self, ch: _Chunk) -> None:
        """At the end of a chunk's forward: each offloaded group's items pending a reload, as moves (their storage
        freed after ``free_op``) where every group that saved the tensor offloaded, else as copies — also a
        tensor whose free the schedule's references defer past the chunk's backward (its received input: the
        events' pairing needs the template's own free of it; Megatron's commit resizes it to nothing, so the
        received input counts until then here)."""
        sp, ph = self.spans[ch.f_action], ch.forward
        ends = _times(sp, ph, ends=True)
        later = self.deferred.get(ch.b_action, frozenset())
        for g in ch.stack:
            for k, item in enumerate(ch.groups[g].items):
                move = not item.copy and all(ch.offloaded.get(p, False) for p in item.partners) and \
                    ph.tensor_names[item.tensor] not in later
                ch.pending[(g, k)] = "move" if move else "copy"
                if move:
                    self.events.append((float(ends[item.free_op]), -1, item.size, item.cat,
                                        ph.tensor_names[item.tensor], ph.op_names[item.free_op], sp.microbatch,
                                        sp.stage, ch.f_action, sp.iteration, 0))

    def reload(self, y: Instance, g: int, t: float, action: int) -> None:
        """``bulk_reload_group``: every item of chunk ``y``'s group ``g`` still on the host, reloaded at ``t``
        (during ``action``)."""
        for k in range(len(self.chunks[y].groups[g].items)):
            if (g, k) in self.chunks[y].pending:
                self.reload_item(y, g, k, t, action)

    def reload_item(self, y: Instance, g: int, k: int, t: float, action: int) -> None:
        ch = self.chunks[y]
        mode = ch.pending.pop((g, k))
        item: OffloadedTensor = ch.groups[g].items[k]
        f = self.spans[ch.f_action]
        name = ch.forward.tensor_names[item.tensor]
        if mode == "copy":
            name += f"{RELOAD}{item.tag}"
        self.events.append((t, 1, item.size, item.cat, name, RELOAD_OP, f.microbatch, f.stage, action, f.iteration,
                            H2D_STREAM))
        if mode == "copy":  # freed once the group's last reader is done
            assert ch.b_ends is not None  # set with the chunk's backward events, before any of them runs
            self.events.append((float(ch.b_ends[item.needs[-1]]), -1, item.size, item.cat, name, RELOAD_OP, f.microbatch, f.stage, ch.b_action,
                                f.iteration, H2D_STREAM))

    def post_warmup(self, pp_rank: int, fraction: float, delta_bytes: int) -> set[tuple[Instance, int]]:
        """``post_warmup_callback``: per group name, the last group of that name in the first chunk of the
        backward order holding one stays on the GPU, for as many names as the most names one chunk holds. From
        Megatron-LM 69c486825c on, then: in backward order, groups stay until ``pp_rank · delta_bytes`` of their
        warm-up offload is kept (``--delta-offload-bytes-across-pp-ranks``); and of each chunk's groups still
        offloading (with bytes), the last ⌊n·(1 − ``fraction``)⌋ stay (``--activation-offload-fraction``)."""
        margin = max((len({g.name for g in ch.groups}) for ch in self.chunks.values()), default=0)
        last: dict[str, tuple[Instance, int]] = {}
        for y in reversed(self.bwd_order):
            ch = self.chunks.get(y)
            for g, grp in enumerate(ch.groups if ch is not None else ()):
                last[grp.name] = (y, g)
        keep = set(list(last.values())[:margin])
        order = [y for y in self.bwd_order if y in self.chunks]

        def size(grp: OffloadedGroup) -> int:
            return sum(it.size for it in grp.items)

        budget = pp_rank * delta_bytes
        for y in order:
            for g, grp in enumerate(self.chunks[y].groups):
                if (y, g) not in keep and budget > 0:
                    budget -= size(grp)
                    keep.add((y, g))
        for y in order:
            eligible = [g for g, grp in enumerate(self.chunks[y].groups) if (y, g) not in keep and size(grp) > 0]
            off = int(len(eligible) * (1 - fraction))
            keep.update((y, g) for g in eligible[len(eligible) - off:] if off)
        return keep


def offload_events(spans: list[Span], phase: Callable[[Span], CompiledPhase], *, pp_rank: int = 0,
                   fraction: float = 1.0, delta_bytes: int = 0,
                   deferred: dict[int, frozenset[str]] | None = None) -> list[Event]:
    """The frees and reload allocations fine-grained activation offloading adds to a device of pipeline rank
    ``pp_rank`` whose actions are ``spans`` (``phase``: a span's compiled phase), iteration after iteration;
    ``fraction`` and ``delta_bytes``: ``[offload]``'s post-warm-up rules (:meth:`_Iteration.post_warmup`);
    ``deferred``: per backward action (span index), the storages whose frees the schedule moves elsewhere."""
    acts = [i for i, sp in enumerate(spans) if sp.kind in ("F", "B")]
    by_iteration: dict[int, list[int]] = {}
    for i in acts:
        by_iteration.setdefault(spans[i].iteration, []).append(i)
    events: list[Event] = []
    keep: set[tuple[Instance, int]] = set()
    for n, it in enumerate(sorted(by_iteration)):
        state = _Iteration(spans, by_iteration[it], phase, events, deferred or {})
        state.run(warm=n == 0, keep=keep)
        if n == 0:
            keep = state.post_warmup(pp_rank, fraction, delta_bytes)
    return events
