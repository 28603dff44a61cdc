"""The engine's startup memory budget, computed as the engine computes it at ``engine_version``.

vLLM (``vllm/v1/worker/gpu_worker.py`` ``Worker.determine_available_memory`` with
``vllm/utils/mem_utils.py`` ``memory_profiling``, read at 35d5cda)::

    requested = total_memory · gpu_memory_utilization                  # Worker.init_device
    non_kv    = weights + torch_peak_increase + non_torch_increase     # memory_profiling
    kv_pool   = requested − non_kv                                     # available_kv_cache_memory_bytes

``torch_peak_increase`` is the profile run's ``allocated_bytes.all.peak`` minus what was allocated
before it: here the allocator model's peak over one step of ``max_num_batched_tokens`` tokens
(``gpu_model_runner.py`` ``profile_run`` → ``_dummy_run(max_num_batched_tokens)`` then
``_dummy_sampler_run`` on ``min(max_num_seqs, max_num_batched_tokens)`` rows). The CUDA-graph
estimate (``profile_cudagraph_memory``) is subtracted only under the opt-in
``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``, so not by default at this version; it is reported.
Blocks: ``vllm/v1/core/kv_cache_utils.py`` ``get_num_blocks`` = ``kv_pool // page_size // group_size``
with ``page_size = block_size · kv_bytes_per_token_layer`` and ``group_size`` the layers per KV cache
group (every layer at one group; GPT-OSS's sliding and full layers make two groups of half the layers,
:func:`timeline.serve.kv.kv_layout`); the engine takes the minimum over workers
(``get_kv_cache_configs``: each worker's ``num_blocks`` from its own memory and layers, then every
worker's set to the smallest, the tensors shrunk to it) — with ``pp`` > 1 the stages differ in weights
(embedding first, LM head last), layers and profile peak (the sampler runs on the last stage); the TP
ranks of a stage are the same.

SGLang (``python/sglang/srt/model_executor/model_runner.py`` ``ModelRunner.profile_max_num_token``,
0.4)::

    rest_memory    = available_after_weights − total · (1 − mem_fraction_static)
    max_num_tokens = rest_memory // cell_size                          # cell_size: KV bytes per token

and ``init_memory_pool``'s ``req_to_token_pool``: ``(max_num_reqs + 1) × (context_len + 4)`` int32.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from timeline.graph.tensors import DTYPE_BYTES
from timeline.serve import dsa
from timeline.serve.dp import profile_moe_tokens, rank_run
from timeline.serve.graph_view import (
    device_params,
    draft_layers,
    moe_rank_width,
    padded_vocab,
    pp_layers,
    stage_has_moe,
    step_ops,
)
from timeline.serve.kv import KVLayout, kv_bytes_per_token_layer, kv_layers, kv_layout, state_block_size
from timeline.serve.non_torch import measured_init, measured_non_torch
from timeline.serve.profile_run import (
    cublas_workspace_bytes,
    flashinfer_sampler,
    moe_workspace_bytes,
    triton_sampler,
)
from timeline.serve.quant_layout import mxfp4_triton_moe
from timeline.serve.transients import (
    SAMPLER_NAMES,
    StepTransients,
    eager_holds,
    new_allocator,
    run_through_allocator,
    sampler_tensors,
    step_transients,
)
from timeline.serve.vision import built, vision_weight_bytes, with_encoder_profile
from timeline.serve.weights import weight_bytes
from timeline.spec.engine_versions import (
    sglang_max_running_requests,
    sglang_req_to_token_width,
    vllm_hybrid_kv_manager,
    vllm_reserved_profile,
    vllm_sorts_in_model_dtype,
    vllm_subtracts_cudagraph_estimate,
    vllm_triton_profile,
)
from timeline.spec.serving import ENGINE_VERSIONS, ServeRunSpec

GIB = 1 << 30


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    engine: str
    engine_version: str
    total_bytes: int
    requested_bytes: int  # vLLM total·util; SGLang total·mem_fraction_static
    weights_bytes: int
    rope_cache_bytes: int
    non_torch_bytes: int
    activation_peak_bytes: int
    cuda_graph_bytes: int  # reported; subtracted only where the engine's version does
    cuda_graph_subtracted: bool
    kv_pool_bytes: int
    kv_bytes_per_token: int
    kv_bytes_per_token_layer: int
    kv_layers: int
    kv_layout: KVLayout  # the KV cache groups, the tensors and the page (vLLM; one group elsewhere)
    block_size: int
    num_kv_blocks: int
    req_to_token_bytes: int  # SGLang's request → token table
    failure: str  # "" or the engine's refusal ("no memory for cache blocks")
    worker_kv_blocks: int = 0  # this worker's own block count, before the minimum over workers
    vision_weights_bytes: int = 0  # of weights_bytes: a vision-language checkpoint's tower and projector
    cuda_graph_estimate_bytes: int = 0  # vLLM 0.20+'s own CUDA-graph estimate, subtracted before the KV pool (given)
    max_running_requests: int = 0  # SGLang: the request slots (ReqToTokenPool rows) it sizes from the pool

    def to_dict(self) -> dict:
        return asdict(self)


def captures_graphs(run: ServeRunSpec) -> bool:
    """Whether the engine captures CUDA graphs (not ``enforce_eager``, ``cudagraph_mode`` not none)."""
    return not run.serving.enforce_eager and run.serving.cudagraph_mode != "none"


def cuda_graph_estimate_bytes(run: ServeRunSpec) -> int:
    """What vLLM subtracts for its CUDA graphs before the KV cache: from 0.20.0, when it captures graphs, its own
    device-measured estimate (:func:`~timeline.spec.engine_versions.vllm_subtracts_cudagraph_estimate`), taken from
    ``serving.cuda_graph_estimate_gib`` (not modelled: 0 when unset, and the run file says so)."""
    sv = run.serving
    if sv.engine != "vllm" or not vllm_subtracts_cudagraph_estimate(sv.engine_version) or not captures_graphs(run):
        return 0
    return int((sv.cuda_graph_estimate_gib or 0) * GIB)


def dsa_load_bytes(run: ServeRunSpec) -> int:
    """DeepSeek-V3.2's buffers made with the model on vLLM, in its load's memory: the top-k indices buffer and the
    FlashMLA sparse backend's workspace (:mod:`timeline.serve.dsa`); 0 for other models."""
    if not run.model.index_n_heads or run.serving.engine != "vllm":
        return 0
    return dsa.topk_buffer_bytes(run) + dsa.sparse_backend_workspace(run)


