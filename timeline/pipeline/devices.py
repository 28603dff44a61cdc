"""Devices and the chunks they hold: each pipeline rank's representative device.

Global ranks are ordered as Megatron orders them (tp fastest, then cp, dp, pp), so pipeline
rank ``r``'s representative device is global rank ``r·tp·cp·dp``; under balanced routing the
``tp·cp·dp`` devices of a pipeline rank are symmetric and the representative stands for all.
Which chunks a rank holds is the schedule's placement (:mod:`timeline.pipeline.placement`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from timeline.graph.build import build_chunk_graph, chunk_layers, graph_params
from timeline.graph.source import model_source
from timeline.graph.static import state_bytes
from timeline.graph.tensors import MODULES, TensorDef
from timeline.pipeline.placement import stage_placement
from timeline.spec.run import RunSpec


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

    @property
    def params_total(self) -> int:
        return sum(self.params_by_module.values())

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes


def device_tensors(run: RunSpec, pp_rank: int) -> tuple[tuple[int, ...], list[TensorDef]]:
    """(chunks, parameter TensorDefs) of pipeline rank ``pp_rank``'s representative device."""
    source = model_source(run)
    stages = stage_placement(run.schedule.kind, run.parallel.pp, run.parallel.vpp)[pp_rank]
    tensors: list[TensorDef] = []
    for chunk in stages:
        tensors += graph_params(build_chunk_graph(source.nodes(chunk), chunk))
    return stages, tensors


def static_devices(run: RunSpec) -> list[StaticDevice]:
    par = run.parallel
    ranges = chunk_layers(run.parallel, run.model.num_hidden_layers)
    stride = par.tp * par.cp * par.dp
    out = []
    for r in range(par.pp):
        stages, tensors = device_tensors(run, r)
        by_module = dict.fromkeys(MODULES, 0)
        for t in tensors:
            if t.trainable:
                by_module[t.module] += t.numel
        w, g, o = state_bytes(run, tensors)
        layers = tuple(i for c in sorted(stages) for i in ranges[c])
        out.append(StaticDevice(device=r * stride, pp_rank=r, stages=tuple(stages), represents=stride,
                                layers=layers, params_by_module=by_module, weights_bytes=w, grads_bytes=g,
                                optimizer_bytes=o, buffers=sum(t.numel for t in tensors if not t.trainable),
                                tensors=tuple(tensors)))
    return out
