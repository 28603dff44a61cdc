"""Which engine versions ``serving.engine_version`` names, and the version-dependent defaults.

vLLM's memory budget changed shape across releases; every rule here was read in the engine's own
source at the release named (the PyPI wheel of that version, file and function cited), and only
the rules that move the KV pool of a calibration log (``tests/data/serving_logs.json``, side
``calibration``) are written:

* **engine** — vLLM's V1 engine is the default from 0.8.0 (``vllm/envs.py`` ``VLLM_USE_V1``
  defaults to 1 at 0.8.0; at 0.7.x it is 0). Before, the V0 ``LLMEngine`` profiles with
  ``vllm/worker/worker.py`` ``Worker.determine_num_available_blocks``.
* **scheduler defaults, V0** — ``vllm/config.py`` ``SchedulerConfig.__post_init__`` @0.6.4.post1
  (unchanged to 0.7.3): without chunked prefill, ``max_num_batched_tokens = max(max_model_len,
  2048)``, so the profile run is one ``max_model_len``-token step; the OpenAI server turns chunked
  prefill on for ``max_model_len > 32768`` (``vllm/engine/arg_utils.py``
  ``EngineArgs.create_engine_config``: ``use_long_context``) and the chunked budget is then 512
  (``SchedulerConfig.__post_init__`` @0.6.4.post1), 2048 from 0.6.6 (@0.6.6.post1, @0.7.3).
  ``max_num_seqs`` defaults to 256.
* **scheduler defaults, V1** — ``vllm/engine/arg_utils.py`` ``EngineArgs._set_default_args_v1``
  @0.9.2 and @0.11.0: the OpenAI server takes ``max_num_batched_tokens`` 8192 and
  ``max_num_seqs`` 1024 on a device of ≥ 70 GiB whose name has no "a100", else 2048 and 256
  (@0.8.5: the same token budgets, ``max_num_seqs`` 256 everywhere).

* **profile run, V1 from 0.17** — read in the 0.16.0, 0.17.0, 0.19.0 and 0.22.0 wheels:
  ``vllm/v1/sample/ops/topk_topp_sampler.py`` ``apply_top_k_top_p`` takes the Triton kernel for ≥ 8 rows
  (``apply_top_k_top_p_triton``, PR #33538) from 0.17.0 on — 0.16.0's has no Triton path and sorts
  (``apply_top_k_top_p_pytorch``), as the llm-d-planner version sweep shows (Qwen3-14B on an H100:
  activation 5.64 GiB at 0.15.0, 2.23 at 0.17.0); and the fused MoE runs as a modular kernel whose
  workspaces come from the worker's ``WorkspaceManager`` (``vllm/v1/worker/workspace.py``), kept after the
  first layer (:mod:`timeline.serve.profile_run`): ``modular_kernel.py`` ``_allocate_buffers`` at 0.17.0
  equals 0.19.0's for one chunk (the profile's tokens are below ``VLLM_FUSED_MOE_CHUNK_SIZE``). Versions
  up to 0.16 sort and allocate the MoE caches per call (``fused_moe.py`` ``fused_experts_impl``; 0.13 …
  0.16 already have the ``WorkspaceManager`` but were not read for MoE and take the 0.11 rules).
* **FlashInfer sampler** (``serving.flashinfer_sampler``) — ``TopKTopPSampler.__init__`` takes
  ``forward_cuda`` → ``flashinfer_sample`` when FlashInfer is installed and ``VLLM_USE_FLASHINFER_SAMPLER``
  is not 0 up to 0.11.0 (read at 0.9.2, 0.10.1.1, 0.11.0: vLLM prints "Using FlashInfer for top-p & top-k
  sampling."), only when it is 1 from 0.11.1 (read at 0.11.1 … 0.19.0). FlashInfer is an extra of the
  wheel (``vllm[flashinfer]`` at 0.10.1.1), so whether it runs is the log's fact, not the version's.
* **CUDA-graph memory profiling** — from 0.18.0 ``gpu_worker.py`` ``determine_available_memory`` calls
  ``profile_cudagraph_memory`` inside the ``memory_profiling`` window unless ``enforce_eager`` (absent in
  0.17.0; read at 0.18.0 and 0.19.0): what the captures leave outside PyTorch is in the non-torch
  increase (:mod:`timeline.serve.non_torch`), the estimate itself subtracted only under the opt-in
  ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``.

The KV pool itself is ``total · gpu_memory_utilization − (weights + torch peak increase +
non-torch increase)`` at every version read here from 0.6.4 on (V0 ``determine_num_available_blocks``
@0.6.4.post1 counts the torch peak of the profile run including the weights and the non-torch
bytes in use after it; V1 ``gpu_worker.py`` ``Worker.determine_available_memory`` @0.9.2 with
``memory_profiling``), so :mod:`timeline.serve.budget` needs no other branch for them. Versions
before 0.6.4 (``peak = init_free − free`` after the profile run, the caching allocator's reserved
bytes) are read too (below).

* **profiler before 0.6.4** — ``vllm/worker/worker.py``: at 0.2.5 and 0.2.7
  ``Worker.profile_num_available_blocks`` takes ``peak = total − free`` after the profile run (no
  ``empty_cache`` in between); from 0.3.3 to 0.6.3.post1 ``Worker.determine_num_available_blocks`` takes
  ``peak = init_free − free``, ``init_free`` read in ``init_device`` before the distributed groups are
  made. Either way the caching allocator's cached segments are in it: the reserved peak, not the
  allocated one (:mod:`timeline.serve.budget`). ``blocks = (total · util − peak) // block_bytes``.
  0.3.0 … 0.3.2 were not read and are refused by name; so is anything before 0.2.5.
* **sampler before 0.6** — ``vllm/model_executor/layers/sampler.py`` up to 0.5.4 sorts the logits in
  the model dtype (``logits.to(torch.float)`` arrives by 0.6.3); the scheduler's long-context chunked
  prefill (``use_long_context``) is read at 0.5.4, not at 0.4.1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from timeline.spec.sglang_rules import explain_mem_fraction_static

#: the rule set of a run that names no vLLM (``timeline.io.serve_runfile`` fills ``serving.engine_version`` with it
#: and says so): 0.19.0, the newest release every version-dependent rule here was read at (scheduler defaults,
#: sampler, kernels, profilers) and the one the most calibration logs ran (the llm-d planner's sweep). Until stop 59
#: it was "0.11+35d5cda", the source the budget was first read at, which a user of a current vLLM got silently.
VLLM_DEFAULT = "0.19.0"
#: the first vLLM release whose budget subtracts allocated (not reserved) bytes
VLLM_OLDEST = (0, 6, 4)
#: releases of the reserved-peak profilers read (module docstring): [first, last] of each
VLLM_RESERVED_READ = (((0, 2, 5), (0, 2, 7)), ((0, 3, 3), (0, 6, 3)))
VLLM_V1_DEFAULT = (0, 8, 0)
SGLANG_VERSIONS = ("0.4",)
#: the SGLang rules a run without ``serving.engine_version`` runs (the newest release read; ``timeline.spec.serving``
#: ``ENGINE_VERSIONS`` names it first)
SGLANG_DEFAULT = "0.5.23"
#: SGLang's ``--max-prefill-tokens`` default (``server_args.py`` ``ServerArgs``, 0.4 … 0.5.23): a prefill batch's
#: tokens when chunked prefill is off (``--chunked-prefill-size`` ≤ 0)
SGLANG_MAX_PREFILL_TOKENS = 16384
#: SGLang's pool rule (``ModelRunner.profile_max_num_token``, from 0.5.11 ``_profile_available_bytes``, from 0.5.16
#: ``mem_cache/kv_cache_configurator.py``) is the same formula, ``post-load free − pre-load free × (1 −
#: mem_fraction_static)``, at every release read: 0.3.0, 0.3.6, 0.4.0, 0.4.5, 0.4.9.post2, 0.5.5 … 0.5.23 (the
#: post-capture sizing of 0.5.16 on is opt-in, ``SGLANG_ENABLE_POST_CAPTURE_KV_SIZING`` False in ``environ.py``
#: through 0.5.23); ``"0.4"`` is the round-1 name of the 0.4 rule. A later release runs the newest rules read.
_VERSION_RE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> tuple[int, int, int] | None:
    """``"0.6.4.post1"`` → (0, 6, 4); ``"0.11+35d5cda"`` → (0, 11, 0); None if not a version."""
    m = _VERSION_RE.match(text)
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def version_problem(engine: str, version: str) -> str:
    """One line saying why ``version`` is not modelled for ``engine``; "" when it is."""
    if not version or engine == "hf":
        return ""
    if engine == "sglang":
        v = parse_version(version)
        if version in SGLANG_VERSIONS or (v is not None and v >= SGLANG_OLDEST):
            return ""
        if v is None:
            return f"{version!r} is not a version such as 0.5.10"
        return (f"SGLang {version}: the pool rules are read from 0.3.0 on (0.3.0 … 0.5.23); an older release's "
                "are not (use 0.3.0 or later)")
    v = parse_version(version)
    if v is None:
        return f"{version!r} is not a version such as 0.6.4 or 0.11.0"
    if v < VLLM_OLDEST and not any(lo <= v <= hi for lo, hi in VLLM_RESERVED_READ):
        return (f"vLLM {version}: the profiler of 0.2.5-0.2.7 and 0.3.3 onwards is read; this version's is not "
                "(use a version from those ranges)")
    return ""


def vllm_reserved_profile(version: str) -> str:
    """Which reserved-peak profiler vLLM ``version`` uses: ``"total"`` (0.2.5 … 0.2.7: total − free),
    ``"init"`` (0.3.3 … 0.6.3: init_free − free) or ``""`` (0.6.4 on: allocated bytes)."""
    v = parse_version(version or VLLM_DEFAULT)
    if v is None or v >= VLLM_OLDEST:
        return ""
    return "total" if v < (0, 3, 0) else "init"


def vllm_sorts_in_model_dtype(version: str) -> bool:
    """vLLM ``version``'s V0 sampler sorts the logits without an fp32 copy (up to 0.5.x)."""
    v = parse_version(version or VLLM_DEFAULT)
    return v is not None and v < (0, 6, 0)