def rope_cache_bytes(run: ServeRunSpec) -> int:
    """vLLM ``rotary_embedding`` ``RotaryEmbedding._compute_cos_sin_cache``: one shared
    ``max_position × rotary_dim`` cos/sin cache (``rotary_dim = head_size · partial_rotary_factor``) in the model
    dtype (``get_rope`` caches instances by their parameters; a ``rope_scaling`` lengthens it,
    ``LinearScalingRotaryEmbedding`` to ``max_position · factor``);
    Gemma-3's local table (another ``rope_theta``, so another instance) adds ``max_position`` rows. Counted in
    ``model_memory_usage`` because it is a buffer of the loaded model."""
    m = run.model
    if m.position_embedding != "rope":  # GPT-2 / OPT: learned positions, a weight of the model
        return 0
    dim = m.rotary_dim  # get_rope's rotary_dim: partial_rotary_factor of the head (Phi, Qwen3-Next: a quarter)
    positions = m.rope_scaled_positions or m.max_position_embeddings  # rope_scaling's length (io/hf_config.py)
    if m.local_rope:  # Gemma-3's sliding layers: an unscaled table of their own (rope_local_base_freq)
        positions += m.max_position_embeddings
    return positions * dim * DTYPE_BYTES[run.serving.dtype]


def samples(run: ServeRunSpec, stage: int, rank: int) -> bool:
    """Whether tensor-parallel ``rank`` of pipeline ``stage`` runs the sampler in the profile run: on the
    last stage only, and under vLLM's V0 on the driver worker only (``vllm/worker/model_runner.py``
    ``ModelRunner.execute_model`` returns after ``compute_logits`` unless ``is_driver_worker``; the logits
    are gathered to TP rank 0, ``LogitsProcessor._get_logits`` → ``tensor_model_parallel_gather``, read at
    0.6.4.post1 and 0.7.3). V1 all-gathers the logits and every rank samples."""
    if stage != run.parallel.pp - 1:
        return False
    return rank == 0 or run.serving.engine != "vllm" or run.vllm_v1


