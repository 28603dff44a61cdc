"""Stage 3 of a simulation, expand: each device's static state and every action's compiled
template shifted to the action's start, into one columnar event log per device (the templates
carry the P2P receive/send buffers that connect chunks), and each action's ops into an op log.
The allocator pass (:mod:`timeline.sim.memory`) reads the event log next."""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

import numpy as np

from timeline.graph.tensors import Category
from timeline.placement.devices import StaticDevice
from timeline.profiles.base import AT_OP, FirstCall
from timeline.sim import fsdp_windows
from timeline.sim.combined import forward_nodes, kept_node_io, router_inputs
from timeline.sim.compiled import CAT_CODE, CompiledPhase
from timeline.sim.engine import Span, span_offsets
from timeline.sim.graph_capture import CaptureRules, capture_events, capture_iteration
from timeline.sim.hf_state import hf_state_events
from timeline.sim.offload import offload_events
from timeline.sim.output import DeviceEvents, DeviceOps, Names
from timeline.sim.plan import Compiled
from timeline.sim.static_state import DeviceState, resolve
from timeline.spec.run import NO_OFFLOAD, OffloadSpec, TrainingSpec

#: per-event columns of the event log, with their dtypes
_EVENT_COLUMNS = (("t_us", np.float64), ("sign", np.int8), ("size", np.int64), ("cat", np.int8),
                  ("tensor", np.int32), ("op", np.int32))
#: per-action columns (one value per pushed chunk of events), with their dtypes
_ACTION_COLUMNS = (("microbatch", np.int32), ("stage", np.int16), ("action", np.int32), ("iteration", np.int32),
                   ("stream", np.int8))


@dataclass(slots=True)
class _Noted:
    """Chunks of the log noted, not pushed, that share their columns but the time: ``columns`` (sign,
    size, category, tensor and op ids, in the log's dtypes), the ``chunks`` they are in push order and, per
    chunk, ``when``: a phase's (start, stretch) — its times ``start + offsets · stretch`` — or, without
    ``offsets``, the chunk's own times."""

    columns: tuple[np.ndarray, ...]
    offsets: np.ndarray | None
    chunks: list[int] = field(default_factory=list)
    when: list = field(default_factory=list)

    def times(self) -> np.ndarray:
        if self.offsets is None:
            return np.concatenate(self.when)
        at = np.array(self.when, dtype=np.float64)
        return (at[:, :1] + self.offsets * at[:, 1:]).ravel()


class _Log:
    """Chunks of events: the per-event columns as arrays (a template's own, shared), the
    per-action ones as one value per chunk, expanded once at the end with ``np.repeat``. A phase
    shifted to an action's start (:meth:`push_phase`), or rows that recur with times of their own
    (:meth:`push_timed`), are only noted: their rows of every chunk are laid out at once, each at its
    own place in push order."""

    def __init__(self) -> None:
        self.arrays: dict[str, list[np.ndarray | None]] = {k: [] for k, _ in _EVENT_COLUMNS}
        self.scalars: list[tuple[int, int, int, int, int]] = []
        self.lengths: list[int] = []
        self.noted: dict[Hashable, _Noted] = {}

    def push(self, t: object, sign: object, size: object, cat: object, tensor: object, op: object,
             mb: int, stage: int, action: int, iteration: int, stream: int = 0) -> None:
        """Append a chunk of events; ``stream`` is the allocator stream (or private pool) they use."""
        n = len(t)  # type: ignore[arg-type]
        for (k, dt), v in zip(_EVENT_COLUMNS, (t, sign, size, cat, tensor, op), strict=True):
            a = np.asarray(v, dtype=dt)
            self.arrays[k].append(a if a.ndim else np.full(n, a, dtype=dt))
        self.scalars.append((mb, stage, action, iteration, stream))
        self.lengths.append(n)

    def push_phase(self, key: Hashable, columns: tuple[np.ndarray, ...], start: float, scale: float, mb: int,
                   stage: int, action: int, iteration: int) -> None:
        """Append the chunk ``push(columns[0] * scale + start, *columns[1:], …)`` would: a phase's
        events (``columns``: offsets, sign, size, category, tensor and op ids, the dtypes of the event
        log) stretched by ``scale`` from ``start``, on stream 0. ``key`` names the columns (the same
        each time)."""
        self._note(("phase", key), columns[1:], columns[0], (start, scale), mb, stage, action, iteration)

    def push_timed(self, key: Hashable, columns: tuple[np.ndarray, ...], times: np.ndarray, mb: int, stage: int,
                   action: int, iteration: int) -> None:
        """Append the chunk ``push(times, *columns, …)`` would (``columns``: sign, size, category,
        tensor and op ids in the event log's dtypes, the same each time for one ``key``), on stream 0."""
        self._note(("timed", key), columns, None, times, mb, stage, action, iteration)

    def _note(self, key: Hashable, columns: tuple[np.ndarray, ...], offsets: np.ndarray | None, when: object,
              mb: int, stage: int, action: int, iteration: int) -> None:
        noted = self.noted.get(key)
        if noted is None:
            noted = self.noted[key] = _Noted(columns, offsets)
        noted.chunks.append(len(self.lengths))
        noted.when.append(when)
        for k, _ in _EVENT_COLUMNS:
            self.arrays[k].append(None)
        self.scalars.append((mb, stage, action, iteration, 0))
        self.lengths.append(len(columns[0]))

    def _places(self, ends: np.ndarray) -> tuple[np.ndarray | None, list[tuple[_Noted, np.ndarray]]]:
        """Where each chunk's rows go in push order: the pushed chunks' rows concatenated (None: they
        are every row, in order), and each noted kind's rows, chunk after chunk."""
        own = [i for i, a in enumerate(self.arrays["t_us"]) if a is not None]
        noted = [(nt, ((ends[nt.chunks] - len(nt.columns[0]))[:, None] + np.arange(len(nt.columns[0]))).ravel())
                 for nt in self.noted.values() if len(nt.columns[0])]
        if not noted:
            return None, []
        lengths = np.array([self.lengths[i] for i in own], dtype=np.int64)
        first = ends[own] - lengths  # where each chunk starts in push order
        before = np.cumsum(lengths) - lengths  # and in the concatenation of the pushed chunks
        return np.repeat(first - before, lengths) + np.arange(int(lengths.sum())), noted

    def events(self) -> DeviceEvents:
        """The events in time order (stable: at equal times, in push order)."""
        if not self.lengths:
            empty = {k: np.zeros(0) for k in DeviceEvents.__slots__}
            empty["microbatch"] = np.zeros(0, dtype=np.int32)
            empty["iteration"] = np.zeros(0, dtype=np.int32)
            return DeviceEvents(**empty)
        ends = np.cumsum(np.array(self.lengths, dtype=np.int64))
        total = int(ends[-1])
        own, noted = self._places(ends)

        def pushed(k: str) -> np.ndarray:
            return np.concatenate([a for a in self.arrays[k] if a is not None] or [np.zeros(0)])

        # the times in push order, then their stable order; every other column is written once, straight
        # to its sorted place (the inverse permutation of each row's push place), never gathered
        t = pushed("t_us") if own is None else np.empty(total, dtype=np.float64)
        if own is not None:
            t[own] = pushed("t_us")
            for nt, at in noted:
                t[at] = nt.times()
        order = np.argsort(t, kind="stable")
        rank = np.empty(total, dtype=np.int64)
        rank[order] = np.arange(total)
        own_to = rank if own is None else rank[own]
        noted_to = [(nt, rank[at]) for nt, at in noted]
        merged: dict[str, np.ndarray] = {"t_us": t[order]}
        for j, (k, dt) in enumerate(_EVENT_COLUMNS[1:]):
            out = np.empty(total, dtype=dt)
            out[own_to] = pushed(k)
            for nt, to in noted_to:
                out[to] = np.broadcast_to(nt.columns[j], (len(nt.chunks), len(nt.columns[j]))).ravel()
            merged[k] = out
        # per-action columns: each row's chunk, in time order, looked up in the chunks' small table
        chunk = np.take(np.repeat(np.arange(len(self.lengths), dtype=np.int32),
                                  np.array(self.lengths, dtype=np.int64)), order)
        per = np.array(self.scalars, dtype=np.int64).reshape(-1, len(_ACTION_COLUMNS))
        for j, (k, dt) in enumerate(_ACTION_COLUMNS):
            merged[k] = np.take(per[:, j].astype(dt), chunk)
        return DeviceEvents(**merged)


