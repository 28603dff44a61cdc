"""The device memory an engine's budget counts outside PyTorch's allocator, built from its parts.

Three parts, each a published measurement (nothing in an engine's source fixes their size) or a rule
that carries one measurement to another GPU:

* **context** — the CUDA primary context and the runtime, in use before any kernel runs
  (:func:`context_bytes`). Measured on an H100 and an RTX 3090; another GPU takes the H100's figure
  with its local-memory reservation swapped for its own: the driver reserves each resident thread's
  stack (``CU_LIMIT_STACK_SIZE``, 1 KiB by default, CUDA driver API ``cuCtxSetLimit``) for the most
  threads every SM can hold (CUDA C++ Programming Guide, "Technical Specifications per Compute
  Capability": 2,048 on sm 70/80/90/100, 1,536 on sm 86/89/120, 1,024 on sm 75). Checked on the
  3090: 0.51 − 132·2,048 KiB + 82·1,536 KiB = 0.372 GiB against its measured 0.35. Checked on a real
  H200 (``traces/groundtruth-h200/context_probe.json``, driver 580.159.04): every 512 B of stack limit
  moves the context by exactly 132 SMs × 2,048 threads × 512 B; the bare primary context is
  552,402,944 B = 0.5145 GiB whether the CUDA runtime 11.8, 12.4, 12.9 or 13.0 makes it, and PyTorch
  2.11 adds nothing until its first kernel — the H100 log's 0.51 to its two decimals, which the rule
  gives the H200 (same GH100 SMs). The 619 MiB "after the context" of ``non_torch.json`` is after a
  first kernel, whose module CUDA loads lazily (+92 MiB; ``CUDA_MODULE_LOADING=EAGER`` loads every module: +732 MiB):
  loading, part of the run below, not of the context. That the driver version moves the context is
  not shown (one driver measured) and not modelled.
* **distributed** — what ``init_worker_distributed_environment`` puts on the device: NCCL
  communicators (their connection buffers, NVLS on NVSwitch systems) and the custom all-reduce
  buffers; nothing at world size 1 from vLLM 0.5 (no communicator is connected there; up to 0.4.1
  ``init_worker_distributed_environment`` ends with a warm-up ``torch.distributed.all_reduce``, which makes
  a one-rank NCCL communicator, not measured). Measured per interconnect
  (:data:`DIST`), by tensor-parallel size, and per communicator set: from vLLM 0.11.0 a TP group on
  sm 9.0 / 10.0 also makes a torch symmetric-memory all-reduce (``cuda_communicator.py``
  ``CudaCommunicator.__init__`` → ``SymmMemCommunicator``, ``VLLM_ALLREDUCE_USE_SYMM_MEM`` defaulting to
  1 in 0.11.0's ``envs.py``; absent in 0.9.2 and 0.10.1.1), so a measurement with it is not carried to
  a version without it (:func:`communicators`). SGLang's groups take vLLM's nearest measured set.
  Without peer access between the ranks (``serving.peer_access = false``: other nodes without GPUDirect
  RDMA, or P2P off) the custom all-reduce is off and NCCL connects through host memory — the SHM
  transport's FIFOs are host shared memory the GPU reads directly (NVIDIA/nccl ``src/transport/shm.cc``:
  ``NCCL_SHM_USE_CUDA_MEMCPY`` defaults to 0), the NET transport's buffers host memory without GPUDirect
  RDMA (``src/transport/net.cc``) — so the groups put none of the measured buffers on the device
  (the communicators' own small structures are not measured), and the run part is TP1's.
  ``serving.disable_custom_all_reduce`` takes the custom all-reduce's IPC buffers, which every measurement holds,
  back out (:func:`custom_all_reduce_bytes`, from vLLM's source; SGLang's port takes vLLM's sizes, not read).
  Not derived from NCCL's source: its buffers are per channel and connected peer (NVIDIA/nccl
  ``src/init.cc``: ``DEFAULT_BUFFSIZE`` 4 MiB for SIMPLE, ``DEFAULT_LL128_BUFFSIZE`` 120·640·8·8 B ≈ 4.69 MiB,
  ``DEFAULT_LL_BUFFSIZE`` 8·512·8·16 B = 512 KiB), but the channel count comes from NCCL's topology search,
  whether the buffers sit on the device depends on the transport (P2P in device memory, SHM in host
  memory), and the communicators' kernel images load with them; the measured total holds all of it.
* **run** — what loading and the profile run add outside PyTorch (kernel images loaded lazily,
  NCCL connections first made by a collective of the profile run). V0 adds none measurable (the RTX
  3090 0.6.4 log: 0.35 GiB before and after its profile run); V1 (torch.compile's Triton modules,
  the device groups' lazy connections) is measured on H100 (:data:`RUN_V1`, at 0.19). From 0.18 the
  window also holds the CUDA-graph memory profiling (:func:`timeline.spec.engine_versions.
  vllm_profiles_cudagraphs`), whose captures leave memory outside PyTorch after their cleanup: an
  earlier version, or ``enforce_eager``, adds the run part without it — measured at TP1
  (:data:`RUN_V1_NO_GRAPH_PROFILE`), elsewhere 0.19's measurement less the TP1 difference
  (:func:`run_bytes`). The H200 ground truth (``traces/groundtruth-h200/context_probe.json``) shows the
  kind of memory this is: PyTorch's first kernel loads its module lazily, 92 MiB.

Which parts a vLLM version subtracts is in its source (:func:`window`):

* ``total`` — 0.2.5 … 0.2.7 ``Worker.profile_num_available_blocks``: ``total − free`` after the
  profile run: context + distributed + run (and the caching allocator's reserved bytes, modelled apart).
* ``init`` — 0.3.3 … 0.6.3 ``Worker.determine_num_available_blocks``: ``init_free − free``, ``init_free``
  read in ``init_device`` once the context exists and before the distributed groups: distributed + run.
* ``absolute`` — 0.6.4.post1 V0 ``determine_num_available_blocks`` and V1 0.8.x
  ``gpu_worker.py`` ``Worker.determine_available_memory`` (read at 0.8.5): device memory in use after the
  profile run and ``empty_cache`` minus PyTorch's allocated bytes: context + distributed + run.
* ``baseline`` — 0.6.5 … 0.7.x V0 (``memory_profiling`` against ``init_device``'s baseline, read at 0.6.5,
  0.6.6.post1, 0.7.2, 0.7.3) and V1 0.9 … 0.10 (``init_snapshot`` taken before
  ``init_worker_distributed_environment``, read at 0.9.2 and 0.10.1.1): distributed + run.
* ``after_init`` — V1 from 0.11 (``init_snapshot`` taken after the distributed groups, read at 0.11.0,
  0.11.2 and 0.22.0; the 0.19 logs print it with ``cuda_memory`` growing with tp): run only.

SGLang sizes its pool from the free memory once its distributed groups exist, before the weights load
(``ModelRunner.init_torch_distributed``'s ``min_per_gpu_memory``): :func:`measured_init`, context +
distributed. ``serving.non_torch_gib`` and ``hardware.non_pytorch_gib`` override the two.
"""