def profile_transients(run: ServeRunSpec, stage: int = 0, rank: int = 0) -> StepTransients:
    """The profile run's step on pipeline stage ``stage``, TP rank ``rank``; the sampler runs where
    :func:`samples` says. vLLM's first GEMM creates PyTorch's cuBLAS workspace here; from 0.17 the
    sampler is the Triton path and the MoE caches a kept workspace; with ``flashinfer_sampler`` (V1) the
    sampler is FlashInfer's at any version (:mod:`timeline.serve.profile_run`). MXFP4 experts on the
    Triton backend keep no workspace: 0.17.0's ``Mxfp4MoEMethod.apply`` calls ``triton_kernel_moe_forward``
    directly, 0.19.0's ``backend_to_kernel_cls`` prefers ``OAITritonMxfp4ExpertsMonolithic``, which
    ``FusedMoEKernelMonolithicImpl.apply`` runs without the ``WorkspaceManager``; its caches are per call."""
    sv = run.serving
    tokens = sv.max_num_batched_tokens
    reqs = min(sv.max_num_seqs, tokens)
    last = samples(run, stage, rank)
    moe_tokens = profile_moe_tokens(run)
    if sv.engine != "vllm":
        sampler = sampler_tensors(run, reqs, profile=True) if last else [0] * len(SAMPLER_NAMES)
        return step_transients(step_ops(run, tokens, stage, moe_tokens, profile=True), sampler)
    first = [("cublas_workspace", cublas_workspace_bytes(run))]
    triton = vllm_triton_profile(sv.engine_version)
    if not triton and not sv.flashinfer_sampler:
        old_sort = vllm_sorts_in_model_dtype(sv.engine_version)
        sampler = [0] * len(SAMPLER_NAMES)
        if last:
            sampler = sampler_tensors(run, reqs, profile=True, model_dtype_sort=old_sort)
        elif stage == run.parallel.pp - 1:  # a V0 worker that does not sample still computes its logits shard
            sampler[0] = sampler_tensors(run, reqs, profile=True)[0]
        ops = step_ops(run, tokens, stage, moe_tokens, profile=True)
        # V0 profiles eagerly (its CUDA graphs come after); V1 eagerly only under enforce_eager
        eager = sv.enforce_eager or not run.vllm_v1
        return step_transients(ops, sampler, first=first, holds=eager_holds(ops) if eager else None)
    # MXFP4 experts on the Triton backend call triton_kernels' MoE without the WorkspaceManager (kept=False)
    kept_moe = triton and not mxfp4_triton_moe(run)
    moe_ws = 0
    if kept_moe and run.model.is_moe and any(stage_has_moe(run, stage)):
        moe_ws = moe_workspace_bytes(run, moe_tokens or tokens, moe_rank_width(run))
    if run.model.index_n_heads:
        # one WorkspaceManager buffer: the sparse backend's (made with the model, in the weights) grows to the
        # indexer's and the fused MoE's requests, the old buffer freed first (timeline.serve.dsa)
        held = dsa.sparse_backend_workspace(run)
        first.append(("workspace_manager.growth", max(held, dsa.indexer_workspace(run), moe_ws) - held))
    elif moe_ws:
        first.append(("fused_moe.workspace", moe_ws))
    bufs: list[tuple[str, int]] = []
    if last and sv.flashinfer_sampler:  # V1 only (serve_validate); FlashInfer keeps no buffer
        bufs = flashinfer_sampler(run, reqs, padded_vocab(run.model.vocab_size))
    elif last:
        bufs, kept_buffer = triton_sampler(run, reqs, padded_vocab(run.model.vocab_size))
        first.append(("sampler.triton_buffer", kept_buffer))
    ops = step_ops(run, tokens, stage, moe_tokens, kept_moe_workspace=kept_moe, profile=True)
    tower = built(run)
    if tower is not None and stage == 0:
        # a multimodal model's dummy step reads the runner's inputs_embeds buffer (gpu_model_runner.py
        # _prepare_mm_inputs): no embedding lookup
        ops = [op for op in ops if op.name != "embedding"]
    holds = eager_holds(ops) if sv.enforce_eager else None
    step = step_transients(ops, [b for _, b in bufs], extra_names=[n for n, _ in bufs], first=first, holds=holds)
    # the encoder runs first: of the kept buffers only PyTorch's cuBLAS workspace (its first GEMM) exists by then
    return step if tower is None else with_encoder_profile(run, step, 1)


