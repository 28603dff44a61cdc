"""SGLang's default ``mem_fraction_static``, 0.5.5 … 0.5.23, on CUDA (NVIDIA) GPUs (the KV pool: :mod:`timeline.serve.budget`).

Read from each release's wheel (``sglang/srt/``); every rule cites ``file:function@versions``. The
function was held to each release's own handlers, run on stubbed server arguments, on 40 written cases and
4,700 random configurations (identical values); DP attention (``dp_attention``/``dp_size``) on 26 more
written cases and 3,000 random DP-attention configurations. A release after 0.5.23 runs 0.5.23's rules
(:func:`rules_patch`).
Citation shorthand:
  SA   = server_args.py
  GMS  = SA ServerArgs._handle_gpu_memory_settings           (0.5.5-0.5.18)
  MH   = arg_groups/memory_hook.py handle_gpu_memory_settings (0.5.19-0.5.23)
  CGH  = arg_groups/cuda_graph_hook.py                        (0.5.19-0.5.23)
  CGC  = model_executor/cuda_graph_config.py                  (0.5.14-0.5.23)
  MC   = configs/model_config.py

What is modelled ("plain" launch on CUDA):
  * ``--mem-fraction-static`` not given (otherwise SGLang keeps the user value).
  * DP attention as the user passes it (``--enable-dp-attention --dp-size N``:
    ``dp_attention=True, dp_size=N``) is modelled: its reserve term
    (``_dp_attention_reserve``) and its prefill-graph rules (``_prefill_backend``).
    DP attention that SGLang switches on by itself AFTER the memory handler
    (DeepSeek NSA/V3.2 in SA _handle_model_specific_adjustments@0.5.5-0.5.7;
    prefill-CP / DWDP set-ups later) does not reach the reserve: pass the user's flag.
  * No speculative decoding, PD disaggregation, DeepEP / MoE A2A,
    LoRA, torch.compile, hierarchical cache / CPU offload, context parallel,
    deterministic inference, symmetric memory, DLLM, GGUF, two-batch-overlap,
    EPLB / expert-distribution recorder, ``--enforce-piecewise-cuda-graph``,
    explicit ``--cuda-graph-config`` JSON / ``--cuda-graph-backend-*`` (other than
    "disabled"), explicit ``--cuda-graph-bs``, KV-cache sharding, post-capture KV
    sizing (env SGLANG_ENABLE_POST_CAPTURE_KV_SIZING, EnvBool(False) in
    environ.py@0.5.16-0.5.23; auto-enabled only for MuseSpark archs at 0.5.23 by
    arg_groups/muse_spark_hook.py apply_muse_spark_env_defaults -> rejected here).
    Each of those either adds reserve terms or auto-disables prefill graphs;
    they are NOT modelled.
  * ``gpu_mem_mib`` must be what ``get_device_memory_capacity()`` returns on
    CUDA: utils/common.py get_nvgpu_memory_capacity@0.5.5-0.5.23 =
    ``min(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits)``
    over ALL GPUs nvidia-smi lists (float MiB, e.g. H100-SXM 81559.0); fallback
    (MIG / no nvidia-smi) ``torch.cuda.mem_get_info()[1] // 2**20``.
"""

from __future__ import annotations


def rules_patch(version: tuple[int, int, int]) -> int:
    """The 0.5.x patch whose rules ``version`` runs (0.5.5 … 0.5.23; a later release: 0.5.23's)."""
    if tuple(version) < (0, 5, 5):
        raise ValueError(f"{version}: these rules are read from 0.5.5")
    return 23 if tuple(version) > (0, 5, 23) else version[2]

# ---------------------------------------------------------------------------
# Data: architecture lists (only the names matter). Keyed by patch number.
# ---------------------------------------------------------------------------

# MC piecewise_cuda_graph_disabled_model_archs / is_piecewise_cuda_graph_disabled_model
# (matches ANY entry of hf_config.architectures). Absent before 0.5.10.
# Used by: SA _handle_piecewise_cuda_graph@0.5.10-0.5.13 and the tc_piecewise
# rule list (SA _disable_tc_piecewise_cudagraph_if_incompatible@0.5.14-0.5.18,
# CGH disable_tc_piecewise_cudagraph_if_incompatible@0.5.19-0.5.21).
_PCG_DISABLED_ARCHS_A = ["DeepseekV32ForCausalLM", "Qwen3NextForCausalLM",
                         "GlmMoeDsaForCausalLM", "BailingMoeV2_5ForCausalLM",
                         "LLaDAModelLM"]
_PCG_DISABLED_ARCHS_B = ["DeepseekV32ForCausalLM", "DeepseekV4ForCausalLM",
                         "DeepseekV4ForCausalLMNextN", "Qwen3NextForCausalLM",
                         "GlmMoeDsaForCausalLM", "BailingMoeV2_5ForCausalLM",
                         "LLaDAModelLM"]
