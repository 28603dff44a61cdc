"""The ``megatron`` profile's static state under Megatron-FSDP, over the parameter groups of
:mod:`timeline.graph.fsdp_buffers`, and the plan of its all-gathers and gradient buckets that
:mod:`timeline.sim.fsdp_windows` turns into events (``MF`` = Megatron-LM's ``megatron/core/distributed/fsdp/src/
megatron_fsdp/`` at 4e85d74ae9 and d98e8a64dd, the ``megatron_fsdp`` package from af28b5a559, 2025-08-21; ``CF`` =
``megatron/core/distributed/custom_fsdp/`` before it, read at 194b2be238):

1. model construction makes each parameter on its own (``training.py: get_model``);
2. ``MF/param_and_grad_buffer.py: ParamAndGradBuffer._init_each_parameter_group_buffers``, group by group: the
   model-weight buffer (``torch.empty`` of the group, or of its shard under ``optim_grads_params``), then — sharded
   — a whole-group bucket from the temporary allocator (``fetch_bucket``), the fp32 main-weight buffer (the shard
   but under ``no_shard``), each parameter copied into its view and its own storage freed, and the sharded
   group's bucket freed (``free_bucket_storage``); then one main-grad buffer for all groups (``buffer_all_in_one``,
   fp32 under ``grad_reduce_in_fp32``);
3. the optimizer's parameters are the main-weight shards themselves (``_init_optimizer_named_parameters``: no
   clone); Adam's moments per shard in the first step (:mod:`timeline.sim.megatron_state`); each step's
   ``update_main_grads`` sets ``grad = main_grad.to(fp32)`` (a copy unless the grads are fp32);
4. the all-gathers (sharded weights, ``optim_grads_params``): every module's forward pre-hook gathers its own
   parameters' bucket groups (a unit's: all of them; another module's: ``parameters(recurse=False)``) and
   prefetches the following groups (``AllGatherPipeline.all_gather_params``); a unit's post-forward and
   post-backward hooks release its groups, a unit's pre-backward hook gathers it and prefetches the preceding
   ones; groups outside the units stay gathered until ``finish_grad_sync``'s ``synchronize_param_gather``
   (``AllGatherPipeline.reset``) before the step. The prefetch budget (``MegatronFSDP._init_fsdp_param_and_grad_
   buffer``): in the package ``suggested_communication_unit_size = max(1e9, 2 × the mean unit's elements)`` and
   groups are added while the prefetched ones (beyond the requested) hold fewer than half of it — for every
   unit below 500M elements, 500M elements ahead; in ``CF`` the unit size ``2 × mean`` itself, counting the
   requested groups (the requested unit and the next);
5. gradient buckets (sharded grads): a group's main gradient is a whole-group temporary from its first gradient
   (``_grad_acc`` → ``get_main_grad``) until its reduce-scatter is waited for; each group ready for reduction
   first pops the queue's oldest while it holds more than ``suggested_communication_unit_size`` elements
   (``GradReducePipeline.wait_for_previous_grad_reduce``: 1B in the package — in effect every unit of a
   backward —, two units in ``CF``), and the root post-backward hook drains it (``reset``) at the backward's end;
6. after the step, ``DistributedOptimizer.step_with_ready_grads`` calls ``start_param_sync`` per chunk: it gathers
   the first parameter's group (bucket 0) — in ``CF`` without prefetch, in the package with it
   (``prefetch=True``); in the package ``calc_params_l2_norm`` (``--log-params-norm``, ``megatron/training/
   utils.py``, later ``utils/common_utils.py``) then calls each chunk's ``stop_communication`` →
   ``synchronize_param_gather``, releasing every gathered group before ``training_log`` reads the memory.

A group outside the units takes its gradient bucket at the first backward op of one of its modules (the final
norm, or the output layer where its weight is its own; a tied embedding's gradient is accumulated by autograd
until the embedding's own backward) and keeps it to the backward's end.

Not modelled: ``--fsdp-double-buffer`` / ``--use-nccl-ub`` pools, FP8 transpose caches, Megatron-FSDP before
d677041da2 (its embedding was a unit), and within an action the exact moment of a unit's first gradient (taken
as its first op).
"""

