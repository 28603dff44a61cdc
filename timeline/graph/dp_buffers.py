"""Megatron-Core's data-parallel state as it lays it out: contiguous param/grad buffers per model
chunk, split into buckets with Megatron's padding, and the distributed optimizer's shards of them.

Rules, read at Megatron-Core 0.14.0 (tag ``core_v0.14.0`` of NVIDIA/Megatron-LM, ``MC``) and
unchanged in bytes through main of 2026-08 (d98e8a6, where the layout moved to
``MC/optimizer/distrib_optimizer.py: DistributedOptimizer._compute_per_buffer_param_layout`` and
``MC/optimizer/param_layout.py: pad_param_start`` / ``bucket_end_divisor``, the same divisors):

- ``MC/distributed/distributed_data_parallel.py: DistributedDataParallel.__init__`` wraps each
  model chunk on its own and splits its trainable parameters (``named_parameters()`` order) into
  dense ones and expert-parallel ones (``allreduce = False``: the routed experts), each set
  grouped by (param dtype, grad dtype) into one ``_ParamAndGradBuffer``
  (``_allocate_buffers_for_parameters``), dense buffers first; the dense ones shard over the
  intra-instance ``dp·cp`` group, the expert ones over the intra-instance expert-DP group.
- ``MC/distributed/param_and_grad_buffer.py: _ParamAndGradBuffer.__init__`` lays the parameters out
  in reverse order; a bucket closes once it holds ``bucket_size`` elements (None: one bucket).
  Under the distributed optimizer each parameter starts at a multiple of 64 elements
  (``_pad_start_of_param_if_needed``), each bucket ends at a multiple of ``lcm(dp, 128)`` (with
  ``--ddp-pad-buckets-for-high-nccl-busbw`` ``lcm(dp, 128, 2**16)``; ``_pad_end_of_bucket_if_needed``),
  and a shared embedding (tied embeddings across pipeline stages) gets a bucket of its own
  (``_does_param_require_new_bucket``); without it there is no padding. The grad buffer is
  ``torch.zeros(numel, grad_dtype)``; under the distributed optimizer a param buffer
  ``torch.zeros(numel, param_dtype)`` is made first and each parameter is copied into its view and
  its own storage freed (``del old_param_data``).
- ``megatron/training/training.py: get_model``: ``bucket_size = --ddp-bucket-size or
  max(40_000_000, 1_000_000·dp·cp)``, None without ``--overlap-grad-reduce``; chunks after the first
  (``disable_bucketing = model_chunk_idx > 0``), every chunk under
  ``--overlap-param-gather-with-optimizer-step`` (``… or args.overlap_param_gather_with_optimizer_step``,
  the same from 46fdcd5b7e, 2025-01, to d98e8a64dd's ``per_chunk_disable_bucketing``) and pipeline ranks
  after the first (``DistributedDataParallel.__init__``: ``pp_rank > 0``) keep one bucket.
- ``MC/optimizer/__init__.py: get_megatron_optimizer``: the dense parameters of all chunks go to one
  ``DistributedOptimizer``, the expert ones to a second, chained after it (``ChainedOptimizer``);
  under ``--overlap-param-gather-with-optimizer-step`` the first model chunk's dense parameters get an
  optimizer of their own, first in the chain (``all_dense_model_chunks = [[model_chunks[0]],
  model_chunks[1:]]``, core_v0.12.0 … d98e8a64dd), so its step can launch that chunk's all-gather
  (``MC/optimizer/optimizer.py: ChainedOptimizer.step``: ``start_param_sync(force_dispatch=True)``, in
  place in the param buffer: nothing allocated). :attr:`DdpBuffer.optimizer` is that chain position.
- ``MC/optimizer/distrib_optimizer.py: DistributedOptimizer._build_model_gbuf_range`` splits each
  bucket into ``dp`` equal contiguous ranges; ``_build_model_gbuf_param_range_map`` gives each
  parameter overlapping this rank's range a shard (the overlap), which
  ``_build_model_and_main_param_groups`` turns into one fp32 ``clone().float()``. A device is
  modelled as the last DP rank of its groups (:func:`ddp_buffers`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from timeline.graph.static import is_expert_state, zero_groups
from timeline.graph.tensors import TensorDef
from timeline.profiles.megatron_workspaces import version_tuple
from timeline.spec.framework import FrameworkSpec
from timeline.spec.run import ParallelSpec, TrainingSpec

#: MC/distributed/param_and_grad_buffer.py: _pad_start_of_param_if_needed (128-byte aligned starts)
PARAM_START_ALIGN = 64
#: _pad_end_of_bucket_if_needed: lcm(dp, 128) (256-byte aligned bucket starts), with 2**16 for NCCL busbw
BUCKET_END_ALIGN = 128
BUSBW_ALIGN = 2 ** 16
#: megatron/training/training.py: get_model, the default bucket (elements) and its per-DP-rank growth
DEFAULT_BUCKET, BUCKET_PER_RANK = 40_000_000, 1_000_000


@dataclass(frozen=True, slots=True)
class DdpRules:
    """What decides the buffer layout besides the parameters: the distributed optimizer, the
    bucket size (None: one bucket), the NCCL bus-bandwidth padding, tied embeddings."""

    distributed_optimizer: bool
    bucket_size: int | None
    pad_for_busbw: bool = False
    tied_embeddings: bool = False
    #: --overlap-param-gather-with-optimizer-step: the first chunk's dense parameters in an optimizer of their own
    first_chunk_optimizer: bool = False
    #: Megatron-FSDP's sharding strategy ('' = DDP's buffers; :mod:`timeline.graph.fsdp_buffers`)
    fsdp: str = ""
    #: Megatron-FSDP makes the decoder layers FSDP units under every strategy but no_shard (Megatron-LM from
    #: 342faa43cd; before it under optim_grads_params alone)
    fsdp_units_all: bool = False
    #: Muon's layer-wise optimizer in the distributed optimizer's buffers, Muon's matrices in buffers of their own
    #: (:mod:`timeline.graph.layer_wise_buffers`): "padded" or "compact"; "" without it
    layer_wise: str = ""


@dataclass(frozen=True, slots=True)
class ParamSlot:
    """One parameter's place in its buffer, [start, end) in elements, and the shard of it this DP
    rank owns under the distributed optimizer ([shard_start, shard_end) of the buffer, empty when
    the rank owns none of it)."""

    name: str
    start: int
    end: int
    bucket: int
    shard_start: int = 0
    shard_end: int = 0

    @property
    def shard_numel(self) -> int:
        return max(0, self.shard_end - self.shard_start)


@dataclass(frozen=True, slots=True)
class DdpBuffer:
    """One ``_ParamAndGradBuffer``: its model chunk, whether it holds expert parameters, its padded
    element count, the DP group it shards over and each parameter's slot (in layout order)."""

    chunk: int
    expert: bool
    numel: int
    group: int
    slots: tuple[ParamSlot, ...]
    #: the position of the optimizer holding its parameters in Megatron's ``ChainedOptimizer`` (0 dense,
    #: 1 expert; 0 the first chunk's dense, 1 the other dense, 2 expert with ``DdpRules.first_chunk_optimizer``)
    optimizer: int = 0
    #: its parameters are FP8 (``--fp8-param-gather``): a ``torch.uint8`` param buffer of their own
    fp8: bool = False
    #: a Megatron-FSDP parameter group: the strategy and the FSDP unit it belongs to ('' for none)
    fsdp: str = ""
    unit: str = ""
    #: under the distributed optimizer, whether the buffer has a param buffer the parameters move into (not a
    #: compact layer-wise buffer: ``_ParamAndGradBuffer.__init__`` turns the distributed optimizer off for it)
    param_buffer: bool = True
    #: a buffer of Muon's matrices under the layer-wise optimizer in the distributed optimizer's buffers
    muon: bool = False

    @property
    def label(self) -> str:
        unit = f".{self.unit or 'rest'}" if self.fsdp else ""
        return (f"chunk{self.chunk}{unit}{'.expert' if self.expert else ''}{'.fp8' if self.fp8 else ''}"
                f"{'.muon' if self.muon else ''}")