def _event_ids(names: Names, ph: CompiledPhase, field: str) -> np.ndarray:
    """Per memory event of ``ph``, the name id of its tensor (``tensor_names``) or op (``op_names``)."""
    index = ph.ev_tensor if field == "tensor_names" else ph.ev_op
    return names.ids(ph, field)[index]


def _phase_ids(names: Names, ph: CompiledPhase, kind: str) -> np.ndarray:
    """Per op of ``ph``, the name id of its phase: ``R`` for a recomputed op, else the action's kind."""
    return np.array([names("R" if rc else kind) for rc in ph.op_recompute], dtype=np.int32)


def _overlapped_ids(names: Names, ph: CompiledPhase) -> np.ndarray:
    """Per op of ``ph``, its stream beside the forward half of an overlapped pair."""
    return np.array([names(f"{x} (overlapped)") for x in ph.op_streams], dtype=np.int32)


def _push_step_copies(log: _Log, state: DeviceState, spans: list[Span], names: Names) -> None:
    """The state's per-step allocations: made when each optimizer step starts, dropped when the next
    iteration's first action starts (its ``train_step`` begins with ``optimizer.zero_grad()``; the
    memory Megatron logs between the two, after ``train_step`` returns, still holds them). The last
    step's stay."""
    if not state.step_copies:
        return
    grads = CAT_CODE[Category.GRADS]
    steps = [(i, sp) for i, sp in enumerate(spans) if sp.kind == "step"]
    first: dict[int, tuple[float, int]] = {}  # iteration -> (start, span index) of its first action
    for i, sp in enumerate(spans):
        if sp.kind not in ("init", "step") and (sp.iteration not in first or sp.start_us < first[sp.iteration][0]):
            first[sp.iteration] = (sp.start_us, i)
    ids = [names(name) for name, _ in state.step_copies]
    sizes = [size for _, size in state.step_copies]
    for i, sp in steps:
        log.push(np.full(len(ids), sp.start_us), 1, sizes, grads, ids, -1, -1, -1, i, sp.iteration)
        nxt = first.get(sp.iteration + 1)
        if nxt is not None:
            start, a = max(nxt[0], sp.end_us), nxt[1]
            log.push(np.full(len(ids), start), -1, sizes, grads, ids, -1, -1, -1, a, sp.iteration + 1)


def _push_step_transients(log: _Log, state: DeviceState, spans: list[Span], names: Names) -> None:
    """Each optimizer step's own allocations and frees (:attr:`DeviceState.step_transients`), at its start in
    their order (the log keeps push order at equal times); the states the first step makes as static state (no
    action), the rest as the step's."""
    steps = [(i, sp) for i, sp in enumerate(spans) if sp.kind == "step"]
    for k, (i, sp) in enumerate(steps):
        todo = [e for e in state.step_transients if k == 0 or not e[4]]
        while todo:  # runs of one kind, one chunk each
            n = next((j for j, e in enumerate(todo) if e[4] != todo[0][4]), len(todo))
            run, todo = todo[:n], todo[n:]
            action, iteration = (-1, -1) if run[0][4] else (i, sp.iteration)
            log.push(np.full(n, sp.start_us), [e[2] for e in run], [e[1] for e in run], [e[3] for e in run],
                     [names(e[0]) for e in run], -1, -1, -1, action, iteration)


@dataclass(frozen=True, slots=True)
class KeptFrees:
    """The frees of one backward action that Megatron's references move: ``mask`` over its phase's
    events and, per masked event, the time it moves to and the action (index into the spans) it
    then belongs to (NaN and −1: it never happens)."""

    mask: np.ndarray
    times: np.ndarray
    actions: np.ndarray


