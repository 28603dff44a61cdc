"""Data parallelism in an engine: DP ranks, each with its own scheduler, KV pool and requests.

vLLM (``data_parallel_size`` = ``parallel.dp``): every DP rank is an engine core of ``tp`` GPUs with
its own scheduler and KV cache (``vllm/v1/engine/core.py`` ``DPEngineCoreProc``); attention, the
dense layers, the embedding and the LM head are split by the rank's ``tp`` and so replicated across
the DP ranks — DP attention — while a MoE layer spans all ``tp·dp`` GPUs
(``vllm/model_executor/layers/fused_moe/config.py`` ``FusedMoEParallelConfig.make``, read at
002d607: with ``enable_expert_parallel`` each GPU holds ``n_routed / (tp·dp)`` whole experts,
``ep = tp·dp``; without it every expert is split over ``flatten_tp_size = dp·tp``). Requests go to
the rank of least ``waiting · 4 + running`` (``vllm/v1/engine/core_client.py``
``DPLBAsyncMPClient.get_core_engine_for_request``, scanning from rank 0 — ``eng_start_index`` is 0
for one API server — the first minimum wins, the chosen rank's waiting count raised at once),
counts refreshed from the engines every 100 ms (``vllm/v1/engine/coordinator.py``
``DPCoordinatorProc``, ``min_stats_update_interval_ms = 100``). Each rank's scheduler has the run's
``max_num_seqs`` and ``max_num_batched_tokens``.

SGLang (``--enable-dp-attention`` with ``--dp-size`` = ``serving.enable_dp_attention`` with
``parallel.dp``; ``parallel.tp`` is SGLang's ``--tp-size``, all the GPUs): the tp group splits into
``dp`` attention groups of ``attn_tp = tp / dp`` GPUs (``python/sglang/srt/layers/dp_attention.py``
``compute_dp_attention_world_info``: ``attn_tp_size = tp_size // dp_size``), each a DP rank with its
own scheduler (``data_parallel_controller.py``: one scheduler per ``dp_rank``). MLA's projections are
split by ``attn_tp`` (``models/deepseek_v2.py`` ``DeepseekV2AttentionMLA``: ``q_b_proj``,
``kv_b_proj`` ``ColumnParallelLinear`` and ``o_proj`` ``RowParallelLinear`` with
``tp_size=attn_tp_size``; the down projections ``ReplicatedLinear``), the embedding is replicated
(``VocabParallelEmbedding(..., enable_tp=not enable_dp_attention)``), and the dense MLPs, shared
experts, routed experts and LM head stay split over the whole tp group. ``server_args.py``
``ServerArgs.__post_init__`` divides ``chunked_prefill_size`` by ``dp_size`` and
``max_running_requests`` is divided by ``dp_size`` per worker (``tp_worker.py``), so each rank's
scheduler gets ``max_num_batched_tokens // dp`` and ``max_num_seqs // dp``. Requests go round-robin
(``DataParallelController.round_robin_scheduler``, the default ``load_balance_method``).
Without ``enable_dp_attention`` SGLang's ``dp`` makes whole replicas of ``tp`` GPUs, round-robin too.

Both engines run a MoE model's DP ranks in lockstep (SGLang under DP attention; its plain replicas
are independent): the MoE layer's collectives need every rank,
so a step runs on all ranks together (an idle rank runs a dummy batch: vLLM
``DPEngineCoreProc.execute_dummy_batch``, SGLang's idle batch of ``prepare_dp_attn_batch``) and
lasts as long as the slowest rank's; a dense model's ranks run independently. The KV pool is each
rank's own (its requests only; MLA's latent cache is not split by tp), from the same budget rule.

vLLM pads every rank's step to the most tokens over the ranks (``gpu_model_runner.py``
``GPUModelRunner.get_dp_padding``: ``max_tokens_across_dp − num_tokens``, no padding under
``enforce_eager``; an idle rank's dummy batch is one token, padded alike), and a MoE layer runs on
the tokens of every rank (``FusedMoE.forward_impl`` dispatch, :func:`timeline.serve.graph_view.fuse_moe`):
``dp × the padded count`` — ``dp × max_num_batched_tokens`` in the profile run, which every rank runs
at once. SGLang's MoE also runs on every rank's tokens, gathered over the tp group without padding
(``dp_attention.py`` ``dp_gather`` into the forward's ``gathered_buffer`` of ``sum(global_num_tokens)``
rows), modelled by the same fused-MoE op on the gathered rows; its dense MLP layers and shared experts
on the gathered rows are not (they keep the rank's own tokens, split by ``tp / dp``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from timeline.spec.serving import ServeRunSpec

#: vLLM ``DPCoordinatorProc``: engine request counts reach the API server every 100 ms
LB_REFRESH_US = 100_000.0
#: vLLM ``DPLBAsyncMPClient``: a waiting request weighs four running ones
LB_WAITING_WEIGHT = 4


def dp_attention(run: ServeRunSpec) -> bool:
    """SGLang's ``--enable-dp-attention`` (vLLM's DP needs no flag)."""
    return run.serving.engine == "sglang" and run.serving.enable_dp_attention


def dp_ranks(run: ServeRunSpec) -> int:
    """How many schedulers the engine runs (1 for ``hf``)."""
    return 1 if run.serving.engine == "hf" else run.parallel.dp


def attention_tp(run: ServeRunSpec) -> int:
    """GPUs one DP rank's attention is split over: ``tp / dp`` under SGLang's DP attention, else ``tp``."""
    return run.parallel.tp // run.parallel.dp if dp_attention(run) else run.parallel.tp


def moe_tp(run: ServeRunSpec) -> int:
    """GPUs a MoE layer spans: vLLM's ``tp·dp`` (``flatten_tp_across_dp``), SGLang's tp group."""
    if run.serving.engine == "vllm":
        return run.parallel.tp * run.parallel.dp
    return run.parallel.tp


def lockstep(run: ServeRunSpec) -> bool:
    """The DP ranks step together: a MoE model's collectives span them (vLLM's experts over
    ``tp·dp``, SGLang's DP attention inside one tp group); SGLang's plain ``dp`` replicas do not."""
    if dp_ranks(run) <= 1 or not run.model.is_moe:
        return False
    return run.serving.engine == "vllm" or dp_attention(run)


def routing(run: ServeRunSpec) -> str:
    """``least_loaded`` (vLLM) or ``round_robin`` (SGLang)."""
    return "least_loaded" if run.serving.engine == "vllm" else "round_robin"


def rank_run(run: ServeRunSpec) -> ServeRunSpec:
    """The run one DP rank's scheduler and profile see: SGLang's DP attention divides
    ``max_running_requests`` and ``chunked_prefill_size`` by ``dp_size``."""
    if not dp_attention(run):
        return run
    sv, dp = run.serving, run.parallel.dp
    return replace(run, serving=replace(sv, max_num_seqs=sv.max_num_seqs // dp,
                                        max_num_batched_tokens=sv.max_num_batched_tokens // dp))


def moe_per_token(run: ServeRunSpec) -> int:
    """MoE tokens gathered per token of a step that every rank runs alike (the profile run, a
    captured graph): ``dp`` when the ranks step together, else 0 (no gather)."""
    return run.parallel.dp if lockstep(run) else 0


def profile_moe_tokens(run: ServeRunSpec) -> int:
    """The profile run's gathered MoE tokens (every rank's dummy run of ``max_num_batched_tokens``)."""
    return moe_per_token(run) * run.serving.max_num_batched_tokens


def dp_step_tokens(run: ServeRunSpec, tokens: Sequence[int]) -> tuple[list[int], int, int]:
    """One lockstep step, from every rank's scheduled tokens (0 for an idle rank): each rank's
    forward tokens and the MoE layer's gathered tokens (for the memory model and the step time).
    vLLM pads every rank to the most tokens (an idle rank's dummy batch too) and gathers ``dp ×``
    that, or without padding (``enforce_eager``) the sum with one token per idle rank; SGLang
    gathers every rank's own tokens (``dp_gather``), an idle rank running none of its own."""
    if not lockstep(run):
        return list(tokens), 0, 0
    if run.serving.engine == "sglang":
        return list(tokens), sum(tokens), sum(tokens)
    if run.serving.enforce_eager:  # no padding; an idle rank's dummy batch is one token
        own = [max(1, t) for t in tokens]
        return own, sum(own), sum(own)
    most = max(tokens)
    return [most] * len(tokens), len(tokens) * most, len(tokens) * most
