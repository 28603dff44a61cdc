"""``serve(run)``: the budget, the CUDA-graph pool, then the request timeline with each step's
memory, as one :class:`ServeResult` (columnar numpy arrays; exporters only format it).

Memory on the device (one representative: every TP/EP rank holds the same): the weights and the
KV pool are allocated first (vLLM ``initialize_kv_cache``: one tensor per layer of
``num_blocks × page_size`` bytes); a graph-replayed step allocates nothing (its transients live in
the graph pool, captured largest size first as vLLM's ``capture_model`` does, one pool shared by
every size, so the pool is the largest capture's footprint); an eager step's transients go through
the caching-allocator model. A step is replayed when the engine captures graphs (not
``enforce_eager``, ``cudagraph_mode`` ≠ none), its token count fits the largest capture size and,
for ``full_decode_only``, it is decode-only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from timeline.alloc.caching import CachingAllocator
from timeline.alloc.config import AllocatorConfig
from timeline.serve.budget import Budget, compute_budget, compute_budgets, with_engine_requests
from timeline.serve.dp import dp_ranks, moe_per_token
from timeline.serve.graph_view import FUSED_MOE_CHUNK, device_params, pp_layers, step_ops
from timeline.serve.hf import hf_timeline
from timeline.serve.requests import synthetic_requests
from timeline.serve.steptime import step_cost
from timeline.serve.transients import (
    SAMPLER_NAMES,
    StepTransients,
    new_allocator,
    run_through_allocator,
    sampler_tensors,
    step_transients,
    step_transients_affine,
    step_transients_scaled,
)
from timeline.sim.batching import ReqState, SchedulerConfig, SchedulerResult, Step, simulate_requests
from timeline.spec.engine_versions import vllm_capture_sizes
from timeline.spec.serving import Request, ServeRunSpec

#: buffers :func:`~timeline.serve.transients.sampler_tensors` returns
SAMPLER_BUFFERS = len(SAMPLER_NAMES)


def _per_token_plan(run: ServeRunSpec, stage: int = 0) -> StepTransients | None:
    """The one-token plan when the step's tensors grow exactly linearly with its tokens (checked
    on 1, 2 and 3 tokens: same allocations, sizes in proportion), else None."""
    one, two, three = (step_transients(step_ops(run, t, stage), [0] * SAMPLER_BUFFERS) for t in (1, 2, 3))
    if [j for _, j in one.plan] != [j for _, j in two.plan] or [j for _, j in one.plan] != [j for _, j in three.plan]:
        return None
    if any(b != 2 * a or c != 3 * a for (a, _), (b, _), (c, _) in zip(one.plan, two.plan, three.plan, strict=True)):
        return None
    return one


#: a template plan and, per allocation, its bytes per token and per gathered MoE token
GatherPlan = tuple[StepTransients, list[int], list[int]]


def _gather_plan(run: ServeRunSpec, stage: int = 0) -> GatherPlan | None:
    """A DP rank's step plan as ``a·tokens + b·moe_tokens`` per allocation (its own tokens through
    attention, the gathered ones through the MoE layers), when exactly so: checked on (1, 1), (2, 1),
    (1, 2) and (2, 3) tokens; else None."""
    p11, p21, p12, p23 = (step_transients(step_ops(run, t, stage, m), [0] * SAMPLER_BUFFERS)
                          for t, m in ((1, 1), (2, 1), (1, 2), (2, 3)))
    if any([j for _, j in p.plan] != [j for _, j in p11.plan] for p in (p21, p12, p23)):
        return None
    s11, s21, s12, s23 = ([size for size, j in p.plan if j < 0] for p in (p11, p21, p12, p23))
    a = [y - x for x, y in zip(s11, s21, strict=True)]
    b = [y - x for x, y in zip(s11, s12, strict=True)]
    if any(x != i + j or z != 2 * i + 3 * j or i < 0 or j < 0 for x, z, i, j in zip(s11, s23, a, b, strict=True)):
        return None
    return p11, a, b


def capture_sizes(run: ServeRunSpec) -> tuple[int, ...]:
    """The batch sizes captured, largest first: vLLM's at its version
    (:func:`timeline.spec.engine_versions.vllm_capture_sizes`), elsewhere the run's, else 1, 2, 4, then multiples
    of 8 up to ``min(max_num_seqs · 2, 512)``; never above ``max_num_batched_tokens``; none when eager."""
    sv = run.serving
    if sv.enforce_eager or sv.cudagraph_mode == "none":
        return ()
    if sv.engine == "vllm":
        spec = sv.num_speculative_tokens if sv.speculative_method else 0
        return vllm_capture_sizes(sv.engine_version, sv.max_num_seqs, sv.max_num_batched_tokens, sv.cuda_graph_sizes,
                                  sv.max_cudagraph_capture_size, spec)[::-1]
    sizes = sv.cuda_graph_sizes or (1, 2, 4, *range(8, min(sv.max_num_seqs * 2, 512) + 1, 8))
    return tuple(sorted({s for s in sizes if s <= sv.max_num_batched_tokens}, reverse=True))


@dataclass(slots=True)
class ServeResult:
    run: ServeRunSpec
    budget: Budget
    capture_sizes: tuple[int, ...]
    sched: SchedulerResult
    #: memory rows: t_us and bytes by part, plus KV blocks and request counts
    memory: dict[str, np.ndarray] = field(default_factory=dict)
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    peak_time_us: float = 0.0
    num_eager_steps: int = 0
    #: (action, address, size, t_us, tensor) allocator entries, the last N (memory_viz)
    alloc_trace: list = field(default_factory=list)
    #: the allocator's segments at the end, weights and KV pool still allocated
    end_segments: list = field(default_factory=list)
    #: every pipeline stage's device (pp > 1; the fields above are stage 0's)
    stages: list[StageMemory] = field(default_factory=list)
    #: every DP rank's device (dp > 1; the fields above are rank 0's, ``sched.states`` every request)
    ranks: list[RankMemory] = field(default_factory=list)
    #: each request's DP rank, in request order (dp > 1)
    rank_of: list[int] = field(default_factory=list)
    #: how the engine splits the run into DP ranks (dp > 1: :func:`timeline.serve.dp_run.serve_dp`)
    data_parallel: dict = field(default_factory=dict)


@dataclass(slots=True, kw_only=True)
class RankMemory:
    """One DP rank's device over its own timeline: its steps, memory rows, budget and peaks."""

    rank: int
    sched: SchedulerResult
    memory: dict[str, np.ndarray]
    budget: Budget
    requests: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_time_us: float
    num_eager_steps: int


