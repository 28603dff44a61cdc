"""The ``megatron`` profile's static state and per-action gathers under Megatron-FSDP, over the parameter groups of
:mod:`timeline.graph.fsdp_buffers` (``MF`` = Megatron-LM d98e8a64dd ``megatron/core/distributed/fsdp/src/
megatron_fsdp/``; the same code paths at 0dd841a7d9 ``megatron/core/distributed/custom_fsdp/``):

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
4. under ``optim_grads_params`` the groups outside the FSDP units are all-gathered by their modules' forward
   pre-hooks (``MF/megatron_fsdp.py: _pre_forward`` — ``parameters(recurse=False)``) and released only by
   ``finish_grad_sync``'s ``AllGatherPipeline.reset``, and the optimizer step re-gathers bucket 0
   (``start_param_sync``: ``queue_bucket_to_all_gather(bucket_id=0)``), so they are held as persistent here;
5. per action: a unit's forward gathers it and prefetches the next (``queue_bucket_to_all_gather(prefetch=True)``
   with ``suggested_AG_prefetch_size`` None: one bucket ahead), its post-forward hook releases it — two units'
   whole buckets live; its backward the same in backward order, and under ``optim_grads*`` each unit's
   main-grad bucket is a whole-group temporary (``DataParallelBuffer.fetch_bucket``) until its reduce-scatter
   has run, one reduce-scatter waited for behind the next (``GradReducePipeline.wait_for_previous_grad_reduce``,
   queue size 1): two units' grad buckets; a non-unit group's grad bucket is taken at its first gradient (the
   final norm, first in backward) and reduced at its last (the embedding): the whole backward.

Not modelled: the all-gathers' and reduce-scatters' positions inside an action (the action holds the largest
unit's buffers throughout), ``--fsdp-double-buffer`` / ``--use-nccl-ub`` pools, FP8 transpose caches, and
Megatron-FSDP before d677041da2 (its embedding was a unit).
"""

from __future__ import annotations

from timeline.graph.dp_buffers import DdpBuffer
from timeline.graph.fsdp_buffers import SHARDED, grad_elements, weight_elements
from timeline.graph.static import optimizer_element_bytes
from timeline.graph.tensors import DTYPE_BYTES, Category
from timeline.placement.devices import StaticDevice
from timeline.sim.compiled import CAT_CODE
from timeline.spec.run import TrainingSpec

#: (created at, name, bytes, category code, +1 alloc / −1 free), as :data:`timeline.sim.megatron_state.StaticEvent`
Event = tuple[str, str, int, int, int]


def _weight_bytes(tr: TrainingSpec, b: DdpBuffer) -> int:
    return DTYPE_BYTES["fp8"] if b.fp8 else DTYPE_BYTES[tr.dtype]


def fsdp_events(tr: TrainingSpec, dev: StaticDevice) -> list[Event]:
    """Weights, model-weight, main-weight and main-grad buffers and the gathered non-unit groups of one device,
    in creation order (the moments: :func:`timeline.sim.megatron_state.megatron_events`)."""
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
    comm = CAT_CODE[Category.COMM]
    out += [("start", f"fsdp.gathered.{i}.{b.label}", b.numel * _weight_bytes(tr, b), comm, 1)
            for i, b in enumerate(dev.dp_buffers) if not b.unit and SHARDED[b.fsdp][0] and b.group > 1]
    return out


def _unit_bytes(dev: StaticDevice, per_buffer: dict[int, int]) -> list[int]:
    units: dict[tuple[int, str], int] = {}
    for i, b in enumerate(dev.dp_buffers):
        if b.unit:
            units[(b.chunk, b.unit)] = units.get((b.chunk, b.unit), 0) + per_buffer[i]
    return sorted(units.values(), reverse=True)


def gathered_bytes(tr: TrainingSpec, dev: StaticDevice) -> tuple[int, int]:
    """(forward, backward) bytes one action holds besides its template: the whole buckets of two FSDP units'
    weights (sharded weights), and in backward two units' grad buckets and every non-unit group's (sharded
    grads)."""
    bufs = dev.dp_buffers
    if not bufs or not bufs[0].fsdp:
        return 0, 0
    weights = {i: b.numel * _weight_bytes(tr, b) if SHARDED[b.fsdp][0] and b.group > 1 else 0
               for i, b in enumerate(bufs)}
    grads = {i: b.numel * DTYPE_BYTES[tr.grad_dtype] if SHARDED[b.fsdp][1] and b.group > 1 else 0
             for i, b in enumerate(bufs)}
    fwd = sum(_unit_bytes(dev, weights)[:2])
    bwd = fwd + sum(_unit_bytes(dev, grads)[:2]) + sum(grads[i] for i, b in enumerate(bufs) if not b.unit)
    return fwd, bwd