def _frees(ph: CompiledPhase, *, tensor: Callable[[str], bool] | None = None, op: str = "") -> np.ndarray:
    """Mask over ``ph``'s events: the frees made by op ``op``, or else of the tensors ``tensor`` accepts."""
    if op:
        hit = [ph.op_names[o] == op for o in ph.ev_op.tolist()]
    else:
        assert tensor is not None
        hit = [tensor(ph.tensor_names[t]) for t in ph.ev_tensor.tolist()]
    return (ph.ev_sign < 0) & np.array(hit, dtype=bool)


def kept_inputs(spans: list[Span], compiled: Compiled) -> dict[int, KeptFrees]:
    """Per backward action, the frees that Megatron's references to a chunk's received input and
    to the gradient it sends back defer (``DeviceState.keeps_input``). Keyed by span index.

    - The model chunk holds the tensor its last forward received (``recv_forward``'s buffer) and,
      once that micro-batch's backward ran, its ``.grad`` (the tensor ``send_backward`` sends) until
      the chunk's next forward hands it a new one: the frees of both move to the start of the
      chunk's next forward after that micro-batch's own, if that comes later (there, after the new
      buffer is made); the last forward's stay through the optimizer step, after the last
      iteration for good.
    - The schedule's loop variable ``input_tensor_grad`` holds the sent gradient until the rank's
      next backward returns, or the schedule function returns (the rank's last action of the
      iteration ends): the gradient's free moves there if that is later still.
    """
    forwards: dict[int, list[int]] = {}
    others: dict[int, list[int]] = {}  # per stage, its other actions (B, I, W) in span order
    for i, sp in enumerate(spans):
        if sp.kind == "F":
            forwards.setdefault(sp.stage, []).append(i)
        elif sp.kind != "step":
            others.setdefault(sp.stage, []).append(i)
    order = sorted((i for i, sp in enumerate(spans) if sp.kind != "step"), key=lambda i: spans[i].start_us)
    backwards = [i for i in order if spans[i].kind in ("B", "I")]
    next_backward = dict(zip(backwards, [*backwards[1:], -1], strict=True))
    last_of_iteration: dict[int, int] = {}
    for i in order:
        it = spans[i].iteration
        if it not in last_of_iteration or spans[i].end_us >= spans[last_of_iteration[it]].end_us:
            last_of_iteration[it] = i
    out: dict[int, KeptFrees] = {}
    for stage, fs in forwards.items():
        f_ph = compiled[(stage, "F")]
        recv_ops = [o for o, name in enumerate(f_ph.op_names) if name == "recv_forward"]
        made = np.isin(f_ph.ev_op, recv_ops) & (f_ph.ev_sign > 0)
        recv = {f_ph.tensor_names[t] for t in f_ph.ev_tensor[made].tolist()}
        if not recv:
            continue  # the chunk receives nothing: the first virtual stage
        fs = sorted(fs, key=lambda i: spans[i].start_us)
        nxt = {(spans[a].iteration, spans[a].microbatch): b for a, b in zip(fs, [*fs[1:], -1], strict=True)}
        # phase kind -> (the held frees' indices, which of them the sent gradient's, their offsets and ops)
        masks: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        for i in others.get(stage, ()):
            sp = spans[i]
            if sp.kind not in masks:
                ph = compiled[(stage, sp.kind)]
                sent = _frees(ph, op="send_backward")
                at = np.flatnonzero(sent | _frees(ph, tensor=recv.__contains__))
                masks[sp.kind] = at, sent[at], ph.ev_offset[at], ph.ev_op[at]
            at, sent_at, offsets, ops = masks[sp.kind]
            if not len(at):
                continue
            # only the held frees can move: the times of those alone
            freed_at = sp.start_us + span_offsets(sp, offsets, ops)
            times, actions = freed_at.copy(), np.full(len(freed_at), i, dtype=np.int64)
            to = nxt.get((sp.iteration, sp.microbatch), -1)
            if to < 0:
                times[:], actions[:] = np.nan, -1
            else:
                later = freed_at <= spans[to].start_us
                times[later], actions[later] = spans[to].start_us, to
            if sp.kind in ("B", "I") and to >= 0:
                nb = next_backward.get(i, -1)
                if nb < 0 or spans[nb].iteration != sp.iteration:
                    nb = last_of_iteration[sp.iteration]
                later = sent_at & (times < spans[nb].end_us)
                times[later], actions[later] = spans[nb].end_us, nb
            moved = (actions != i) | (times != freed_at)
            if moved.any():
                mask = np.zeros(len(compiled[(stage, sp.kind)].ev_offset), dtype=bool)
                mask[at[moved]] = True
                out[i] = KeptFrees(mask=mask, times=times[moved], actions=actions[moved])
    return out


def iterator_kept(spans: list[Span], compiled: Compiled) -> dict[int, KeptFrees]:
    """Per action, the frees of the micro-batch tensors Megatron-LM's rerun data iterator keeps
    (``batch.saved.*``: :mod:`timeline.graph.families.batch`): ``RerunDataIterator.advance`` drops
    the saved micro-batches when the next ``train_step`` begins (its
    ``should_run_forward_backward``), so each moves to the start of the next iteration's first
    action, after that iteration's optimizer step; after the last iteration it never happens.
    Keyed by span index."""
    first: dict[int, tuple[float, int]] = {}  # iteration -> (start, span index) of its first action
    step_end: dict[int, float] = {}
    for i, sp in enumerate(spans):
        if sp.kind == "step":
            step_end[sp.iteration] = max(step_end.get(sp.iteration, sp.end_us), sp.end_us)
        elif sp.kind != "init" and (sp.iteration not in first or sp.start_us < first[sp.iteration][0]):
            first[sp.iteration] = (sp.start_us, i)
    masks: dict[tuple[int, str], np.ndarray | None] = {}
    out: dict[int, KeptFrees] = {}
    for i, sp in enumerate(spans):
        if sp.kind in ("init", "step"):
            continue
        key = (sp.stage, sp.kind)
        if key not in masks:
            saved = _frees(compiled[key], tensor=lambda name: name.startswith("batch.saved."))
            masks[key] = saved if saved.any() else None
        held = masks[key]
        if held is None:
            continue
        nxt = first.get(sp.iteration + 1)
        n = int(held.sum())
        if nxt is None:
            out[i] = KeptFrees(mask=held, times=np.full(n, np.nan), actions=np.full(n, -1, dtype=np.int64))
        else:
            start = max(nxt[0], step_end.get(sp.iteration, nxt[0]))
            out[i] = KeptFrees(mask=held, times=np.full(n, start), actions=np.full(n, nxt[1], dtype=np.int64))
    return out