from __future__ import annotations

from dataclasses import replace

from timeline.spec.engine_versions import VLLM_DEFAULT, parse_version, vllm_profiles_cudagraphs
from timeline.spec.hardware import preset_values
from timeline.spec.run import HardwareSpec
from timeline.spec.serving import ServeRunSpec

GIB = 1 << 30
MIB = 1 << 20
KIB = 1 << 10

#: GiB in use once the context exists and before any tensor, per GPU preset, and where it is printed
CONTEXT: dict[str, tuple[float, str]] = {
    "h100": (0.51, "llm-d-planner vLLM 0.19.0 TP1 logs (worker init memory snapshot, cuda_memory=0.51GiB)"),
    "rtx3090": (0.35, "vllm-project/vllm#10517 (0.6.4.post1: initial_memory_usage 15.34 GiB with 14.99 GiB of "
                      "weights, before the profile run)"),
}
#: the GPU whose context carries to GPUs without a measurement (module docstring)
CONTEXT_REFERENCE = "h100"
#: most resident threads per SM by compute capability (CUDA C++ Programming Guide, compute capabilities table)
THREADS_PER_SM: dict[int, int] = {70: 2048, 75: 1024, 80: 2048, 86: 1536, 89: 1536, 90: 2048, 100: 2048, 120: 1536}
#: the driver's default per-thread stack (``cuCtxGetLimit(CU_LIMIT_STACK_SIZE)`` before any change)
DEFAULT_STACK_BYTES = KIB