from __future__ import annotations

from dataclasses import dataclass

from timeline.graph.dp_buffers import DdpBuffer
from timeline.graph.fsdp_buffers import SHARDED, grad_elements, weight_elements
from timeline.graph.static import optimizer_element_bytes
from timeline.graph.tensors import DTYPE_BYTES, Category
from timeline.placement.devices import StaticDevice
from timeline.sim.compiled import CAT_CODE
from timeline.spec.framework import FrameworkSpec
from timeline.spec.run import TrainingSpec

#: MF/megatron_fsdp.py: _init_fsdp_param_and_grad_buffer — the floor of suggested_communication_unit_size
PACKAGE_UNIT_ELEMENTS = 1_000_000_000

#: (created at, name, bytes, category code, +1 alloc / −1 free), as :data:`timeline.sim.megatron_state.StaticEvent`
Event = tuple[str, str, int, int, int]


def _weight_bytes(tr: TrainingSpec, b: DdpBuffer) -> int:
    return DTYPE_BYTES["fp8"] if b.fp8 else DTYPE_BYTES[tr.dtype]


def fsdp_events(tr: TrainingSpec, dev: StaticDevice) -> list[Event]:
    """Weights, model-weight, main-weight and main-grad buffers of one device, in creation order (the moments:
    :func:`timeline.sim.megatron_state.megatron_events`; the gathers and gradient buckets:
    :func:`fsdp_plan`)."""
    w_cat, g_cat, o_cat = CAT_CODE[Category.WEIGHTS], CAT_CODE[Category.GRADS], CAT_CODE[Category.OPTIMIZER]
    master, _ = optimizer_element_bytes(tr)
    sizes = {t.name: t.size_bytes if t.dtype == "fp8" or not t.trainable else t.numel * DTYPE_BYTES[tr.dtype]
             for t in dev.tensors}
    out: list[Event] = [("start", f"static.weights.{t.name}", sizes[t.name], w_cat, 1) for t in dev.tensors]
    for i, b in enumerate(dev.dp_buffers):
        pw = _weight_bytes(tr, b)
        sharded = SHARDED[b.fsdp][0] and b.group > 1
        out.append(("start", f"static.param_buffer.{i}.{b.label}", weight_elements(b) * pw, w_cat, 1))
        if sharded:
            out.append(("start", f"fsdp.init_bucket.{i}.{b.label}", b.numel * pw, w_cat, 1))
        if master:
            out.append(("start", f"static.master.{i}.{b.label}", sum(s.shard_numel for s in b.slots) * master, o_cat, 1))
        out += [("start", f"static.weights.{s.name}", sizes[s.name], w_cat, -1) for s in b.slots]
        if sharded:
            out.append(("start", f"fsdp.init_bucket.{i}.{b.label}", b.numel * pw, w_cat, -1))
    out.append(("start", "static.grad_buffer.fsdp", sum(grad_elements(b) for b in dev.dp_buffers)
                * DTYPE_BYTES[tr.grad_dtype], g_cat, 1))
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class FsdpGroup:
    """One bucket group of a model chunk: an FSDP unit's buckets, or one bucket outside any unit."""

    unit: str  # "layers.3", "mtp.0.layer"; "" outside any unit
    label: str
    #: the buckets' padded elements (``bucket_index.size``): what the prefetch budget and the queue count
    elements: int
    #: the unit's parameters' own elements (``p.numel()``): what the mean unit size counts
    param_elements: int
    weight_bytes: int  # gathered whole (0: its weights are not sharded)
    grad_bytes: int  # its whole gradient bucket (0: its grads are not sharded)
    #: the modules its parameters belong to (their names less the last part), whose backward ops make its grads
    modules: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class FsdpChunk:
    """One model chunk's ``MegatronFSDP``: its bucket groups in bucket order and its pipelines' budgets."""

    stage: int
    groups: tuple[FsdpGroup, ...]
    #: the all-gather prefetch budget in elements (None: one group ahead)
    prefetch_elements: int | None
    #: ``CF``: the budget counts the requested groups too; the package: only the prefetched ones
    prefetch_counts_requested: bool
    #: the reduce-scatter queue's capacity in elements (None: one reduce-scatter behind the next)
    queue_elements: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class FsdpPlan:
    """A device's Megatron-FSDP chunks, and what each step's ``start_param_sync`` gathers and keeps."""

    chunks: tuple[FsdpChunk, ...]
    #: the step's gather of bucket 0 prefetches (the package)
    step_prefetch: bool
    #: ``calc_params_l2_norm``'s ``stop_communication`` releases it right after the step
    released_after_step: bool

    def chunk(self, stage: int) -> FsdpChunk | None:
        return next((c for c in self.chunks if c.stage == stage), None)


