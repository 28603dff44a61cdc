"""Read and write a captured op trace (:class:`~timeline.spec.trace.CapturedTrace`) as Parquet.

One row per aten op (index, name, module, phase, layer, FLOPs, and list columns: storages it
allocates, reads, frees and saves; its output tensors' storage, shape, dtype and bytes). The
file's key-value metadata ``timeline.trace`` holds a JSON document with the schema version
(:data:`~timeline.spec.trace.TRACE_SCHEMA`), the provenance (torch and transformers versions,
model config, micro-batch size, sequence length, the capture command) and the small tables:
storages (columnar), parameters and decoder-layer boundaries. pyarrow is imported inside the
functions so ``import timeline`` stays light.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from timeline.errors import UserError
from timeline.io.hf_config import model_from_hf_dict
from timeline.spec.model import ModelSpec
from timeline.spec.run import RunSpec
from timeline.spec.trace import (
    NO_SELECTIVE,
    TRACE_SCHEMA,
    CapturedTrace,
    TraceLayer,
    TraceOp,
    TraceParam,
    TraceStorage,
    TraceTensor,
)
from timeline.spec.trace_shard import shard_problems

META_KEY = b"timeline.trace"
_STORAGE_COLS = ("id", "nbytes", "kind", "alloc_op", "free_op", "saved", "saved_by", "role")


def write_trace(trace: CapturedTrace, path: str | Path) -> None:
    """Write ``trace`` to ``path`` (zstd-compressed Parquet); the same trace gives the same bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ops = trace.ops
    cols: dict[str, Any] = {
        "index": pa.array([o.index for o in ops], pa.int32()),
        "name": pa.array([o.name for o in ops], pa.string()),
        "module": pa.array([o.module for o in ops], pa.string()),
        "phase": pa.array([o.phase for o in ops], pa.string()),
        "layer": pa.array([o.layer for o in ops], pa.int32()),
        "step": pa.array([o.step for o in ops], pa.int32()),
        "flops": pa.array([o.flops for o in ops], pa.float64()),
    }
    for key in ("allocs", "inputs", "frees", "saves"):
        cols[key] = pa.array([list(getattr(o, key)) for o in ops], pa.list_(pa.int64()))
    cols["out_storage"] = pa.array([[t.storage for t in o.outputs] for o in ops], pa.list_(pa.int64()))
    cols["out_shape"] = pa.array([[list(t.shape) for t in o.outputs] for o in ops], pa.list_(pa.list_(pa.int64())))
    cols["out_dtype"] = pa.array([[t.dtype for t in o.outputs] for o in ops], pa.list_(pa.string()))
    cols["out_nbytes"] = pa.array([[t.nbytes for t in o.outputs] for o in ops], pa.list_(pa.int64()))
    storages = [trace.storages[k] for k in sorted(trace.storages)]
    meta = {
        "schema": TRACE_SCHEMA,
        "provenance": trace.provenance,
        "storages": {c: [getattr(s, c) for s in storages] for c in _STORAGE_COLS},
        "params": [{"name": p.name, "shape": list(p.shape), "dtype": p.dtype, "nbytes": p.nbytes,
                    "layer": p.layer, "trainable": p.trainable, "storage": p.storage} for p in trace.params],
        "layers": [{"index": ly.index, "module": ly.module, "hidden_in": ly.hidden_in, "hidden_out": ly.hidden_out,
                    "grad_in": ly.grad_in, "grad_out": ly.grad_out} for ly in trace.layers],
    }
    table = pa.table(cols).replace_schema_metadata({META_KEY: json.dumps(meta, sort_keys=True).encode()})
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, str(path), compression="zstd")


def read_trace_provenance(path: str | Path) -> dict[str, Any]:
    """Only the provenance (cheap: reads the footer)."""
    return _meta(path)["provenance"]


def read_trace(path: str | Path) -> CapturedTrace:
    """Read a trace written by :func:`write_trace`; a UserError for a missing, foreign or newer file."""
    import pyarrow.parquet as pq

    meta = _meta(path)
    cols = pq.read_table(str(path)).to_pydict()
    ops = []
    steps = cols.get("step") or [0] * len(cols["index"])  # files written before whole-step captures
    for i in range(len(cols["index"])):
        outputs = tuple(TraceTensor(storage=s, shape=tuple(sh), dtype=dt, nbytes=nb) for s, sh, dt, nb in zip(
            cols["out_storage"][i], cols["out_shape"][i], cols["out_dtype"][i], cols["out_nbytes"][i], strict=True))
        ops.append(TraceOp(index=cols["index"][i], name=cols["name"][i], module=cols["module"][i],
                           phase=cols["phase"][i], layer=cols["layer"][i], flops=cols["flops"][i], outputs=outputs,
                           allocs=tuple(cols["allocs"][i]), inputs=tuple(cols["inputs"][i]),
                           frees=tuple(cols["frees"][i]), saves=tuple(cols["saves"][i]), step=steps[i]))
    st = meta["storages"]
    st.setdefault("role", [""] * len(st["id"]))
    storages = {row[0]: TraceStorage(**dict(zip(_STORAGE_COLS, row, strict=True)))
                for row in zip(*(st[c] for c in _STORAGE_COLS), strict=True)}
    params = tuple(TraceParam(**{**p, "shape": tuple(p["shape"])}) for p in meta["params"])
    layers = tuple(TraceLayer(**ly) for ly in meta["layers"])
    return CapturedTrace(ops=tuple(ops), storages=storages, params=params, layers=layers,
                         provenance=meta["provenance"])