#: communicator set → (interconnect, tp, pp > 1) → (GiB the distributed groups put on the device, where measured)
DIST: dict[str, dict[tuple[str, int, bool], tuple[float, str]]] = {
    "nccl+symm_mem": {
        ("nvswitch", 2, False): (1.02, "llm-d-planner vLLM 0.19.0 H100 TP2 logs: init cuda_memory 1.53 − TP1's 0.51"),
        ("nvswitch", 4, False): (1.04, "llm-d-planner vLLM 0.19.0 H100 TP4 logs: init cuda_memory 1.55 − TP1's 0.51"),
        ("nvswitch", 1, True): (0.97, "llm-d-planner vLLM 0.19.0 H100 PP4 log: init cuda_memory 1.48 − TP1's 0.51"),
    },
    "nccl": {
        ("pcie", 2, False): (0.30, "vllm-project/vllm#15815 (0.7.3 V0, 2×L40S: non_torch_memory takes 0.30GiB, the "
                                   "distributed groups and V0's run, which adds none)"),
    },
}

#: (interconnect, tp, pp > 1) → (GiB a V1 engine's loading and profile run add, where it is measured)
RUN_V1: dict[tuple[str, int, bool], tuple[float, str]] = {
    ("nvswitch", 1, False): (0.25, "llm-d-planner 0.19.0 TP1 logs: Llama-3.1-8B, Qwen2.5-7B, CodeLlama-7b 0.24-0.25, "
                                   "Qwen3-30B-A3B 0.27, DeepSeek-V2-Lite 0.26"),
    ("nvswitch", 2, False): (2.07, "llm-d-planner 0.19.0 TP2 logs: Llama-3.1-8B, Mixtral-8x7B, gpt-oss-20b 2.07, "
                                   "Llama-3.3-70B FP8 2.10"),
    ("nvswitch", 4, False): (2.17, "llm-d-planner 0.19.0 TP4 logs: Llama-3.1-8B 2.13, Llama-3.3-70B FP8 2.21"),
    ("nvswitch", 1, True): (0.07, "llm-d-planner 0.19.0 Llama-3.1-8B PP4 log"),
}

#: (interconnect, tp, pp > 1) → (GiB the run adds where the window has no CUDA-graph profiling)
RUN_V1_NO_GRAPH_PROFILE: dict[tuple[str, int, bool], tuple[float, str]] = {
    ("nvswitch", 1, False): (0.13, "llm-d-planner version sweep, Qwen3-14B TP1 on H100 at vLLM 0.15.0 and 0.17.0 "
                                   "(non_torch_forward_memory 0.13 GiB each)"),
}

UNMEASURED = "not measured"


def link(run: ServeRunSpec) -> str:
    """How a run's ranks connect: "host" without peer access (module docstring), else the GPU's interconnect
    (``hardware.interconnect``)."""
    return run.hardware.interconnect if run.serving.peer_access else "host"