def ddp_rules(fw: FrameworkSpec, tr: TrainingSpec, par: ParallelSpec, *, tied: bool) -> DdpRules:
    """The layout rules of a Megatron job from its ``[framework]`` and ZeRO level (``zero = 1``:
    the distributed optimizer); ``tied``: the model ties its embeddings."""
    bucket = None
    split = fw.overlap_param_gather_with_optimizer_step
    # get_model: disable_bucketing for every chunk under the split; Megatron-FSDP reads the same bucket_size,
    # None without --overlap-grad-reduce (set before MegatronFSDP.__init__ forces its own overlap_grad_reduce)
    if fw.overlap_grad_reduce and not split:
        bucket = fw.ddp_bucket_size or max(DEFAULT_BUCKET, BUCKET_PER_RANK * par.dp * par.cp)
    # mcore_fsdp_adapter.py: FullyShardedDataParallel.__init__ (342faa43cd, 2026-08-18: `!= "no_shard"`; main after
    # core_v0.19.0, so Megatron-Core 0.20 on — main's 0.20.0 of 2026-07-29 … 08-18 did not have it yet)
    units_all = version_tuple(fw.megatron_core) >= (0, 20)
    return DdpRules(distributed_optimizer=tr.zero >= 1, bucket_size=bucket, pad_for_busbw=fw.ddp_pad_for_busbw,
                    tied_embeddings=tied, first_chunk_optimizer=split, fsdp=fw.fsdp_sharding,
                    fsdp_units_all=units_all,
                    layer_wise=fw.layer_wise_layout if tr.muon_layer_wise and tr.zero >= 1 else "")