#: the first vLLM release whose profile run is modelled with the Triton sampler and the persistent MoE
#: workspace (module docstring)
VLLM_TRITON_SAMPLER = (0, 17, 0)
#: the first vLLM release that profiles CUDA-graph memory inside the memory-profiling window (module docstring)
VLLM_GRAPH_PROFILE = (0, 18, 0)


#: the first vLLM release that ships ``vllm/third_party/triton_kernels`` (the 0.12.0 wheel has it, and
#: ``vllm/utils/import_utils.py`` ``has_triton_kernels`` imports it; 0.11.2's ``third_party`` holds pynvml only)
VLLM_TRITON_KERNELS_VENDORED = (0, 12, 0)


def triton_kernels_vendored(version: str) -> bool:
    """vLLM ``version`` (default: :data:`VLLM_DEFAULT`) can import ``triton_kernels`` without an extra package."""
    v = parse_version(version or VLLM_DEFAULT)
    return v is not None and v >= VLLM_TRITON_KERNELS_VENDORED


def vllm_triton_profile(version: str) -> bool:
    """vLLM ``version`` (default: :data:`VLLM_DEFAULT`) samples with the Triton top-k/top-p kernel
    and keeps the MoE workspace (module docstring)."""
    v = parse_version(version or VLLM_DEFAULT)
    return v is not None and v >= VLLM_TRITON_SAMPLER