def window(engine: str, version: str, v1: bool | None = None) -> str:
    """Which parts vLLM ``version``'s budget subtracts (module docstring); "" for another engine. ``v1``: the job's
    engine where known (:attr:`timeline.spec.serving.ServeRunSpec.vllm_v1`): V0 from 0.8 to 0.10 keeps 0.6.5's
    ``baseline`` (``vllm/worker/worker.py`` ``Worker.init_device`` takes ``baseline_snapshot`` before
    ``init_worker_distributed_environment``, read at 0.8.0, 0.8.2, 0.8.5, 0.9.0, 0.9.2, 0.10.0, 0.10.1, 0.10.2)."""
    v = parse_version(version or "0.11")
    if engine != "vllm" or v is None:
        return ""
    if v1 is False and (0, 8, 0) <= v < (0, 11, 0):
        return "baseline"
    if v < (0, 3, 0):
        return "total"
    if v < (0, 6, 4):
        return "init"
    if v < (0, 6, 5) or (0, 8, 0) <= v < (0, 9, 0):
        return "absolute"
    return "baseline" if v < (0, 11, 0) else "after_init"


def context_bytes(hw: HardwareSpec) -> tuple[int, str]:
    """(bytes, source) of the CUDA context on ``hw`` (module docstring): a preset's measurement, else the
    reference's with ``hw``'s own local-memory reservation (``hardware.sms`` SMs of compute capability
    ``hardware.sm``) — a GPU no preset holds included."""
    if hw.gpu in CONTEXT:
        gib, source = CONTEXT[hw.gpu]
        return int(gib * GIB), source
    ref_gib, _ = CONTEXT[CONTEXT_REFERENCE]
    if not hw.sms or hw.sm not in THREADS_PER_SM:
        why = "no SM count" if not hw.sms else f"compute capability {hw.sm} not in the threads-per-SM table"
        return int(ref_gib * GIB), f"{UNMEASURED}: the H100's context ({why} for {hw.gpu!r})"
    ref = preset_values(CONTEXT_REFERENCE)
    lmem_ref = int(ref["sms"]) * THREADS_PER_SM[int(ref["sm"])] * DEFAULT_STACK_BYTES
    lmem = hw.sms * THREADS_PER_SM[hw.sm] * DEFAULT_STACK_BYTES
    return int(ref_gib * GIB) - lmem_ref + lmem, \
        f"the H100's context with {hw.gpu}'s local-memory reservation ({hw.sms} SMs)"


def _nearest_key(table: dict[tuple[str, int, bool], tuple[float, str]],
                 key: tuple[str, int, bool]) -> tuple[str, int, bool] | None:
    """``key`` where measured, else the measured key of the largest tp below it (same interconnect and pipeline
    kind); None where there is none."""
    near = [k for k in table if k[0] == key[0] and k[2] == key[2] and k[1] <= key[1]]
    return max(near, key=lambda k: k[1]) if near else None


def _nearest(table: dict[tuple[str, int, bool], tuple[float, str]], key: tuple[str, int, bool]) -> tuple[int, str]:
    """The entry of ``key``, else of the largest measured tp below it (same interconnect and pipeline kind)."""
    best = _nearest_key(table, key)
    if best is None:
        return 0, f"{UNMEASURED} ({key[0]}, tp={key[1]}{', pp' if key[2] else ''}): 0"
    gib, source = table[best]
    return int(gib * GIB), source if best == key else f"{source} (measured at tp={best[1]})"


def communicators(run: ServeRunSpec) -> str:
    """The communicator set a vLLM run's TP groups make (module docstring); "" for SGLang (any set)."""
    sv = run.serving
    if sv.engine != "vllm":
        return ""
    v = parse_version(sv.engine_version or VLLM_DEFAULT) or (0, 11, 0)
    return "nccl+symm_mem" if v >= (0, 11, 0) and run.hardware.sm in (90, 100) and run.parallel.tp > 1 else "nccl"