def weight_blocks(run: ServeRunSpec, stage: int, weights: int) -> list[int]:
    """The weights as the loader allocates them: one tensor each (model-dtype checkpoints), else one
    block of ``weights`` bytes (a quantized layout's tensors are not listed one by one)."""
    params = device_params(run, stage)
    sizes = [t.size_bytes for t in params]
    if run.quant is not None or run.serving.weight_dtype not in ("bf16", "fp16") or sum(sizes) > weights:
        return [weights]
    return sizes + ([weights - sum(sizes)] if weights > sum(sizes) else [])


def compute_budgets(run: ServeRunSpec) -> list[Budget]:
    """Every pipeline stage's budget (its TP rank 0), each with the workers' smallest block count (vLLM
    ``get_kv_cache_configs``; V0 ``determine_num_available_blocks`` run on every worker, the executor
    taking the minimum): a V0 TP rank that does not sample counts too; one entry at ``pp = 1``."""
    run = with_engine_requests(run)
    budgets = [compute_budget(run, stage) for stage in range(run.parallel.pp)]
    fewest = min(b.num_kv_blocks for b in budgets)
    if run.parallel.tp > 1 and not samples(run, run.parallel.pp - 1, 1):
        fewest = min(fewest, compute_budget(run, run.parallel.pp - 1, 1).num_kv_blocks)
    return [replace(b, num_kv_blocks=fewest) for b in budgets]


def with_engine_requests(run: ServeRunSpec) -> ServeRunSpec:
    """The run with SGLang's own ``max_running_requests`` where the run file leaves it out (``max_num_seqs``
    0): :func:`timeline.spec.engine_versions.sglang_max_running_requests` from the pool the budget sizes, over
    every DP-attention worker, marked ``derived_max_num_seqs`` (the request table sized as the engine sizes it
    when none is given) and said in a note. Any other run is returned as it is."""
    sv = run.serving
    if sv.engine != "sglang" or sv.max_num_seqs:
        return run
    b = _compute_budget(run, 0, 0)
    dp = run.parallel.dp if sv.enable_dp_attention else 1
    reqs = max(1, b.max_running_requests) * dp
    note = (f"SGLang {b.engine_version}'s max_running_requests: {reqs:,} (from its pool of {b.num_kv_blocks:,} "
            "tokens; give serving.max_num_seqs to set it)")
    return replace(run, serving=replace(sv, max_num_seqs=reqs, derived_max_num_seqs=True), notes=(*run.notes, note))


def compute_budget(run: ServeRunSpec, stage: int = 0, rank: int = 0) -> Budget:
    """One worker's budget (:func:`_compute_budget` of the run :func:`with_engine_requests` completes)."""
    return _compute_budget(with_engine_requests(run), stage, rank)


