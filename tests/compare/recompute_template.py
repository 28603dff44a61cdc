"""A synthetic recompute-aware op template and a tiny run, for testing compare and fit
mechanics without the real activation model.

Every decoder layer saves its input ``x`` (1 MiB) and one tensor per module — layernorm 1 MiB,
core_attn 8 MiB, mlp 6 MiB — made by a compute-only op (no bytes moved, so its duration is its
FLOPs over the cost model's throughput). Selective recompute of a module keeps its tensor
transient in the forward and re-creates it just before its backward; full recompute keeps
only each group's input and re-creates the whole group before its backward (``uniform``:
groups of N layers; ``block``: the first N layers, one by one).
"""

from __future__ import annotations

import helpers_run
from sources import template_source

from timeline.graph.build import chunk_layers
from timeline.graph.ops import ChunkTemplate, Op
from timeline.graph.tensors import Category, TensorDef
from timeline.pipeline.placement import stage_placement
from timeline.spec.run import RecomputeSpec, RunSpec

MIB = 1 << 20
X_BYTES = MIB
MODULES = (("layernorm", 1 * MIB, 2e8), ("core_attn", 8 * MIB, 2e9), ("mlp", 6 * MIB, 6e9))
LAYER_FLOPS = sum(f for _, _, f in MODULES)


def _t(storage: str, size: int, cat: Category) -> TensorDef:
    return TensorDef(name=storage, shape=(size,), dtype="uint8", category=cat, module="m", storage=storage)


def _groups(run: RunSpec, chunk: int, layers: list[int], rank: int | None) -> list[list[int]]:
    rc = run.recompute
    if rc.policy != "full":
        return []
    if rank is None:
        rank = next(r for r, st in enumerate(stage_placement(run.schedule.kind, run.parallel.pp, run.parallel.vpp))
                    if chunk in st)
    n = rc.num_layers if isinstance(rc.num_layers, int) else rc.num_layers[rank]
    if n <= 0:
        return []
    if rc.method == "uniform":
        return [layers[i:i + n] for i in range(0, len(layers), n)]
    return [[x] for x in layers[:n]]


def _recompute_template(run: RunSpec, chunk: int, *, pp_rank: int | None = None) -> ChunkTemplate:
    layers = list(chunk_layers(run.parallel, run.model.num_hidden_layers)[chunk])
    group = {x: g for g in _groups(run, chunk, layers, pp_rank) for x in g}
    sel = set(run.recompute.modules) if run.recompute.policy == "selective" else set()
    fwd: list[Op] = []
    bwd: list[Op] = []
    saved: dict[int, int] = {}
    for x in layers:
        g = group.get(x)
        keep_x = g is None or x == g[0]
        cat = Category.ACTIVATIONS if keep_x else Category.TEMPORARY
        fwd.append(Op(name=f"in.{x}", module="m", layer=x, allocs=(_t(f"x.{x}", X_BYTES, cat),),
                      frees=() if keep_x else (f"x.{x}",)))
        saved[x] = X_BYTES if keep_x else 0
        for mod, size, flops in MODULES:
            keep = g is None and mod not in sel
            fwd.append(Op(name=f"f.{x}.{mod}", module="m", layer=x, flops=flops,
                          allocs=(_t(f"a.{x}.{mod}", size, Category.ACTIVATIONS if keep else Category.TEMPORARY),),
                          frees=() if keep else (f"a.{x}.{mod}",)))
            saved[x] += size if keep else 0
    for x in reversed(layers):
        g = group.get(x)
        if g is not None and x == g[-1]:  # re-run the whole group's forward before its backward
            for y in g:
                if y != g[0]:
                    bwd.append(Op(name=f"r.in.{y}", module="m", layer=y, recompute=True,
                                  allocs=(_t(f"rx.{y}", X_BYTES, Category.RECOMPUTE),)))
                for mod, size, flops in MODULES:
                    bwd.append(Op(name=f"r.{y}.{mod}", module="m", layer=y, flops=flops, recompute=True,
                                  allocs=(_t(f"ra.{y}.{mod}", size, Category.RECOMPUTE),)))
        for mod, size, flops in reversed(MODULES):
            redo = g is not None or mod in sel
            if g is None and mod in sel:
                bwd.append(Op(name=f"r.{x}.{mod}", module="m", layer=x, flops=flops, recompute=True,
                              allocs=(_t(f"ra.{x}.{mod}", size, Category.RECOMPUTE),)))
            bwd.append(Op(name=f"b.{x}.{mod}", module="m", layer=x, flops=flops,
                          frees=(f"ra.{x}.{mod}" if redo else f"a.{x}.{mod}",)))
        bwd.append(Op(name=f"b.in.{x}", module="m", layer=x,
                      frees=(f"rx.{x}" if g is not None and x != g[0] else f"x.{x}",)))
    bw = tuple(Op(name=f"w.{x}", module="m", layer=x, flops=LAYER_FLOPS) for x in layers)
    return ChunkTemplate(chunk=chunk, forward=tuple(fwd), backward_i=tuple(bwd), backward_w=bw,
                         layer_activation_bytes=saved)


recompute_template = template_source(_recompute_template)


def tiny_run(pp: int = 2, layers_per_rank: int = 2, m: int = 4, allocator: str = "caching",
             recompute: RecomputeSpec | None = None, capacity_gib: float = 80.0) -> RunSpec:
    """The tests' tiny run (``tests/helpers_run.py``) with several layers per rank and one iteration;
    without Megatron's library workspaces, so that the synthetic template's bytes are all there is, and
    with the distributed optimizer over dp = 1 (the same bytes as none: each parameter's whole is its shard)."""
    return helpers_run.tiny_run(layers=pp * layers_per_rank, pp=pp, num_microbatches=m, iterations=1,
                                allocator=allocator, recompute=recompute, capacity_gib=capacity_gib,
                                workspaces=False, zero=1)
