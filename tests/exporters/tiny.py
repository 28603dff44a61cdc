"""The exporter tests' run: pp=2, 4 micro-batches, 2 iterations, on a synthetic template with a
compute and a tensor-parallel stream, a recompute op and every category, under the caching
allocator so segments and fragmentation show. A plain module so ``tools/regen_goldens.py``
builds exactly what the golden tests compare against."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from timeline.graph.ops import ChunkTemplate, Op
from timeline.graph.tensors import Category, TensorDef
from timeline.result.build import build_timeline
from timeline.spec.presets import PRESETS
from timeline.spec.run import (
    AllocatorSpec,
    HardwareSpec,
    ParallelSpec,
    RecomputeSpec,
    RunSpec,
    ScheduleSpec,
    TrainingSpec,
)

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"

MIB = 1 << 20


def _t(name: str, size: int, cat: Category, module: str) -> TensorDef:
    return TensorDef(name=name, shape=(size,), dtype="uint8", category=cat, module=module, storage=name)


def synthetic_template(run: RunSpec, chunk: int, pp_rank: int | None = None) -> ChunkTemplate:
    """One decoder layer per chunk: attention with a TP all-gather, an MLP, a recomputed norm."""
    m = f"layers.{chunk}"
    fwd = (
        Op(name=f"{m}.attn", module=f"{m}.self_attn", layer=chunk, flops=2e9,
           allocs=(_t("x", 3 * MIB, Category.ACTIVATIONS, m), _t("t", MIB + 100, Category.TEMPORARY, m)),
           frees=("t",)),
        Op(name=f"{m}.all_gather", module=f"{m}.self_attn", layer=chunk, kind="collective", stream="tp",
           bytes_moved=4e6, allocs=(_t("ag", 2 * MIB, Category.COMM, m),), frees=("ag",)),
        Op(name=f"{m}.mlp", module=f"{m}.mlp", layer=chunk, flops=1e9,
           allocs=(_t("h", 5 * MIB + 3, Category.ACTIVATIONS, m),)),
    )
    bi = (
        Op(name=f"{m}.norm", module=f"{m}.norm", layer=chunk, flops=1e8, recompute=True,
           allocs=(_t("r", 700_000, Category.RECOMPUTE, m),)),
        Op(name=f"{m}.mlp.backward", module=f"{m}.mlp", layer=chunk, flops=2e9,
           allocs=(_t("g", MIB, Category.TEMPORARY, m),), frees=("g", "h", "r")),
        Op(name=f"{m}.reduce_scatter", module=f"{m}.self_attn", layer=chunk, kind="collective", stream="tp",
           bytes_moved=4e6, allocs=(_t("rs", 2 * MIB, Category.COMM, m),), frees=("rs",)),
    )
    bw = (Op(name=f"{m}.attn.backward_w", module=f"{m}.self_attn", layer=chunk, flops=2e9, frees=("x",)),)
    return ChunkTemplate(chunk=chunk, forward=fwd, backward_i=bi, backward_w=bw,
                         layer_activation_bytes={chunk: 8 * MIB + 3})


def tiny_run(pp: int = 2, m: int = 4, allocator: str = "caching", capacity_gib: float = 80.0,
             expandable: bool = False) -> RunSpec:
    model = replace(PRESETS["llama3-8b"], num_hidden_layers=pp, hidden_size=256, num_attention_heads=8,
                    num_key_value_heads=8, intermediate_size=512, vocab_size=1024)
    return RunSpec(name="tiny", source="-", model=model, profile="megatron", model_source="test",
                   parallel=ParallelSpec(pp=pp, tp=2), training=TrainingSpec(num_microbatches=m, seq_len=128,
                                                                             iterations=2),
                   recompute=RecomputeSpec(), schedule=ScheduleSpec(kind="1f1b"),
                   allocator=AllocatorSpec(kind=allocator, expandable_segments=expandable),
                   hardware=replace(HardwareSpec(), capacity_gib=capacity_gib))




#: golden file name → (format, options); the proto golden needs the optional perfetto package
GOLDENS: dict[str, tuple[str, dict]] = {
    "trace.json": ("trace", {}),
    "trace_max_samples_16.json": ("trace", {"max_samples": 16}),
    "trace.perfetto-trace": ("perfetto", {}),
    "snapshot.pickle": ("snapshot", {}),
}


def golden_bytes(name: str) -> bytes:
    """What the exporter writes today for golden file ``name`` (the OOM run, so every kind of
    event is in the files)."""
    import importlib
    import io

    from timeline.exporters import EXPORTERS

    fmt, options = GOLDENS[name]
    tl = build_timeline(tiny_run(capacity_gib=40 / 1024), synthetic_template)
    buf = io.BytesIO()
    importlib.import_module(EXPORTERS[fmt]).write(tl, buf, options)
    return buf.getvalue()