def combined_kept(spans: list[Span], compiled: Compiled) -> dict[int, KeptFrees]:
    """Per backward action of a combined-1F1B schedule (paired or alone: both run through
    ``combined_forward_backward_step``), the frees of its layer nodes' inputs' gradients and outputs,
    moved to the action's end (:func:`timeline.sim.combined.kept_node_io`: Megatron-Core before
    a56a0b001d, ``[framework] combined_1f1b_keeps_node_io``). Keyed by span index."""
    masks: dict[tuple[int, str], np.ndarray] = {}
    out: dict[int, KeptFrees] = {}
    for i, sp in enumerate(spans):
        if sp.kind != "B":
            continue
        key = (sp.stage, sp.kind)
        if key not in masks:
            f = compiled[(sp.stage, "F")]
            masks[key] = kept_node_io(f, forward_nodes(f), compiled[key])
        mask = masks[key]
        if mask.any():
            n = int(mask.sum())
            out[i] = KeptFrees(mask=mask, times=np.full(n, sp.end_us), actions=np.full(n, i, dtype=np.int64))
    return out


def _held_to_next_forward(spans: list[Span], compiled: Compiled, kinds: tuple[str, ...],
                          held: Callable[[int, str], dict[str, int]]) -> dict[int, KeptFrees]:
    """Per action of ``kinds``, the frees of the tensors ``held(stage, kind)`` names (tensor name → the forward op
    that lets it go), each moved to that op of the chunk's next forward after this micro-batch's own, where that is
    later (the last micro-batch's: into the next iteration, through the optimizer step; after the last iteration,
    never). Keyed by span index."""
    forwards: dict[int, list[int]] = {}
    for i, sp in enumerate(spans):
        if sp.kind == "F":
            forwards.setdefault(sp.stage, []).append(i)
    nxt: dict[tuple[int, int, int], int] = {}
    for stage, fs in forwards.items():
        fs = sorted(fs, key=lambda i: spans[i].start_us)
        for a, after in zip(fs, [*fs[1:], -1], strict=True):
            nxt[(stage, spans[a].iteration, spans[a].microbatch)] = after
    masks: dict[tuple[int, str], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None] = {}
    out: dict[int, KeptFrees] = {}
    for i, sp in enumerate(spans):
        if sp.kind not in kinds or (sp.stage, "F") not in compiled:
            continue
        key = (sp.stage, sp.kind)
        if key not in masks:
            at_op, ph = held(sp.stage, sp.kind), compiled[key]
            names = [ph.tensor_names[t] for t in ph.ev_tensor.tolist()]
            at = np.flatnonzero((ph.ev_sign < 0) & np.array([n in at_op for n in names], dtype=bool))
            masks[key] = (at, np.array([at_op[names[j]] for j in at.tolist()], dtype=np.int64),
                          ph.ev_offset[at], ph.ev_op[at]) if len(at) else None
        m = masks[key]
        if m is None:
            continue
        at, f_ops, offsets, ops = m
        freed_at = sp.start_us + span_offsets(sp, offsets, ops)
        to = nxt.get((sp.stage, sp.iteration, sp.microbatch), -1)
        if to < 0:
            times, actions = np.full(len(at), np.nan), np.full(len(at), -1, dtype=np.int64)
        else:
            f = compiled[(sp.stage, "F")]
            dropped = spans[to].start_us + span_offsets(spans[to], f.op_start[f_ops], f_ops)
            later = dropped > freed_at
            if not later.any():
                continue
            at, times, actions = at[later], dropped[later], np.full(int(later.sum()), to, dtype=np.int64)
        mask = np.zeros(len(compiled[key].ev_offset), dtype=bool)
        mask[at] = True
        out[i] = KeptFrees(mask=mask, times=times, actions=actions)
    return out


def router_graph_kept(spans: list[Span], compiled: Compiled) -> dict[int, KeptFrees]:
    """Per backward action of a combined-1F1B schedule with the alltoall dispatcher, the frees of each MoE
    layer's ``post_attn`` input and of that input's gradient, which the dispatcher's ``self.probs`` keeps
    alive through the router's autograd graph (:func:`timeline.sim.combined.router_inputs`) until the
    layer's next forward stores new probabilities (:func:`_held_to_next_forward`). Keyed by span index."""
    def held(stage: int, kind: str) -> dict[str, int]:
        f = compiled[(stage, "F")]
        at_op: dict[str, int] = {}  # tensor name -> the forward op that lets it go
        for name, op in router_inputs(f, forward_nodes(f)).values():
            at_op[name] = at_op["grad:" + name] = op
        return at_op

    return _held_to_next_forward(spans, compiled, ("B",), held)