@dataclass(slots=True, kw_only=True)
class StageMemory:
    """One pipeline stage's device over the timeline: its budget and peaks."""

    stage: int
    layers: range
    budget: Budget
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_time_us: float
    num_eager_steps: int


def run_requests(run: ServeRunSpec) -> tuple[Request, ...]:
    """The run's request trace, else its synthetic load (validation gives a run one of the two)."""
    if run.requests:
        return run.requests
    assert run.load is not None
    return synthetic_requests(run.load)


def serve_hf(run: ServeRunSpec) -> ServeResult:
    """``engine = "hf"``: generate batches with a concatenated cache (:mod:`timeline.serve.hf`);
    memory is the weights plus the cache's peak per step (the step's activations are not modelled)."""
    budget = compute_budget(run)
    requests = run_requests(run)
    params = device_params(run)
    cost = step_cost(run, params, budget.weights_bytes, budget.kv_bytes_per_token)
    sched, rows = hf_timeline(run.model, run.serving.dtype, requests, run.serving.max_num_seqs, cost.step_us)
    n = len(rows)
    t = np.array([r[0] for r in rows], dtype=np.float64)
    cache_peak = np.array([r[2] for r in rows], dtype=np.int64)
    allocated = budget.weights_bytes + cache_peak
    zeros = np.zeros(n, dtype=np.int64)
    memory = {"t_us": t, "allocated_bytes": allocated, "reserved_bytes": allocated.copy(),
              "temporary_bytes": cache_peak - np.array([r[1] for r in rows], dtype=np.int64),
              "kv_blocks_used": zeros, "requests_running": np.array([s.running for s in sched.steps], dtype=np.int64),
              "requests_waiting": np.array([s.waiting for s in sched.steps], dtype=np.int64),
              "requests_preempted": zeros.copy(), "weights_bytes": np.full(n, budget.weights_bytes, dtype=np.int64),
              "kv_cache_bytes": np.array([r[1] for r in rows], dtype=np.int64), "cuda_graph_bytes": zeros.copy(),
              "kv_blocks_free": zeros.copy()}
    k = int(np.argmax(allocated)) if n else 0
    return ServeResult(run=run, budget=budget, capture_sizes=(), sched=sched, memory=memory,
                       peak_allocated_bytes=int(allocated[k]) if n else budget.weights_bytes,
                       peak_reserved_bytes=int(allocated[k]) if n else budget.weights_bytes,
                       peak_time_us=float(t[k]) if n else 0.0, num_eager_steps=n)


