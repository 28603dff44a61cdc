#!/usr/bin/env python3
"""Compare the simulator with ``record_groundtruth.py`` results (``../shared/device/``).

For every case in ``RESULTS_DIR/results.json`` it writes a run file as the recording ran (the case's
Hugging Face config, profile ``hf``, its micro-batch and sequence, the recorded pipeline order as a
CSV schedule on one rank, bf16 weights, gradients and AdamW moments, the recorded allocator
settings, the GPU preset its name matches and its PyTorch version; the recorder's
``AdamW(foreach=False)`` runs as foreach, whose temporaries are dropped within the step and at no
peak), simulates it and prints, per case: saved bytes per decoder layer (measured vs model) and, from
a CUDA run, peak allocated and reserved (measured vs model), the worst allocated-after-action error
from the first backward on, the gap left at the forwards before it (the recorder's untimed warm-up
step already made the autograd thread's cuBLAS workspace), and two checks of the snapshot: the
allocator replay (addresses, segments) and the peak reserved of the recorded requests replayed from
an empty cache — how much of a reserved gap the allocator's state at the recording's start explains.
Needs no torch (it reads JSON and snapshot pickles). Run on purpose:
``python tools/compare_groundtruth.py RESULTS_DIR [--gpu PRESET] [--json]``. A CPU dry run of the
recorder (``record_groundtruth.py OUT --device cpu``) already checks the per-layer bytes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from timeline.io.runfile import load_run
from timeline.result.build import build_timeline
from timeline.result.timeline import Timeline
from timeline.spec.hardware import GPUS
from timeline.spec.run import RunSpec

RUN = """\
name = "{case}"
[model]
hf_config = "{case}.json"
profile = "hf"
[training]
micro_batch_size = {batch}
seq_len = {seq}
num_microbatches = {m}
iterations = {iterations}
dtype = "bf16"
grad_dtype = "bf16"
master_dtype = "bf16"
moment_dtype = "bf16"
[schedule]
kind = "csv"
csv = "{case}.csv"
[allocator]
kind = "caching"
expandable_segments = {expandable}
[hardware]
gpu = "{gpu}"
[framework]
pytorch = "{pytorch}"
"""


def gpu_preset(name: str) -> str | None:
    """The ``[hardware] gpu`` preset a device name (``torch.cuda.get_device_name``) names, if one does."""
    low = name.lower().replace(" ", "")
    hits = [k for k in GPUS if k.replace("-", "") in low]
    return max(hits, key=len) if hits else None


def case_run(case: dict[str, Any], folder: Path, gpu: str | None = None) -> RunSpec:
    """The run file of one recorded case, written into ``folder`` with its config and schedule."""
    name = case["case"]
    preset = gpu or gpu_preset(case.get("gpu", ""))
    if preset is None:
        raise SystemExit(f"{name}: no [hardware] preset for GPU {case.get('gpu')!r}; give --gpu PRESET "
                         f"({', '.join(GPUS)})")
    (folder / f"{name}.json").write_text(json.dumps(case["hf_config"]))
    (folder / f"{name}.csv").write_text(",".join(case["schedule_csv_row"]) + "\n")
    m = sum(1 for a in case["schedule_csv_row"] if a[1] == "F")
    expandable = "expandable_segments:true" in case.get("alloc_conf", "").lower().replace(" ", "")
    pytorch = case.get("torch", "2.13").split("+")[0]
    (folder / f"{name}.toml").write_text(RUN.format(
        case=name, batch=case["batch"], seq=case["seq"], m=m, iterations=case.get("iterations", 2),
        expandable=str(expandable).lower(), gpu=preset, pytorch=pytorch))
    return load_run(folder / f"{name}.toml")  # reads the CSV schedule beside it


def allocated_after_actions(tl: Timeline, d: int = 0) -> list[tuple[int, str, int]]:
    """(iteration, action, allocated bytes) just after each action of device ``d`` ends, in schedule
    order; actions are named as the recorder names them (``0F3``, ``0B1``, ``step``)."""
    ev, mem = tl.events(d), tl.memory[d]
    allocated = np.cumsum(mem.block_bytes)
    out = []
    for a, sp in enumerate(tl.spans[d]):
        if sp.kind == "init":
            continue
        # every event before the action's end, and at its end those of static state or an earlier action
        lo = int(np.searchsorted(ev.t_us, sp.end_us, side="left"))
        hi = int(np.searchsorted(ev.t_us, sp.end_us, side="right"))
        at_end = [j for j in range(lo, hi) if ev.action[j] <= a]
        total = int(allocated[lo - 1]) if lo else 0
        total += int(sum(int(mem.block_bytes[j]) for j in at_end))
        out.append((sp.iteration, "step" if sp.kind == "step" else f"{sp.stage}{sp.kind}{sp.microbatch}", total))
    return out


def empty_cache_replay_peak(snapshot: dict[str, Any]) -> int:
    """Peak reserved of device 0's recorded requests replayed from an empty cache: the blocks live at
    the trace's start allocated first (by address), then every alloc and free of the trace."""
    from timeline.alloc.caching import CachingAllocator
    from timeline.alloc.config import AllocatorConfig

    model = CachingAllocator(AllocatorConfig.from_snapshot_settings(snapshot.get("allocator_settings")))
    trace = snapshot["device_traces"][0]
    made = {e["addr"] for e in trace if e["action"] == "alloc"}
    live = sorted((b["address"], b["requested_size"]) for s in snapshot["segments"] if int(s.get("device", 0)) == 0
                  for b in s["blocks"] if b["state"] == "active_allocated" and b["address"] not in made)
    where = {addr: model.malloc(size, 0) for addr, size in live}
    for e in trace:
        if e["action"] == "alloc":
            where[e["addr"]] = model.malloc(e["size"], e.get("stream", 0))
        elif e["action"] == "free_requested" and e["addr"] in where:
            model.free(where.pop(e["addr"]))
    return model.peak_reserved_bytes


