"""Run-level validation of a serving run: every rule that spans sections, all problems at once.

Returns (key path, message) pairs like :func:`timeline.spec.validate.validate_run`; the reader
adds the file name. Engine-specific acceptance (which ``kv_cache_dtype`` an engine takes at a
version) cites the engine's own argument checks.
"""

from __future__ import annotations

from timeline.spec.engine_versions import (
    VLLM_KV_CACHE_MEMORY_BYTES,
    VLLM_V0_REMOVED,
    VLLM_V1_DEFAULT,
    is_v1,
    parse_version,
    release_at_least,
    version_problem,
    vllm_subtracts_cudagraph_estimate,
    vllm_v1_fallback,
)
from timeline.spec.serve_quant import quant_problems
from timeline.spec.serving import ENGINE_VERSIONS, ServeRunSpec
from timeline.spec.validate import _divisors, model_problems

#: the vLLM whose DeepSeek-V3.2 sparse attention is read (timeline/serve/dsa.py)
DSA_VLLM = (0, 19, 0)
#: vLLM builds gated delta-net layers from 0.10.2 (``models/qwen3_next.py`` first ships in that release; V1 only)
GDN_VLLM = (0, 10, 2)

#: kv_cache_dtype values each engine accepts: vLLM ``vllm/config/cache.py`` ``CacheDType``
#: (auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2, fp8_inc, fp8_ds_mla); SGLang ``server_args.py``
#: ``--kv-cache-dtype`` choices (auto, fp8_e5m2, fp8_e4m3); hf: the model dtype only
#: the largest device a serving run models (64× the biggest GPU today; addressable by the allocator model)
MAX_DEVICE_GIB = 16_384
KV_DTYPES_BY_ENGINE = {
    "vllm": ("auto", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla"),
    "sglang": ("auto", "fp8_e4m3", "fp8_e5m2"),
    "hf": ("auto",),
}


def engine_v1_problems(run: ServeRunSpec) -> list[tuple[str, str]]:
    """``serving.engine_v1`` set where vLLM has no choice to make, or ``VLLM_USE_V1=1`` with a feature the version's
    V1 rejects (``engine/arg_utils.py`` ``_raise_or_fallback``: ``NotImplementedError("VLLM_USE_V1=1 is not supported
    with F.")``; an experimental one, ``_warn_or_fallback``, runs)."""
    sv = run.serving
    if sv.engine_v1 == "auto":
        return []
    if sv.engine != "vllm":
        return [("serving.engine_v1", f"VLLM_USE_V1 is vLLM's; {sv.engine} has no V0/V1 engines: remove it")]
    v = parse_version(sv.engine_version) or (0, 0, 0)
    if sv.engine_v1 == "on" and v < VLLM_V1_DEFAULT:
        return [("serving.engine_v1", f"vLLM {sv.engine_version}'s V1 engine (an alpha before 0.8.0) is not modelled; "
                 'remove it (V0) or give engine_version 0.8.0 or later')]
    if sv.engine_v1 == "off" and v >= VLLM_V0_REMOVED:
        return [("serving.engine_v1", f"vLLM {sv.engine_version} has no V0 engine (removed in 0.11.0): remove it")]
    feature, experimental = vllm_v1_fallback(sv.engine_version, **run.v1_features)  # type: ignore[arg-type]
    if sv.engine_v1 == "on" and feature and not experimental:
        return [("serving.engine_v1", f"vLLM {sv.engine_version} refuses VLLM_USE_V1=1 with {feature} (engine/"
                 "arg_utils.py _raise_or_fallback: NotImplementedError); remove it to run V0 as vLLM does")]
    return []


def serve_problems(run: ServeRunSpec) -> list[tuple[str, str]]:
    m, par, sv = run.model, run.parallel, run.serving
    problems = model_problems(m)
    add = problems.append
    if m.architecture != "gpt":
        add(("model.architecture", f'"{m.architecture}" is not served: `timeline serve` models causal decoders'))
    if m.num_attention_heads % par.tp:
        add(("parallel.tp", f"{par.tp} does not divide num_attention_heads={m.num_attention_heads}; "
             f"use one of {_divisors(m.num_attention_heads)}"))
    elif not m.is_mla and par.tp < m.kv_heads and m.kv_heads % par.tp:
        add(("parallel.tp", f"{par.tp} does not divide num_key_value_heads={m.kv_heads}; use a divisor "
             f"({_divisors(m.kv_heads)}) or a multiple of it (heads are then replicated)"))
    elif not m.is_mla and par.tp > m.kv_heads and par.tp % m.kv_heads:
        add(("parallel.tp", f"{par.tp} is above num_key_value_heads={m.kv_heads} but not a multiple of it "
             "(vLLM replicates each key/value head over tp / num_key_value_heads ranks)"))
    if par.pp > 1 and sv.engine != "vllm":
        add(("parallel.pp", f'pp > 1 is modelled for engine = "vllm" only (its get_pp_indices and the pool as the '
             f'minimum over workers); set pp = 1 for {sv.engine}'))
    elif par.pp > m.num_hidden_layers:
        add(("parallel.pp", f"{par.pp} stages for num_hidden_layers={m.num_hidden_layers}: every stage needs a "
             f"layer; use at most {m.num_hidden_layers}"))
    for key in ("cp", "vpp"):
        if getattr(par, key) > 1:
            add((f"parallel.{key}", f"{key} > 1 is not modelled by `timeline serve` yet; use tp (and ep for MoE)"))
    if par.ep > 1 and not m.is_moe:
        add(("parallel.ep", f"ep={par.ep} needs a mixture-of-experts model; {m.name} is dense"))
    elif m.is_moe and m.n_routed_experts % par.ep:
        add(("parallel.ep", f"{par.ep} does not divide n_routed_experts={m.n_routed_experts}"))
    dp_attention = sv.engine == "sglang" and sv.enable_dp_attention
    if m.is_moe and par.ep > 1 and dp_attention and par.ep != par.tp:
        add(("parallel.ep", f"SGLang's expert parallelism under DP attention spans the tp group ({par.tp} ranks, "
             "--enable-ep-moe sets ep_size = tp_size); set ep to that or 1"))
    elif m.is_moe and par.ep > 1 and sv.engine == "sglang" and not dp_attention and par.tp % par.ep:
        # srt/distributed/parallel_state.py: initialize_model_parallel — moe_tp_size = tp_size // moe_ep_size
        add(("parallel.ep", f"SGLang splits each expert over tp / ep ranks (moe_tp_size); {par.ep} does not divide "
             f"tp = {par.tp}: use one of {', '.join(str(d) for d in range(1, par.tp + 1) if par.tp % d == 0)}"))
    elif m.is_moe and par.ep > 1 and sv.engine != "sglang" and not dp_attention and par.ep != par.tp * par.dp:
        add(("parallel.ep", f"vLLM's expert parallelism spans tp·dp = {par.tp * par.dp} ranks; set ep to that "
             "or 1 (experts then split by tp·dp)"))
    if m.is_moe and par.ep == 1 and m.moe_intermediate_size % par.tp:
        add(("parallel.tp", f"{par.tp} does not divide moe_intermediate_size={m.moe_intermediate_size}"))
    elif m.is_moe and 1 < par.ep < par.tp and not par.tp % par.ep and m.moe_intermediate_size % (par.tp // par.ep):
        add(("parallel.ep", f"each expert splits over tp / ep = {par.tp // par.ep} ranks, which does not divide "
             f"moe_intermediate_size={m.moe_intermediate_size}"))
    if m.intermediate_size % par.tp and not all(m.is_moe_layer(i) for i in range(m.num_hidden_layers)):
        add(("parallel.tp", f"{par.tp} does not divide intermediate_size={m.intermediate_size}"))
    if sv.engine == "hf" and (par.tp > 1 or par.ep > 1 or par.dp > 1):
        add(("parallel.tp", 'engine = "hf" models one device running generate; set tp = ep = dp = 1'))
    problems += dp_problems(run)
    versions = ENGINE_VERSIONS[sv.engine]
    why = version_problem(sv.engine, sv.engine_version) if sv.engine_version not in versions else ""
    if why:
        add(("serving.engine_version", why))
    problems += engine_v1_problems(run)
    v0 = ""
    if sv.engine == "vllm" and not run.vllm_v1:
        feature = vllm_v1_fallback(sv.engine_version, **run.v1_features)[0]  # type: ignore[arg-type]
        v0 = (f" — this job runs V0: engine_version {sv.engine_version}" if not is_v1(sv.engine_version) else
              " — this job runs V0: serving.engine_v1 = \"off\"" if sv.engine_v1 == "off" else
              f" — this job runs V0: vLLM {sv.engine_version} falls back for {feature}")
    if sv.flashinfer_sampler and (sv.engine != "vllm" or not run.vllm_v1):
        add(("serving.flashinfer_sampler", "FlashInfer's top-k/top-p sampler is modelled for vLLM's V1 engine "
             f'(engine = "vllm", engine_version 0.8 or later){v0}; set it to false'))
    v = run.vision
    if v is not None and (sv.engine != "vllm" or not run.vllm_v1):
        add(("serving.engine", f"a vision-language checkpoint ({v.architecture}) is modelled for vLLM's V1 engine "
             f"(engine_version 0.8 or later: its tower and encoder profile, read at 0.19.0){v0}; "
             "serving.limit_mm_per_prompt = 0 serves its language model alone"))
    elif v is not None and v.kind == "qwen3_vl" and sv.limit_mm_per_prompt > 0:
        add(("serving.limit_mm_per_prompt", f"{v.architecture or 'this checkpoint'}'s Qwen3-VL vision tower and its "
             "encoder profile are not modelled yet; serve its language model alone with limit_mm_per_prompt = 0 "
             "(vLLM --limit-mm-per-prompt '{\"image\": 0, \"video\": 0}' builds no tower)"))
    elif v is not None and sv.limit_mm_per_prompt > 0:
        for name, size in (("num_attention_heads", v.num_attention_heads), ("intermediate_size", v.intermediate_size),
                           ("text hidden_size", v.text_hidden_size)):
            if size % par.tp:
                add(("parallel.tp", f"{par.tp} does not divide the vision tower's {name}={size}"))
    if sv.engine == "sglang" and sv.enable_chunked_prefill and 0 < sv.max_prefill_tokens < sv.max_num_batched_tokens:
        add(("serving.max_prefill_tokens", f"{sv.max_prefill_tokens} is below the chunked prefill size "
             f"{sv.max_num_batched_tokens}: it caps SGLang's prefill batches below the chunk (PrefillAdder's "
             "rem_input_tokens), which is not modelled; give max_num_batched_tokens (--chunked-prefill-size) "
             f"{sv.max_prefill_tokens} instead"))
    for key, engine in (("num_gpu_blocks_override", "vllm"), ("kv_cache_memory_bytes", "vllm"),
                        ("max_total_tokens", "sglang"), ("max_prefill_tokens", "sglang")):
        if getattr(sv, key) and sv.engine != engine:
            add((f"serving.{key}", f"an option of {engine} (--{key.replace('_', '-')}), not of {sv.engine}; "
                 "remove it, or set it to 0"))
    if sv.engine != "sglang" and (sv.cuda_graph_max_bs or sv.prefill_cuda_graph != "auto" or sv.derived_max_num_seqs):
        key = "cuda_graph_max_bs" if sv.cuda_graph_max_bs else \
            "prefill_cuda_graph" if sv.prefill_cuda_graph != "auto" else "derived_max_num_seqs"
        add((f"serving.{key}", f"SGLang's (its default mem_fraction_static and request slots), not {sv.engine}'s; "
             "remove it (vLLM's capture sizes: cuda_graph_sizes / max_cudagraph_capture_size)"))
    if sv.usage_context != "openai_api_server" and sv.engine != "vllm":
        add(("serving.usage_context", f"vLLM's usage context (its offline LLM class's defaults); {sv.engine} "
             "takes one set of defaults: remove it"))
    if sv.kv_cache_memory_bytes and sv.engine == "vllm" and sv.engine_version \
            and not release_at_least(sv.engine_version, VLLM_KV_CACHE_MEMORY_BYTES):
        add(("serving.kv_cache_memory_bytes", f"vLLM {sv.engine_version} has no --kv-cache-memory-bytes (an option "
             "from 0.10.2); remove it, or name the version that ran with it"))
    allowed = KV_DTYPES_BY_ENGINE[sv.engine]
    if sv.kv_cache_dtype not in allowed:
        add(("serving.kv_cache_dtype", f"{sv.kv_cache_dtype!r} is not accepted by {sv.engine}; use one of "
             f"{', '.join(allowed)}"))
    elif m.index_n_heads and sv.kv_cache_dtype not in ("auto", "bf16", "fp8", "fp8_ds_mla"):
        add(("serving.kv_cache_dtype", f"{sv.kv_cache_dtype!r}: DeepSeek-V3.2's FlashMLA sparse backend takes auto, "
             "bf16 or fp8_ds_mla (fp8 its alias)"))
    elif sv.kv_cache_dtype == "fp8_ds_mla" and not m.is_mla:
        add(("serving.kv_cache_dtype", '"fp8_ds_mla" is vLLM\'s MLA-only cache layout; this model has no MLA'))
    # per-channel int checkpoints: compressed-tensors, bitsandbytes int8 (one SCB scale a row)
    channel_ok = run.quant is not None and run.quant.method in ("compressed-tensors", "bitsandbytes")
    for dtype, group in (("nvfp4", 16), ("nf4", 64)):
        if sv.weight_dtype == dtype and sv.quant_group_size != group:
            add(("serving.quant_group_size", f"{dtype} scales {group} values each; set quant_group_size = {group}"))
    problems += quant_problems(run)
    if sv.quant_group_size == 0 and sv.weight_dtype in ("int8", "int4") and not channel_ok:
        add(("serving.quant_group_size", "GPTQ int8/int4 weights need a group size ≥ 1 (0 means per-channel fp8 only)"))
    if sv.weight_dtype in ("int4", "mxfp4") and sv.quant_group_size % 2:
        add(("serving.quant_group_size", "4-bit weights pack two per byte; use an even group size"))
    if sv.engine == "vllm" and sv.block_size % 16 and sv.block_size not in (1, 8):
        add(("serving.block_size", f"{sv.block_size}: vLLM takes 1, 8 or a multiple of 16 "
             "(vllm/config/cache.py BlockSize)"))
    if m.index_n_heads and not (m.is_mla and m.q_lora_rank):
        add(("model.index_n_heads", "the lightning indexer reads MLA's compressed query (DeepSeek-V3.2's Indexer takes "
             "q_lora_rank); give kv_lora_rank and q_lora_rank, or index_n_heads = 0"))
    if m.index_n_heads and (sv.engine != "vllm" or (parse_version(sv.engine_version) or (99,)) < DSA_VLLM):
        add(("serving.engine_version" if sv.engine == "vllm" else "serving.engine",
             "DeepSeek-V3.2's sparse attention (its indexer, its cache and the workspaces they reserve) is modelled as "
             'vLLM 0.19.0 runs it; set engine = "vllm" and engine_version = "0.19.0"'))
    if m.has_linear_attention:
        if sv.engine != "vllm" or (parse_version(sv.engine_version) or (99,)) < GDN_VLLM:
            add(("serving.engine_version" if sv.engine == "vllm" else "serving.engine",
                 "gated delta-net layers (Qwen3-Next, Qwen3.5) are modelled as vLLM's V1 engine runs them (0.10.2 "
                 'or later: the recurrent state pages of its hybrid KV cache); set engine = "vllm" and '
                 'engine_version = "0.19.0"'))
        for name, heads in (("linear_num_key_heads", m.linear_num_key_heads),
                            ("linear_num_value_heads", m.linear_num_value_heads)):
            if heads % par.tp:
                add(("parallel.tp", f"{par.tp} does not divide {name}={heads} (GatedDeltaNetAttention splits its "
                     "heads over the tensor-parallel ranks)"))
        if sv.enable_prefix_caching and any(r.prefix_id for r in run.requests):
            add(("serving.enable_prefix_caching", "prefix sharing with gated delta-net layers (vLLM's "
                 'mamba_cache_mode "align") is not modelled; set enable_prefix_caching = false or leave prefix_id '
                 "empty in the trace"))
    if sv.cuda_graph_estimate_gib is not None and (sv.engine != "vllm"
                                                   or not vllm_subtracts_cudagraph_estimate(sv.engine_version)):
        add(("serving.cuda_graph_estimate_gib", "only vLLM 0.20.0 and later subtract a CUDA-graph estimate from the KV "
             "budget by default (an earlier version's opt-in VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 is not "
             "modelled); remove it or set engine_version"))
    if sv.speculative_method == "mtp":
        if not m.has_linear_attention or sv.engine != "vllm":
            add(("serving.speculative_method", "MTP speculative decoding is modelled for gated delta-net hybrids on "
                 "vLLM (Qwen3-Next, Qwen3.5: their draft layers in the hybrid KV cache and the states' draft rows); "
                 'set speculative_method = ""'))
        if par.pp > 1:
            add(("serving.speculative_method", "the MTP drafter shares the target's embedding and LM head only at "
                 "pp = 1 (vLLM eagle.py _maybe_share_embeddings); set pp = 1"))
        if sv.num_speculative_tokens < 1:
            add(("serving.num_speculative_tokens", "MTP drafts at least one token a step; give "
                 "num_speculative_tokens ≥ 1"))
    elif sv.num_speculative_tokens:
        add(("serving.num_speculative_tokens", 'tokens drafted without a speculative_method; set speculative_method '
             '= "mtp" or num_speculative_tokens = 0'))
    sliding = any(m.is_sliding(i) for i in range(m.num_hidden_layers))
    if sliding and sv.engine in ("sglang", "hf"):
        what = "SGLang's SWA pool" if sv.engine == "sglang" else "Hugging Face's sliding-window cache layers"
        add(("serving.engine", f"sliding-window layers (layer_types) are modelled for vLLM's hybrid KV cache "
             f'manager only; {what} is not modelled yet: use engine = "vllm"'))
    if sliding and sv.engine == "vllm" and sv.enable_prefix_caching and any(r.prefix_id for r in run.requests):
        add(("serving.enable_prefix_caching", "prefix sharing across sliding-window KV cache groups is not "
             "modelled; set enable_prefix_caching = false or leave prefix_id empty in the trace"))
    mml, longest = run.max_model_len, run.derived_max_model_len  # vLLM checks against its derived length
    if mml > longest:
        what = "the rope_scaling's length " if longest != m.max_position_embeddings else "max_position_embeddings="
        refuses = ("SGLang refuses it without SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" if sv.engine == "sglang"
                   else "vLLM refuses it without VLLM_ALLOW_LONG_MAX_MODEL_LEN")
        add(("serving.max_model_len", f"{mml} exceeds {what}{longest} ({refuses})"))
    if sv.engine == "vllm" and not sv.enable_chunked_prefill and sv.max_num_batched_tokens < mml:
        add(("serving.max_num_batched_tokens", f"{sv.max_num_batched_tokens} is below max_model_len={mml}; "
             "without chunked prefill a whole prompt runs in one step (vllm/config/scheduler.py "
             "verify_max_model_len); raise it or enable chunked prefill"))
    if sv.max_num_seqs == 0 and sv.engine != "sglang":
        add(("serving.max_num_seqs", "0 (derived from the KV pool) is SGLang's; give the number of requests "
             "running at once (vLLM's default is 256)"))
    if sv.engine == "vllm" and sv.max_num_batched_tokens < sv.max_num_seqs:
        add(("serving.max_num_batched_tokens", f"{sv.max_num_batched_tokens} is below max_num_seqs="
             f"{sv.max_num_seqs} (vLLM requires max_num_batched_tokens ≥ max_num_seqs)"))
    if run.hardware.capacity_gib > MAX_DEVICE_GIB:  # the allocator model addresses 256 TiB per device
        add(("hardware.capacity_gib", f"{run.hardware.capacity_gib:g} GiB is beyond any device; serving models "
             f"one GPU, use at most {MAX_DEVICE_GIB:,} GiB"))
    if sv.non_torch_gib is not None and sv.non_torch_gib >= run.hardware.capacity_gib:
        add(("serving.non_torch_gib", f"{sv.non_torch_gib} leaves nothing of capacity_gib={run.hardware.capacity_gib}"))
    ld = run.load
    if ld is not None:
        for key in ("prompt_tokens", "output_tokens"):
            d = getattr(ld, key)
            where = f"serving.load.{key}"
            if d.dist == "fixed" and d.value < 1:
                add((where, 'dist = "fixed" needs value ≥ 1'))
            elif d.dist == "uniform" and not 1 <= d.min <= d.max:
                add((where, 'dist = "uniform" needs 1 ≤ min ≤ max'))
            elif d.dist == "lognormal" and d.mean < 1:
                add((where, 'dist = "lognormal" needs mean ≥ 1 (and sigma ≥ 0)'))
    return problems


def dp_problems(run: ServeRunSpec) -> list[tuple[str, str]]:
    """Data parallelism and DP attention (:mod:`timeline.serve.dp`): SGLang's ``server_args.py``
    ``ServerArgs.__post_init__`` asserts ``dp_size > 1`` and ``tp_size % dp_size == 0`` under
    ``--enable-dp-attention``; vLLM has no such flag (its ``data_parallel_size`` is DP attention)."""
    m, par, sv = run.model, run.parallel, run.serving
    out: list[tuple[str, str]] = []
    if sv.enable_dp_attention and sv.engine == "vllm":
        out.append(("serving.enable_dp_attention", "vLLM has no DP-attention flag: its data parallelism (parallel.dp, "
                    "each rank an engine core of tp GPUs) is DP attention; remove the key and set parallel.dp"))
    elif sv.enable_dp_attention and sv.engine == "hf":
        out.append(("serving.enable_dp_attention", 'engine = "hf" runs generate on one device; DP attention is '
                    'SGLang\'s (engine = "sglang"): remove the key'))
    elif sv.enable_dp_attention and sv.engine == "sglang":
        if par.dp < 2:
            out.append(("parallel.dp", "SGLang's --enable-dp-attention needs dp-size > 1 (1 < dp ≤ tp); set parallel.dp"))
        elif par.tp % par.dp:
            out.append(("parallel.dp", f"{par.dp} does not divide tp={par.tp}: SGLang's DP attention splits the tp "
                        f"group into dp attention groups of tp/dp GPUs; use one of {_divisors(par.tp)}"))
        if not m.is_mla:
            out.append(("serving.enable_dp_attention", "DP attention is modelled for MLA models (DeepSeek-V2/V3); "
                        f"{m.name} has no MLA: remove the key (parallel.dp alone gives SGLang's data-parallel replicas)"))
        elif par.dp > 1 and not par.tp % par.dp and (0 < sv.max_num_seqs < par.dp or sv.max_num_batched_tokens < par.dp):
            out.append(("serving.max_num_seqs", f"SGLang divides max_running_requests and chunked_prefill_size by "
                        f"dp_size={par.dp} under DP attention; both must be at least {par.dp}"))
    if par.dp > 1 and par.pp > 1:
        out.append(("parallel.pp", "pp > 1 with dp > 1 is not modelled by `timeline serve` yet; use one of them"))
    return out