def serve(run: ServeRunSpec, record_entries: int = 0) -> ServeResult:
    """Simulate the deployment; ``record_entries`` > 0 keeps the allocator's last N trace entries
    and its end-state segments for a memory_viz snapshot (like PyTorch's ring buffer); −1 keeps
    every entry (events.parquet). With ``pp`` > 1 one scheduler drives every stage (vLLM's engine
    core schedules for all workers, with the workers' smallest pool); each stage's device runs the
    step's tokens through its own layers; the memory rows, trace and snapshot are stage 0's, every
    stage's budget and peaks are in ``stages``. A step's duration is the whole model's (the stages in
    sequence; vLLM's concurrent batches over the pipeline are not modelled)."""
    run = with_engine_requests(run)  # SGLang's own max_running_requests where none is given
    if run.serving.engine == "hf":
        return serve_hf(run)
    if dp_ranks(run) > 1:
        from timeline.serve.dp_run import serve_dp

        return serve_dp(run, record_entries)
    budgets = compute_budgets(run)
    budget = budgets[0]
    sv = run.serving
    sizes = capture_sizes(run)
    requests = run_requests(run)
    stages = range(run.parallel.pp)
    params = [t for s in stages for t in device_params(run, s)]
    weights = sum(b.weights_bytes for b in budgets)
    cost = step_cost(run, params, weights, sum(b.kv_bytes_per_token for b in budgets))
    cfg = SchedulerConfig(num_blocks=budget.num_kv_blocks, block_size=budget.block_size,
                          max_num_seqs=sv.max_num_seqs, max_num_batched_tokens=sv.max_num_batched_tokens,
                          max_model_len=run.max_model_len, enable_chunked_prefill=sv.enable_chunked_prefill,
                          oversized_prompt_alone=sv.engine == "sglang",
                          enable_prefix_caching=sv.enable_prefix_caching,
                          full_groups=budget.kv_layout.full_groups, sliding_windows=budget.kv_layout.sliding_windows)

    def step_us(batch: Sequence[tuple[ReqState, int]]) -> float:
        tokens = sum(n for _, n in batch)
        kv = sum(st.computed + n for st, n in batch)
        pairs = sum(n * (st.computed + (n + 1) / 2) for st, n in batch)
        return cost.step_us(tokens, kv, pairs)

    first = _Device(run, 0, budget, sizes, record_entries)
    sched = simulate_requests(cfg, requests, step_us, first.on_step)
    devices = [first]
    for s in stages[1:]:  # the later stages see the same steps
        dev = _Device(run, s, budgets[s], sizes, 0)
        for step in sched.steps:
            dev.on_step(step)
        dev.finish()
        devices.append(dev)
    first.finish()
    stage_rows = [StageMemory(stage=d.stage, layers=pp_layers(run)[d.stage], budget=d.budget_out,
                              peak_allocated_bytes=d.peak[0], peak_reserved_bytes=d.peak_reserved,
                              peak_time_us=d.peak[2], num_eager_steps=d.eager) for d in devices] \
        if run.parallel.pp > 1 else []
    return ServeResult(run=run, budget=first.budget_out, capture_sizes=sizes, sched=sched, memory=first.memory,
                       peak_allocated_bytes=first.peak[0], peak_reserved_bytes=first.peak_reserved,
                       peak_time_us=first.peak[2], num_eager_steps=first.eager,
                       alloc_trace=list(first.trace) if record_entries else [], end_segments=first.end_segments,
                       stages=stage_rows)