_PCG_DISABLED_ARCHS_C = ["DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN",
                         "Qwen3NextForCausalLM", "BailingMoeV2_5ForCausalLM",
                         "LLaDAModelLM"]
_PCG_DISABLED_ARCHS_D = ["DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN",
                         "DeepseekV4ForCausalLMDSpark", "Qwen3NextForCausalLM",
                         "BailingMoeV2_5ForCausalLM", "LLaDAModelLM"]
_PCG_DISABLED_ARCHS_E = ["DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN",
                         "DeepseekV4ForCausalLMDSpark", "Qwen3NextForCausalLM",
                         "Glm5NextForConditionalGeneration",
                         "BailingMoeV2_5ForCausalLM", "LLaDAModelLM"]
PIECEWISE_CUDA_GRAPH_DISABLED_ARCHS: dict[int, list[str]] = {
    10: _PCG_DISABLED_ARCHS_A, 11: _PCG_DISABLED_ARCHS_A,
    12: _PCG_DISABLED_ARCHS_B,
    13: _PCG_DISABLED_ARCHS_C, 14: _PCG_DISABLED_ARCHS_C, 15: _PCG_DISABLED_ARCHS_C,
    16: _PCG_DISABLED_ARCHS_D, 17: _PCG_DISABLED_ARCHS_D, 18: _PCG_DISABLED_ARCHS_D,
    19: _PCG_DISABLED_ARCHS_D,
    20: _PCG_DISABLED_ARCHS_E, 21: _PCG_DISABLED_ARCHS_E, 22: _PCG_DISABLED_ARCHS_E,
    23: _PCG_DISABLED_ARCHS_E,
}

# MC multimodal_piecewise_cuda_graph_supported_model_archs (0.5.14+); consulted
# only when ModelConfig.is_multimodal is true.
_MM_PCG_A = ["Cohere2VisionForConditionalGeneration"]
_MM_PCG_B = ["Cohere2VisionForConditionalGeneration", "KimiK25ForConditionalGeneration",
             "MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration"]
_MM_PCG_C = ["KimiK25ForConditionalGeneration", "MiniMaxM3SparseForCausalLM",
             "MiniMaxM3SparseForConditionalGeneration"]
MULTIMODAL_PIECEWISE_SUPPORTED_ARCHS: dict[int, list[str]] = {
    14: _MM_PCG_A, 15: _MM_PCG_A, 16: _MM_PCG_B, 17: _MM_PCG_B, 18: _MM_PCG_B,
    19: _MM_PCG_C, 20: _MM_PCG_C, 21: _MM_PCG_C, 22: _MM_PCG_C, 23: _MM_PCG_C,
}

# MC multimodal_breakable_cuda_graph_supported_model_archs (0.5.16+).
_MM_BCG_A = ["Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"]
_MM_BCG_B = _MM_BCG_A + ["InternS2MobiusForConditionalGeneration",
                         "MuseGlimmerForConditionalGeneration",
                         "KimiK3ForConditionalGeneration", "KimiK25ForConditionalGeneration"]
_MM_BCG_C = _MM_BCG_B + ["Cohere2VisionForConditionalGeneration",
                         "PaddleOCRVLForConditionalGeneration"]
_MM_BCG_D = _MM_BCG_C + ["Glm5NextForConditionalGeneration"]
_MM_BCG_E = _MM_BCG_D + ["Qwen4ExpForConditionalGeneration", "MiniMaxM3SparseForCausalLM",
                         "MiniMaxM3SparseForConditionalGeneration"]
_MM_BCG_F = _MM_BCG_E + ["MuseSparkForConditionalGeneration"]
MULTIMODAL_BREAKABLE_SUPPORTED_ARCHS: dict[int, list[str]] = {
    16: _MM_BCG_A, 17: _MM_BCG_A, 18: _MM_BCG_B, 19: _MM_BCG_C, 20: _MM_BCG_D,
    21: _MM_BCG_D, 22: _MM_BCG_E, 23: _MM_BCG_F,
}

# MC is_deepseek_v4 (checks architectures[0] only).
DEEPSEEK_V4_ARCHS: dict[int, list[str]] = {
    15: ["DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN"],
    **{p: ["DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN",
           "DeepseekV4ForCausalLMDSpark"] for p in range(16, 24)},
}
# MC is_nemotron_h@0.5.17 (architectures[0]); BCG rule only at 0.5.17.
NEMOTRON_H_ARCHS = ["NemotronHForCausalLM", "NemotronHPuzzleForCausalLM",
                    "NemotronHForCausalLMMTP"]
