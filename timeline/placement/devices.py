"""Devices and the chunks they hold: each pipeline rank's representative device.

Global ranks are ordered as Megatron orders them (tp fastest, then cp, dp, pp), so pipeline
rank ``r``'s representative device is global rank ``r·tp·cp·dp``; under balanced routing the
``tp·cp·dp`` devices of a pipeline rank are symmetric and the representative stands for all.
Which chunks a rank holds is the schedule's placement (:mod:`timeline.pipeline.placement`); the
bytes of the static state come from :func:`timeline.graph.static.state_bytes`, once per device.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from timeline.graph.build import chunk_layers, node_params
from timeline.graph.dp_buffers import DdpBuffer, DdpRules, ddp_buffers
from timeline.graph.fsdp_buffers import fsdp_buffers, grad_elements, weight_elements
from timeline.graph.layer_wise_buffers import layer_wise_buffers
from timeline.graph.optim_state import main_params
from timeline.graph.source import ModelSource
from timeline.graph.static import optimizer_element_bytes, state_bytes
from timeline.graph.tensors import DTYPE_BYTES, MODULES, TensorDef
from timeline.profiles.megatron_fp8 import is_fp8_weight
from timeline.spec.run import ParallelSpec, TrainingSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class StaticDevice:
    device: int
    pp_rank: int
    stages: tuple[int, ...]
    represents: int
    layers: tuple[int, ...]
    params_by_module: dict[str, int]
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    buffers: int = 0
    tensors: tuple[TensorDef, ...] = field(default=(), repr=False)
    #: Megatron's param/grad buffers (:mod:`timeline.graph.dp_buffers`; empty outside the profiles that lay them out)
    dp_buffers: tuple[DdpBuffer, ...] = field(default=(), repr=False)

    @property
    def params_total(self) -> int:
        return sum(self.params_by_module.values())

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes


def chunk_params(source: ModelSource, chunks: Iterable[int]) -> dict[int, list[TensorDef]]:
    """Each chunk's parameter TensorDefs in dataflow order, read once (a chunk DualPipe places on two
    ranks is read once)."""
    return {c: node_params(source.nodes(c)) for c in dict.fromkeys(chunks)}


def optimizer_bytes(tr: TrainingSpec, tensors: Sequence[TensorDef], buffers: Sequence[DdpBuffer],
                    expert_rule: str) -> int:
    """Master weights and optimizer states of a device's main parameters, or owned shards
    (:func:`timeline.graph.optim_state.main_params`)."""
    master, _ = optimizer_element_bytes(tr)
    return sum(k * (master + sum(b for _, b in states)) for _, k, states in main_params(tensors, buffers, tr, expert_rule))


def buffer_bytes(tr: TrainingSpec, tensors: Sequence[TensorDef], buffers: Sequence[DdpBuffer],
                 distributed_optimizer: bool, expert_rule: str) -> tuple[int, int, int]:
    """(weights, grads, optimizer) bytes of a device whose parameters live in Megatron's ``buffers``:
    the padded grad buffers; the padded param buffers under the distributed optimizer (else each
    parameter on its own); master weights and optimizer states per main parameter, or per owned shard
    (:func:`timeline.graph.optim_state.main_params`)."""
    w = DTYPE_BYTES[tr.dtype]
    nbuf = sum(t.size_bytes for t in tensors if not t.trainable)
    grads = sum(b.numel for b in buffers) * DTYPE_BYTES[tr.grad_dtype]
    weights = sum(b.numel if distributed_optimizer and b.param_buffer else sum(s.end - s.start for s in b.slots)
                  for b in buffers) * w
    return weights + nbuf, grads, optimizer_bytes(tr, tensors, buffers, expert_rule)


def fsdp_bytes(tr: TrainingSpec, tensors: Sequence[TensorDef], buffers: Sequence[DdpBuffer],
               expert_rule: str) -> tuple[int, int, int]:
    """(weights, grads, optimizer) bytes of a device under Megatron-FSDP (:mod:`timeline.graph.fsdp_buffers`): its
    persistent model-weight and main-grad buffers, and main weights and optimizer states per owned shard
    (:func:`timeline.graph.optim_state.main_params`)."""
    nbuf = sum(t.size_bytes for t in tensors if not t.trainable)
    weights = sum(weight_elements(b) * (DTYPE_BYTES["fp8"] if b.fp8 else DTYPE_BYTES[tr.dtype]) for b in buffers)
    grads = sum(grad_elements(b) for b in buffers) * DTYPE_BYTES[tr.grad_dtype]
    return weights + nbuf, grads, optimizer_bytes(tr, tensors, buffers, expert_rule)


def static_devices(source: ModelSource, stages_of_rank: Sequence[Sequence[int]], *, parallel: ParallelSpec,
                   training: TrainingSpec, num_layers: int, expert_state_group: str,
                   ddp: DdpRules | None = None) -> list[StaticDevice]:
    """Each pipeline rank's representative device with its static state; ``stages_of_rank``: the
    schedule's placement (:func:`timeline.pipeline.placement.stage_placement`, or a CSV schedule's
    own); ``expert_state_group``: the profile's rule for which states shard over EDP; ``ddp``:
    Megatron's buffer layout rules, where the profile lays its state out so (else flat ZeRO shards)."""
    par = parallel
    ranges = chunk_layers(par, num_layers)
    stride = par.tp * par.cp * par.dp
    placed = stages_of_rank
    params = chunk_params(source, (c for st in placed for c in st))
    if training.fp8_param_gather:  # the TE linears' weights are FP8 parameters (profiles/megatron_fp8.py)
        bf16 = (training.fp8_bf16_first_layers, training.fp8_bf16_last_layers, num_layers)
        params = {c: [replace(t, dtype="fp8") if is_fp8_weight(t.name, t.shape, *bf16) else t for t in ts]
                  for c, ts in params.items()}
    out = []
    for r in range(par.pp):
        stages = tuple(placed[r])
        # Megatron builds a rank's model chunks in virtual-stage order (``get_model``), whatever order the
        # schedule uses them in
        tensors = [t for c in (sorted(stages) if ddp is not None else stages) for t in params[c]]
        by_module = dict.fromkeys(MODULES, 0)
        for t in tensors:
            if t.trainable:
                by_module[t.module] += t.numel
        bufs: tuple[DdpBuffer, ...] = ()
        if ddp is None:
            w, g, o = state_bytes(training, par, expert_state_group, tensors)
        else:
            if ddp.fsdp:
                bufs = fsdp_buffers([(c, params[c]) for c in sorted(stages)], strategy=ddp.fsdp,
                                    bucket_size=ddp.bucket_size, tr=training, par=par, expert_rule=expert_state_group,
                                    units_all=ddp.fsdp_units_all)
                w, g, o = fsdp_bytes(training, tensors, bufs, expert_state_group)
            else:
                lay = layer_wise_buffers if ddp.layer_wise else ddp_buffers
                bufs = lay([(c, params[c]) for c in sorted(stages)], rules=ddp, tr=training, par=par,
                           expert_rule=expert_state_group, pp_rank=r,
                           num_chunks=1 + max(c for st in placed for c in st))
                w, g, o = buffer_bytes(training, tensors, bufs, ddp.distributed_optimizer, expert_state_group)
        layers = tuple(i for c in sorted(stages) for i in ranges[c])
        out.append(StaticDevice(device=r * stride, pp_rank=r, stages=stages, represents=stride,
                                layers=layers, params_by_module=by_module, weights_bytes=w, grads_bytes=g,
                                optimizer_bytes=o, buffers=sum(t.numel for t in tensors if not t.trainable),
                                tensors=tuple(tensors), dp_buffers=bufs))
    return out


def chunk_holders(stages_of_rank: Sequence[Sequence[int]]) -> dict[int, int]:
    """Chunk → the pipeline rank whose templates stand for it: the first rank holding it (under
    DualPipe every chunk lives on two ranks)."""
    return {c: r for r in reversed(range(len(stages_of_rank))) for c in stages_of_rank[r]}


def ep_devices(devices: Sequence[StaticDevice], par: ParallelSpec, num_loads: int) -> list[StaticDevice]:
    """The simulated devices: each pipeline rank's representative, or — with ``num_loads`` > 1
    simulated EP loads (skewed routing) — one device per EP rank, each standing for its
    ``tp·cp·dp / ep`` devices, the busiest first."""
    if num_loads == 1:
        return list(devices)
    stride = par.tp * par.cp * par.dp
    return [replace(dev, device=dev.device + e * (stride // par.ep), represents=stride // par.ep)
            for dev in devices for e in range(num_loads)]