def _groups(tr: TrainingSpec, bufs: list[DdpBuffer]) -> tuple[FsdpGroup, ...]:
    """The bucket groups of one chunk's buffers: a unit's buffers together, every other buffer alone."""
    out: list[FsdpGroup] = []
    for b in bufs:
        w = b.numel * _weight_bytes(tr, b) if SHARDED[b.fsdp][0] and b.group > 1 else 0
        g = b.numel * DTYPE_BYTES[tr.grad_dtype] if SHARDED[b.fsdp][1] and b.group > 1 else 0
        own = sum(s.end - s.start for s in b.slots)
        if b.unit and out and out[-1].unit == b.unit:
            last = out[-1]
            out[-1] = FsdpGroup(unit=b.unit, label=last.label, elements=last.elements + b.numel,
                                param_elements=last.param_elements + own, weight_bytes=last.weight_bytes + w,
                                grad_bytes=last.grad_bytes + g)
        else:
            modules = tuple(dict.fromkeys(s.name.rsplit(".", 1)[0] for s in b.slots))
            out.append(FsdpGroup(unit=b.unit, label=b.label, elements=b.numel, param_elements=own, weight_bytes=w,
                                 grad_bytes=g, modules=() if b.unit else modules))
    return tuple(out)


def fsdp_plan(tr: TrainingSpec, dev: StaticDevice, fw: FrameworkSpec, bucket_size: int | None) -> FsdpPlan | None:
    """The all-gather and gradient-bucket plan of a Megatron-FSDP device (None: not Megatron-FSDP, or nothing
    sharded that a step gathers); ``bucket_size``: ``DdpRules.bucket_size``."""
    bufs = dev.dp_buffers
    if not bufs or not bufs[0].fsdp or bufs[0].fsdp == "no_shard":
        return None
    chunks = []
    for k, stage in enumerate(sorted({b.chunk for b in bufs})):
        groups = _groups(tr, [b for b in bufs if b.chunk == stage])
        units = [g for g in groups if g.unit]
        # the mean unit size over the chunk's units (MF and CF: optim_grads_params; else the bucket size)
        size = 2 * (sum(g.param_elements for g in units) // len(units)) if units and bufs[0].fsdp == \
            "optim_grads_params" else None
        bucket = bucket_size if k == 0 else None  # get_model: disable_bucketing for the later chunks
        if fw.megatron_fsdp_package:
            unit = max(PACKAGE_UNIT_ELEMENTS, size if size is not None else bucket or PACKAGE_UNIT_ELEMENTS)
            chunks.append(FsdpChunk(stage=stage, groups=groups, prefetch_elements=unit // 2,
                                    prefetch_counts_requested=False, queue_elements=unit))
        else:
            unit_cf = size if size is not None else (2 * bucket if bucket else None)
            chunks.append(FsdpChunk(stage=stage, groups=groups, prefetch_elements=unit_cf,
                                    prefetch_counts_requested=True, queue_elements=unit_cf))
    return FsdpPlan(chunks=tuple(chunks), step_prefetch=fw.megatron_fsdp_package,
                    released_after_step=fw.megatron_fsdp_package and fw.log_params_norm)