# SA _apply_inkling_prefill_cuda_graph_default@0.5.16-0.5.18 /
# CGH apply_inkling_prefill_cuda_graph_default@0.5.19-0.5.23 (architectures[0]).
INKLING_ARCHS = ["InklingForConditionalGeneration", "InklingForConditionalGenerationMTP"]
# SA _apply_muse_glimmer_prefill_cuda_graph_max_bs_default@0.5.18 /
# CGH apply_muse_glimmer_prefill_cuda_graph_max_bs_default@0.5.19-0.5.23.
MUSE_GLIMMER_ARCHS = ["MuseGlimmerForCausalLM", "MuseGlimmerForConditionalGeneration"]
# arg_groups/muse_spark_hook.py MUSE_SPARK_ARCHITECTURES@0.5.23 (architectures[0]);
# apply_muse_spark_env_defaults sets SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=True -> out of scope.
MUSE_SPARK_ARCHS = ["MuseSparkForConditionalGeneration"]

DISABLED, TC_PIECEWISE, BREAKABLE, FULL = "disabled", "tc_piecewise", "breakable", "full"


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------

def _band(p: int, gpu_mem: float, tp: int) -> tuple[int, int]:
    """(default chunked_prefill_size, default decode cuda_graph_max_bs).

    GMS@0.5.5-0.5.18 and MH@0.5.19-0.5.23 (is_npu() bands of 0.5.5-0.5.6 never
    apply on CUDA; removed in 0.5.7). Thresholds are strict '<' on MiB.
    """
    if gpu_mem < 20 * 1024:                       # T4, 4080
        return 2048, 8
    if gpu_mem < 35 * 1024:                       # A10, 4090, 5090
        if p >= 20:
            # MH@0.5.20-0.5.23: 4k chunk, max_bs 48 if tp < 4 else 160
            return 4096, (48 if tp < 4 else 160)
        # GMS@0.5.5-0.5.18, MH@0.5.19: 2k chunk, max_bs 24 if tp < 4 else 80
        return 2048, (24 if tp < 4 else 80)
    if gpu_mem < 60 * 1024:                       # A100-40G, L40(S), A6000
        return 4096, (32 if tp < 4 else 160)
    if gpu_mem < 90 * 1024:                       # H100, A100-80G
        return 8192, (256 if tp < 4 else 512)
    if gpu_mem < 160 * 1024:                      # H20, H200
        return 8192, (256 if tp < 4 else 512)
    return 16384, 512                             # B200 (any tp)


def _prefill_capture_sizes(p: int, max_tokens: int) -> list[int]:
    """Captured prefill token sizes.

    0.5.5-0.5.7: SA _generate_piecewise_cuda_graph_tokens (640..4096 step 128, then 256).
    0.5.8:       same fn, 640..1024 step 64, 1280..4096 step 256, 4608.. step 512.
    0.5.9-0.5.13: same fn, first 576..1024 step 64 bucket.
    0.5.14-0.5.18: SA _generate_prefill_cuda_graph_batch_sizes (== 0.5.9 list).
    0.5.19-0.5.23: CGH generate_prefill_cuda_graph_batch_sizes (== 0.5.9 list).
    For BOTH tc_piecewise and breakable backends these are token counts: the
    runner uses cuda_graph_config.prefill.bs as capture_num_tokens
    (model_executor/runner/prefill_cuda_graph_runner.py@0.5.19); only len()
    matters for the reserve.
    """
    if p <= 7:
        sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16))
                 + list(range(288, 513, 32)) + list(range(640, 4096 + 1, 128))
                 + list(range(4352, max_tokens + 1, 256)))
    else:
        start = 640 if p == 8 else 576
        sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16))
                 + list(range(288, 513, 32)) + list(range(start, 1024 + 1, 64))
                 + list(range(1280, 4096 + 1, 256))
                 + list(range(4608, max_tokens + 1, 512)))
    return [s for s in sizes if s <= max_tokens]


