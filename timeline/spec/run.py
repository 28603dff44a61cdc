"""Run-file sections (DESIGN §3) and the resolved run.

Defaults follow Megatron-LM where a user would expect them: no recompute, 1F1B, the caching
allocator, bf16 weights with fp32 gradients, master weights and moments, no distributed
optimizer (``zero = 0``), ``sp`` on when ``tp > 1`` and ``etp = tp`` (resolved by the reader,
which knows whether the user set them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from timeline.spec.fields import DTYPES, spec_field
from timeline.spec.framework import FrameworkSpec
from timeline.spec.hardware import GPUS, preset_values
from timeline.spec.model import MAX_LAYERS, ModelSpec
from timeline.spec.schedule_rules import SCHEDULE_KINDS as _KINDS
from timeline.spec.trace import CapturedTrace

#: ``--fp8-recipe`` values modelled (blockwise and mxfp8 are refused by from-megatron, with why)
FP8_RECIPES = ("none", "delayed", "tensorwise", "blockwise", "mxfp8")
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "layernorm", "mlp", "moe", "moe_act", "shared_experts",
                     "gdn_norm_out")
#: Megatron-LM's ``--offload-modules`` (``transformer_config.py: TransformerConfig.__post_init__``'s allowed set)
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")
#: ``[training] optimizer``: whose per-parameter state the static state holds
OPTIMIZERS = ("adam", "sgd", "muon")
#: simulated iterations at most: the second already shows the steady state
MAX_ITERATIONS = 1000
#: the ``[schedule] kind`` names, from the one table of kinds (:data:`timeline.spec.schedule_rules.SCHEDULES`)
SCHEDULE_KINDS = tuple(_KINDS)


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelSpec:
    pp: int = spec_field(1, positive=True, maximum=2**20, doc="pipeline-parallel ranks")
    vpp: int = spec_field(1, positive=True, maximum=2**20, doc="model chunks per pipeline rank")
    tp: int = spec_field(1, positive=True, maximum=2**20, doc="tensor-parallel ranks")
    sp: bool = spec_field(False, doc="sequence parallelism (default: on when tp > 1)")
    cp: int = spec_field(1, positive=True, maximum=2**20, doc="context-parallel ranks")
    ep: int = spec_field(1, positive=True, maximum=2**20, doc="expert-parallel ranks")
    etp: int = spec_field(1, positive=True, maximum=2**20, doc="expert tensor-parallel ranks (default: tp)")
    dp: int = spec_field(1, positive=True, maximum=2**20, doc="data-parallel ranks")
    layout: tuple[int, ...] | None = spec_field(None, nonneg=True, maximum=MAX_LAYERS, doc="layers per virtual stage")
    mtp_stage: int | None = spec_field(None, nonneg=True, maximum=2**20, doc=(
        "virtual stage (0-based, layout order) holding all MTP layers; default: the last, with the loss. An "
        "earlier stage runs them apart from the loss (Megatron-Core >= 0.16's standalone MTP): it receives the "
        "hidden states, holds its own embedding and sends the main and MTP hidden states on, concatenated"))
    encoder_pp: int = spec_field(0, nonneg=True, maximum=1, doc=(
        "LLaVA: 1 puts the ViT and projector on a pipeline stage of their own before the decoder's (Megatron "
        "--encoder-pipeline-model-parallel-size 1, Megatron-Core before 0.14); pp counts that stage, whose layout "
        "entry is 0"))
    encoder_tp: int = spec_field(0, nonneg=True, maximum=2**20, doc=(
        "LLaVA: the ViT stage's tensor-parallel ranks when they are fewer than tp (Megatron "
        "--encoder-tensor-model-parallel-size); 0 = tp"))

    @property
    def edp(self) -> int:
        """Expert data-parallel size: the ranks one expert's states are sharded over."""
        return self.dp * self.tp * self.cp // (self.ep * self.etp)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSpec:
    micro_batch_size: int = spec_field(1, positive=True, maximum=2**16)
    seq_len: int = spec_field(4096, positive=True, maximum=2**26)
    decoder_seq_len: int = spec_field(0, nonneg=True, maximum=2**26, doc=(
        "T5's decoder tokens per sample (Megatron --decoder-seq-length); seq_len is the encoder's"))
    num_microbatches: int = spec_field(8, positive=True, maximum=2**31 - 1)
    iterations: int = spec_field(2, positive=True, maximum=MAX_ITERATIONS, doc="back-to-back "
                                    "iterations; the steady state is reached in the second")
    warmup_iterations: int = spec_field(0, nonneg=True, maximum=MAX_ITERATIONS,
                                        doc="iterations simulated before the reported ones and left out of "
                                        "every reported peak (their state and cache history stay)")
    zero_grad: str = spec_field("set_to_none", choices=("set_to_none", "zeros"),
                                doc="set_to_none: each .grad appears when backward first produces it (PyTorch's "
                                "default since 2.0); zeros: gradients stay allocated between steps")
    optimizer_step: bool = spec_field(True, doc="false: no optimizer step (nor the states it creates), e.g. to "
                                      "compare one forward + backward with a measured peak")
    resumed: bool = spec_field(False, doc="the run resumes from a checkpoint: the optimizer's moments are "
                               "loaded with it, so they exist from the start instead of from the first step")
    dtype: str = spec_field("bf16", choices=DTYPES, doc="weights and activations")
    grad_dtype: str = spec_field("fp32", choices=DTYPES)
    master_dtype: str = spec_field("fp32", choices=DTYPES)
    moment_dtype: str = spec_field("fp32", choices=DTYPES)
    exp_avg_sq_dtype: str = spec_field("", choices=("",) + DTYPES, doc="Adam's second moment when it differs from "
                                       "moment_dtype (Megatron's precision-aware --exp-avg-sq-dtype; '' = moment_dtype)")
    optimizer: str = spec_field("adam", choices=OPTIMIZERS, doc="the optimizer's per-parameter state "
                                "(timeline.graph.optim_state): adam (two moments), sgd (a momentum buffer unless "
                                "sgd_momentum = 0), muon (a momentum buffer for 2-D hidden matrices, Adam for the rest; "
                                "megatron profile only)")
    sgd_momentum: float = spec_field(0.9, nonneg=True, maximum=1.0, doc="SGD's momentum (0: no momentum buffer)")
    weight_decay: float = spec_field(0.01, nonneg=True, maximum=1e3, doc="Megatron --weight-decay: SGD's foreach step "
                                     "makes its decayed gradients as a copy where it is not 0")
    muon_layer_wise: bool = spec_field(False, doc="Muon's layer-wise distributed optimizer (Megatron --optimizer "
                                       "dist_muon): each dp·cp rank keeps the main parameters and states of whole "
                                       "parameters; zero = 0: dealt by size over unsharded buffers (Megatron-Core "
                                       "0.18), zero = 1: by their shard of the distributed optimizer's buffers (0.19)")
    precision_aware: bool = spec_field(False, doc="Megatron --use-precision-aware-optimizer: TE's FusedAdam makes "
                                       "the master weights (master_dtype) with the moments in its first step; Megatron "
                                       "makes no main parameters and no main-grad copies; needs zero = 1")
    optimizer_cpu_offload: bool = spec_field(False, doc="Megatron --optimizer-cpu-offload: a HybridDeviceOptimizer "
                                             "keeps the first optimizer_offload_fraction of each optimizer's main "
                                             "parameters on the CPU and gives the rest fp32 masters and fp32 moments on "
                                             "the GPU (timeline.graph.optim_state.hybrid_split); needs precision_aware")
    optimizer_offload_fraction: float = spec_field(1.0, nonneg=True, maximum=1.0, doc="Megatron "
                                                   "--optimizer-offload-fraction: the share of each optimizer's "
                                                   "parameter elements whose update runs on the CPU")
    master_remainders: bool = spec_field(False, doc="precision_aware with fp32 masters of bf16 weights: TE keeps the "
                                         "16 bits the bf16 weight lacks (int16 store_param_remainders), not fp32")
    zero: int = spec_field(0, choices=(0, 1, 2, 3))
    fp8_recipe: str = spec_field("none", choices=FP8_RECIPES, doc=(
        "Megatron --fp8-recipe under --fp8-format (megatron profile): the Transformer Engine linears of every "
        "layer run their GEMMs in FP8 and keep FP8 copies of their inputs for backward (delayed: DelayedScaling; "
        "tensorwise: Float8CurrentScaling; blockwise: Float8BlockScaling, fp32 scales per 1×128 of the activations "
        "and per 128×128 of the weights, sm 9.0+; mxfp8: MXFP8BlockScaling, a byte scale per 32, sm 10.0+); "
        "none: no FP8"))
    fp8_param_gather: bool = spec_field(False, doc=(
        "Megatron --fp8-param-gather: the TE linears' weights are FP8 parameters (1 byte, the distributed "
        "optimizer's param buffer in uint8) beside fp32 main parameters"))
    mxfp8_reuse_grad_buf: bool = spec_field(False, doc=(
        "Megatron --reuse-grad-buf-for-mxfp8-param-ag (with fp8_param_gather under mxfp8): the MXFP8 weights get no "
        "param buffer — their bf16 all-gather lands in their fp32 grad buffer (param_and_grad_buffer.py: "
        "shared_buffer), each weight keeping its own MXFP8 data"))
    fp8_bf16_first_layers: int = spec_field(0, nonneg=True, maximum=2**16, doc=(
        "Megatron --first-last-layers-bf16 with --num-layers-at-start-in-bf16 (default 1): the first decoder layers "
        "(global index) run and keep their weights in the model dtype, outside fp8_autocast and fp8_model_init"))
    fp8_bf16_last_layers: int = spec_field(0, nonneg=True, maximum=2**16, doc=(
        "Megatron --first-last-layers-bf16 with --num-layers-at-end-in-bf16 (default 1): the last decoder layers "
        "likewise"))
    fp8_amax_history_len: int = spec_field(1, positive=True, maximum=2**20, doc=(
        "Megatron --fp8-amax-history-len under the delayed recipe: each TE module keeps an fp32 [len, 3·GEMMs] "
        "forward and [len, 2·GEMMs] backward amax history (and its scales) from its first FP8 forward"))
    optimizer_instances: int = spec_field(1, positive=True, maximum=2**20, doc="Megatron --num-distributed-optimizer-instances: "
                                          "states shard over dp·cp / this (a partial data-parallel group)")
    routing: str = spec_field("balanced", choices=("balanced", "skew"))
    routing_skew: float = spec_field(1.0, minimum=1.0, doc="busiest EP rank's tokens / mean")
    capacity_factor: float = spec_field(0.0, nonneg=True, maximum=1e3, doc="0 = dropless")
    pad_to_capacity: bool = spec_field(False)
    moe_router_padding: bool = spec_field(False, doc=(
        "Megatron --moe-router-padding-for-quantization (--moe-router-padding-for-fp8): the routing map is padded "
        "so each expert's token count is a multiple of the FP8 GEMM alignment (16; MXFP8 32): the alltoall "
        "dispatcher pads each source rank's count per expert, the flex dispatcher each local expert's received count"))

    @property
    def moe_pad_multiple(self) -> int:
        """The token-count alignment of ``moe_router_padding`` (Megatron ``fp8_utils.py: get_fp8_align_size``), 0
        without it."""
        if not self.moe_router_padding or self.fp8_recipe == "none":
            return 0
        return 32 if self.fp8_recipe == "mxfp8" else 16


