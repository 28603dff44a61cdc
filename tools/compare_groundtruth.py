#!/usr/bin/env python3
"""Compare the simulator with ``record_groundtruth.py`` results (``../shared/device/``).

For every case in ``RESULTS_DIR/results.json`` it writes a run file (the case's Hugging Face
config, profile ``hf``, its micro-batch and sequence, the recorded pipeline order as a CSV
schedule on one rank, bf16 weights, gradients and AdamW moments, two iterations), simulates it
with the caching allocator and prints, per case: saved bytes per decoder layer (measured vs
model) and, from a CUDA run, peak allocated and reserved (measured vs model), plus the allocator
replay of the case's snapshot. Needs no torch (it reads JSON and snapshot pickles). Run on
purpose: ``python tools/compare_groundtruth.py RESULTS_DIR [--json]``. A CPU dry run of the
recorder (``record_groundtruth.py OUT --device cpu``) already checks the per-layer bytes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from pathlib import Path

from timeline.io.runfile import load_run
from timeline.result.build import build_timeline

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
"""


def compare_case(case: dict, results_dir: Path, tmp: Path) -> dict:
    name = case["case"]
    (tmp / f"{name}.json").write_text(json.dumps(case["hf_config"]))
    (tmp / f"{name}.csv").write_text(",".join(case["schedule_csv_row"]) + "\n")
    m = sum(1 for a in case["schedule_csv_row"] if a[1] == "F")
    (tmp / f"{name}.toml").write_text(RUN.format(case=name, batch=case["batch"], seq=case["seq"], m=m,
                                                 iterations=case.get("iterations", 2)))
    run = load_run(tmp / f"{name}.toml")  # reads the CSV schedule beside it
    tl = build_timeline(run)
    model_layers = tl.sim.templates[0].layer_activation_bytes
    out = {"case": name, "layers": [{"layer": i, "measured": b, "model": model_layers.get(i)}
                                     for i, b in enumerate(case["layer_saved_bytes"])]}
    pk = tl.peak(0)
    if "max_allocated_bytes" in case:
        out["peak_allocated"] = {"measured": case["max_allocated_bytes"], "model": pk.allocated_bytes}
        out["peak_reserved"] = {"measured": case["max_reserved_bytes"], "model": pk.reserved_bytes}
    for snap in (results_dir / f"{name}.pickle", results_dir / f"{name}.pickle.gz"):
        if snap.exists():
            from timeline.alloc.replay import replay_snapshot
            from timeline.io.snapshot import load_snapshot

            path = snap
            if snap.suffix == ".gz":
                path = tmp / f"{name}.pickle"
                path.write_bytes(gzip.decompress(snap.read_bytes()))
            out["replay"] = [d.to_dict() for d in replay_snapshot(load_snapshot(path))]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results_dir", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cases = json.loads((args.results_dir / "results.json").read_text())
    report = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            if "error" in case:
                report.append({"case": case["case"], "error": case["error"]})
                continue
            report.append(compare_case(case, args.results_dir, Path(tmp)))
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        return 0
    for r in report:
        if "error" in r:
            print(f"{r['case']}: recording failed: {r['error']}")
            continue
        layers = "; ".join(f"L{x['layer']} {x['measured']:,} vs {x['model']:,} ({(x['model'] - x['measured']) / x['measured']:+.3%})"
                           for x in r["layers"])
        print(f"{r['case']}: saved per layer, measured vs model: {layers}")
        for key in ("peak_allocated", "peak_reserved"):
            if key in r:
                v = r[key]
                print(f"  {key}: {v['measured']:,} vs {v['model']:,} ({(v['model'] - v['measured']) / v['measured']:+.3%})")
        for d in r.get("replay", []):
            print(f"  replay device {d['device']}: {d['alloc_address_matches']}/{d['allocs']} allocations at the "
                  f"real address, {d['segment_alloc_matches']}/{d['segment_allocs']} segments")
    return 0


if __name__ == "__main__":
    sys.exit(main())