def _compute_budget(run: ServeRunSpec, stage: int = 0, rank: int = 0) -> Budget:
    """One worker's budget: TP rank ``rank`` of pipeline stage ``stage`` (its own block count, before
    the minimum over workers of :func:`compute_budgets`); under SGLang's DP attention with one DP
    rank's ``max_running_requests`` and ``chunked_prefill_size`` (:func:`~timeline.serve.dp.rank_run`)."""
    run = rank_run(run)
    sv, hw, m = run.serving, run.hardware, run.model
    total = int(hw.capacity_gib * GIB)
    rope = rope_cache_bytes(run) if sv.engine == "vllm" else 0
    # a vision-language checkpoint's tower and projector sit beside every stage's layers (timeline.serve.vision)
    vision = vision_weight_bytes(run)
    weights = weight_bytes(run, device_params(run, stage)).total_bytes + rope + vision + dsa_load_bytes(run)
    activation = 0  # generate has no profile run
    reserved = vllm_reserved_profile(sv.engine_version) if sv.engine == "vllm" else ""
    if reserved:
        # before 0.6.4 the profiler reads free device memory: the allocator's cached segments count, so the
        # weights as loaded tensor by tensor and the profile step's reserved peak (engine_versions)
        alloc = new_allocator(run, total)
        for size in weight_blocks(run, stage, weights):
            alloc.malloc(size)
        run_through_allocator(alloc, profile_transients(run, stage, rank))
        activation = alloc.reserved_bytes - weights  # the reserved bytes above the weights after the run
    elif sv.engine != "hf":
        alloc = new_allocator(run, total)
        base = alloc.malloc(weights)  # the weights are one block here; only the step's peak increase is read
        activation = run_through_allocator(alloc, profile_transients(run, stage, rank)) - alloc.allocated_bytes
        alloc.free(base)
    # the parts outside PyTorch this version's budget counts (timeline.serve.non_torch.window)
    non_torch = measured_non_torch(run)[0] if sv.engine == "vllm" else int((sv.non_torch_gib or 0) * GIB)
    per_layer = kv_bytes_per_token_layer(m, run.parallel.tp, sv.kv_cache_dtype, sv.dtype)
    held = pp_layers(run)[stage]
    layers = kv_layers(m) if run.parallel.pp == 1 else len(held)
    bs = sv.block_size if sv.engine != "sglang" else 1
    if m.index_n_heads and sv.engine == "vllm":  # FlashMLA sparse runs 64-token blocks (timeline.serve.dsa)
        bs = dsa.block_size(run)
    spec = sv.num_speculative_tokens if sv.speculative_method else 0
    drafts = draft_layers(run)  # the MTP drafter's attention layers, after the target's (pp = 1)
    if m.has_linear_attention:  # the attention page holds a gated delta-net layer's state (timeline.serve.kv)
        bs = state_block_size(m, run.parallel.tp, bs, per_layer, sv.dtype, spec)
        layers = drafts + sum(not m.is_linear_attention(i) for i in (range(m.num_hidden_layers)
                                                                       if run.parallel.pp == 1 else held))
    # gated delta-net states under prefix caching: vLLM's mamba_cache_mode "align", two blocks a request
    # (model_executor/models/config.py MambaModelConfig: "all" is refused by Qwen3-Next and not offered by Qwen3.5)
    state_blocks = (2 if m.has_linear_attention and sv.enable_prefix_caching else 1) + spec
    layout = kv_layout(m, range(kv_layers(m) + drafts), bs, bs * per_layer, hybrid_manager=sv.engine == "vllm"
                       and vllm_hybrid_kv_manager(sv.engine_version, run.vllm_v1), state_blocks=state_blocks)
    if run.parallel.pp > 1:
        layout = layout.project(set(held))
    per_token = per_layer * layers  # over the layers this device holds
    graph_estimate = cuda_graph_estimate_bytes(run)  # vLLM 0.20+'s own, as given (not modelled)
    cuda_graph = 0  # the graph pool's own footprint comes from the timeline's capture (summary)
    req_to_token = max_reqs = 0
    if sv.engine == "hf":  # no pool: the cache grows with the batch (timeline.serve.hf)
        requested, kv_pool, blocks = total, 0, 0
    elif sv.engine == "sglang":
        # model_runner.py ModelRunner.profile_max_num_token (0.4.9.post2, 0.5.5): its ``total_gpu_memory``
        # is init_torch_distributed's min_per_gpu_memory, the free memory before the weights load
        free0 = total - measured_init(run)[0]
        requested = int(free0 * sv.mem_fraction_static)
        rest = (free0 - weights) - (free0 - requested)
        profiled = max(0, rest // per_token)
        # the cap (--max-total-tokens), then whole pages (--page-size): init_memory_pool (0.4.9.post2 … 0.5.9),
        # _resolve_token_capacity (0.5.10 …)
        tokens = min(profiled, sv.max_total_tokens) if sv.max_total_tokens else profiled
        tokens = tokens // sv.block_size * sv.block_size
        max_reqs, rows = sglang_max_running_requests(sv.engine_version, profiled, tokens, run.max_model_len,
                                                     0 if sv.derived_max_num_seqs else sv.max_num_seqs)
        kv_pool = tokens * per_token
        blocks = tokens  # SGLang's pool counts tokens (a page is block_size of them)
        req_to_token = rows * (run.max_model_len + sglang_req_to_token_width(sv.engine_version)) * 4
    else:
        requested = int(total * sv.gpu_memory_utilization)
        kv_pool = requested - (weights + activation + non_torch) - graph_estimate
        if sv.kv_cache_memory_bytes:
            # gpu_worker.py Worker.determine_available_memory (0.11.0): the profile run still runs (it compiles the
            # model), then the given bytes are the budget, gpu_memory_utilization unread
            kv_pool = sv.kv_cache_memory_bytes
        blocks = max(0, kv_pool // layout.page_bytes // layout.group_size)
    override = sv.num_gpu_blocks_override if sv.engine == "vllm" else 0
    if override and not run.vllm_v1:
        # V0 llm_engine.py LLMEngine._initialize_kv_caches (0.6.4.post1): the override replaces the profiled count
        # before the workers' raise_if_cache_size_invalid checks it
        blocks = override
    failure = ""
    need = layout.max_request_blocks(run.max_model_len, sv.max_num_batched_tokens)
    if sv.engine == "hf":
        failure = "" if weights <= total else f"out of memory while loading the weights ({weights / GIB:,.2f} GiB)"
    elif weights > total:
        failure = f"out of memory while loading the weights ({weights / GIB:,.2f} GiB on a {total / GIB:,.2f} GiB device)"
    elif blocks <= 0:
        failure = ("no memory for cache blocks" if sv.engine != "sglang" else
                   "Not enough memory. Please try to increase --mem-fraction-static.")
    elif sv.engine == "vllm" and blocks < need:
        # vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory: one max_model_len request must fit
        failure = (f"max_model_len={run.max_model_len} needs {need} KV blocks and the pool has {blocks}; "
                   "vLLM refuses to start (" + ("check_enough_kv_cache_memory" if run.vllm_v1
                                                 else "raise_if_cache_size_invalid") + ")")
    if override:
        # V1 kv_cache_utils.py (0.11.0): check_enough_kv_cache_memory reads the memory, then get_num_blocks'
        # may_override_num_blocks sets the count
        blocks = override
    pool_bytes, free = blocks * layout.page_bytes * layout.group_size, total - weights - non_torch
    if not failure and (override or sv.kv_cache_memory_bytes) and sv.engine == "vllm" and pool_bytes > free:
        # the pool's tensors are allocated at that size whatever the budget said: past the device's free memory
        # (the profile run's cached blocks released on the way), the allocation fails
        failure = (f"CUDA out of memory allocating the KV cache: {blocks:,} blocks are {pool_bytes / GIB:,.2f} GiB, "
                   f"and {free / GIB:,.2f} GiB are free after the weights")
    return Budget(engine=sv.engine, engine_version=sv.engine_version or ENGINE_VERSIONS[sv.engine][0], total_bytes=total,
                  requested_bytes=requested, weights_bytes=weights, rope_cache_bytes=rope,
                  non_torch_bytes=non_torch, activation_peak_bytes=activation, cuda_graph_bytes=cuda_graph,
                  cuda_graph_subtracted=graph_estimate > 0, kv_pool_bytes=max(0, kv_pool), kv_bytes_per_token=per_token,
                  kv_bytes_per_token_layer=per_layer, kv_layers=layers, kv_layout=layout, block_size=bs,
                  num_kv_blocks=max(0, blocks), worker_kv_blocks=max(0, blocks), req_to_token_bytes=req_to_token, failure=failure,
                  vision_weights_bytes=vision, cuda_graph_estimate_bytes=graph_estimate,
                  max_running_requests=max_reqs)