def _meta(path: str | Path) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such trace file")
    try:
        raw = (pq.read_schema(str(path)).metadata or {}).get(META_KEY)
    except pa.ArrowInvalid as exc:
        raise UserError(f"{path}: not a Parquet file ({exc})") from None
    if raw is None:
        raise UserError(f"{path}: not a timeline trace (no {META_KEY.decode()} metadata); "
                        "write one with `timeline capture`")
    meta = json.loads(raw)
    if meta.get("schema") != TRACE_SCHEMA:
        raise UserError(f"{path}: trace schema {meta.get('schema')!r}, this timeline reads {TRACE_SCHEMA!r}; "
                        "capture it again with this version")
    return meta


def trace_model(trace: CapturedTrace, name: str) -> ModelSpec:
    """The ModelSpec a trace run starts from: the captured config (HF captures) or, for a plain
    module, its hidden size and layer count; ``num_hidden_layers`` defaults to the captured layers."""
    prov = trace.provenance
    layers = len(trace.layers) or 1  # a whole-step trace runs its model as one piece
    config = prov.get("config")
    if isinstance(config, dict):
        model = model_from_hf_dict(config, name=name)
        return model.with_(num_hidden_layers=layers, mtp_layers=0)
    return ModelSpec(name=name, model_type=str(prov.get("model_type", "custom")), num_hidden_layers=layers,
                     hidden_size=int(prov.get("hidden_size") or 1), num_attention_heads=1,
                     intermediate_size=1)


def capture_command(prov: dict[str, Any], micro_batch_size: int, seq_len: int, dtype: str) -> str:
    """The ``timeline capture`` command that records the same model at other sizes."""
    src = prov.get("capture_args") or "--hf-config CONFIG.json"
    stem = str(prov.get("name") or "trace")
    return (f"timeline capture {src} --micro-batch-size {micro_batch_size} --seq-len {seq_len} --dtype {dtype} "
            f"-o traces/{stem}-b{micro_batch_size}-s{seq_len}.parquet")


def trace_problems(run: RunSpec, path: str) -> list[tuple[str, str]]:
    """What a run asks of a trace that the trace cannot give, each as (key, message)."""
    trace = run.trace
    if trace is None:
        return []
    if trace.is_step:
        return step_problems(run)
    prov, tr, par = trace.provenance, run.training, run.parallel
    problems: list[tuple[str, str]] = []
    b, s, dt = trace.micro_batch_size, trace.seq_len, str(prov.get("dtype", tr.dtype))
    if (tr.micro_batch_size, tr.seq_len, tr.dtype) != (b, s, dt):
        problems.append(("training", f"{path} was captured at micro_batch_size = {b}, seq_len = {s}, dtype = "
                         f"{dt!r}; the run asks for {tr.micro_batch_size}, {tr.seq_len}, {tr.dtype!r}. Capture "
                         "it at those sizes: "
                         f"{capture_command(prov, tr.micro_batch_size, tr.seq_len, tr.dtype)}"))
    problems += shard_problems(trace, par, run.model.n_routed_experts)
    if run.recompute.policy == "selective":
        problems.append(("recompute.policy", NO_SELECTIVE))
    if run.model.num_hidden_layers < len(trace.layers):
        problems.append(("model.num_layers", f"{path} captured {len(trace.layers)} decoder layers; "
                         f"num_layers must be at least that (more repeat the last captured layer)"))
    return problems


def step_problems(run: RunSpec) -> list[tuple[str, str]]:
    """What a run asks of a whole-step trace that it cannot give, each as (key, message)."""
    par, tr = run.parallel, run.training
    problems = []
    for key in ("pp", "vpp", "tp", "cp", "ep", "dp"):
        if getattr(par, key) > 1:
            problems.append((f"parallel.{key}", "a whole-step trace (capture --step) runs the step as captured on "
                             f"one device; {key} must be 1"))
    if tr.num_microbatches != 1:
        problems.append(("training.num_microbatches", "a whole-step trace runs the step function as written "
                         "(its own micro-batch loop, if any); num_microbatches must be 1"))
    if run.recompute.policy != "none":
        problems.append(("recompute.policy", "a whole-step trace keeps the step's own checkpointing; policy must "
                         "be \"none\""))
    if tr.zero:
        problems.append(("training.zero", "a whole-step trace runs unsharded; zero must be 0"))
    return problems