def _prefill_backend(p: int, *, mla: bool, dsa: bool, kda: bool, pp: int,
                     archs: list[str], multimodal: bool, disable_cuda_graph: bool,
                     disable_prefill_cuda_graph: bool, enable_piecewise_cuda_graph: bool,
                     trtllm_mla_prefill: bool, dp_attention: bool = False) -> tuple[str, str]:
    """Prefill (piecewise / breakable) CUDA-graph backend as seen by the memory
    handler, i.e. after every auto-disable that runs BEFORE it. Returns
    (backend, reason).

    ``dp_attention`` is the raw ``--enable-dp-attention`` flag: every DP-attention
    rule below reads ``enable_dp_attention`` itself (not ``dp_size``), and
    ``_handle_data_parallelism``'s dp_size == 1 reset runs after the memory
    handler, so ``--enable-dp-attention --dp-size 1`` triggers them too.
    """
    arch0 = archs[0] if archs else ""
    if p == 5:
        # GMS@0.5.5 has no prefill-graph reserve term at all.
        return DISABLED, "0.5.5: no piecewise reserve term"
    if p <= 9:
        # GMS@0.5.6-0.5.9: opt-in --enable-piecewise-cuda-graph (default False);
        # nothing before the handler flips it (SA __post_init__ order) -- not even
        # DP attention: the opted-in term is still counted with --enable-dp-attention.
        return (TC_PIECEWISE, "--enable-piecewise-cuda-graph") if enable_piecewise_cuda_graph \
            else (DISABLED, "piecewise cuda graph is opt-in (default off)")
    if p <= 13:
        # SA __post_init__@0.5.10-0.5.13 calls _handle_piecewise_cuda_graph()
        # BEFORE _handle_gpu_memory_settings(). Default disable_piecewise_cuda_graph=False.
        # Rules of SA _handle_piecewise_cuda_graph@0.5.10-0.5.13 relevant to a plain
        # launch: model-arch blacklist, pp_size > 1, ModelConfig.is_multimodal.
        # NOTE: --disable-cuda-graph does NOT disable it here (not a rule), so the
        # reserve is still counted with --disable-cuda-graph in 0.5.10-0.5.13.
        if disable_prefill_cuda_graph:
            return DISABLED, "--disable-piecewise-cuda-graph"
        if any(a in PIECEWISE_CUDA_GRAPH_DISABLED_ARCHS[p] for a in archs):
            return DISABLED, "arch in piecewise_cuda_graph_disabled_model_archs"
        if multimodal:
            return DISABLED, "multimodal model"
        if pp > 1:
            return DISABLED, "pp_size > 1"
        # SA _handle_piecewise_cuda_graph@0.5.10-0.5.13 rule "DP attention":
        # enable_dp_attention -> disable_piecewise_cuda_graph = True.
        if dp_attention:
            return DISABLED, "DP attention (0.5.10-0.5.13 piecewise rule)"
        return TC_PIECEWISE, "default on (0.5.10-0.5.13)"

    # ---- 0.5.14+: cuda_graph_config.prefill.backend ----
    # Inkling: SA _apply_inkling_prefill_cuda_graph_default@0.5.16-0.5.18 / CGH
    # apply_inkling_prefill_cuda_graph_default@0.5.19-0.5.23 sets the convenience
    # flag cuda_graph_backend_prefill=FULL unless --disable-prefill-cuda-graph;
    # in SA _parse_cuda_graph_config / CGH parse_cuda_graph_config the convenience
    # flag wins over legacy --disable-cuda-graph, and it LOCKS the prefill backend
    # so _apply_cuda_graph_compatibility is skipped.
    # (The lock also skips every DP-attention rule: Inkling keeps the term with DP attention.)
    if p >= 16 and arch0 in INKLING_ARCHS and not disable_prefill_cuda_graph:
        return FULL, "Inkling: prefill backend forced to full"
    # SA _parse_cuda_graph_config@0.5.14-0.5.18 / CGH parse_cuda_graph_config:
    # --disable-cuda-graph -> decode AND prefill DISABLED; --disable-prefill-cuda-graph
    # (and the deprecated --disable-piecewise-cuda-graph alias) -> prefill DISABLED;
    # both lock the prefill backend (no compat rules run).
    if disable_cuda_graph:
        return DISABLED, "--disable-cuda-graph disables prefill graph too (0.5.14+)"
    if disable_prefill_cuda_graph:
        return DISABLED, "--disable-prefill-cuda-graph"
    # CGC CudaGraphConfig default: prefill=TC_PIECEWISE@0.5.14;
    # default_prefill_backend() = BREAKABLE if is_cuda() @0.5.15-0.5.23.
    backend = TC_PIECEWISE if p == 14 else BREAKABLE

    # CGH apply_cuda_graph_compatibility@0.5.19-0.5.23: pp_size > 1 with the
    # default breakable backend -> DISABLED (PP prefill graph is opt-in).
    if p >= 19 and pp > 1 and backend == BREAKABLE:
        return DISABLED, "pp_size > 1 (breakable is opt-in under PP, 0.5.19+)"

    # SA _apply_cuda_graph_compatibility@0.5.16-0.5.18 / CGH@0.5.19-0.5.21:
    # multimodal arch on the piecewise allowlist switches BREAKABLE->TC_PIECEWISE
    # (0.5.18+: only if not also on the breakable allowlist and the resolved
    # prefill attention backend is not trtllm_mla). Removed at 0.5.22.
    if 16 <= p <= 21 and backend == BREAKABLE and multimodal and any(
            a in MULTIMODAL_PIECEWISE_SUPPORTED_ARCHS[p] for a in archs):
        if p <= 17 or (not any(a in MULTIMODAL_BREAKABLE_SUPPORTED_ARCHS[p] for a in archs)
                       and not trtllm_mla_prefill):
            backend = TC_PIECEWISE

    if backend == TC_PIECEWISE:
        # SA _disable_tc_piecewise_cudagraph_if_incompatible@0.5.14-0.5.18 /
        # CGH disable_tc_piecewise_cudagraph_if_incompatible@0.5.19-0.5.21
        # (plain-launch rules only): arch blacklist, pp_size > 1, multimodal
        # not on the piecewise allowlist.
        if any(a in PIECEWISE_CUDA_GRAPH_DISABLED_ARCHS[p] for a in archs):
            return DISABLED, "tc_piecewise: arch blacklist"
        if pp > 1:
            return DISABLED, "tc_piecewise: pp_size > 1"
        if multimodal and not any(a in MULTIMODAL_PIECEWISE_SUPPORTED_ARCHS[p] for a in archs):
            return DISABLED, "tc_piecewise: multimodal not allowlisted"
        # same rule lists, rule "DP attention" (enable_dp_attention; SA reads it through
        # _resolved() at 0.5.15-0.5.18, CGH through resolved_view) -- present in every
        # version that has the tc_piecewise list (0.5.14-0.5.21).
        if dp_attention:
            return DISABLED, "tc_piecewise: DP attention"
        return TC_PIECEWISE, "tc_piecewise"

    # backend == BREAKABLE:
    # SA _disable_breakable_cudagraph_if_incompatible@0.5.15-0.5.18 /
    # CGH disable_breakable_cudagraph_if_incompatible@0.5.19-0.5.23 (plain rules).
    # NB: no model-arch blacklist and (before 0.5.19) no pp rule for breakable.
    if p in (15, 16) and mla:
        return DISABLED, "breakable: MLA attention (0.5.15-0.5.16)"
    # SA _disable_breakable_cudagraph_if_incompatible@0.5.15-0.5.16 rule "DP attention"
    # ("DP-attn x BCG capture/replay not yet validated"); removed at 0.5.17, absent in
    # CGH disable_breakable_cudagraph_if_incompatible@0.5.19-0.5.23, so breakable stays on
    # under DP attention from 0.5.17.
    if p in (15, 16) and dp_attention:
        return DISABLED, "breakable: DP attention (0.5.15-0.5.16)"
    if p == 17 and mla and not dsa:
        return DISABLED, "breakable: MLA attention, non-DSA (0.5.17)"
    if p == 17 and arch0 in NEMOTRON_H_ARCHS:
        return DISABLED, "breakable: NemotronH (0.5.17)"
    if 20 <= p <= 21 and kda:
        return DISABLED, "breakable: KDA hybrid linear attention (0.5.20-0.5.21)"
    if p >= 22 and kda and "Glm5NextForConditionalGeneration" not in archs:
        return DISABLED, "breakable: KDA hybrid linear attention (0.5.22+)"
    if arch0 in DEEPSEEK_V4_ARCHS[p]:
        # 0.5.23 exempts it only when prefill CP BCG is supported (CP: out of scope)
        return DISABLED, "breakable: DeepSeek-V4"
    if multimodal:
        if p == 15 or not any(a in MULTIMODAL_BREAKABLE_SUPPORTED_ARCHS[p] for a in archs):
            return DISABLED, "breakable: multimodal not allowlisted"
    return BREAKABLE, "breakable"