def dist_bytes(run: ServeRunSpec) -> tuple[int, str]:
    """(bytes, source) the distributed groups put on one device (module docstring); with
    ``serving.disable_custom_all_reduce`` less what the custom all-reduce would have held
    (:func:`custom_all_reduce_bytes`)."""
    par, sv = run.parallel, run.serving
    if par.tp * par.pp == 1:
        v = parse_version(sv.engine_version or VLLM_DEFAULT) or (0, 11, 0)
        if sv.engine == "vllm" and v < (0, 5, 0):  # worker.py init_worker_distributed_environment, 0.2.7 … 0.4.1
            return 0, f"the warm-up all_reduce's one-rank NCCL communicator is {UNMEASURED}: 0"
        return 0, "world size 1: no communicator"
    if link(run) == "host":
        return 0, ("no peer access: NCCL's SHM/NET transports keep their buffers in host memory and the custom "
                   "all-reduce is off (module docstring)")
    key = (run.hardware.interconnect, par.tp, par.pp > 1)
    sets = [communicators(run)] if communicators(run) else list(DIST)
    found = [(_nearest(DIST[name], key), _nearest_key(DIST[name], key)) for name in sets]
    measured = [f for f in found if UNMEASURED not in f[0][1]]
    (nbytes, source), at = measured[0] if measured else found[0]
    if sv.disable_custom_all_reduce and at is not None and custom_all_reduce_bytes(run):
        # the measurement's own custom all-reduce: that of the tp it was taken at (the nearest carried)
        custom = custom_all_reduce_bytes(replace(run, parallel=replace(par, tp=at[1])))
        return max(nbytes - custom, 0), f"{source}, less the custom all-reduce's {custom / MIB:.0f} MiB (disabled)"
    return nbytes, source


#: the custom all-reduce's largest message and the size of its per-rank signal block: vLLM 0.19.0
#: ``device_communicators/custom_all_reduce.py`` ``CustomAllreduce.__init__`` (``max_size=8192 * 1024``) and
#: ``csrc/custom_all_reduce.cuh`` ``struct Signal`` (``start`` and ``end`` of 36 × 8 uint32 and ``_flag`` of 36, each
#: aligned to 128 bytes: 1,152 + 1,152 + 256), ``ops.meta_size()``
CUSTOM_AR_MAX, CUSTOM_AR_SIGNAL = 8 << 20, 2560
#: ``all_reduce_utils.py`` ``CUSTOM_ALL_REDUCE_MAX_SIZES`` (0.19.0): the smaller message bound where the symmetric-
#: memory all-reduce takes the rest (``symm_mem_enabled``, from 0.11.0 on sm 9.0 / 10.0)
CUSTOM_AR_SYMM_MAX = {90: {2: 64 << 20, 4: 32 << 20, 6: 512 << 10, 8: 256 << 10},
                      100: {2: 2 << 20, 4: 2 << 20, 6: 1 << 20, 8: 1 << 20}}
#: device allocations (``cudaMalloc``) take whole 2 MiB pages
PAGE = 2 << 20


