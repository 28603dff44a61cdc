"""Scheduler invariants on random loads (hypothesis): blocks in use never exceed the pool and equal
what requests and shared prefixes hold; a running request holds ⌈cached tokens / block_size⌉ blocks
less its shared prefix; preemption happens only in a step whose blocks ran out; every request that
fits the pool alone finishes with all its output tokens."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from timeline.sim.batching import Engine, SchedulerConfig, blocks_for
from timeline.spec.serving import Request

loads = st.lists(st.tuples(st.integers(1, 300), st.integers(1, 40), st.sampled_from(["", "a", "b"])),
                 min_size=1, max_size=25)


@settings(max_examples=150, deadline=None)
@given(loads, st.integers(4, 80), st.sampled_from([4, 16]), st.integers(1, 6), st.integers(16, 256),
       st.booleans(), st.booleans())
def test_invariants(rows, num_blocks, bs, max_seqs, budget, chunked, prefix):
    budget = max(budget, max_seqs)
    # without chunked prefill vLLM requires max_num_batched_tokens ≥ max_model_len (a recomputed
    # request must fit one step); serve_validate enforces it
    cfg = SchedulerConfig(num_blocks=num_blocks, block_size=bs, max_num_seqs=max_seqs,
                          max_num_batched_tokens=budget, max_model_len=4096 if chunked else budget,
                          enable_chunked_prefill=chunked, enable_prefix_caching=prefix)
    shortest = {}
    for p, _, x in rows:
        if x:
            shortest[x] = min(shortest.get(x, p), p)
    reqs = tuple(Request(rid=i, arrival_us=0.0, prompt_tokens=p, output_tokens=o, prefix_id=x,
                         prefix_tokens=shortest.get(x, 0)) for i, (p, o, x) in enumerate(rows))
    eng = Engine(cfg, reqs)
    for s in eng.states:
        eng.arrive(s)
    for step in range(20_000):
        if eng.done == len(eng.states):
            break
        # the blocks the running requests' next tokens need, in scheduling order under the budget
        need, left = 0, cfg.max_num_batched_tokens
        for s in eng.running:
            if left <= 0:
                break
            new = min(s.total_tokens - s.computed, left)
            need += max(0, blocks_for(s.computed + new, bs) - s.own_blocks - s.shared_blocks)
            left -= new
        free_before = eng.free_blocks
        batch, preempted = eng.schedule()
        assert batch, "a live request must always be schedulable"
        assert (preempted > 0) == (need > free_before)  # preemption exactly when a step cannot get a block
        eng.finish_step(batch, float(step))
        assert 0 <= eng.free_blocks <= num_blocks
        held = sum(s.own_blocks for s in eng.states) + sum(b for b, _ in eng.prefix.values())
        assert eng.used_blocks == held
        for s in eng.running:
            assert s.own_blocks + s.shared_blocks == blocks_for(s.computed, bs)
    for s in eng.states:
        tokens = s.req.prompt_tokens + s.req.output_tokens
        fits = blocks_for(tokens, bs) <= num_blocks and tokens <= cfg.max_model_len
        assert (s.generated == s.req.output_tokens and s.finish_us >= 0) == fits
        assert bool(s.rejected) == (not fits)
    assert eng.free_blocks == num_blocks