def vllm_profiles_cudagraphs(version: str, enforce_eager: bool) -> bool:
    """vLLM ``version`` captures CUDA graphs inside its memory-profiling window (module docstring)."""
    v = parse_version(version or VLLM_DEFAULT)
    return v is not None and v >= VLLM_GRAPH_PROFILE and not enforce_eager


@dataclass(frozen=True)
class SGLangDefaults:
    """What SGLang's server arguments resolve to on a device (:func:`sglang_server_defaults`)."""

    chunked_prefill_size: int
    cuda_graph_max_bs: int  # the largest decode batch captured
    prefill_graph: bool  # prefill (piecewise / breakable) CUDA graphs captured
    prefill_graph_sizes: int  # how many prefill shapes are captured (0 when none)
    reserved_mib: float  # what the default mem_fraction_static leaves out
    mem_fraction_static: float


#: the oldest SGLang modelled; its server defaults are read apart (``srt/server_args.py`` ``ServerArgs.__post_init__``
#: in every PyPI sdist from 0.3.0 to 0.4.10): up to 0.4.7 ``mem_fraction_static`` is a table, not 0.4.7.post1's reserve
SGLANG_OLDEST = (0, 3, 0)
SGLANG_RESERVE_RULE = (0, 4, 7, 1)


def sglang_release(version: str) -> tuple[int, int, int, int] | None:
    """``"0.4.6.post2"`` → (0, 4, 6, 2): SGLang's post-releases change its defaults (:func:`sglang_server_defaults`)."""
    m = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:\.post(\d+))?", version or "")
    if m is None:
        return None
    return int(m[1]), int(m[2]), int(m[3] or 0), int(m[4] or 0)


def _sglang_table(version: tuple[int, int, int, int], gpu_mem_mib: float, tp: int, pp: int,
                  speculative: bool) -> tuple[int, int, float]:
    """(chunked_prefill_size, cuda_graph_max_bs, mem_fraction_static) of SGLang 0.3.0 … 0.4.7
    (:func:`sglang_server_defaults`; ``gpu_mem_mib``: ``get_nvgpu_memory_capacity`` / ``get_device_memory_capacity``,
    nvidia-smi's total)."""
    v, mem, gib = version, gpu_mem_mib, 1024
    # chunked_prefill_size: a field default of 8,192 to 0.3.6.post3 (a quarter below 25,000 MiB from 0.3.5.post2);
    # from 0.4.0 None, then 2,048 below 25,000 MiB, else 8,192; 0.4.7 16,384 above 180,000
    chunk = 2048 if mem < 25_000 and v >= (0, 3, 5, 2) else 8192
    if v >= (0, 4, 7) and mem > 180_000:
        chunk = 16384
    # cuda_graph_max_bs: 160 (4 below 25,000 MiB from 0.3.5.post2); from 0.4.0 8 below 25,000 (from 0.4.0.post1 80
    # at tp ≥ 4), else 160 (from 0.4.5.post3 unset above 25,000: the capture list's own top, 160)
    graph_bs = 160
    if mem < 25_000 and v >= (0, 3, 5, 2):
        graph_bs = 4 if v < (0, 4, 0) else 8 if v < (0, 4, 0, 1) or tp < 4 else 80
    # mem_fraction_static: by tp (from 0.4.6.post2 tp·pp) — 0.79 at 16, at 8 0.83 (0.82 from 0.3.6, 0.81 from
    # 0.4.0), 0.85 at 4, 0.87 at 2, else 0.88; 0.4.5.post3 … 0.4.6.post1 above 81,920 MiB (gpu − 13 GiB) / gpu;
    # from 0.4.6.post2 0.88 there, then above 96 GiB min(f + 48 GiB·(1 − f)/gpu, (gpu − 18 GiB)/gpu) (20 GiB with
    # speculative decoding, 0.4.7), 0.4.7 0.79 above 180,000 MiB and × 0.95 with speculative decoding below 96 GiB
    par = tp * pp if v >= (0, 4, 6, 2) else tp
    at8 = 0.83 if v < (0, 3, 6) else 0.82 if v < (0, 4, 0) else 0.81
    frac = 0.79 if par >= 16 else at8 if par >= 8 else 0.85 if par >= 4 else 0.87 if par >= 2 else 0.88
    if v >= (0, 4, 5, 3) and mem > 81920:
        frac = (mem - 13 * gib) / mem if v < (0, 4, 6, 2) else 0.88
    if v >= (0, 4, 7) and mem > 180 * 1000:
        frac = 0.79
    elif v >= (0, 4, 6, 2) and mem > 96 * gib:
        reserve = 20 * gib if speculative and v >= (0, 4, 7) else 18 * gib
        frac = min(frac + 48 * gib * (1 - frac) / mem, (mem - reserve) / mem)
    elif v >= (0, 4, 7) and speculative:
        frac *= 0.95
    return chunk, graph_bs, frac