@dataclass(frozen=True, slots=True, kw_only=True)
class RecomputeSpec:
    policy: str = spec_field("none", choices=("none", "selective", "full"))
    modules: tuple[str, ...] = spec_field(("core_attn",), choices=RECOMPUTE_MODULES)
    method: str = spec_field("uniform", choices=("uniform", "block"))
    num_layers: int | tuple[int, ...] = spec_field(1, nonneg=True, maximum=MAX_LAYERS)
    distribute_saved: bool = spec_field(False, doc=(
        "Megatron --distribute-saved-activations: full recompute keeps each checkpoint's input as this rank's "
        "1/tp chunk and all-gathers it back before the recompute (tensor_parallel/random.py: CheckpointFunction); "
        "needs policy = \"full\", tp > 1 and no sequence parallelism"))


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadSpec:
    """Megatron-LM's fine-grained activation offloading (``--fine-grained-activation-offloading``): the
    tensors each named module group saves for its backward, copied to the host after the group's forward
    and reloaded during the backward (:mod:`timeline.graph.offload`, :mod:`timeline.sim.offload`)."""

    modules: tuple[str, ...] = spec_field((), choices=OFFLOAD_MODULES,
                                          doc="module groups whose saved tensors go to the host (none: off)")
    min_elements: int = spec_field(1024 * 1024, nonneg=True, maximum=2**62,
                                   doc="a saved tensor of fewer elements stays on the GPU")
    fraction: float = spec_field(1.0, minimum=0.0, maximum=1.0,
                                 doc="share of each chunk's offloading groups that offload from the second iteration")
    delta_bytes: int = spec_field(0, nonneg=True, maximum=2**62,
                                  doc="bytes each later pipeline rank keeps on the GPU beyond the one before it")


