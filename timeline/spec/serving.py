"""The ``[serving]`` and ``[serving.load]`` sections of a serving run file (DESIGN §12).

A serving run keeps ``[model]``, ``[parallel]``, ``[hardware]`` and ``[allocator]`` and replaces
``[training]`` / ``[recompute]`` / ``[schedule]`` with ``[serving]``. Engine knobs carry the
engine's own names (vLLM's ``gpu_memory_utilization``, ``max_num_seqs``, ``block_size``; SGLang's
``mem_fraction_static``); defaults are vLLM's (``vllm/config/scheduler.py``, ``cache.py``) where a
user would expect them. Cross-field rules live in :mod:`timeline.serve.validate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from timeline.spec.engine_versions import (
    ENGINE_V1,
    SGLANG_DEFAULT,
    USAGE_CONTEXTS,
    VLLM_DEFAULT,
    vllm_runs_v1,
)
from timeline.spec.fields import spec_field
from timeline.spec.model import ModelSpec
from timeline.spec.quant import CheckpointQuant
from timeline.spec.run import AllocatorSpec, HardwareSpec, ParallelSpec
from timeline.spec.vision import VisionSpec

ENGINES = ("vllm", "sglang", "hf")
WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "int8", "int4", "mxfp4", "nvfp4", "nf4")
KV_CACHE_DTYPES = ("auto", "bf16", "fp16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla")
CUDAGRAPH_MODES = ("none", "piecewise", "full", "full_decode_only", "full_and_piecewise")
DISTS = ("fixed", "uniform", "lognormal")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingSpec:
    engine: str = spec_field("vllm", choices=ENGINES)
    engine_version: str = spec_field("", doc="the engine version the budget rules are read at (default: vLLM "
                                     f"{VLLM_DEFAULT}, SGLang {SGLANG_DEFAULT}: the newest releases read)")
    engine_v1: str = spec_field("auto", choices=ENGINE_V1, doc=(
        "vLLM's engine from 0.8 to 0.10 (VLLM_USE_V1): auto = as vLLM's oracle picks it (V1, or V0 where the job "
        "has a feature V1 lacks there: a GPU below compute capability 8.0, an fp8 KV cache without FlashAttention "
        "3, fp32, pipeline parallelism before 0.9.1, MTP before 0.9 — the run says which), on = VLLM_USE_V1=1, "
        "off = VLLM_USE_V1=0; its log names it: 'Initializing a V1 LLM engine' or 'Initializing an LLM engine'"))
    gpu_memory_utilization: float = spec_field(0.9, minimum=0.01, maximum=1.0, doc="vLLM")
    mem_fraction_static: float = spec_field(0.88, minimum=0.01, maximum=1.0, doc="SGLang")
    max_num_seqs: int = spec_field(256, nonneg=True, maximum=2**20, doc=(
        "requests running at once (SGLang --max-running-requests; 0 = SGLang's own, from its KV pool)"))
    max_num_batched_tokens: int = spec_field(8192, positive=True, maximum=2**26)
    max_model_len: int = spec_field(0, nonneg=True, maximum=2**26, doc="0 = max_position_embeddings")
    enable_chunked_prefill: bool = spec_field(True)
    enable_prefix_caching: bool = spec_field(True)
    block_size: int = spec_field(16, positive=True, maximum=2**16, doc="tokens per KV block")
    cuda_graph_sizes: tuple[int, ...] = spec_field((), positive=True, maximum=2**20,
                                                  doc="batch sizes captured (empty: the engine's list)")
    max_cudagraph_capture_size: int = spec_field(0, nonneg=True, maximum=2**20, doc=(
        "vLLM 0.12+ --max-cudagraph-capture-size: the largest batch captured when cuda_graph_sizes is empty "
        "(0 = the engine's default)"))
    cudagraph_mode: str = spec_field("full_and_piecewise", choices=CUDAGRAPH_MODES)
    enforce_eager: bool = spec_field(False)
    peer_access: bool = spec_field(True, doc="the tensor/pipeline-parallel ranks reach each other's memory (NVLink, "
                                   "NVSwitch or PCIe P2P); false on separate nodes without GPUDirect RDMA or with "
                                   "P2P off (vLLM: 'Custom allreduce is disabled because this process group spans "
                                   "across nodes' / '... lacks GPU P2P capability')")
    disable_custom_all_reduce: bool = spec_field(False, doc=(
        "--disable-custom-all-reduce: no custom all-reduce IPC buffers on the device (tensor-parallel ranks with "
        "peer access otherwise hold them)"))
    flashinfer_sampler: bool = spec_field(False, doc="vLLM V1 samples top-k/top-p with FlashInfer (its log prints "
                                          "'Using FlashInfer for top-p & top-k sampling.': the default up to 0.11.0 "
                                          "when FlashInfer is installed, opt-in from 0.11.1)")
    weight_dtype: str = spec_field("bf16", choices=WEIGHT_DTYPES)
    quantization: str = spec_field("", doc=(
        "vLLM --quantization as given (empty: the engine picks from the checkpoint); gptq / awq keep a GPTQ / AWQ "
        "checkpoint on the plain kernels instead of Marlin"))
    quant_group_size: int = spec_field(128, nonneg=True, maximum=2**16, doc="elements per scale (fp8: 0 = "
                                       "one scale per output channel)")
    kv_cache_dtype: str = spec_field("auto", choices=KV_CACHE_DTYPES)
    dtype: str = spec_field("bf16", choices=("bf16", "fp16", "fp32"), doc="activations and unquantized weights "
                            "(the engine's --dtype; fp32 also keeps the KV cache in fp32 under kv_cache_dtype auto)")
    limit_mm_per_prompt: int = spec_field(999, nonneg=True, maximum=2**20, doc=(
        "images a prompt may carry (vLLM --limit-mm-per-prompt '{\"image\": N}', default 999); 0 serves a "
        "vision-language checkpoint's language model only: its vision tower is neither built nor profiled"))
    speculative_method: str = spec_field("", choices=("", "mtp"), doc=(
        "speculative decoding (vLLM --speculative-config method): mtp drafts with the checkpoint's multi-token "
        "prediction layers (modelled for gated delta-net hybrids: Qwen3-Next, Qwen3.5); empty = none"))
    num_speculative_tokens: int = spec_field(0, nonneg=True, maximum=64, doc=(
        "tokens drafted per step (--speculative-config num_speculative_tokens)"))
    cuda_graph_estimate_gib: float | None = spec_field(None, nonneg=True, maximum=2.0**20, doc=(
        "vLLM 0.20+'s CUDA-graph memory estimate, which it subtracts from the KV budget (its log's 'Estimated CUDA "
        "graph memory: X GiB total'; 0 for VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0); not modelled: unset, "
        "nothing is subtracted and the run says so"))
    usage_context: str = spec_field("openai_api_server", choices=USAGE_CONTEXTS, doc=(
        "vLLM: how the engine is started — the OpenAI server (vllm serve), the offline LLM class (LLM(...): "
        "max_num_batched_tokens 16,384 / 8,192 by default on V1) or an engine built from EngineArgs elsewhere "
        "(engine_context: 2,048 tokens and 128 sequences)"))
    num_gpu_blocks_override: int = spec_field(0, nonneg=True, maximum=2**40, doc=(
        "vLLM --num-gpu-blocks-override: the KV pool's block count, whatever memory the profile leaves (0 = none)"))
    kv_cache_memory_bytes: int = spec_field(0, nonneg=True, maximum=2**60, doc=(
        "vLLM --kv-cache-memory-bytes (0.10.2 and later): the KV budget per GPU in bytes, instead of "
        "gpu_memory_utilization's rest (0 = none)"))
    max_total_tokens: int = spec_field(0, nonneg=True, maximum=2**40, doc=(
        "SGLang --max-total-tokens: a cap on the KV pool's tokens (0 = none)"))
    non_torch_gib: float | None = spec_field(None, nonneg=True, maximum=2.0**20,
                                             doc="CUDA context, NCCL and cuBLAS outside PyTorch's allocator "
                                             "(default: the published measurement, timeline.serve.non_torch)")
    requests: str | None = spec_field(None, doc="CSV trace arrival_us,prompt_tokens,output_tokens,prefix_id")
    max_prefill_tokens: int = spec_field(0, nonneg=True, maximum=2**26, doc=(
        "SGLang --max-prefill-tokens: a prefill batch's tokens when chunked prefill is off (0 = its 16,384); "
        "with chunked prefill on, at least max_num_batched_tokens (a smaller one is not modelled)"))
    cuda_graph_max_bs: int = spec_field(0, nonneg=True, maximum=2**20, doc=(
        "SGLang --cuda-graph-max-bs: the largest decode batch captured (0 = the version's default for the GPU's "
        "memory); its default mem_fraction_static reserves 2 MiB per batch"))
    derived_max_num_seqs: bool = spec_field(False, doc=(
        "written by the tool: max_num_seqs is SGLang's own max_running_requests, derived from its pool (the "
        "request table is sized as when --max-running-requests is not given)"))
    prefill_cuda_graph: str = spec_field("auto", choices=("auto", "on", "off"), doc=(
        "SGLang's prefill (piecewise / breakable) CUDA graphs: auto = the version's default (off before 0.5.10 "
        "unless --enable-piecewise-cuda-graph; on from 0.5.10 unless --disable-piecewise-cuda-graph or a rule "
        "turns them off); the default mem_fraction_static reserves memory for them"))
    enable_dp_attention: bool = spec_field(False, doc="SGLang --enable-dp-attention: attention data-parallel over "
                                           "parallel.dp ranks inside the tp group (MLA models); vLLM's data "
                                           "parallelism is parallel.dp alone")


@dataclass(frozen=True, slots=True, kw_only=True)
class DistSpec:
    """A token-count distribution: ``fixed`` (value), ``uniform`` (min…max) or ``lognormal``."""

    dist: str = spec_field("fixed", choices=DISTS)
    value: int = spec_field(0, nonneg=True, maximum=2**26)
    min: int = spec_field(0, nonneg=True, maximum=2**26)
    max: int = spec_field(0, nonneg=True, maximum=2**26)
    mean: float = spec_field(0.0, nonneg=True, maximum=2.0**26, doc="lognormal: mean of the token count")
    sigma: float = spec_field(0.0, nonneg=True, maximum=8.0, doc="lognormal: sigma of log(tokens)")


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadSpec:
    num_requests: int = spec_field(100, positive=True, maximum=10**7)
    rate_per_s: float = spec_field(10.0, minimum=1e-6, maximum=1e9, doc="Poisson arrivals")
    prompt_tokens: DistSpec = field(default_factory=lambda: DistSpec(value=1024))
    output_tokens: DistSpec = field(default_factory=lambda: DistSpec(value=128))
    seed: int = spec_field(0, nonneg=True, maximum=2**63 - 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """One request of a load: what the scheduler admits."""

    rid: int
    arrival_us: float
    prompt_tokens: int
    output_tokens: int
    prefix_id: str = ""
    prefix_tokens: int = 0  # the leading prompt tokens shared with every request of the same prefix_id


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeRunSpec:
    """One simulated serving deployment, resolved; paths stay as the run file wrote them."""

    name: str
    source: str
    model: ModelSpec
    model_source: str
    parallel: ParallelSpec
    hardware: HardwareSpec
    allocator: AllocatorSpec
    serving: ServingSpec
    load: LoadSpec | None
    requests: tuple[Request, ...] = field(default=(), compare=False, repr=False)
    notes: tuple[str, ...] = field(default=(), compare=False, repr=False)
    quant: CheckpointQuant | None = None  # the checkpoint's quantization_config (hf_config models)
    vision: VisionSpec | None = None  # a vision-language checkpoint's vision tower and projector

    @property
    def derived_max_model_len(self) -> int:
        """The length the engine derives from the config: vLLM's (``config/model.py`` ``_get_and_verify_max_len``,
        0.19.0) is ``max_position_embeddings`` times the ``rope_scaling`` factor (a YaRN config's
        ``original_max_position_embeddings`` times it; none for ``llama3`` / ``longrope``) —
        ``model.rope_scaled_positions`` (:func:`timeline.io.hf_config.rope_scaled_positions`). SGLang's
        ``get_context_length`` reads the factor otherwise (none where ``original_max_position_embeddings`` is
        given): not read here, it keeps ``max_position_embeddings``."""
        # ``_get_and_verify_max_len`` skips the scaling for every model_type holding "gemma3"
        if self.serving.engine == "vllm" and self.model.rope_scaled_positions \
                and "gemma3" not in self.model.model_type:
            return self.model.rope_scaled_positions
        return self.model.max_position_embeddings

    @property
    def max_model_len(self) -> int:
        """``serving.max_model_len``, else :attr:`derived_max_model_len`."""
        return self.serving.max_model_len or self.derived_max_model_len

    @property
    def vllm_v1(self) -> bool:
        """Whether this job runs vLLM's V1 engine (False for another engine): ``serving.engine_v1`` where set,
        else the version's default unless vLLM's oracle falls back to V0 for one of its features
        (:func:`timeline.spec.engine_versions.vllm_v1_fallback`)."""
        sv = self.serving
        return sv.engine == "vllm" and vllm_runs_v1(sv.engine_version, sv.engine_v1, **self.v1_features)

    @property
    def v1_features(self) -> dict[str, object]:
        """What vLLM's V0/V1 oracle reads of this job (:func:`timeline.spec.engine_versions.vllm_v1_fallback`)."""
        sv = self.serving
        return {"sm": self.hardware.sm, "kv_cache_dtype": sv.kv_cache_dtype, "dtype": sv.dtype,
                "pp": self.parallel.pp, "speculative": sv.speculative_method, "mla": self.model.is_mla,
                "quant_method": self.quant.method if self.quant is not None else ""}


#: the engine versions whose source the budget rules (``timeline.serve.rules``) are read at; the
#: first is the default (vLLM's: :data:`timeline.spec.engine_versions.VLLM_DEFAULT`)
ENGINE_VERSIONS: dict[str, tuple[str, ...]] = {
    "vllm": (VLLM_DEFAULT,),
    "sglang": (SGLANG_DEFAULT, "0.4"),  # the newest release read; "0.4" the round-1 rule set
    "hf": ("transformers",),
}