def sglang_server_defaults(version: str, gpu_mem_mib: float, tp: int, pp: int = 1, *, mla: bool = False,
                           architectures: tuple[str, ...] = (), model_path: str = "",
                           chunked_prefill_size: int = 0, cuda_graph_max_bs: int = 0,
                           disable_cuda_graph: bool = False, prefill_cuda_graph: str = "auto",
                           max_running_requests: int = 0, max_total_tokens: int = 0, context_length: int = 0,
                           multimodal: bool = False, dp_attention: bool = False, dp_size: int = 1, dsa: bool = False,
                           max_prefill_tokens: int = SGLANG_MAX_PREFILL_TOKENS) -> SGLangDefaults:
    """SGLang's ``chunked_prefill_size``, decode ``cuda_graph_max_bs`` and default ``mem_fraction_static`` for a
    device whose total is ``gpu_mem_mib`` (``get_device_memory_capacity``: nvidia-smi's ``memory.total``,
    :data:`timeline.spec.hardware.NVIDIA_SMI_TOTAL_MIB`), on CUDA, without speculative decoding, PD
    disaggregation or DeepEP (0 / "" arguments: not given); DP attention (``dp_attention`` over ``dp_size``
    workers) as each release reserves for it. ``mem_fraction_static = round((gpu_mem − reserved) /
    gpu_mem, 3)`` with, in MiB:

    * 0.3.0 … 0.4.7 (``server_args.py`` ``ServerArgs.__post_init__`` in each sdist): a table by tp (:func:`_sglang_table`,
      ``reserved_mib`` what it leaves of the device);
    * 0.4.7.post1 … 0.4.x (``ServerArgs.__post_init__``, 0.4.9.post2): (2.8 + tp·pp/10) GiB below 35 GiB,
      (9.5 + tp·pp/2) GiB below 90, (12 + tp·pp/2) GiB below 160, else 32 GiB;
    * 0.5.x (``ServerArgs._handle_gpu_memory_settings``; from 0.5.19 ``arg_groups/memory_hook.py``
      ``handle_gpu_memory_settings``): 512 + 1.5 per token of ``max(chunked_prefill_size, 2048)`` + tp·pp/8 GiB
      + 2 per decode batch + the prefill CUDA graphs' reserve, at least 10 GiB on a device above 60 GiB, each
      term as the release reads it (:func:`timeline.spec.sglang_rules.explain_mem_fraction_static`: the GPU
      bands of ``chunked_prefill_size`` and ``cuda_graph_max_bs``, when prefill graphs are captured and how many
      sizes); 0.5.0 … 0.5.4 run 0.5.5's rules, a release after 0.5.23 0.5.23's."""
    gib = 1024
    v = parse_version(version) or (0, 4, 0)
    release = sglang_release(version)
    if version not in SGLANG_VERSIONS and release is not None and release < SGLANG_RESERVE_RULE:
        chunk, graph_bs, frac = _sglang_table(release, gpu_mem_mib, tp, pp, False)
        chunk = chunked_prefill_size or chunk
        graph_bs = cuda_graph_max_bs or graph_bs
        return SGLangDefaults(chunk, graph_bs, False, 0, gpu_mem_mib * (1 - frac), frac)
    if v < (0, 5, 0):
        # 0.4.9.post2 ServerArgs.__post_init__: chunked_prefill_size 2,048 below 35 GiB, 8,192 below 160, else 16,384;
        # cuda_graph_max_bs 8 / 80 below 35 GiB (tp < 4 / tp ≥ 4), else unset (160)
        chunk = chunked_prefill_size or (2048 if gpu_mem_mib < 35 * gib else 8192 if gpu_mem_mib < 160 * gib
                                         else 16384)
        graph_bs = cuda_graph_max_bs or ((8 if tp < 4 else 80) if gpu_mem_mib < 35 * gib else 160)
        par = tp * pp
        if gpu_mem_mib < 35 * gib:
            reserved = (2.8 + par / 10) * gib
        elif gpu_mem_mib < 90 * gib:
            reserved = (9.5 + par / 2) * gib
        elif gpu_mem_mib < 160 * gib:
            reserved = (12 + par / 2) * gib
        else:
            reserved = 32 * gib
        return SGLangDefaults(chunk, graph_bs, False, 0, reserved, round((gpu_mem_mib - reserved) / gpu_mem_mib, 3))
    info = explain_mem_fraction_static(
        max(v, (0, 5, 5)), gpu_mem_mib=gpu_mem_mib, tp=tp, pp=pp, mla=mla, architectures=list(architectures),
        model_path=model_path, chunked_prefill_size=chunked_prefill_size or None,
        cuda_graph_max_bs=cuda_graph_max_bs or None, disable_cuda_graph=disable_cuda_graph,
        max_running_requests=max_running_requests or None, max_total_tokens=max_total_tokens or None,
        context_length=context_length or None, multimodal=multimodal,
        enable_piecewise_cuda_graph=prefill_cuda_graph == "on", disable_prefill_cuda_graph=prefill_cuda_graph == "off",
        dsa=dsa, max_prefill_tokens=max_prefill_tokens, dp_attention=dp_attention, dp_size=dp_size)
    return SGLangDefaults(int(info["chunked_prefill_size"]), int(info["decode_max_bs"]),
                          info["prefill_backend"] != "disabled",
                          int(info["prefill_num_sizes"]) if info["prefill_backend"] != "disabled" else 0,
                          float(info["reserved_mem"]), float(info["mem_fraction_static"]))