#: per dispatcher (:attr:`DeviceState.dispatcher_keeps`), the tensors of an MoE layer (suffixes after its
#: ``<layer>.mlp.``) its token dispatcher references from the layer's forward until the layer's next forward
DISPATCHER_HELD: dict[str, tuple[str, ...]] = {
    # MoEAlltoAllTokenDispatcher.dispatch_preprocess: self.probs, self.routing_map (the router's outputs) and
    # self.reversed_local_input_permutation_mapping (permute's TE row-id map, or the unfused int64 sorted_indices)
    "alltoall": ("router.probs", "router.routing_map", "dispatch.row_id_map", "dispatch.sorted_idx"),
    # before Megatron-LM ac0474d26e (index routing): token_permutation's self.probs is [tokens, k] (the graph's
    # dense probs are not it) and the reversed mapping the sorted indices
    "alltoall_indices": ("dispatch.row_id_map", "dispatch.sorted_idx"),
    # _HybridEPManager: setup_metadata's token_probs and routing_map (the router's outputs, or their copies
    # expanded over expert-TP; token_probs.float() where not fp32), dispatch's dispatched_probs — whose
    # HybridEPDispatch node keeps the dispatch handle in ctx.handle (fused_a2a.py), so the handle's tensors too
    "hybridep": ("router.probs", "router.routing_map", "dispatch.expanded_probs", "dispatch.expanded_map",
                 "router.probs_fp32", "dispatch.expanded_probs_fp32", "dispatch.received_probs",
                 *(f"dispatch.{k}" for k in ("sparse_to_dense_map", "rdma_to_attn_map", "attn_to_rdma_map",
                                             "num_dispatched_tokens", "local_expert_routing_map", "row_id_map",
                                             "tokens_per_expert", "overflow_flag"))),
}


def dispatcher_held(f: CompiledPhase, dispatcher: str) -> dict[str, int]:
    """Per tensor of the forward phase ``f`` that an MoE layer's token dispatcher keeps referenced (the
    :data:`DISPATCHER_HELD` of ``dispatcher``), the forward op where the layer's next forward replaces it:
    the layer's first ``mlp.dispatch.*`` op (``dispatch_preprocess``). Where the flex dispatcher expands the
    router's outputs over expert-TP it keeps the copies, not the router's own."""
    suffixes = DISPATCHER_HELD.get(dispatcher, ())
    names = set(f.tensor_names)
    out: dict[str, int] = {}
    seen: set[str] = set()
    for o, op in enumerate(f.op_names):
        prefix, sep, _ = op.partition(".mlp.dispatch.")
        if not sep or prefix in seen:
            continue
        seen.add(prefix)
        held = [f"{prefix}.mlp.{s}" for s in suffixes]
        if f"{prefix}.mlp.dispatch.expanded_probs" in names:
            held = [n for n in held if not n.startswith(f"{prefix}.mlp.router.")]
        out.update((n, o) for n in held if n in names)
    return out


def dispatcher_kept(spans: list[Span], compiled: Compiled, dispatcher: str) -> dict[int, KeptFrees]:
    """Per action, the frees of the tensors each MoE layer's token dispatcher keeps as attributes
    (:func:`dispatcher_held`): the layer's next forward overwrites them, so each free moves to that op of the
    chunk's next forward (:func:`_held_to_next_forward`). Under recompute the backward's recomputed forward
    overwrites them first: the forward's frees of what the backward re-creates stay. Keyed by span index."""
    held_of: dict[int, dict[str, int]] = {}

    def held(stage: int, kind: str) -> dict[str, int]:
        if stage not in held_of:
            held_of[stage] = dispatcher_held(compiled[(stage, "F")], dispatcher)
        at_op = held_of[stage]
        if kind != "F":
            return at_op
        # what a later phase of the micro-batch re-creates is replaced there
        remade = {ph.tensor_names[t] for (st, k), ph in compiled.items() if st == stage and k != "F"
                  for t in ph.ev_tensor[ph.ev_sign > 0].tolist()}
        return {name: op for name, op in at_op.items() if name not in remade}

    return _held_to_next_forward(spans, compiled, ("F", "B", "I", "W"), held)


def head_wgrad_kept(spans: list[Span], compiled: Compiled, limit: int) -> dict[int, KeptFrees]:
    """Per backward action of the stage holding the output layer, the frees Megatron-LM's deferred
    embedding weight gradient (``--defer-embedding-wgrad-compute``) moves to the pipeline flush. Keyed
    by span index.

    ``megatron/core/tensor_parallel/layers.py`` (core_v0.12.0 … d98e8a64dd): ``ColumnParallelLinear.forward``
    appends its input to ``embedding_activation_buffer`` and
    ``LinearWithGradAccumulationAndAsyncCommunication.backward`` appends ``grad_output`` (the logits'
    gradient) to ``grad_output_buffer`` and skips the weight-gradient GEMM, while fewer than
    ``wgrad_deferral_limit`` entries are held (0: always); ``pipeline_parallel/schedules.py:
    finish_embedding_wgrad_compute`` runs them after the schedule's last backward
    (``core/utils.py: drain_embedding_wgrad_compute``, which pops each pair). So the frees the output
    layer's weight-gradient op (``*.output_layer.wgrad``) makes of its input and incoming gradient move,
    for an iteration's first ``limit`` micro-batches (every one at 0; each micro-batch calls it once, as
    ``from-megatron`` requires without MTP), to the end of the rank's last action of the iteration."""
    last_of_iteration: dict[int, int] = {}
    for i, sp in enumerate(spans):
        if sp.kind in ("init", "step"):
            continue
        j = last_of_iteration.get(sp.iteration)
        if j is None or sp.end_us >= spans[j].end_us:
            last_of_iteration[sp.iteration] = i
    masks: dict[tuple[int, str], np.ndarray | None] = {}
    out: dict[int, KeptFrees] = {}
    for i, sp in enumerate(spans):
        if sp.kind not in ("B", "I", "W") or (limit and sp.microbatch >= limit):
            continue
        key = (sp.stage, sp.kind)
        if key not in masks:
            ph = compiled[key]
            hit = [ph.op_names[o].endswith(".output_layer.wgrad") and not ph.tensor_names[t].endswith(
                ".output_layer.wgrad") for o, t in zip(ph.ev_op.tolist(), ph.ev_tensor.tolist(), strict=True)]
            held = (ph.ev_sign < 0) & np.array(hit, dtype=bool)
            masks[key] = held if held.any() else None
        held = masks[key]
        if held is None:
            continue
        to = last_of_iteration[sp.iteration]
        n = int(held.sum())
        out[i] = KeptFrees(mask=held, times=np.full(n, spans[to].end_us), actions=np.full(n, to, dtype=np.int64))
    return out


