"""Serving (DESIGN §12): a continuous-batching scheduler in the style of vLLM V1's token-budget
scheduler, in simpy.

Per step (``vllm/v1/core/sched/scheduler.py`` ``Scheduler.schedule``): with a budget of
``max_num_batched_tokens`` tokens, first every *running* request gets its next tokens (one when
decoding, the rest of its prompt — chunked to the budget — when prefilling), allocating blocks of
``block_size`` tokens (``kv_cache_manager.py`` ``allocate_slots``); when a request cannot get a
block, the most recently admitted running request is preempted (``_preempt_request``: blocks freed,
computed tokens reset, back to the front of the queue — recompute) until it fits or it is itself
preempted. Then, if nothing was preempted this step, *waiting* requests are admitted in order while
fewer than ``max_num_seqs`` run and the budget lasts, reusing a resident shared prefix's full blocks
(``find_longest_cache_hit``: whole blocks only, at least the last prompt token recomputed) with a
reference count. A request is done when it has all its output tokens; its blocks return to the pool.
A shared prefix whose last user finishes stays cached in free blocks (``block_pool.py``: freed
blocks keep their hash in the free queue) until a later request of that prefix revives it or an
allocation needs the space; eviction takes the least recently freed prefix, a whole prefix at a time
(vLLM evicts block by block).

Rejected on arrival, with a reason: prompt + output beyond ``max_model_len``, or more blocks than the
whole pool.

KV cache groups (vLLM's hybrid KV cache manager, :func:`timeline.serve.kv.kv_layout`): with
``full_groups`` full-attention groups and one sliding group per entry of ``sliding_windows``, a request
takes a block per group per ``block_size`` tokens from the one pool, and before each allocation a
sliding group frees the blocks that left its window (``single_type_kv_cache_manager.py``
``remove_skipped_blocks``: the first ``max(0, computed − window + 1) // block_size`` blocks). Prefix
sharing is not modelled across sliding groups (the run's validation refuses traces that would need it).
The defaults (one full group) are the plain scheduler. Step durations come from a callable (the roofline, :mod:`timeline.serve.steptime`);
what each step allocates is the caller's (:mod:`timeline.serve.run`). Ties are broken by request id.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field

import simpy

from timeline.spec.serving import Request


@dataclass(slots=True)
class ReqState:
    req: Request
    computed: int = 0  # tokens whose KV is in the cache
    generated: int = 0  # output tokens produced
    own_blocks: int = 0
    shared_blocks: int = 0  # blocks of a shared prefix it references
    skipped_blocks: int = 0  # sliding-group blocks freed as they left the window (null blocks)
    first_token_us: float = -1.0
    finish_us: float = -1.0
    preemptions: int = 0
    rejected: str = ""

    @property
    def total_tokens(self) -> int:
        return self.req.prompt_tokens + self.generated


@dataclass(slots=True)
class Step:
    """One engine step as it ran."""

    t_start_us: float
    t_end_us: float
    num_tokens: int
    num_reqs: int
    decode_only: bool
    context_tokens: int  # KV tokens read by attention over the step
    blocks_used: int
    running: int
    waiting: int
    preempted: int  # requests preempted in this step
    # with DP ranks stepping together (timeline.sim.dp_batching): the tokens this rank's forward runs
    # (padded to the other ranks'), the MoE layer's tokens gathered from every rank, and whether the
    # rank had nothing of its own (a dummy batch); 0 / 0 / False otherwise
    padded_tokens: int = 0
    moe_tokens: int = 0
    dummy: bool = False


@dataclass(slots=True)
class SchedulerResult:
    states: list[ReqState]
    steps: list[Step] = field(default_factory=list)
    max_blocks_used: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    num_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    # SGLang without chunked prefill: a prompt over the prefill budget runs when it is the first of its prefill
    # batch (managers/schedule_policy.py PrefillAdder.add_one_req, 0.5.12: ``input_tokens >= rem_input_tokens``
    # stops only a batch that already has a request)
    oversized_prompt_alone: bool = False
    full_groups: int = 1  # full-attention KV cache groups
    sliding_windows: tuple[int, ...] = ()  # one window per sliding-window KV cache group

    def request_peak_blocks(self, tokens: int) -> int:
        """The most blocks a request of ``tokens`` tokens can hold: ``cdiv(tokens, block_size)`` per
        full group, ``cdiv(min(window − 1 + max_num_batched_tokens, tokens), block_size) + 1`` per sliding
        group (vLLM's ``SlidingWindowSpec.max_memory_usage_bytes`` / page, the admission check)."""
        bs = self.block_size
        return self.full_groups * blocks_for(tokens, bs) + sum(
            blocks_for(min(w - 1 + self.max_num_batched_tokens, tokens), bs) + 1 for w in self.sliding_windows)


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class Engine:
    """The scheduler's state and one step's decisions; :func:`simulate_requests` drives it in time."""

    def __init__(self, cfg: SchedulerConfig, requests: tuple[Request, ...]) -> None:
        self.cfg = cfg
        self.states = [ReqState(r) for r in requests]
        self.waiting: deque[ReqState] = deque()
        self.running: list[ReqState] = []
        self.free_blocks = cfg.num_blocks
        self.prefix: dict[str, list[int]] = {}  # prefix_id -> [blocks, refcount ≥ 1]
        #: prefixes no request holds, still in free blocks, least recently freed first
        self.cached: OrderedDict[str, int] = OrderedDict()
        self.cached_blocks = 0
        self.done = 0

    @property
    def used_blocks(self) -> int:
        return self.cfg.num_blocks - self.free_blocks

    def arrive(self, st: ReqState) -> None:
        r, c = st.req, self.cfg
        if r.prompt_tokens + r.output_tokens > c.max_model_len:
            st.rejected = f"prompt + output = {r.prompt_tokens + r.output_tokens} tokens exceed max_model_len={c.max_model_len}"
        elif c.request_peak_blocks(r.prompt_tokens + r.output_tokens) > c.num_blocks:
            st.rejected = (f"needs {c.request_peak_blocks(r.prompt_tokens + r.output_tokens)} KV blocks; "
                           f"the pool has {c.num_blocks}")
        if st.rejected:
            self.done += 1
        else:
            self.waiting.append(st)

    def _grow(self, st: ReqState, tokens: int) -> bool:
        """Give ``st`` blocks for ``tokens`` cached tokens; False (nothing taken) if the pool is short."""
        c = self.cfg
        if c.sliding_windows:  # free what left each sliding window (remove_skipped_blocks), then allocate
            skipped = sum(max(0, st.computed - w + 1) // c.block_size for w in c.sliding_windows)
            if skipped > st.skipped_blocks:
                st.own_blocks -= skipped - st.skipped_blocks
                self.free_blocks += skipped - st.skipped_blocks
                st.skipped_blocks = skipped
        groups = c.full_groups + len(c.sliding_windows)
        need = groups * blocks_for(tokens, c.block_size) - st.skipped_blocks - st.shared_blocks - st.own_blocks
        if need > self.free_blocks:
            return False
        while need > self.free_blocks - self.cached_blocks:  # evict cached prefixes, oldest first
            _, blocks = self.cached.popitem(last=False)
            self.cached_blocks -= blocks
        if need > 0:
            self.free_blocks -= need
            st.own_blocks += need
        return True

    def _release(self, st: ReqState) -> None:
        self.free_blocks += st.own_blocks
        st.own_blocks = 0
        st.skipped_blocks = 0
        if st.shared_blocks:
            entry = self.prefix[st.req.prefix_id]
            entry[1] -= 1
            if entry[1] == 0:  # free, but cached for the next request of this prefix
                self.free_blocks += entry[0]
                del self.prefix[st.req.prefix_id]
                self.cached[st.req.prefix_id] = entry[0]
                self.cached_blocks += entry[0]
            st.shared_blocks = 0

    def _preempt(self, st: ReqState) -> None:
        self._release(st)
        st.computed = 0
        st.preemptions += 1
        self.running.remove(st)
        self.waiting.appendleft(st)

    def _share_prefix(self, st: ReqState) -> None:
        r, bs = st.req, self.cfg.block_size
        if not (self.cfg.enable_prefix_caching and r.prefix_id and r.prefix_tokens >= bs) or self.cfg.sliding_windows:
            return
        full = min(r.prefix_tokens, r.prompt_tokens - 1) // bs  # the last prompt token is always computed
        if r.prefix_id in self.cached and full:  # revive a cached prefix: its blocks leave the free pool
            blocks = self.cached.pop(r.prefix_id)
            self.cached_blocks -= blocks
            self.free_blocks -= blocks
            self.prefix[r.prefix_id] = [blocks, 0]
        entry = self.prefix.get(r.prefix_id)
        if entry is not None and full:
            entry[1] += 1
            st.shared_blocks = min(entry[0], full)
            st.computed = st.shared_blocks * bs

    def _publish_prefix(self, st: ReqState) -> None:
        """Once a request has computed its prefix's full blocks, they become shareable."""
        r, bs = st.req, self.cfg.block_size
        if not (self.cfg.enable_prefix_caching and r.prefix_id) or r.prefix_id in self.prefix or st.shared_blocks \
                or self.cfg.sliding_windows:
            return
        if r.prefix_id in self.cached:  # recomputed meanwhile: the newer copy replaces the cached one
            self.cached_blocks -= self.cached.pop(r.prefix_id)
        full = min(r.prefix_tokens, r.prompt_tokens - 1) // bs
        if full and st.computed >= full * bs:
            st.own_blocks -= full
            st.shared_blocks = full
            self.prefix[r.prefix_id] = [full, 1]

    def schedule(self) -> tuple[list[tuple[ReqState, int]], int]:
        """The step's (request, new tokens) and how many were preempted."""
        c = self.cfg
        budget = c.max_num_batched_tokens
        batch: list[tuple[ReqState, int]] = []
        preempted = 0
        i = 0
        while i < len(self.running) and budget > 0:
            st = self.running[i]
            new = min(st.total_tokens - st.computed, budget)
            while not self._grow(st, st.computed + new):
                victim = self.running[-1]
                self._preempt(victim)
                preempted += 1
                if victim is st:
                    break
            else:
                batch.append((st, new))
                budget -= new
                i += 1
        if not preempted:
            admitted = False
            while self.waiting and len(self.running) < c.max_num_seqs and budget > 0:
                st = self.waiting[0]
                if not st.own_blocks and not st.shared_blocks:
                    self._share_prefix(st)
                new = st.total_tokens - st.computed
                if new > budget and not c.enable_chunked_prefill and (admitted or not c.oversized_prompt_alone):
                    break
                if c.enable_chunked_prefill:
                    new = min(new, budget)
                admitted = True
                if not self._grow(st, st.computed + new):
                    self._release(st)
                    st.computed = 0
                    break
                self.waiting.popleft()
                self.running.append(st)
                batch.append((st, new))
                budget -= new
        return batch, preempted

    def finish_step(self, batch: list[tuple[ReqState, int]], now: float) -> None:
        for st, new in batch:
            st.computed += new
            self._publish_prefix(st)
            if st.computed >= st.total_tokens:  # the step sampled a token for this request
                st.generated += 1
                if st.first_token_us < 0:
                    st.first_token_us = now
                if st.generated >= st.req.output_tokens:
                    st.finish_us = now
                    self._release(st)
                    self.running.remove(st)
                    self.done += 1


def simulate_requests(cfg: SchedulerConfig, requests: tuple[Request, ...],
                      step_us: Callable[[list[tuple[ReqState, int]]], float],
                      on_step: Callable[[Step], None] | None = None) -> SchedulerResult:
    """Run the load to completion; ``step_us(batch)`` is a step's duration."""
    env = simpy.Environment()
    eng = Engine(cfg, requests)
    result = SchedulerResult(states=eng.states)
    work = env.event()
    pending = {"wake": work}

    def arrivals() -> Generator[simpy.Event, None, None]:
        for st in eng.states:
            if st.req.arrival_us > env.now:
                yield env.timeout(st.req.arrival_us - env.now)
            eng.arrive(st)
            if not pending["wake"].triggered:
                pending["wake"].succeed()

    def engine() -> Generator[simpy.Event, None, None]:
        while eng.done < len(eng.states):
            batch, preempted = eng.schedule()
            if not batch:
                pending["wake"] = env.event()
                yield pending["wake"]
                continue
            t0 = env.now
            yield env.timeout(step_us(batch))
            eng.finish_step(batch, env.now)
            tokens = sum(n for _, n in batch)
            step = Step(t_start_us=t0, t_end_us=env.now, num_tokens=tokens, num_reqs=len(batch),
                        decode_only=all(n == 1 and st.computed > st.req.prompt_tokens for st, n in batch),
                        context_tokens=sum(st.computed for st, _ in batch), blocks_used=eng.used_blocks,
                        running=len(eng.running), waiting=len(eng.waiting), preempted=preempted)
            assert 0 <= eng.free_blocks <= cfg.num_blocks, "blocks in use exceed the pool"
            result.max_blocks_used = max(result.max_blocks_used, eng.used_blocks)
            result.steps.append(step)
            if on_step is not None:
                on_step(step)

    env.process(arrivals())
    env.process(engine())
    env.run()
    return result