def sglang_max_running_requests(version: str, profiled_tokens: int, capacity: int, context_len: int,
                                given: int) -> tuple[int, int]:
    """SGLang's ``max_running_requests`` (the scheduler's) and its ``ReqToTokenPool``'s rows (int32
    ``[rows, context_len + 4]``), per DP worker; ``given`` is ``--max-running-requests`` (over the DP workers
    already), 0 when not given; ``capacity`` the final (capped, page-aligned) pool tokens:

    * up to 0.5.9 (``model_runner.py`` ``init_memory_pool``, 0.4.x … 0.5.9): the pool's requests ``given``, else
      ``min(max(int(profiled / context_len · 512), 2048), 4096)`` from the profiled tokens, before the cap —
      ``max_num_reqs + 1`` rows up to 0.4.6, ``max_num_reqs`` from 0.4.7; the scheduler's (``tp_worker.py``
      ``TpModelWorker.__init__``) ``min(given or capacity // 2, rows)``;
    * from 0.5.10 (``model_runner_kv_cache_mixin.py`` ``_resolve_max_num_reqs``; ``kv_cache_configurator.py`` from
      0.5.16): ``estimated = max(min(int(capacity / context_len · 512), 4096), 2048)``; ``min(given, estimated)``
      (from 0.5.14 ``min(given, capacity // 2)``), else ``min(estimated, capacity // 2)``; the rows are those
      requests, one more from 0.5.12 (``ReqToTokenPool._alloc_size``)."""
    v = parse_version(version or SGLANG_DEFAULT) or (0, 4, 0)
    release = sglang_release(version or SGLANG_DEFAULT) or (0, 4, 0, 0)
    if v < (0, 5, 10):
        # 0.3.0 caps the requests at 5,120; 0.3.0 … 0.3.1.post1 make max_num_reqs rows, later releases one more
        # (to 0.4.6), read in each sdist's init_memory_pool
        cap = 5120 if release < (0, 3, 1) else 4096
        pool = given or min(max(int(profiled_tokens / context_len * 512), 2048), cap)
        rows = pool + (1 if (0, 3, 1, 2) <= release < (0, 4, 7) else 0)
        return min(given or capacity // 2, rows), rows
    estimated = max(min(int(capacity / context_len * 512), 4096), 2048)
    if given:
        reqs = min(given, estimated if v < (0, 5, 14) else capacity // 2)
    else:
        reqs = min(estimated, capacity // 2)
    return reqs, reqs + (1 if v >= (0, 5, 12) else 0)


def sglang_req_to_token_width(version: str) -> int:
    """Columns of SGLang's int32 ``ReqToTokenPool`` beyond the context length: 8 up to 0.3.1.post1, 4 from
    0.3.1.post2 (``init_memory_pool``'s ``context_len + 8`` / ``+ 4``, read in each sdist)."""
    release = sglang_release(version or SGLANG_DEFAULT)
    return 8 if release is not None and release < (0, 3, 1, 2) else 4


#: the first vLLM release read whose tensor-parallel all-reduce returns a new tensor
VLLM_OUT_OF_PLACE_ALL_REDUCE = (0, 6, 5)


def vllm_all_reduce_out_of_place(version: str) -> bool:
    """vLLM ``version``'s TP all-reduce allocates its output: ``GroupCoordinator.all_reduce`` →
    ``_all_reduce_out_place`` (pynccl ``PyNcclCommunicator.all_reduce``: ``torch.empty_like``; custom
    all-reduce likewise) in ``vllm/distributed/parallel_state.py`` at 0.6.5, 0.6.6.post1, 0.7.2, 0.7.3 and
    0.8.5 (V1 as the ``vllm::all_reduce`` op). Up to 0.6.4.post1 (read at 0.4.1, 0.5.4, 0.6.4.post1) a
    tensor above the custom all-reduce's 8 MiB is reduced in place by NCCL."""
    v = parse_version(version or VLLM_DEFAULT)
    return v is None or v >= VLLM_OUT_OF_PLACE_ALL_REDUCE


#: vLLM's encoder budget over the versions: (first version, what an item counts, how items are counted)
VLLM_ENCODER_BUDGET_RULES = ((0, 13, 0), (0, 10, 1), (0, 10, 0))


def vllm_encoder_budget_rule(version: str) -> tuple[str, str]:
    """(what vLLM ``version`` counts of the largest multimodal item, how its profile counts dummy items) —
    ``"embeds"`` its embeddings (``PlaceholderRange.get_num_embeds``: the ``is_embed`` positions) or
    ``"placeholder"`` the placeholder's whole length, text between the embeddings included; ``"cdiv"``
    ``min(cdiv(budget, item), max_num_seqs · limit)``, ``"floor"`` ``max(1, min(budget // item, max_num_seqs ·
    limit))``, ``"per_prompt"`` ``max(1, min(budget // item, max_num_seqs · max(1, min(limit, max_model_len //
    item))))``. Read at: 0.8.5 and 0.9.2 (``gpu_model_runner.py`` ``profile_run``: cdiv, ``profiling.py``
    ``_get_mm_num_tokens``: embeds); 0.10.0 (floor, embeds); 0.10.1.1, 0.10.2, 0.11.0, 0.12.0 (``worker/utils.py``
    ``MultiModalBudget._get_max_items``: per prompt; ``registry.py`` → ``get_mm_max_contiguous_tokens``:
    placeholder, pull request #21798); 0.13.0 and 0.19.0 (per prompt, embeds again: ``profiling.py`` /
    ``encoder_budget.py`` ``get_mm_max_toks_per_item``)."""
    v = parse_version(version or VLLM_DEFAULT) or (99, 0, 0)
    if v >= VLLM_ENCODER_BUDGET_RULES[0]:
        return "embeds", "per_prompt"
    if v >= VLLM_ENCODER_BUDGET_RULES[1]:
        return "placeholder", "per_prompt"
    return "embeds", "floor" if v >= VLLM_ENCODER_BUDGET_RULES[2] else "cdiv"


#: the first vLLM whose V1 engine keeps sliding-window layers in KV cache groups of their own
VLLM_HYBRID_KV_MANAGER = (0, 9, 1)

#: the first vLLM that prints its KV cache size as the maximum concurrency times max_model_len
VLLM_KV_TOKENS_FROM_CONCURRENCY = (0, 20, 1)
_PRE_RELEASE_RE = re.compile(r"^\d+\.\d+(?:\.\d+)?(?:rc|a|b|\.dev)\d")


def release_at_least(version: str, first: tuple[int, int, int]) -> bool:
    """Whether ``version`` is ``first`` or later, a pre-release of ``first`` (``0.20.1rc1.dev16``) counting as before
    it: a build off the main branch between two releases carries the later release's number."""
    v = parse_version(version)
    if v is None:
        return False
    return v > first or (v == first and not _PRE_RELEASE_RE.match(version))


#: the first vLLM release whose command line has ``--kv-cache-memory-bytes`` (the option tables of
#: ``timeline/io/serve_options.json``: absent at 0.10.1.1, present from 0.10.2)
VLLM_KV_CACHE_MEMORY_BYTES = (0, 10, 2)
#: the first vLLM release whose quantized layouts after loading are 0.19.0's (fp4 scalars and CUTLASS padding,
#: AWQ on Machete, NVFP4 from sm 75): read at 0.11.0 and 0.19.0; 0.18.0's AWQ-Marlin has no kernel chooser yet
VLLM_FP4_019 = (0, 19, 0)
#: ModelOpt's fp8 kv_cache_quant_algo makes --kv-cache-dtype auto fp8_e4m3 (utils/torch_utils.py
#: resolve_kv_cache_dtype_string, called by EngineArgs.create_engine_config): in 0.14.0, not in 0.13.0
VLLM_MODELOPT_KV_FP8 = (0, 14, 0)
#: the first vLLM that subtracts its CUDA-graph memory estimate from the KV budget by default
VLLM_CUDAGRAPH_ESTIMATE = (0, 20, 0)


def vllm_subtracts_cudagraph_estimate(version: str) -> bool:
    """Whether vLLM ``version`` subtracts its CUDA-graph memory estimate from the KV cache budget by default
    (``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``: ``cudagraph_memory_estimate_applied`` when
    ``envs.VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``, whose default is "0" at 0.19.0 and 0.19.1 and "1" at 0.20.0,
    0.20.1, 0.20.2, 0.24.0, 0.29.0 and 0.34.0; ``gpu_model_runner.py`` ``profile_cudagraph_memory`` logs it as
    "Estimated CUDA graph memory: X GiB total"). The estimate is measured on the device (``torch.cuda.mem_get_info``
    around the two largest captures of each mode, the rest extrapolated per graph), mostly the driver's memory for
    each captured graph's kernel nodes: this project does not model it (``serving.cuda_graph_estimate_gib`` takes
    the logged value)."""
    return bool(version) and release_at_least(version, VLLM_CUDAGRAPH_ESTIMATE)


def vllm_kv_tokens_from_concurrency(version: str) -> bool:
    """How vLLM ``version`` prints "GPU KV cache size: N tokens" (``vllm/v1/core/kv_cache_utils.py``
    ``_report_kv_cache_config``): up to 0.20.0 ``num_blocks // len(kv_cache_groups) · min_block_size`` (read at
    0.19.0, 0.19.1, 0.20.0); from 0.20.1 ``int(max_concurrency · max_model_len)`` with ``max_concurrency =
    num_blocks / blocks_per_request`` (``get_max_concurrency_for_kv_cache_config``; read at 0.20.1, 0.20.2), which
    counts a sliding window's or a recurrent state's few blocks per request instead of a whole context's. The
    default (no version) is the older rule, this project's default rule set."""
    return bool(version) and release_at_least(version, VLLM_KV_TOKENS_FROM_CONCURRENCY)


def vllm_hybrid_kv_manager(version: str, v1: bool | None = None) -> bool:
    """Whether vLLM ``version`` runs the hybrid KV cache manager (sliding-window layers in groups of their own, each
    freeing what leaves its window): V1 from 0.9.1 (``vllm/v1/core/kv_cache_utils.py``
    ``_get_kv_cache_config_uniform_page_size``, on unless ``disable_hybrid_kv_cache_manager``: read at 0.9.1, 0.9.2,
    0.19.0). Before — 0.9.0 and 0.8.5's ``get_kv_cache_config`` call ``unify_hybrid_kv_cache_specs``, which makes every
    ``SlidingWindowSpec`` a ``FullAttentionSpec`` — and on V0 every layer holds the whole context. ``v1``: the
    job's engine where known (:func:`vllm_runs_v1`), else the version's."""
    v = parse_version(version or VLLM_DEFAULT)
    return v is None or ((is_v1(version) if v1 is None else v1) and v >= VLLM_HYBRID_KV_MANAGER)


def is_v1(version: str) -> bool:
    """vLLM's V1 engine (the default from 0.8.0; the default rule set is V1) — by the version alone; a run's own
    engine, the oracle's fallback and ``serving.engine_v1`` included, is :func:`vllm_runs_v1`."""
    v = parse_version(version or VLLM_DEFAULT)
    return v is None or v >= VLLM_V1_DEFAULT


#: the first vLLM without a V0 engine: its sdist has no ``vllm/worker/worker.py`` (0.10.2's still has the V0
#: ``Worker``); the oracle's answer no longer picks an engine
VLLM_V0_REMOVED = (0, 11, 0)
#: ``serving.engine_v1``: ``VLLM_USE_V1`` unset (auto: the oracle decides), 1 (on) or 0 (off)
ENGINE_V1 = ("auto", "on", "off")


def vllm_v1_fallback(version: str, *, sm: int, kv_cache_dtype: str = "auto", dtype: str = "bf16", pp: int = 1,
                     speculative: str = "", mla: bool = False, quant_method: str = "") -> tuple[str, bool]:
    """``(feature, experimental)``: the first feature of a job for which vLLM ``version``'s engine picks V0
    although V1 is its default (``("", False)`` where it runs V1, and below 0.8.0 or from 0.11.0, where the
    version alone decides). ``EngineArgs.create_engine_config`` asks ``_is_v1_supported_oracle`` unless
    ``VLLM_USE_V1`` is set (``vllm/engine/arg_utils.py``, read in every release's sdist from 0.8.0 to 0.10.2);
    a feature it rejects logs "F is not supported by the V1 Engine. Falling back to V0." (``_raise_or_fallback``:
    under ``VLLM_USE_V1=1`` it raises ``NotImplementedError`` instead), an *experimental* one "F is experimental
    on VLLM_USE_V1=1. Falling back to V0 Engine." (``_warn_or_fallback``: ``VLLM_USE_V1=1`` runs V1). The checks
    a run expresses, in the oracle's order:

    - ``Compute Capability < 8.0`` (``current_platform.get_device_capability().major < 8``): 0.8.0 … 0.10.1
      (0.10.2 has no such check);
    - ``--kv-cache-dtype`` other than auto: always at 0.8.0 and 0.8.1; from 0.8.2 to 0.9.2 unless fp8 on
      FlashAttention 3 (``fa_utils.py`` ``flash_attn_supports_fp8``: FA version 3 and compute capability 9.x);
      0.10.0 and 0.10.1 ``CudaPlatformBase.is_kv_cache_dtype_supported`` also on compute capability 10.0; 0.10.2
      an MLA model's default FlashMLA / CUTLASS MLA takes any, another on 10.0 any, else FlashAttention fp8
      on 3 and a 16-bit dtype (no ``VLLM_ATTENTION_BACKEND`` set: the default backend);
    - ``--dtype torch.float32`` (``V1_SUPPORTED_DTYPES`` bf16 / fp16): 0.8.0 … 0.9.1;
    - ``--quantization bitsandbytes`` (``V1_UNSUPPORTED_QUANT``): 0.8.0 … 0.8.2;
    - speculative decoding by multi-token prediction: 0.8.x accepts only ngram (and from 0.8.4 EAGLE),
      ``deepseek_mtp`` from 0.9.0;
    - pipeline parallelism: experimental ("PP") at 0.8.0 … 0.8.2; "Pipeline Parallelism without Ray distributed
      executor" at 0.8.3 … 0.8.5, "… or multiprocessing executor or external launcher" at 0.9.0 (the default
      ``distributed_executor_backend`` is None, which neither list holds; from 0.9.1 the default passes).

    Not expressed (the job's other arguments): guided decoding backends, LoRA at 0.8.0 … 0.8.2, prompt adapters,
    CPU offloading at 0.8.0 … 0.8.2, ``VLLM_ATTENTION_BACKEND``, architectures marked V0-only (Mamba,
    encoder-decoder)."""
    v = parse_version(version or VLLM_DEFAULT)
    if v is None or not VLLM_V1_DEFAULT <= v < VLLM_V0_REMOVED:
        return "", False
    if sm < 80 and v < (0, 10, 2):
        return "Compute Capability < 8.0", False
    if kv_cache_dtype != "auto":
        fp8 = kv_cache_dtype.startswith("fp8")
        if v < (0, 8, 2):
            ok = False
        elif v < (0, 10, 0):
            ok = fp8 and sm // 10 == 9
        elif v < (0, 10, 2):
            ok = sm == 100 or (fp8 and sm // 10 == 9)
        else:
            ok = mla or sm == 100 or (sm // 10 == 9 if fp8 else True)
        if not ok:
            return "--kv-cache-dtype", False
    if dtype == "fp32" and v < (0, 9, 2):
        return "--dtype torch.float32", False
    if quant_method == "bitsandbytes" and v < (0, 8, 3):
        return "--quantization bitsandbytes", False
    if speculative and v < (0, 9, 0):
        return "Speculative Decoding", False
    if pp > 1 and v < (0, 8, 3):
        return "PP", True
    if pp > 1 and v < (0, 8, 6):
        return "Pipeline Parallelism without Ray distributed executor", False
    if pp > 1 and v < (0, 9, 1):
        return ("Pipeline Parallelism without Ray distributed executor or multiprocessing executor or external "
                "launcher"), False
    return "", False


def vllm_runs_v1(version: str, engine_v1: str = "auto", **features: object) -> bool:
    """Whether a vLLM job runs the V1 engine: ``engine_v1`` (``VLLM_USE_V1``) where set, else the version's default
    (:func:`is_v1`) unless the oracle falls back (:func:`vllm_v1_fallback`, ``features`` its keywords)."""
    if engine_v1 in ("on", "off"):
        return engine_v1 == "on"
    return is_v1(version) and not vllm_v1_fallback(version, **features)[0]  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerDefaults:
    max_num_batched_tokens: int
    max_num_seqs: int
    enable_chunked_prefill: bool


#: the first vLLM whose CUDA-graph capture list steps by 16 from 256 and is capped by ``max_cudagraph_capture_size``
#: (``vllm/config/vllm.py`` ``VllmConfig._set_cudagraph_sizes`` at 0.12.0; 0.11.0's ``config/__init__.py`` steps by 8)
VLLM_CAPTURE_STEP16 = (0, 12, 0)
#: the first vLLM read whose default capture cap counts the speculative tokens a decode step verifies (0.14.0, 0.17.0,
#: 0.19.0 ``decode_query_len``; absent at 0.12.0)
VLLM_CAPTURE_SPEC = (0, 14, 0)


def vllm_capture_sizes(version: str, max_num_seqs: int, max_num_batched_tokens: int, given: tuple[int, ...] = (),
                       max_size: int = 0, spec_tokens: int = 0) -> tuple[int, ...]:
    """The batch sizes vLLM ``version`` captures CUDA graphs at, ascending (``VllmConfig._set_cudagraph_sizes``):

    - from 0.12.0: ``given`` (``--cudagraph-capture-sizes``, ``--cuda-graph-sizes``, the compilation config's
      ``cudagraph_capture_sizes``) as listed, else 1, 2, 4, multiples of 8 below 256 and of 16 from 256 up to
      ``max_size`` (``--max-cudagraph-capture-size``; default ``min(max_num_seqs · decode_query_len · 2, 512)``,
      ``decode_query_len`` = 1 + the speculative tokens from 0.14.0);
    - before (read at 0.10.1.1 and 0.11.0): ``given`` (``--cuda-graph-sizes``, default
      ``[min(max_num_seqs · 2, 512)]``, ``SchedulerConfig.__post_init__``) of one value N is 1, 2, 4 and the
      multiples of 8 up to N, of several values the list itself;

    never above ``max_num_batched_tokens``."""
    v = parse_version(version or VLLM_DEFAULT) or (0, 11, 0)
    if v >= VLLM_CAPTURE_STEP16:
        if given:
            sizes = set(given)
        else:
            query = 1 + (spec_tokens if v >= VLLM_CAPTURE_SPEC else 0)
            top = min(max_num_batched_tokens, max_size or min(max_num_seqs * query * 2, 512))
            sizes = {s for s in (1, 2, 4) if s <= top} | set(range(8, min(top + 1, 256), 8)) | set(
                range(256, top + 1, 16))
    else:
        listed = given or (min(max_num_seqs * 2, 512),)
        sizes = {1, 2, 4, *range(8, listed[0] + 1, 8)} if len(listed) == 1 else set(listed)
    return tuple(sorted(s for s in sizes if s <= max_num_batched_tokens))


#: the first V1 release that keeps a user's ``--no-enable-chunked-prefill`` for a generative model (engine/arg_utils.py
#: ``_set_default_args``: ``if self.enable_chunked_prefill is None`` at 0.11.1; 0.11.0 and before set it True)
VLLM_V1_CHUNKED_OPTIONAL = (0, 11, 1)


#: the usage contexts whose V1 scheduler defaults are read (``vllm/usage/usage_lib.py`` ``UsageContext``)
USAGE_CONTEXTS = ("openai_api_server", "llm_class", "engine_context")


def vllm_scheduler_defaults(version: str, max_model_len: int, device_gib: float, device_name: str,
                            chunked: bool | None = None, usage: str = "openai_api_server",
                            v1: bool | None = None, *, mla: bool = False, multimodal: bool = False,
                            sliding: bool = False, speculative: bool = False) -> SchedulerDefaults:
    """The ``max_num_batched_tokens`` / ``max_num_seqs`` the engine takes when the user gives neither
    (module docstring: V0 ``SchedulerConfig.__post_init__``, V1 ``_set_default_args_v1``);
    ``chunked`` is the user's ``enable_chunked_prefill`` (None: the engine's default); ``usage``: the OpenAI
    server's or the offline ``LLM`` class's defaults. V1's token budget of the ``LLM`` class is 16,384 on a
    large device and 8,192 elsewhere (``default_max_num_batched_tokens[UsageContext.LLM_CLASS]`` of
    ``engine/arg_utils.py`` at 0.8.5, 0.9.2, 0.11.0 and 0.19.0; its ``max_num_seqs`` the server's). An engine built
    from ``EngineArgs`` / ``AsyncEngineArgs`` elsewhere (``UsageContext.ENGINE_CONTEXT``, in neither table) keeps
    ``SchedulerConfig``'s own: 128 sequences and 2,048 tokens (``__post_init__`` at 0.8.5, 0.9.2, 0.10.1.1, 0.11.0;
    ``DEFAULT_MAX_NUM_SEQS`` / ``DEFAULT_MAX_NUM_BATCHED_TOKENS`` at 0.19.0). V0 has one default for all (a 0.8 …
    0.10 job the oracle sends to V0 too: ``_set_default_args_v0``, read at 0.8.2 and 0.10.1, keeps
    ``SchedulerConfig``'s, as before 0.8); ``v1``: the job's engine where known (:func:`vllm_runs_v1`)."""
    if not (is_v1(version) if v1 is None else v1):
        v0 = parse_version(version) or (0, 7, 0)
        if chunked is None:  # the OpenAI server's use_long_context (read at 0.5.4; absent at 0.4.1)
            chunked = max_model_len > 32768 and v0 >= (0, 5, 4)
            # ... but not for a multimodal model, one that slides or a speculative job (create_engine_config at 0.7.3,
            # _set_default_args_v0 at 0.8.0 … 0.10.2), nor for MLA from 0.8.0 ("Chunked prefill not supported for
            # Multimodal or MLA in V0")
            if v0 >= (0, 7, 3) and (multimodal or sliding or speculative) or v0 >= (0, 8, 0) and mla:
                chunked = False
        if chunked:
            chunk = 2048 if (parse_version(version) or (0, 7, 0)) >= (0, 6, 6) else 512
            return SchedulerDefaults(max_num_batched_tokens=chunk, max_num_seqs=256, enable_chunked_prefill=True)
        return SchedulerDefaults(max_num_batched_tokens=max(max_model_len, 2048), max_num_seqs=256,
                                 enable_chunked_prefill=False)
    v = parse_version(version or VLLM_DEFAULT) or (0, 11, 0)
    large = device_gib >= 70 and (v < (0, 9, 0) or "a100" not in device_name.lower())
    seqs = 1024 if large and v >= (0, 9, 0) else 256
    tokens = (16384 if large else 8192) if usage == "llm_class" else (8192 if large else 2048)
    if usage == "engine_context":
        seqs, tokens = 128, 2048
    if chunked is False and v >= VLLM_V1_CHUNKED_OPTIONAL:
        # the user's --no-enable-chunked-prefill: a whole prompt in one step, so the budget covers max_model_len —
        # engine/arg_utils.py _set_default_max_num_seqs_and_batched_tokens_args ``max(max_model_len, the default)``
        # (0.11.1, 0.11.2, 0.12.0); before, _set_default_args(_v1) sets enable_chunked_prefill = True for every
        # generative model whatever the user gave (0.9.2, 0.10.1.1, 0.11.0), so the flag changes nothing there
        return SchedulerDefaults(max_num_batched_tokens=max(max_model_len, tokens), max_num_seqs=seqs,
                                 enable_chunked_prefill=False)
    return SchedulerDefaults(max_num_batched_tokens=tokens, max_num_seqs=seqs, enable_chunked_prefill=True)