@dataclass(frozen=True, slots=True)
class _Moved:
    """An action's frees moved to one other action: its phase's ``key``, their ``times`` and ``columns``
    (sign, size, category, tensor and op ids: the same for every action of that key)."""

    key: Hashable
    times: np.ndarray
    columns: tuple[np.ndarray, ...]


def _merge(a: KeptFrees, b: KeptFrees) -> KeptFrees:
    """Two actions' moved frees over the same phase's events, as one (``b`` wins where both move one)."""
    mask = a.mask | b.mask
    times = np.full(len(mask), np.nan)
    actions = np.full(len(mask), -1, dtype=np.int64)
    for k in (a, b):
        times[k.mask], actions[k.mask] = k.times, k.actions
    return KeptFrees(mask=mask, times=times[mask], actions=actions[mask])


def _merge_later(a: KeptFrees, b: KeptFrees) -> KeptFrees:
    """Two actions' moved frees over the same phase's events, as one: where both move one, the later (never,
    NaN, latest of all)."""
    merged = _merge(a, b)
    times, actions = merged.times.copy(), merged.actions.copy()
    pos = np.cumsum(merged.mask) - 1  # each masked event's row in the merged arrays
    rows = pos[a.mask]
    keep = np.isnan(a.times) | (~np.isnan(times[rows]) & (a.times > times[rows]))
    times[rows[keep]], actions[rows[keep]] = a.times[keep], a.actions[keep]
    return KeptFrees(mask=merged.mask, times=times, actions=actions)


def _kept_frees(state: DeviceState, spans: list[Span], compiled: Compiled) -> dict[int, KeptFrees]:
    """Per action (span index), the frees Megatron's references defer, over ``compiled``'s phases."""
    kept = kept_inputs(spans, compiled) if state.keeps_input else {}
    if state.combined_keeps_node_io:
        for i, node_io in combined_kept(spans, compiled).items():
            kept[i] = _merge(kept[i], node_io) if i in kept else node_io
    if state.router_graph_kept:
        for i, held in router_graph_kept(spans, compiled).items():
            kept[i] = _merge_later(kept[i], held) if i in kept else held
    if state.dispatcher_keeps:
        for i, held in dispatcher_kept(spans, compiled, state.dispatcher_keeps).items():
            kept[i] = _merge_later(kept[i], held) if i in kept else held
    for i, saved in iterator_kept(spans, compiled).items():
        kept[i] = _merge(kept[i], saved) if i in kept else saved
    if state.deferred_head_wgrad >= 0:
        for i, saved in head_wgrad_kept(spans, compiled, state.deferred_head_wgrad).items():
            kept[i] = _merge(kept[i], saved) if i in kept else saved
    return kept