def round_up(n: int, divisor: int) -> int:
    return -(-n // divisor) * divisor


def layout(params: Sequence[TensorDef], *, rules: DdpRules, group: int, bucket_size: int | None,
           shared: frozenset[str] = frozenset(), rank: int = 0) -> tuple[int, tuple[ParamSlot, ...]]:
    """(padded numel, slots) of one buffer holding ``params`` (in ``named_parameters()`` order) over
    a DP group of ``group`` ranks; ``shared``: names of shared-embedding parameters; ``rank``: the
    DP rank whose shard the slots carry."""
    dist = rules.distributed_optimizer
    end_div = math.lcm(group, BUCKET_END_ALIGN, *((BUSBW_ALIGN,) if rules.pad_for_busbw else ())) if dist else 1
    placed: list[tuple[str, int, int, int]] = []
    buckets: list[tuple[int, int]] = []
    start = bucket_start = 0
    in_bucket = 0
    end = 0
    for t in reversed(params):
        own = dist and t.name in shared
        if dist:
            start = round_up(start, PARAM_START_ALIGN)
        if own and in_bucket:
            buckets.append((bucket_start, round_up(start, end_div)))
            start = bucket_start = buckets[-1][1]
            in_bucket = 0
        end = start + t.numel
        placed.append((t.name, start, end, len(buckets)))
        in_bucket += 1
        if (bucket_size is not None and end - bucket_start >= bucket_size) or own:
            buckets.append((bucket_start, round_up(end, end_div)))
            start = bucket_start = buckets[-1][1]
            in_bucket = 0
        else:
            start = end
    if in_bucket:
        buckets.append((bucket_start, round_up(end, end_div)))
    numel = buckets[-1][1] if buckets else 0
    slots = []
    for name, s, e, b in placed:
        lo, hi = buckets[b]
        size = (hi - lo) // group
        r0, r1 = lo + rank * size, lo + (rank + 1) * size
        slots.append(ParamSlot(name, s, e, b, max(s, r0), min(e, r1)) if dist else ParamSlot(name, s, e, b))
    return numel, tuple(slots)


def shared_embeddings(chunks: Sequence[tuple[int, Sequence[TensorDef]]], num_chunks: int, tied: bool) -> frozenset[str]:
    """Names of the parameters Megatron marks ``shared_embedding`` (tied embeddings over more than
    one pipeline chunk: the first chunk's word embeddings, the last chunk's output layer or, where
    that reuses the embedding, its MTP embedding, and a standalone MTP stage's embedding; ``MC/models/common/language_module/
    language_module.py: LanguageModule.setup_embeddings_and_output_layer``)."""
    if not tied or num_chunks < 2:
        return frozenset()
    out = set()
    for c, ts in chunks:
        names = {t.name for t in ts}
        if c == 0 and "embedding.word_embeddings.weight" in names:
            out.add("embedding.word_embeddings.weight")
        if c == num_chunks - 1:
            out |= {"output_layer.weight"} & names or {n for n in names if n == "mtp.embedding.word_embeddings.weight"}
        elif c > 0:  # a standalone MTP stage's embedding (``mtp_process and not pre_process``, 5247a1f460)
            out |= {"mtp.embedding.word_embeddings.weight"} & names
    return frozenset(out)


def megatron_order(tensors: Sequence[TensorDef]) -> list[TensorDef]:
    """A chunk's trainable parameters in Megatron's ``named_parameters()`` order: GPTModel registers
    ``output_layer`` after the decoder and the MTP block (``MC/models/gpt/gpt_model.py: GPTModel.__init__``)."""
    trainable = [t for t in tensors if t.trainable]
    return [t for t in trainable if not t.name.startswith("output_layer.")] + \
        [t for t in trainable if t.name.startswith("output_layer.")]


def ddp_buffers(chunks: Sequence[tuple[int, Sequence[TensorDef]]], *, rules: DdpRules, tr: TrainingSpec,
                par: ParallelSpec, expert_rule: str, pp_rank: int, num_chunks: int) -> tuple[DdpBuffer, ...]:
    """Every buffer of one device, in creation order: per model chunk (``chunks``: (chunk, its
    tensors), in the device's chunk order), its dense buffer then its expert buffer. The shards are
    the last DP rank's (of the dense and of the expert group): the one whose shards hold each bucket's
    end padding, and the rank Megatron-LM logs memory on (global rank ``world_size − 1``, the last
    TP, CP and DP rank of the last stage); the other ranks' differ only by that padding."""
    dense_g, expert_g = zero_groups(tr, par)
    shared = shared_embeddings(chunks, num_chunks, rules.tied_embeddings)
    out = []
    for i, (c, ts) in enumerate(chunks):
        bucket = rules.bucket_size if i == 0 and pp_rank == 0 else None
        params = megatron_order(ts)
        for expert, group in ((False, dense_g), (True, expert_g)):
            for fp8 in (False, True):  # one buffer per (param dtype, grad dtype): FP8 parameters apart
                mine = [t for t in params if is_expert_state(t, expert_rule) == expert and (t.dtype == "fp8") == fp8]
                if not mine:
                    continue
                numel, slots = layout(mine, rules=rules, group=group, bucket_size=bucket, shared=shared,
                                      rank=group - 1)
                split = int(rules.first_chunk_optimizer)
                optimizer = 1 + split if expert else int(split and i > 0)
                # MXFP8 weights under --reuse-grad-buf-for-mxfp8-param-ag: no param buffer of their own — the
                # bf16 all-gather target is a view of the fp32 grad buffer and each weight keeps its MXFP8 data
                # (param_and_grad_buffer.py: _ParamAndGradBuffer.__init__ shared_buffer, 4e85d74ae9)
                out.append(DdpBuffer(chunk=c, expert=expert, numel=numel, group=group, slots=slots,
                                     optimizer=optimizer, fp8=fp8, param_buffer=not (fp8 and tr.mxfp8_reuse_grad_buf)))
    return tuple(out)