def _dp_attention_reserve(p: int, *, dp_attention: bool, dp_size: int,
                          decode_max_bs: int) -> tuple[int, float]:
    """(attention-DP width the reserve multiplies by, MiB) -- the DP-attention term.

    GMS@0.5.5-0.5.15, SA reserve_for_graph_mb@0.5.16-0.5.18, MH reserve_for_graph_mb@0.5.19-0.5.23:
        if <attention DP on>:
            reserved_mem += decode max_bs * W * 3
            if decode max_bs > 300: reserved_mem += decode max_bs * W * 1.5
    added with the other graph terms, i.e. BEFORE the 10 GiB floor in every release (0.5.6/0.5.7
    included: only their piecewise term sits after the floor). ``decode max_bs`` is
    ``cuda_graph_max_bs`` (0.5.5-0.5.13) / ``cuda_graph_config.decode.max_bs`` (0.5.14+) as the
    handler just resolved it (band default, user value, 0.5.22+ max_running_requests cap); the
    term is NOT gated on the decode graph being enabled (0.5.15+ gate it only on
    disaggregation_mode != "prefill"), so ``--disable-cuda-graph`` keeps it.
    <attention DP on> / W:
      0.5.5-0.5.21: ``enable_dp_attention`` / ``dp_size`` (SA@0.5.15-0.5.18 reads the flag via
        ``_resolved()``, MH@0.5.19-0.5.21 via resolved_view). ``--dp-size 1`` is reset (flag off)
        only later, in SA _handle_data_parallelism@0.5.5-0.5.18 / overrides.py
        _data_parallelism_defaults (run from parallel_hook.py handle_data_parallelism)@0.5.19-0.5.21,
        so ``--enable-dp-attention --dp-size 1`` still pays ``max_bs * 1 * 3``.
      0.5.22-0.5.23: ``attn_dp_enabled_of(cfg)`` (runtime_context.py: ``attn_dp_size > 1``, or an
        EP scale joiner) / ``attn_dp_size``. parallel_hook.py handle_deprecated_dp_attention, the
        first step of pipeline.py run_resolution_pipeline@0.5.22-0.5.23, rewrites
        ``--enable-dp-attention --dp-size N`` to ``attn_dp_size=N, dp_size=1``,
        ``enable_dp_attention=False``; so W = N, and N = 1 gives no term.
    No other DP-attention adjustment of mem_fraction_static runs for a plain CUDA launch: the
    only later writer of the field is AMD aiter's *0.85 (SA _handle_attention_backend_compatibility
    @0.5.5-0.5.18, attention_hook.py handle_attention_backend_compatibility@0.5.19-0.5.23), and
    the DeepSeek / DP-attention branches of SA _handle_model_specific_adjustments / model_hook.py
    run after the memory handler.
    """
    if not dp_attention:
        return 1, 0.0
    width = dp_size
    if p >= 22 and width <= 1:
        return 1, 0.0
    mib = decode_max_bs * width * 3.0
    if decode_max_bs > 300:
        mib += decode_max_bs * width * 1.5
    return width, mib