def device_events(tr: TrainingSpec, dev: StaticDevice, state: DeviceState, spans: list[Span], compiled: Compiled,
                  names: Names, capture: tuple[Compiled, CaptureRules] | None = None,
                  offload: OffloadSpec = NO_OFFLOAD) -> DeviceEvents:
    """Static state (as the plan's ``state`` says it comes into being), the CUDA graphs' capture
    (``capture``: its phases and rules, :mod:`timeline.sim.graph_capture`), then every action's template
    shifted to its start; fine-grained activation offloading's frees and reloads under ``offload``'s rules
    (:func:`timeline.sim.offload.offload_events`)."""
    first_bwd = min((s.start_us for s in spans if s.kind in ("B", "I")), default=0.0)
    first_step = min((s.start_us for s in spans if s.kind == "step"), default=0.0)
    log = _Log()
    late: list[tuple[float, str, int, int, int]] = []
    if state.per_parameter:  # one tensor per parameter; ``state.allocs`` holds the workspaces only
        for t, sign, name, size, cat, a in hf_state_events(
                tr, dev, spans, lambda sp: compiled.get((sp.stage, sp.kind)), state.pytorch):
            log.push([t], sign, size, cat, names(name), -1, -1, -1, a, spans[a].iteration if a >= 0 else -1)
    else:
        # each step's main-grad copies come before the first step's moments (prepare_grads, then step)
        _push_step_copies(log, state, spans, names)
    # the first backward runs eagerly where warm-up iterations precede the CUDA graphs' capture
    first_phases = capture[1].eager if capture is not None and capture[1].eager is not None else compiled
    at_op = {a[0]: first_backward_op(a[0][len(AT_OP):], spans, first_phases, first_bwd)
             for a in state.allocs if a[0].startswith(AT_OP)}
    timed = resolve(state.allocs, first_bwd, first_step, at_op)
    # static state in three chunks: from the start, the first step's (after the actions), at ops (last)
    static: list[tuple[float, str, int, int, int]] = []
    at_step: list[tuple[float, str, int, int, int]] = []
    for alloc, row in zip(state.allocs, timed, strict=True):
        (late if alloc[0] in at_op else at_step if alloc[0] == "first_step" else static).append(row)
    _push_static(log, static, names)  # one chunk: thousands of events under Megatron's layout
    if capture is not None:
        capture_events(log.push, spans, capture[0], capture[1], names)
    gather = state.gathered_bytes
    comm = CAT_CODE[Category.COMM]
    if state.fsdp is not None:
        for (t, sign, size, name), a in fsdp_windows.iteration_events(state.fsdp, spans):
            log.push([t], sign, size, comm, names(name), -1, -1, -1, a, spans[a].iteration,
                     fsdp_windows.stream_of(name))
    unit_ops: dict[int, dict[str, tuple[int, int]]] = {}  # per phase (by id: the phases live through this call)
    kept = _kept_frees(state, spans, compiled)
    # warm-up iterations before the CUDA graphs' capture run the eager phases (timeline.sim.graph_capture): their
    # actions' moved frees are the eager phases' (each mask is over its own action's phase)
    eager, captured_at = None, 0
    if capture is not None and capture[1].eager is not None:
        eager, captured_at = capture[1].eager, capture_iteration(spans, capture[1])
        kept_eager = _kept_frees(state, spans, eager)
        kept = {i: k for i, k in ((i, (kept_eager if spans[i].iteration < captured_at else kept).get(i))
                                  for i in range(len(spans))) if k is not None}
    # (columns or a phase's moved rows, mb, stage, action, iteration)
    deferred: list[tuple[tuple[np.ndarray, ...] | _Moved, int, int, int, int]] = []
    #: per (phase by id, the mask of its moved frees): its columns in the log's dtypes, and those of the moved frees
    phase_cols: dict[tuple[int, bytes | None], tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]] = {}
    for i, sp in enumerate(spans):
        if sp.kind == "step":
            continue
        ph = (eager if eager is not None and sp.iteration < captured_at else compiled)[(sp.stage, sp.kind)]
        m, s, it = sp.microbatch, sp.stage, sp.iteration
        fsdp: list[fsdp_windows.Event] = []
        if state.fsdp is not None:
            units = unit_ops.setdefault(id(ph), fsdp_windows.unit_ops(ph))
            fsdp = fsdp_windows.action_events(state.fsdp, sp, ph, units)
            _push_fsdp(log, names, [e for e in fsdp if e[1] > 0], comm, m, s, i, it)
        if gather:
            log.push([sp.start_us], 1, gather, comm, names("zero3.gathered_params"), -1, m, s, i, it)
        if len(ph.ev_offset):
            tensor_ids = names.cached((id(ph), "ev_tensor"), partial(_event_ids, names, ph, "tensor_names"))
            op_ids = names.cached((id(ph), "ev_op"), partial(_event_ids, names, ph, "op_names"))
            k = kept.get(i)
            # the phase's columns less the frees moved to other actions, and those moved frees' columns
            key = (id(ph), None if k is None else k.mask.tobytes())
            pc = phase_cols.get(key)
            if pc is None:
                full = tuple(np.asarray(v, dtype=dt) for (_, dt), v in zip(
                    _EVENT_COLUMNS, (ph.ev_offset, ph.ev_sign, ph.ev_size, ph.ev_cat, tensor_ids, op_ids), strict=True))
                pc = phase_cols[key] = (full if k is None else tuple(c[~k.mask] for c in full),
                                        () if k is None else tuple(c[k.mask] for c in full[1:]))
            if k is not None:
                first = int(k.actions[0])
                if first >= 0 and bool((k.actions == first).all()):  # every moved free to one action
                    deferred.append((_Moved(key, k.times, pc[1]), m, s, first, spans[first].iteration))
                else:
                    for a in np.unique(k.actions[k.actions >= 0]).tolist():
                        sel = k.actions == a
                        deferred.append(((k.times[sel], *(c[sel] for c in pc[1])), m, s, a, spans[a].iteration))
            if not sp.shift:  # stretched by the span alone: noted, laid out with the phase's other actions
                log.push_phase(key, pc[0], sp.start_us, sp.scale, m, s, i, it)
            else:  # a combined-1F1B half: each op moved by its own shift
                at = span_offsets(sp, ph.ev_offset, ph.ev_op) + sp.start_us
                cols0 = pc[0]
                log.push(at if k is None else at[~k.mask], cols0[1], cols0[2], cols0[3], cols0[4], cols0[5], m, s, i,
                         it)
        if gather:
            log.push([sp.end_us], -1, gather, comm, names("zero3.gathered_params"), -1, m, s, i, it)
        if fsdp:
            _push_fsdp(log, names, [e for e in fsdp if e[1] < 0], comm, m, s, i, it)  # after the action's own
    for c, d_mb, d_stage, d_action, d_it in deferred:  # after that forward's new buffer, same instant
        if isinstance(c, _Moved):
            log.push_timed(c.key, c.columns, c.times, d_mb, d_stage, d_action, d_it)
        else:
            log.push(c[0], c[1], c[2], c[3], c[4], c[5], d_mb, d_stage, d_action, d_it)
    # the first step's states and every step's transients after the actions' events: what the last backward frees
    # as it ends (at the step's start) is free before the step allocates
    _push_static(log, at_step, names)
    if not state.per_parameter:
        _push_step_transients(log, state, spans, names)
    # fine-grained activation offloading's frees and reloads, per chunk instance (timeline.sim.offload)
    offloads: list = []
    if any(ph.offload for ph in compiled.values()):
        later_frees = {i: frozenset(ph.tensor_names[t] for t in ph.ev_tensor[k.mask].tolist())
                       for i, k in kept.items() for ph in (compiled[(spans[i].stage, spans[i].kind)],)}
        offloads = offload_events(spans, lambda sp: compiled[(sp.stage, sp.kind)], pp_rank=dev.pp_rank,
                                  fraction=offload.fraction, delta_bytes=offload.delta_bytes, deferred=later_frees)
    for t, sign, size, cat, tensor, op, mb, stage, action, it, stream in offloads:
        log.push([t], sign, size, cat, names(tensor), names(op), mb, stage, action, it, stream)
    _push_static(log, late, names)  # pushed last: after the matching op's own allocations
    temp = CAT_CODE[Category.TEMPORARY]
    for rule in state.first_call:  # after the op's own allocations too, in its action
        for fc in first_call_events(rule, spans, first_phases):
            made = list(fc.tensors) + [(n, -z) for n, z in reversed(fc.tensors)]
            sp = spans[fc.action]
            log.push([fc.t_us] * len(made), [1 if z > 0 else -1 for _, z in made], [abs(z) for _, z in made], temp,
                     [names(n) for n, _ in made], names(fc.op), sp.microbatch, sp.stage, fc.action, sp.iteration)
    return log.events()


def _push_static(log: _Log, rows: list[tuple[float, str, int, int, int]], names: Names) -> None:
    """Resolved static-state rows (time, name, bytes, category, sign) as one chunk of no action."""
    if rows:
        cols = list(zip(*rows, strict=True))
        log.push(cols[0], cols[4], cols[2], cols[3], [names(n) for n in cols[1]], -1, -1, -1, -1, -1)