class _Device:
    """One device's memory over the steps: the weights and the KV tensors first, a captured graph
    pool, then each eager step's transients through the caching-allocator model."""

    def __init__(self, run: ServeRunSpec, stage: int, budget: Budget, sizes: tuple[int, ...],
                 record_entries: int, like: _Device | None = None) -> None:
        self.run, self.stage, self.budget, self.sizes = run, stage, budget, sizes
        sv = run.serving
        self.reqs_cap = min(sv.max_num_seqs, sv.max_num_batched_tokens)
        self.sampler = stage == run.parallel.pp - 1  # logits and sampling on the last stage
        # a device alike (another DP rank's) shares its step plans and graph pool
        self.moe_per_token = moe_per_token(run)  # MoE tokens gathered per token of a captured graph (DP ranks)
        self.linear: StepTransients | None = like.linear if like is not None else _per_token_plan(run, stage)
        self.gather: GatherPlan | None = like.gather if like is not None \
            else _gather_plan(run, stage) if self.moe_per_token else None
        self.plan: Callable[[int, int, int], StepTransients] = like.plan if like is not None \
            else lru_cache(maxsize=4096)(self._plan)
        self.graph_pool: int = like.graph_pool if like is not None else 0
        if sizes and like is None:  # one private pool, largest capture first; its footprint is what the largest leaves reserved
            pool = new_allocator(run, budget.total_bytes)
            for size in sizes[:1]:
                run_through_allocator(pool, self.plan(size, 0, self.moe_per_token * size))
            self.graph_pool = pool.reserved_bytes
        self.trace: deque = deque(maxlen=None if record_entries < 0 else record_entries or 1)
        self.clock = 0.0
        self.record_entries = record_entries
        self.alloc = CachingAllocator(AllocatorConfig.from_spec(run.allocator), capacity_bytes=budget.total_bytes,
                                      listener=(lambda a, addr, size, stream: self.record(a, addr, size, ""))
                                      if record_entries else None)
        self.rec = self.record if record_entries else None
        self.weights_addr = self.alloc.malloc(budget.weights_bytes)
        if self.rec:
            self.rec("alloc", self.weights_addr, budget.weights_bytes, "weights")
        layout = budget.kv_layout
        # one tensor per layer, or per layer slot shared by one layer of every group (hybrid)
        self.kv_addrs = [self.alloc.malloc(budget.num_kv_blocks * layout.page_bytes) for _ in range(layout.group_size)] \
            if budget.num_kv_blocks else []
        for name, a in zip(layout.tensor_names(), self.kv_addrs, strict=False):
            if self.rec:
                self.rec("alloc", a, budget.num_kv_blocks * layout.page_bytes, f"kv_cache.layers.{name}")
        self.static_alloc = self.alloc.allocated_bytes
        self.rows: dict[str, list] = {k: [] for k in ("t_us", "allocated_bytes", "reserved_bytes", "temporary_bytes",
                                                       "kv_blocks_used", "requests_running", "requests_waiting",
                                                       "requests_preempted")}
        self.peak: tuple[int, int, float] = (self.static_alloc, self.alloc.reserved_bytes, 0.0)
        self.eager = 0
        self.graph_max = sizes[0] if sizes else 0
        self.memory: dict[str, np.ndarray] = {}
        self.end_segments: list = []
        self.peak_reserved = 0
        self.budget_out = budget

    def record(self, action: str, addr: int, size: int, name: str) -> None:
        self.trace.append((action, addr, size, self.clock, name))

    def _plan(self, tokens: int, reqs: int, moe: int) -> StepTransients:
        # reqs = 0: a captured graph, which holds the model's forward only (the sampler runs outside it)
        extra = sampler_tensors(self.run, min(reqs, self.reqs_cap)) if reqs and self.sampler else [0] * SAMPLER_BUFFERS
        if not moe and self.linear is not None:  # every tensor of the step is (tokens × width): scale the one-token plan
            return step_transients_scaled(self.linear, tokens, extra)
        if moe and self.gather is not None and moe <= FUSED_MOE_CHUNK:  # within one fused-MoE chunk
            return step_transients_affine(*self.gather, tokens, moe, extra)
        return step_transients(step_ops(self.run, tokens, self.stage, moe), extra)

    def replayed(self, tokens: int, decode_only: bool) -> bool:
        if not self.sizes or tokens > self.graph_max:
            return False
        return decode_only or self.run.serving.cudagraph_mode != "full_decode_only"

    def on_step(self, step: Step) -> None:
        temp_peak = 0
        tokens = step.padded_tokens or step.num_tokens  # DP ranks: the forward runs the padded count
        if not self.replayed(tokens, step.decode_only):
            self.eager += 1
            self.clock = step.t_start_us
            temp_peak = run_through_allocator(self.alloc, self.plan(tokens, step.num_reqs, step.moe_tokens),
                                              self.rec) - self.static_alloc
        allocated = self.static_alloc + temp_peak + self.graph_pool
        reserved = self.alloc.reserved_bytes + self.graph_pool
        for key, value in (("t_us", step.t_start_us), ("allocated_bytes", allocated), ("reserved_bytes", reserved),
                           ("temporary_bytes", temp_peak), ("kv_blocks_used", step.blocks_used),
                           ("requests_running", step.running), ("requests_waiting", step.waiting),
                           ("requests_preempted", step.preempted)):
            self.rows[key].append(value)
        if allocated > self.peak[0]:
            self.peak = (allocated, reserved, step.t_start_us)

    def finish(self) -> None:
        b, layout = self.budget, self.budget.kv_layout
        self.end_segments = self.alloc.segments() if self.record_entries else []
        for a in self.kv_addrs + [self.weights_addr]:
            self.alloc.free(a)
        memory = {k: np.asarray(v, dtype=np.float64 if k == "t_us" else np.int64) for k, v in self.rows.items()}
        n = len(memory["t_us"])
        memory["weights_bytes"] = np.full(n, b.weights_bytes, dtype=np.int64)
        memory["kv_cache_bytes"] = np.full(n, b.num_kv_blocks * layout.page_bytes * layout.group_size, dtype=np.int64)
        memory["cuda_graph_bytes"] = np.full(n, self.graph_pool, dtype=np.int64)
        memory["kv_blocks_free"] = b.num_kv_blocks - memory["kv_blocks_used"]
        self.memory = memory
        if self.graph_pool:
            self.budget_out = replace(b, cuda_graph_bytes=self.graph_pool)
        self.peak_reserved = max(memory["reserved_bytes"], default=self.peak[1])