def vlm_factor(vit_num_layers: int = 24, vit_hidden_size: int = 1024) -> float:
    """SA ServerArgs.adjust_mem_fraction_for_vlm@0.5.5-0.5.18 (identical in all) /
    MH adjust_mem_fraction_for_vlm@0.5.19-0.5.23 (non-post-capture branch):
    factor = 0.95 * clamp(1 - 0.1*(L*H^2/(24*1024^2) - 1), 0.8, 1.05).
    Defaults 24/1024 are the getattr defaults when vision_config lacks them."""
    ratio = (vit_num_layers * vit_hidden_size ** 2) / (24 * 1024 ** 2)
    dyn = max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))
    return 0.95 * dyn


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

def explain_mem_fraction_static(
    version: tuple[int, int, int], *, gpu_mem_mib: float, tp: int, pp: int,
    mla: bool, architectures: list[str], model_path: str,
    chunked_prefill_size: int | None, cuda_graph_max_bs: int | None,
    disable_cuda_graph: bool, max_running_requests: int | None,
    max_total_tokens: int | None, context_length: int | None,
    multimodal: bool = False,
    # ---- optional extras (defaults = plain launch) ----
    max_prefill_tokens: int = 16384,            # --max-prefill-tokens (used if chunked <= 0)
    enable_piecewise_cuda_graph: bool = False,  # 0.5.6-0.5.9 opt-in flag
    disable_prefill_cuda_graph: bool = False,   # --disable-piecewise-cuda-graph (0.5.10-0.5.13) /
                                                # --disable-prefill-cuda-graph (0.5.14+)
    dsa: bool = False,        # MC is_deepseek_dsa (arch + hf_config.index_topk); 0.5.17 rule
    kda: bool = False,        # MC uses_kda_attention; 0.5.20+ rule
    vision_config: dict | None = None,  # {"num_hidden_layers":..,"hidden_size":..}; None => no VLM adjust
    hopper: bool = False,     # is_sm90_supported(); Qwen3-VL rule 0.5.20+
    hf_model_type: str = "",  # hf_config.model_type; Qwen3-VL rule 0.5.20+
    trtllm_mla_prefill: bool = False,  # resolved prefill attn backend == trtllm_mla (0.5.18-0.5.21 mm switch)
    dp_attention: bool = False,  # --enable-dp-attention
    dp_size: int = 1,            # --dp-size (the attention-DP width when dp_attention; ignored otherwise)
) -> dict:
    p = rules_patch(version)
    archs = list(architectures or [])
    arch0 = archs[0] if archs else ""
    if p >= 23 and arch0 in MUSE_SPARK_ARCHS:
        raise ValueError("MuseSpark at 0.5.23 auto-enables post-capture KV sizing (out of scope)")
    if gpu_mem_mib is None or gpu_mem_mib <= 0:
        raise ValueError("gpu_mem_mib required (gpu_mem None -> SGLang uses 0.88/0.95, not modelled)")
    gpu_mem = float(gpu_mem_mib)
    if dp_attention and (dp_size < 1 or tp % dp_size):
        # SA _handle_data_parallelism@0.5.5-0.5.18 / parallel_hook.py handle_data_parallelism
        # @0.5.19-0.5.23: assert tp_size % dp_size (attn_dp_size) == 0 -> the launch fails.
        raise ValueError(f"DP attention needs dp_size dividing tp (tp={tp}, dp_size={dp_size})")
    info: dict = {"version": ".".join(str(x) for x in version)}

    # ---- 1. chunked_prefill_size / decode max_bs defaults (bands) ----
    # DP attention changes neither band nor value here: the bands key on tp_size only, and the
    # division chunked_prefill_size //= dp_size (attn_dp_size at 0.5.22+) happens AFTER the
    # memory handler (SA _handle_data_parallelism@0.5.5-0.5.18, parallel_hook.py
    # handle_data_parallelism@0.5.19-0.5.23, which at 0.5.16+ also re-clamps the prefill graph's
    # max_bs), so the activation and prefill-graph terms use the undivided size.
    # --max-running-requests is likewise used undivided by the 0.5.22+ cap below.
    band_cps, band_bs = _band(p, gpu_mem, tp)
    cps = chunked_prefill_size if chunked_prefill_size is not None else band_cps
    decode_max_bs_is_default = cuda_graph_max_bs is None
    max_bs = cuda_graph_max_bs if cuda_graph_max_bs is not None else band_bs

    # MH@0.5.20-0.5.23 -> arg_groups/model_overrides/qwen3_vl.py
    # expand_multimodal_decode_graph_to_running_limit: large-Hopper Qwen3-VL
    # raises a default decode max_bs to max_running_requests (<= 512).
    if (p >= 20 and decode_max_bs_is_default and max_running_requests is not None
            and max_running_requests <= 512 and max_bs < max_running_requests
            and hopper and gpu_mem >= 60 * 1024 and multimodal
            and hf_model_type in ("qwen3_vl", "qwen3_vl_moe")):
        max_bs = max_running_requests
    # MH@0.5.22-0.5.23: a DEFAULT decode max_bs is capped by --max-running-requests.
    if (p >= 22 and decode_max_bs_is_default and max_running_requests is not None
            and max_bs > max_running_requests):
        max_bs = max_running_requests
    info.update(chunked_prefill_size=cps, decode_max_bs=max_bs)

    # ---- 2. prefill graph backend at the time of the memory handler ----
    backend, reason = _prefill_backend(
        p, mla=mla, dsa=dsa, kda=kda, pp=pp, archs=archs, multimodal=multimodal,
        disable_cuda_graph=disable_cuda_graph,
        disable_prefill_cuda_graph=disable_prefill_cuda_graph,
        enable_piecewise_cuda_graph=enable_piecewise_cuda_graph,
        trtllm_mla_prefill=trtllm_mla_prefill,
        # 0.5.22+: handle_deprecated_dp_attention clears enable_dp_attention before any rule
        # runs, and no rule list there has a DP entry (CGH@0.5.22-0.5.23).
        dp_attention=dp_attention and p <= 21)
    info.update(prefill_backend=backend, prefill_reason=reason)
    # decode backend: FULL by default (CGC), DISABLED by --disable-cuda-graph (0.5.14+).
    decode_disabled = disable_cuda_graph

    # ---- 3. prefill capture max tokens / sizes ----
    pf_max = None
    if p == 6:
        # SA dataclass default piecewise_cuda_graph_max_tokens = 4096 @0.5.5-0.5.6
        pf_max = 4096
    elif p == 7:
        # GMS@0.5.7: max_tokens = chunked_prefill_size when unset
        pf_max = cps
    elif p >= 8:
        locked_max = p >= 18 and arch0 in MUSE_GLIMMER_ARCHS  # max_bs=512, locked
        if locked_max:
            pf_max = 512
        else:
            # GMS@0.5.8-0.5.18 / MH@0.5.19-0.5.22: chunked_prefill_size, or 2048 for MLA.
            # MH@0.5.23: MLA -> min(8192, chunked_prefill_size).
            if not mla:
                pf_max = cps
            else:
                pf_max = min(8192, cps) if p >= 23 else 2048
            # (MH@0.5.19+: pp>1 & explicitly-opted-in breakable -> cap 8192; not
            #  reachable with the default backend, see _prefill_backend.)
            # GMS@0.5.10-0.5.18 / MH: cap by --max-total-tokens (inside the "unset" block)
            if p >= 10 and max_total_tokens is not None:
                pf_max = min(pf_max, max_total_tokens)
            # GMS@0.5.10-0.5.18 / MH: "llama-2" in model_path.lower() -> cap 4096
            if p >= 10 and "llama-2" in model_path.lower():
                pf_max = min(pf_max, 4096)
        # GMS@0.5.13-0.5.16: clamp to explicit --context-length (removed 0.5.17)
        if 13 <= p <= 16 and context_length is not None:
            pf_max = min(pf_max, context_length)
    sizes = _prefill_capture_sizes(p, pf_max) if pf_max is not None else []
    info.update(prefill_max_tokens=pf_max, prefill_num_sizes=len(sizes))

    # ---- 4. reserved_mem (MiB) ----
    terms: list[tuple[str, float]] = []
    reserved = 512.0  # "constant meta data" GMS@0.5.5-0.5.18 / MH (non post-capture branch)
    terms.append(("base", 512))
    # activation: GMS/MH: max(chunked_prefill_size, 2048)*1.5, or max_prefill_tokens if chunked <= 0
    act_tokens = max(cps, 2048) if cps > 0 else max(max_prefill_tokens, 2048)
    reserved += act_tokens * 1.5
    terms.append((f"activation {act_tokens}*1.5", act_tokens * 1.5))
    # decode graph: GMS@0.5.5-0.5.14 unconditional max_bs*2;
    # GMS@0.5.15 / SA reserve_for_graph_mb@0.5.16-0.5.18 / MH reserve_for_graph_mb:
    # only if decode backend != DISABLED.
    if p <= 14 or not decode_disabled:
        reserved += max_bs * 2
        terms.append((f"decode graph {max_bs}*2", max_bs * 2))
    # parallel: tp*pp/8 GiB (all versions)
    par = tp * pp / 8 * 1024
    reserved += par
    terms.append((f"tp*pp/8*1024 = {tp}*{pp}/8*1024", par))
    # DP attention: decode max_bs * W * 3 (+ * 1.5 if max_bs > 300), before the floor
    # (see _dp_attention_reserve for the citations).
    dp_width, dp_mib = _dp_attention_reserve(p, dp_attention=dp_attention, dp_size=dp_size,
                                             decode_max_bs=max_bs)
    info.update(dp_attention_width=dp_width if dp_mib else 1, dp_attention_reserve=dp_mib)
    if dp_mib:
        reserved += dp_mib
        big = f" + {max_bs}*{dp_width}*1.5" if max_bs > 300 else ""
        terms.append((f"DP attention {max_bs}*{dp_width}*3{big}", dp_mib))

    pcg = 0.0
    if backend != DISABLED:
        if p == 6 and pf_max is not None:
            pcg = pf_max // 4          # GMS@0.5.6, added AFTER the 10 GiB floor
        elif p == 7 and pf_max is not None:
            pcg = pf_max // 8          # GMS@0.5.7, added AFTER the 10 GiB floor
        elif p in (8, 9):
            pcg = len(sizes) * 8       # GMS@0.5.8-0.5.9 (no MLA special case), before floor
        else:
            # GMS@0.5.10-0.5.15, SA reserve_for_graph_mb@0.5.16-0.5.18, MH reserve_for_graph_mb:
            # non-MLA len(bs)*8, MLA flat 1.5 GiB; before floor.
            pcg = len(sizes) * 8 if not mla else 1.5 * 1024
    info["prefill_graph_reserve"] = pcg
    if p >= 8 and pcg:
        reserved += pcg
        terms.append(("prefill graph", pcg))
    pre_floor = reserved
    # floor: gpu_mem > 60 GiB -> at least 10 GiB (all versions)
    if gpu_mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    floored = reserved != pre_floor
    if p in (6, 7) and pcg:
        reserved += pcg
        terms.append(("prefill graph (after floor)", pcg))
    info.update(reserved_pre_floor=pre_floor, floor_applied=floored, reserved_mem=reserved,
                terms=terms)

    mfs = round((gpu_mem - reserved) / gpu_mem, 3)
    info["mem_fraction_static_before_vlm"] = mfs

    # ---- 5. VLM adjustment ----
    # GMS@0.5.5-0.5.8: if model_config.is_multimodal; @0.5.9+: and not language_only;
    # @0.5.17+: and disaggregation_mode != "decode"; @0.5.18+: and not language_model_only.
    # Applied only if hf_config has a vision_config (else no-op).
    if multimodal and vision_config is not None:
        f = vlm_factor(vision_config.get("num_hidden_layers", 24),
                       vision_config.get("hidden_size", 1024))
        mfs = mfs * f
        info["vlm_factor"] = f
    info["mem_fraction_static"] = mfs
    return info