#: no offloading (the default ``[offload]``)
NO_OFFLOAD = OffloadSpec()


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSpec:
    kind: str = spec_field("1f1b", choices=SCHEDULE_KINDS)
    csv: str | None = spec_field(None, doc="path of a CSV schedule (kind = csv)")
    microbatch_group_size: int = spec_field(0, nonneg=True, maximum=2**31 - 1, doc="interleaved: 0 = pp")
    combined_1f1b: bool = spec_field(False, doc="Megatron's combined 1F1B (--overlap-moe-expert-parallel-comm): "
                                     "each steady-state forward runs with a backward of another micro-batch as "
                                     "one pair, layer by layer; 1f1b at pp = 1, or interleaved")


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocatorSpec:
    kind: str = spec_field("caching", choices=("caching", "ideal"))
    expandable_segments: bool = spec_field(False)
    max_split_size_mb: int = spec_field(0, nonneg=True, maximum=2**30, doc="0 = unlimited; else > 20")
    max_non_split_rounding_mb: int = spec_field(20, nonneg=True, maximum=2**30)
    roundup_power2_divisions: int | dict[str, int] = spec_field(0, nonneg=True, maximum=2**10)


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareSpec:
    gpu: str = spec_field("h800")
    capacity_gib: float = spec_field(80.0, positive=True, maximum=2.0**20)
    non_pytorch_gib: float = spec_field(0.0, nonneg=True, maximum=2.0**20, doc="CUDA context, NCCL, workspaces")
    bf16_tflops: float = spec_field(989.0, minimum=0.001, maximum=1e9, doc="dense BF16 peak")
    hbm_gbps: float = spec_field(3350.0, minimum=0.001, maximum=1e9)
    nvlink_gbps: float = spec_field(200.0, minimum=0.001, maximum=1e9, doc="per direction")
    network_gbps: float = spec_field(50.0, minimum=0.001, maximum=1e9, doc="per GPU")
    efficiency: float = spec_field(0.6, minimum=0.001, maximum=1.0, doc="achieved / peak compute")
    comm_efficiency: float = spec_field(0.8, minimum=0.001, maximum=1.0)
    latency_us: float = spec_field(10.0, nonneg=True, maximum=1e6, doc="per-collective alpha")
    sm: int = spec_field(90, positive=True, maximum=1000, doc="compute capability × 10 (80 Ampere, 90 Hopper, 100 Blackwell)")
    sms: int = spec_field(0, nonneg=True, maximum=1_000_000,
                          doc="streaming multiprocessors (0: the preset's; for a GPU no preset holds, not known)")
    interconnect: str = spec_field("", choices=("", "nvswitch", "pcie"),
                                   doc='how a node\'s GPUs connect ("": the preset\'s; for a GPU no preset holds, pcie)')

    def __post_init__(self) -> None:
        # built in code with a preset's name alone (the run files fill both from the preset themselves)
        preset: dict[str, float | int | str] = preset_values(self.gpu) if self.gpu in GPUS else \
            {"sms": 0, "interconnect": "pcie"}
        if not self.sms:
            object.__setattr__(self, "sms", int(preset["sms"]))
        if not self.interconnect:
            object.__setattr__(self, "interconnect", str(preset["interconnect"]))

    @property
    def capacity_bytes(self) -> int:
        return int((self.capacity_gib - self.non_pytorch_gib) * 2**30)

    @classmethod
    def preset(cls, gpu: str, **values: Any) -> HardwareSpec:
        """Preset kind ``gpu``'s hardware (:func:`timeline.spec.hardware.preset_values`), ``values`` over it."""
        return cls(gpu=gpu, **{**preset_values(gpu), **values})


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSpec:
    """One simulated training job, resolved (defaults filled); paths stay as the run file wrote
    them, relative to its folder (``source``), so outputs do not depend on the checkout."""

    name: str
    source: str
    model: ModelSpec
    profile: str
    model_source: str  # "preset:NAME", "hf_config:PATH" or "trace:PATH", PATH as written in the run file
    parallel: ParallelSpec
    training: TrainingSpec
    recompute: RecomputeSpec
    schedule: ScheduleSpec
    allocator: AllocatorSpec
    hardware: HardwareSpec
    #: implementation choices and versions the megatron profile assumes (``[framework]``)
    framework: FrameworkSpec = field(default_factory=FrameworkSpec)
    #: fine-grained activation offloading to the host (``[offload]``)
    offload: OffloadSpec = field(default_factory=OffloadSpec)
    #: the captured op trace when ``model_source`` is "trace:PATH" (kept out of equality and hashing:
    #: the path in ``model_source`` names it)
    trace: CapturedTrace | None = field(default=None, compare=False, repr=False)
    #: the cells of each rank of the CSV schedule when ``schedule.kind`` is "csv", as ``io`` read them
    #: from ``schedule.csv`` (kept out of equality and hashing, like the trace: the path names them)
    csv_rows: tuple[tuple[str, ...], ...] | None = field(default=None, compare=False, repr=False)
    #: one-line notes for the user about how the inputs were read (e.g. a config's family read
    #: from its ``architectures``); printed by the CLI, never part of any output
    notes: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @property
    def sp_enabled(self) -> bool:
        return self.parallel.sp and self.parallel.tp > 1