def compare_case(case: dict[str, Any], results_dir: Path, tmp: Path, gpu: str | None = None) -> dict[str, Any]:
    name = case["case"]
    tl = build_timeline(case_run(case, tmp, gpu))
    model_layers = tl.sim.templates[0].layer_activation_bytes
    out: dict[str, Any] = {"case": name, "layers": [{"layer": i, "measured": b, "model": model_layers.get(i)}
                                                    for i, b in enumerate(case["layer_saved_bytes"])]}
    pk = tl.peak(0)
    if "max_allocated_bytes" in case:
        out["peak_allocated"] = {"measured": case["max_allocated_bytes"], "model": pk.allocated_bytes}
        out["peak_reserved"] = {"measured": case["max_reserved_bytes"], "model": pk.reserved_bytes}
        sim = allocated_after_actions(tl)
        rows = [{"iteration": it, "action": a, "measured": v, "model": s}
                for (it, a, v), (_, _, s) in zip(case["allocated_after_phase"], sim, strict=True)]
        first_b = next(i for i, r in enumerate(rows) if r["action"][1:2] == "B")
        out["after_actions"] = rows
        out["worst_after_first_backward"] = max(rows[first_b:], key=lambda r: abs(r["model"] / r["measured"] - 1))
        out["before_first_backward_gap"] = [r["measured"] - r["model"] for r in rows[:first_b]]
    for snap in (results_dir / f"{name}.pickle", results_dir / f"{name}.pickle.gz"):
        if snap.exists():
            from timeline.alloc.replay import replay_snapshot
            from timeline.io.snapshot import load_snapshot

            loaded = load_snapshot(snap)  # reads gzip too
            out["replay"] = [d.to_dict() for d in replay_snapshot(loaded)]
            out["empty_cache_peak_reserved"] = empty_cache_replay_peak(loaded)
    return out


def _pct(model: int, measured: int) -> str:
    return f"{(model - measured) / measured:+.2%}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results_dir", type=Path)
    ap.add_argument("--gpu", help="the [hardware] preset to simulate (default: the one the recorded GPU name matches)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cases = json.loads((args.results_dir / "results.json").read_text())
    report = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            if "error" in case:
                report.append({"case": case["case"], "error": case["error"]})
                continue
            report.append(compare_case(case, args.results_dir, Path(tmp), args.gpu))
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        return 0
    for r in report:
        if "error" in r:
            print(f"{r['case']}: recording failed: {r['error']}")
            continue
        layers = "; ".join(f"L{x['layer']} {x['measured']:,} vs {x['model']:,} ({_pct(x['model'], x['measured'])})"
                           for x in r["layers"])
        print(f"{r['case']}: saved per layer, measured vs model: {layers}")
        for key in ("peak_allocated", "peak_reserved"):
            if key in r:
                v = r[key]
                print(f"  {key}: {v['measured']:,} vs {v['model']:,} ({_pct(v['model'], v['measured'])})")
        if "empty_cache_peak_reserved" in r and "peak_reserved" in r:
            v, e = r["peak_reserved"]["measured"], r["empty_cache_peak_reserved"]
            print(f"  the recorded requests from an empty cache: peak reserved {e:,} ({_pct(e, v)})")
        if "worst_after_first_backward" in r:
            w = r["worst_after_first_backward"]
            gap = ", ".join(f"{g / 2**20:+.1f}" for g in r["before_first_backward_gap"])
            print(f"  allocated after each action from the first backward on: worst {w['iteration']}:{w['action']} "
                  f"{w['measured']:,} vs {w['model']:,} ({_pct(w['model'], w['measured'])}); before it, measured − "
                  f"model MiB: {gap}")
        for d in r.get("replay", []):
            print(f"  replay device {d['device']}: {d['alloc_address_matches']}/{d['allocs']} allocations at the "
                  f"real address, {d['segment_alloc_matches']}/{d['segment_allocs']} segments")
    return 0


if __name__ == "__main__":
    sys.exit(main())