def custom_all_reduce_bytes(run: ServeRunSpec) -> int:
    """What the custom all-reduce puts on each tensor-parallel rank outside PyTorch (0 where it is off): two
    ``cudaMalloc``'d IPC buffers, the signal block with a ``max_size`` staging buffer and a ``max_size`` buffer
    (``create_shared_buffer``; the peers' are mapped, not allocated), each in whole 2 MiB pages. It runs for 2, 4, 6
    or 8 ranks with peer access, beyond two only fully NVLink-connected (``_SUPPORTED_WORLD_SIZES``,
    ``fully_connected``). Its 8 MiB ``rank_data`` is a PyTorch tensor (not counted here). The measured distributed
    parts (:data:`DIST`) hold it: a run that disables it leaves it out."""
    tp, sm = run.parallel.tp, int(run.hardware.sm)
    if tp not in (2, 4, 6, 8) or link(run) == "host" or (tp > 2 and run.hardware.interconnect != "nvswitch"):
        return 0
    size = CUSTOM_AR_MAX
    if communicators(run) == "nccl+symm_mem":
        size = min(size, CUSTOM_AR_SYMM_MAX[sm][tp])
    pages = (-(-(CUSTOM_AR_SIGNAL + size) // PAGE) + -(-size // PAGE)) * PAGE
    return pages


def run_bytes(run: ServeRunSpec) -> tuple[int, str]:
    """(bytes, source) loading and the profile run add outside PyTorch (module docstring)."""
    sv, par = run.serving, run.parallel
    if sv.engine == "vllm" and not run.vllm_v1:
        return 0, "V0 adds none (vllm-project/vllm#10517: 0.35 GiB before and after the profile run)"
    key = (run.hardware.interconnect, par.tp, par.pp > 1)
    if link(run) == "host":  # the lazy connections land in host memory: what loading adds on one GPU
        key = ("nvswitch", 1, False)
    measured = ("nvswitch", key[1], key[2]) if key[0] == "nvswitch" or key[1:] == (1, False) else ("nvswitch", 1, False)
    size, source = _nearest(RUN_V1, measured)
    if key[0] != "nvswitch" and key[1:] == (1, False):
        source = f"{source}, on H100 (the kernels loaded are the software's)"
    elif key[0] != "nvswitch":
        source = f"{source}; the lazy NCCL connections over PCIe are {UNMEASURED}"
    if sv.engine != "vllm" or vllm_profiles_cudagraphs(sv.engine_version, sv.enforce_eager):
        return size, source
    if measured in RUN_V1_NO_GRAPH_PROFILE:
        gib, without = RUN_V1_NO_GRAPH_PROFILE[measured]
        return int(gib * GIB), without
    tp1 = ("nvswitch", 1, False)
    residue = int(RUN_V1[tp1][0] * GIB) - int(RUN_V1_NO_GRAPH_PROFILE[tp1][0] * GIB)
    return size - residue, (f"{source}, less the CUDA-graph profiling's {residue / GIB:.2f} GiB measured at TP1 "
                            f"({RUN_V1_NO_GRAPH_PROFILE[tp1][1]})")


def measured_non_torch(run: ServeRunSpec) -> tuple[int, str]:
    """(bytes, where they come from) of the non-PyTorch memory vLLM's budget subtracts for ``run``: the
    parts its version's :func:`window` counts."""
    sv = run.serving
    if sv.non_torch_gib is not None:
        return int(sv.non_torch_gib * GIB), "serving.non_torch_gib"
    win = window(sv.engine, sv.engine_version, run.vllm_v1)
    parts = {"total": ("context", "dist", "run"), "absolute": ("context", "dist", "run"),
             "init": ("dist", "run"), "baseline": ("dist", "run"), "after_init": ("run",)}.get(win, ())
    found = {"context": lambda: context_bytes(run.hardware), "dist": lambda: dist_bytes(run),
             "run": lambda: run_bytes(run)}
    sizes = {p: found[p]() for p in parts}
    text = "; ".join(f"{p}: {s / GIB:.2f} GiB ({src})" for p, (s, src) in sizes.items())
    return sum(s for s, _ in sizes.values()), f"window {win!r}: {text}"


def measured_init(run: ServeRunSpec) -> tuple[int, str]:
    """(bytes, source) in use on a device once its distributed groups exist, before the weights load:
    context + distributed."""
    if run.hardware.non_pytorch_gib:
        return int(run.hardware.non_pytorch_gib * GIB), "hardware.non_pytorch_gib"
    ctx, ctx_src = context_bytes(run.hardware)
    dist, dist_src = dist_bytes(run)
    return ctx + dist, f"context: {ctx_src}; distributed: {dist_src}"