def _push_fsdp(log: _Log, names: Names, events: list[fsdp_windows.Event], cat: int, mb: int, stage: int,
               action: int, iteration: int) -> None:
    """Megatron-FSDP's events, each on its allocator stream (:func:`timeline.sim.fsdp_windows.stream_of`)."""
    for stream in (0, fsdp_windows.AG_STREAM):
        chunk = [e for e in events if fsdp_windows.stream_of(e[3]) == stream]
        if chunk:
            t, sign, size, name = zip(*chunk, strict=True)
            log.push(t, sign, size, cat, [names(n) for n in name], -1, mb, stage, action, iteration, stream)


def first_backward_op(pattern: str, spans: list[Span], compiled: Compiled, default: float) -> float:
    """When the first op matching ``pattern`` starts in the device's first backward action (its
    earliest ``B``/``I`` span), or ``default`` where none matches."""
    first = min((s for s in spans if s.kind in ("B", "I")), key=lambda s: s.start_us, default=None)
    if first is None:
        return default
    ph = compiled[(first.stage, first.kind)]
    rx = re.compile(pattern)
    hit = next((i for i, name in enumerate(ph.op_names) if rx.search(name)), None)
    return default if hit is None else _op_start_us(first, ph, hit)


def _op_start_us(sp: Span, ph: CompiledPhase, i: int) -> float:
    """When op ``i`` of phase ``ph`` starts in span ``sp`` (stretched and shifted as the span is)."""
    return sp.start_us + float(span_offsets(sp, ph.op_start[i:i + 1], np.array([i]))[0])


def _first_op(rx: re.Pattern[str], spans: list[Span], compiled: Compiled, kinds: tuple[str, ...]
              ) -> tuple[int, CompiledPhase, int] | None:
    """(span index, phase, op index) of the first op matching ``rx`` in the device's earliest action of
    ``kinds`` that runs one."""
    hits: dict[tuple[int, str], int | None] = {}  # per phase: the op's index, searched once
    for a in sorted((j for j, s in enumerate(spans) if s.kind in kinds), key=lambda j: spans[j].start_us):
        key = (spans[a].stage, spans[a].kind)
        ph = compiled[key]
        if key not in hits:
            hits[key] = next((i for i, name in enumerate(ph.op_names) if rx.search(name)), None)
        hit = hits[key]
        if hit is not None:
            return a, ph, hit
    return None


class FirstCallEvents(NamedTuple):
    """One set of a compiled step's first-call transients, at ``t_us`` in action ``action`` (a span index) of
    op ``op``: ``tensors`` (name, bytes) allocated in order, then freed in reverse."""

    t_us: float
    action: int
    op: str
    tensors: tuple[tuple[str, int], ...]


def first_call_events(rule: FirstCall, spans: list[Span], compiled: Compiled) -> list[FirstCallEvents]:
    """A compiled step's first-call transients (:class:`timeline.profiles.base.FirstCall`): at the start of the
    first forward op ``rule.op`` matches, each copy of that op's ``<op>.<like>`` tensor and the flush buffer; the
    same at that op (by its name) in the first backward that runs it; none where no forward runs such an op."""
    rx = re.compile(rule.op)
    fwd = _first_op(rx, spans, compiled, ("F",))
    if fwd is None:
        return []
    _, ph, i = fwd
    size = 0
    if rule.forward_copies or rule.backward_copies:
        like = f"{ph.op_names[i]}.{rule.like}"
        size = next((int(z) for z, k, sign in zip(ph.ev_size.tolist(), ph.ev_tensor.tolist(), ph.ev_sign.tolist(),
                                                   strict=True) if sign > 0 and ph.tensor_names[k] == like), 0)
        if not size:
            return []
    out = []
    # that op's own backward, not another op the pattern matches (unless the rule says any)
    same = re.compile(f"^{re.escape(ph.op_names[i])}$") if rule.backward_same_op else rx
    for hit, copies, phase in ((fwd, rule.forward_copies, "forward"),
                               (_first_op(same, spans, compiled, ("B", "I")), rule.backward_copies, "backward")):
        if hit is None:
            continue
        a, ph, i = hit
        t = _op_start_us(spans[a], ph, i)
        base = f"autotune.{rule.tag}.{phase}" if rule.tag else f"autotune.{phase}"
        made = ((f"{base}.flush", rule.flush_bytes), *((f"{base}.copy{j}.{rule.like}", size) for j in range(copies)))
        out.append(FirstCallEvents(t_us=t, action=a, op=ph.op_names[i], tensors=made))
    return out


def device_ops(spans: list[Span], compiled: Compiled, names: Names) -> DeviceOps:
    """Every op of every action, shifted (and stretched, for an overlapped pair) to its span."""
    cols: dict[str, list] = {k: [] for k in DeviceOps.__slots__}
    for sp in spans:
        if sp.kind == "step":
            for k, v in (("name", names("optimizer.step")), ("stream", names("compute")),
                         ("t_start_us", sp.start_us), ("t_end_us", sp.end_us), ("phase", names("step")),
                         ("microbatch", -1), ("stage", -1), ("layer", -1), ("flops", 0.0)):
                cols[k].append(np.array([v]))
            continue
        ph = compiled[(sp.stage, sp.kind)]
        n = len(ph.op_names)
        if not n:
            continue
        phase = names.cached((id(ph), "phase", sp.kind), partial(_phase_ids, names, ph, sp.kind))
        cols["name"].append(names.ids(ph, "op_names"))
        if sp.overlapped:  # beside the forward half: its own threads, so slices stay nested
            cols["stream"].append(names.cached((id(ph), "overlapped"), partial(_overlapped_ids, names, ph)))
        else:
            cols["stream"].append(names.ids(ph, "op_streams"))
        index = np.arange(n)
        cols["t_start_us"].append(span_offsets(sp, ph.op_start, index) + sp.start_us)
        cols["t_end_us"].append(span_offsets(sp, ph.op_end, index) + sp.start_us)
        cols["phase"].append(phase)
        cols["microbatch"].append(np.full(n, sp.microbatch, dtype=np.int32))
        cols["stage"].append(np.full(n, sp.stage, dtype=np.int16))
        cols["layer"].append(names.cached((id(ph), "layers"), partial(np.array, ph.op_layers, dtype=np.int32)))
        cols["flops"].append(ph.op_flops)
    return DeviceOps(**{k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()})
