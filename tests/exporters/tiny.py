"""The exporter tests' run: pp=2, 4 micro-batches, 2 iterations, on a synthetic template with a
compute and a tensor-parallel stream, a recompute op and every category, under the caching
allocator so segments and fragmentation show. A plain module so ``tools/regen_goldens.py``
builds exactly what the golden tests compare against."""

from __future__ import annotations

import sys
from pathlib import Path

from timeline.graph.ops import ChunkTemplate, Op
from timeline.graph.tensors import Category, TensorDef
from timeline.result.build import build_timeline
from timeline.spec.run import RunSpec

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "tests") not in sys.path:  # helpers_run and sources, also when tools/regen_goldens.py imports this file
    sys.path.insert(0, str(ROOT / "tests"))
import helpers_run  # noqa: E402
from sources import template_source  # noqa: E402

GOLDEN = Path(__file__).resolve().parent / "golden"

MIB = 1 << 20


def _t(name: str, size: int, cat: Category, module: str) -> TensorDef:
    return TensorDef(name=name, shape=(size,), dtype="uint8", category=cat, module=module, storage=name)


def _synthetic_template(run: RunSpec, chunk: int, pp_rank: int | None = None) -> ChunkTemplate:
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


synthetic_template = template_source(_synthetic_template)


def tiny_run(pp: int = 2, m: int = 4, allocator: str = "caching", capacity_gib: float = 80.0,
             expandable: bool = False) -> RunSpec:
    """The tests' tiny run (``tests/helpers_run.py``) with tp = 2, so a TP stream shows; the
    distributed optimizer over dp = 1 (the same bytes as none: each parameter's whole is its shard)."""
    return helpers_run.tiny_run(pp=pp, tp=2, num_microbatches=m, allocator=allocator, capacity_gib=capacity_gib,
                                expandable_segments=expandable, zero=1)


#: golden file name → (format, options); the proto golden needs the optional perfetto package
GOLDENS: dict[str, tuple[str, dict]] = {
    "trace.json": ("trace", {}),
    "trace_max_samples_16.json": ("trace", {"max_samples": 16}),
    "trace.perfetto-trace": ("perfetto", {}),
    "snapshot.pickle": ("snapshot", {}),
    "summary.json": ("summary", {}),
    "memory.parquet": ("memory", {}),
    "events.parquet": ("events", {}),
    "ops.parquet": ("ops", {}),
    "devices.parquet": ("devices", {}),
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
