"""``serve`` with ``dp`` > 1: every DP rank's scheduler on its share of the requests
(:func:`timeline.sim.dp_batching.simulate_dp`, routed and stepped as :mod:`timeline.serve.dp`
says), each rank's device with the same budget (its weights and its own KV pool) and its own memory
over its own steps. The result's top-level memory, peaks and trace are rank 0's; ``ranks`` holds
every rank's; ``sched.states`` is every request, in request order."""

from __future__ import annotations

from collections.abc import Sequence

from timeline.serve.budget import compute_budget
from timeline.serve.dp import (
    LB_REFRESH_US,
    LB_WAITING_WEIGHT,
    attention_tp,
    dp_attention,
    dp_ranks,
    dp_step_tokens,
    lockstep,
    moe_tp,
    rank_run,
    routing,
)
from timeline.serve.graph_view import device_params
from timeline.serve.run import RankMemory, ServeResult, _Device, capture_sizes, run_requests
from timeline.serve.steptime import step_cost
from timeline.sim.batching import ReqState, SchedulerConfig, SchedulerResult
from timeline.sim.dp_batching import Routing, simulate_dp
from timeline.spec.serving import ServeRunSpec


def serve_dp(run: ServeRunSpec, record_entries: int = 0) -> ServeResult:
    """Simulate a deployment of ``dp`` DP ranks (``pp`` = 1: validation refuses both at once)."""
    dp = dp_ranks(run)
    rrun = rank_run(run)  # the run one rank's scheduler and profile see
    budget = compute_budget(run)  # which applies rank_run itself
    sv = rrun.serving
    sizes = capture_sizes(rrun)
    requests = run_requests(run)
    cost = step_cost(rrun, device_params(rrun), budget.weights_bytes, budget.kv_bytes_per_token)
    cfg = SchedulerConfig(num_blocks=budget.num_kv_blocks, block_size=budget.block_size,
                          max_num_seqs=sv.max_num_seqs, max_num_batched_tokens=sv.max_num_batched_tokens,
                          max_model_len=run.max_model_len, enable_chunked_prefill=sv.enable_chunked_prefill,
                          oversized_prompt_alone=sv.engine == "sglang",
                          enable_prefix_caching=sv.enable_prefix_caching,
                          full_groups=budget.kv_layout.full_groups, sliding_windows=budget.kv_layout.sliding_windows)

    def step_us(rank: int, batch: Sequence[tuple[ReqState, int]], padded: int, moe: int) -> float:
        tokens = padded or sum(n for _, n in batch)  # vLLM: the forward runs the padded count
        kv = sum(st.computed + n for st, n in batch)
        pairs = sum(n * (st.computed + (n + 1) / 2) for st, n in batch)
        return cost.step_us(tokens, kv, pairs, moe)

    first = _Device(rrun, 0, budget, sizes, record_entries)
    devices = [first] + [_Device(rrun, 0, budget, sizes, 0, like=first) for _ in range(1, dp)]
    rule = routing(run)
    route = Routing(rule=rule, refresh_us=LB_REFRESH_US if rule == "least_loaded" else 0.0,
                    waiting_weight=LB_WAITING_WEIGHT if rule == "least_loaded" else 1)
    out = simulate_dp(cfg, requests, dp, route, lockstep(run), step_us, lambda r, step: devices[r].on_step(step),
                      lambda tokens: dp_step_tokens(run, tokens))
    for d in devices:
        d.finish()
    taken = [0] * dp
    states: list[ReqState] = []
    for r in out.rank_of:  # every request's state, in request order
        states.append(out.ranks[r].states[taken[r]])
        taken[r] += 1
    ranks = [RankMemory(rank=r, sched=out.ranks[r], memory=d.memory, budget=d.budget_out, requests=taken[r],
                        peak_allocated_bytes=d.peak[0], peak_reserved_bytes=d.peak_reserved, peak_time_us=d.peak[2],
                        num_eager_steps=d.eager) for r, d in enumerate(devices)]
    sched = SchedulerResult(states=states, steps=out.ranks[0].steps,
                            max_blocks_used=max(s.max_blocks_used for s in out.ranks))
    return ServeResult(run=run, budget=first.budget_out, capture_sizes=sizes, sched=sched, memory=first.memory,
                       peak_allocated_bytes=first.peak[0], peak_reserved_bytes=first.peak_reserved,
                       peak_time_us=first.peak[2], num_eager_steps=first.eager,
                       alloc_trace=list(first.trace) if record_entries else [], end_segments=first.end_segments,
                       ranks=ranks, rank_of=out.rank_of, data_parallel=dp_info(run))


def dp_info(run: ServeRunSpec) -> dict:
    """How the engine splits the run into DP ranks (summary.json ``data_parallel``)."""
    return {"ranks": dp_ranks(run), "dp_attention": dp_attention(run) or (run.serving.engine == "vllm" and run.model.is_moe),
            "attention_tp": attention_tp(run), "moe_tp": moe_tp(run) if run.model.is_moe else None,
            "routing": routing(run), "lockstep": lockstep(run)}
