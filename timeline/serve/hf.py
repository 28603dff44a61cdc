"""``engine = "hf"``: Hugging Face ``generate`` with its default ``DynamicCache`` (transformers 5.x).

``generate`` runs one static batch: the prompts are left-padded to the longest, prefilled together,
then every sequence decodes one token per step until the batch's longest output is done (finished
sequences stay in the batch as padding). The cache is contiguous per layer and grows by
concatenation (``cache_utils.py`` ``DynamicLayer.update``: ``self.keys = torch.cat([self.keys,
key_states], dim=-2)``, the same for values), so while a layer updates, its old and new tensors are
both alive. After ``n`` new tokens the cache holds ``prompt + n − 1`` positions (the last sampled
token is never fed back). Per token and layer it stores:

* MHA/GQA: keys and values of ``num_key_value_heads × head_dim`` each (no tensor parallelism);
* DeepSeek-V2/V3 (``modeling_deepseek_v3.py`` at 5.x): the compressed latent, keys of
  ``kv_lora_rank`` and values of ``qk_rope_head_dim`` elements under one head — not decompressed
  per-head K/V as transformers 4.x cached.

Batches of up to ``max_num_seqs`` requests are formed in arrival order and run back to back.
"""

from __future__ import annotations

from collections.abc import Callable

from timeline.graph.tensors import DTYPE_BYTES
from timeline.sim.batching import ReqState, SchedulerResult, Step
from timeline.spec.model import ModelSpec
from timeline.spec.serving import Request


def hf_layer_bytes_per_token(model: ModelSpec, dtype: str) -> tuple[int, int]:
    """(key, value) bytes one position takes in one layer's DynamicCache."""
    b = DTYPE_BYTES[dtype]
    if model.is_mla:
        return model.kv_lora_rank * b, model.qk_rope_head_dim * b
    per = model.kv_heads * model.attn_head_dim * b
    return per, per


def hf_cache_bytes(model: ModelSpec, dtype: str, batch: int, positions: int) -> int:
    """DynamicCache bytes of ``batch`` sequences holding ``positions`` positions each."""
    k, v = hf_layer_bytes_per_token(model, dtype)
    return model.num_hidden_layers * batch * positions * (k + v)


def hf_cache_peak_bytes(model: ModelSpec, dtype: str, batch: int, positions: int) -> int:
    """The cache's peak while growing from ``positions − 1`` to ``positions``: every layer updated
    but the last one's old values not yet released (``torch.cat`` allocates before the old tensor
    is dropped)."""
    _, v = hf_layer_bytes_per_token(model, dtype)
    return hf_cache_bytes(model, dtype, batch, positions) + batch * (positions - 1) * v


def hf_timeline(model: ModelSpec, dtype: str, requests: tuple[Request, ...], max_batch: int,
                step_us: Callable[[int, int, float], float]) -> tuple[SchedulerResult, list[tuple[float, int, int]]]:
    """Run the requests as generate batches; return the per-request result and, per step,
    ``(t_us, cache_bytes_after, cache_peak_bytes)``."""
    states = [ReqState(r) for r in requests]
    result = SchedulerResult(states=states)
    rows: list[tuple[float, int, int]] = []
    now = 0.0
    for start in range(0, len(states), max_batch):
        group = states[start:start + max_batch]
        now = max(now, max(s.req.arrival_us for s in group))
        b = len(group)
        prompt = max(s.req.prompt_tokens for s in group)
        steps = max(s.req.output_tokens for s in group)
        for n in range(1, steps + 1):  # step n samples token n; its forward fed prompt (n = 1) or one token
            fed = prompt if n == 1 else 1
            positions = prompt + n - 1
            dur = step_us(b * fed, b * positions, b * fed * (positions - fed / 2))
            after = hf_cache_bytes(model, dtype, b, positions)  # prefill creates the cache without a cat
            rows.append((now, after, after if n == 1 else hf_cache_peak_bytes(model, dtype, b, positions)))
            t0, now = now, now + dur
            for s in group:
                if s.generated < s.req.output_tokens:
                    s.generated += 1
                    s.computed = s.req.prompt_tokens + s.generated - 1
                    if s.first_token_us < 0:
                        s.first_token_us = now
                    if s.generated == s.req.output_tokens:
                        s.finish_us = now
            result.steps.append(Step(t_start_us=t0, t_end_us=now, num_tokens=b * fed, num_reqs=b, decode_only=n > 1,
                                     context_tokens=b * positions, blocks_used=0, running=b,
                                     waiting=len(states) - start - b, preempted=0))
    return result, rows
