"""The serving budget against public startup logs of vLLM and SGLang (issue 27).

Reads the fact table ``tests/data/serving_logs.json`` (inputs as each log or its thread states them,
the engine's printed numbers) and the split ``tools/serving_logs_split.json`` (every log
identity, its side fixed by a hash before its numbers were read). Each record becomes a serve run
file in memory — the engine, ``engine_version``, GPU memory and every setting from the record, the
published ``config.json`` from ``tests/data/hf`` — and the budget comes from
:func:`timeline.serve.budget.compute_budgets`, the tool's own code: no per-record constant.

Inputs that are *measured*, not predicted: the device's total memory (what the engine printed; else the
hardware table's total PyTorch reports for that GPU, :data:`timeline.spec.hardware.TORCH_TOTAL_GIB`). The
non-PyTorch memory is the tool's own (:mod:`timeline.serve.non_torch`, published measurements of the
calibration side, carried to other GPUs by its rules; ``nt?`` where a part of it is not measured) and is
compared where the log prints it.
Compared per record: weights, the
profile run's activation peak (vLLM 0.6.4's ``peak_torch_memory`` minus the weights where that is what
the log gives), the KV pool (GiB, blocks or tokens, as the engine printed it) and whether the engine
started. A record's ``rank`` names the tensor-parallel rank whose line it transcribes (0, the driver, when
absent): its own activation peak and pool, the engine's block count (the minimum over workers). Two
inputs are the log's own facts, not the version's: ``flashinfer_sampler`` (vLLM printed "Using FlashInfer for
top-p & top-k sampling.") and ``peer_access: false`` (it printed that the custom all-reduce is off because the
group spans nodes or lacks GPU P2P). The calibration and unseen sides are summarised separately; a record the tool cannot build
(family not modelled, config or inputs missing, version not modelled) is counted with its reason.

``python tools/compare_serving_logs.py`` prints the Markdown tables of the calibration side and, of the
unseen side, only which records build; ``--unseen`` prints the unseen errors too (run it once, at the end
of a round: the unseen side is never looked at while a rule is written). ``--before`` runs every record
without its ``engine_version`` and with the weight format given by hand (the tool before issue 27's
rules: the V1 rules at 35d5cda and the spec's scheduler defaults).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from timeline.errors import UserError
from timeline.io.serve_log import infer_vllm_version
from timeline.io.serve_runfile import load_serve_run
from timeline.serve.budget import Budget, captures_graphs, compute_budget, compute_budgets
from timeline.serve.kv import printed_kv_tokens
from timeline.serve.non_torch import UNMEASURED, measured_non_torch
from timeline.spec.engine_versions import vllm_subtracts_cudagraph_estimate
from timeline.spec.hardware import TORCH_TOTAL_GIB

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "tests" / "data" / "serving_logs.json"
SPLIT = ROOT / "tools" / "serving_logs_split.json"
HF = ROOT / "tests" / "data" / "hf"
GIB = 2**30
#: the weight format a run file stated by hand before checkpoints were read (``--before`` only)
HAND_FORMAT = {"fp8 (from config)": 'weight_dtype = "fp8"\nquant_group_size = 128\n',
               "mxfp4 (from config)": 'weight_dtype = "mxfp4"\nquant_group_size = 32\n'}


@dataclass
class Row:
    rec: dict
    budget: Budget | None = None
    refused: str = ""
    errors: dict[str, float] = field(default_factory=dict)  # metric → relative error
    cells: dict[str, str] = field(default_factory=dict)


#: a log's GPU name (lower case, a part of it) → the hardware preset it runs as; first match wins
GPU_KEYS = (("a100 40gb", "a100-40gb"), ("a100", "a100"), ("a800", "a800"), ("h200", "h200"), ("h100", "h100"),
            ("80 gb class", "h100"), ("l40s", "l40s"), ("a6000", "a6000"), ("3090", "rtx3090"), ("4090", "rtx4090"),
            ("5090", "rtx5090"), ("b200", "b200"), ("rtx pro 6000", "rtx-pro-6000"), ("rtx pro 4500", "rtx-pro-4500"), ("4070 ti super", "rtx4070ti-super"),
            ("4080", "rtx4080"), ("5080", "rtx5080"), ("a4000", "rtx-a4000"), ("a5000", "rtx-a5000"),
            ("l4", "l4"), ("a10", "a10"),
            ("a30", "a30"), ("a40", "a40"), ("tesla t4", "t4"))


def gpu_key(name: str | None) -> str | None:
    """The hardware preset a record runs as (:data:`timeline.spec.hardware.GPUS`); None if none fits."""
    low = (name or "").lower()
    return next((key for part, key in GPU_KEYS if part in low), None)


def dated(rec: dict) -> str | None:
    """A vLLM record stating no version: the one its transcribed lines' logger sites give
    (:func:`timeline.io.serve_log.infer_vllm_version`), as ``timeline from-vllm`` reads such a log; else None."""
    if rec["engine"] != "vllm" or not rec.get("lines"):
        return None
    return infer_vllm_version("\n".join(rec["lines"]))[0]


def run_text(rec: dict, before: bool) -> str:
    sv = [f'engine = "{rec["engine"]}"']
    version = None if before else rec.get("engine_version") or dated(rec)
    if version:
        sv.append(f'engine_version = "{version}"')
    for key in ("gpu_memory_utilization", "mem_fraction_static", "max_model_len", "max_num_seqs",
                "max_num_batched_tokens", "block_size", "kv_cache_dtype", "weight_dtype", "quant_group_size"):
        if rec.get(key) is not None:
            value = rec[key]
            sv.append(f"{key} = {json.dumps(value)}")
    if rec.get("enforce_eager"):
        sv.append("enforce_eager = true")
    if rec.get("peer_access") is False and not before:  # the log: custom all-reduce off, no P2P between the ranks
        sv.append("peer_access = false")
    if rec.get("flashinfer_sampler") and not before:  # the log's "Using FlashInfer for top-p & top-k sampling."
        sv.append("flashinfer_sampler = true")
    nt = rec["measured"].get("non_torch_gib")
    if nt is not None and before:  # round 1 took the printed non-torch memory as an input
        sv.append(f"non_torch_gib = {nt}")
    cg = rec["measured"].get("cuda_graph_estimate_gib")
    if cg is not None and not before:  # vLLM 0.20+'s own CUDA-graph estimate, printed, subtracted: a measured input
        sv.append(f"cuda_graph_estimate_gib = {cg}")
    if rec.get("dtype") in ("bf16", "fp16", "fp32"):
        sv.append(f'dtype = "{rec["dtype"]}"')
    if before and rec.get("quantization") in HAND_FORMAT:
        sv.append(HAND_FORMAT[rec["quantization"]].strip())
    hw = f'gpu = "{gpu_key(rec.get("gpu"))}"\n'
    if rec.get("capacity_gib") is not None:  # the log's own total; else the preset's (TORCH_TOTAL_GIB)
        hw += f'capacity_gib = {rec["capacity_gib"]}\n'
    return (f'[model]\nhf_config = "{HF / rec["hf_config"] / "config.json"}"\n'
            f'[parallel]\ntp = {rec.get("tp", 1)}\npp = {rec.get("pp", 1)}\n'
            f"[hardware]\n{hw}[serving]\n" + "\n".join(sv) + "\n[serving.load]\nnum_requests = 1\n")


def refusal(rec: dict) -> str:
    if rec.get("refused_family"):
        return f"family not modelled: {rec['refused_family']}"
    if rec.get("missing"):
        return f"inputs missing: {rec['missing']}"
    if not rec.get("hf_config"):
        return "no published config.json in tests/data/hf"
    key = gpu_key(rec.get("gpu"))
    if key is None:
        return f"GPU {rec.get('gpu')!r} not in the hardware table"
    if rec.get("capacity_gib") is None and key not in TORCH_TOTAL_GIB:
        return f"GPU total memory not printed, and {key!r} has none in TORCH_TOTAL_GIB"
    return ""


def rel(pred: float, meas: float) -> float:
    return (pred - meas) / abs(meas) if meas else float("inf")


def compare(rec: dict, folder: Path, before: bool) -> Row:
    row = Row(rec=rec, refused=refusal(rec))
    if row.refused:
        return row
    path = folder / f"{rec['id']}.toml"
    path.write_text(run_text(rec, before))
    try:
        row_run = load_serve_run(path)
        budgets = compute_budgets(row_run)
    except UserError as exc:
        row.refused = f"tool error: {str(exc).splitlines()[0][:160]}"
        return row
    b = row.budget = budgets[0]
    if rec.get("rank"):  # the printed line is another TP rank's (its own peak and pool; the engine's blocks)
        b = row.budget = replace(compute_budget(row_run, 0, rec["rank"]), num_kv_blocks=budgets[0].num_kv_blocks)
    m = rec["measured"]
    if "weights_gib" in m:
        row.errors["weights"] = rel(b.weights_bytes / GIB, m["weights_gib"])
        row.cells["weights"] = f"{b.weights_bytes / GIB:.2f} / {m['weights_gib']:.2f}"
    act = m.get("activation_gib")
    if act is None and "torch_peak_gib" in m and "weights_gib" in m:
        act = m["torch_peak_gib"] - m["weights_gib"]  # vLLM 0.6.4 prints the torch peak with the weights in it
    if act is not None:
        row.errors["activation"] = rel(b.activation_peak_bytes / GIB, act)
        row.cells["activation"] = f"{b.activation_peak_bytes / GIB:.2f} / {act:.2f}"
    if "gpu_blocks" in m and rec["engine"] == "vllm" and m["gpu_blocks"] > 0:  # exact where printed
        row.errors["kv"] = rel(b.num_kv_blocks, m["gpu_blocks"])
        row.cells["kv"] = f"{b.num_kv_blocks:,} / {m['gpu_blocks']:,} blk"
    elif "kv_pool_gib" in m:
        pred = (b.requested_bytes - b.weights_bytes - b.activation_peak_bytes - b.non_torch_bytes) / GIB
        row.errors["kv"] = rel(pred, m["kv_pool_gib"])
        row.cells["kv"] = f"{pred:.2f} / {m['kv_pool_gib']:.2f} GiB"
    elif "kv_tokens" in m:
        # as the version prints it (timeline.serve.kv.printed_kv_tokens): the blocks over the KV cache groups, or
        # from 0.20.1 the maximum concurrency times max_model_len
        tokens = printed_kv_tokens(b.kv_layout, b.num_kv_blocks, row_run.max_model_len,
                                   row_run.serving.max_num_batched_tokens, b.engine_version) \
            if rec["engine"] == "vllm" else b.num_kv_blocks
        row.errors["kv"] = rel(tokens, m["kv_tokens"])
        row.cells["kv"] = f"{tokens:,} / {m['kv_tokens']:,} tok"
    if m.get("non_torch_gib") is not None and rec["engine"] == "vllm":
        nt = b.non_torch_bytes / GIB
        row.errors["non_torch"] = rel(nt, m["non_torch_gib"]) if m["non_torch_gib"] else nt
        row.cells["non_torch"] = f"{nt:.2f} / {m['non_torch_gib']:.2f}"
    if "starts" in m:
        ours = not b.failure
        row.cells["start"] = ("ok" if ours == m["starts"] else "DIFFERS") + f" ({'starts' if ours else 'refuses'})"
    if rec["engine"] == "vllm" and UNMEASURED in measured_non_torch(row_run)[1]:
        row.cells["note"] = "nt?"
    sv = row_run.serving
    if rec["engine"] == "vllm" and sv.cuda_graph_estimate_gib is None and captures_graphs(row_run) \
            and vllm_subtracts_cudagraph_estimate(sv.engine_version):
        row.cells["note"] = " ".join(filter(None, (row.cells.get("note", ""), "cg?")))
    return row


def pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:+.1f} %"


def summary(rows: list[Row], side: str, listed: int) -> list[str]:
    mine = [r for r in rows if r.rec["side"] == side]
    built = [r for r in mine if not r.refused]
    out = [f"**{side}**: {listed} logs listed, {len(mine)} transcribed, {len(built)} compared, "
           f"{len(mine) - len(built)} refused by the tool"]
    for metric in ("weights", "activation", "non_torch", "kv"):
        errs = [abs(r.errors[metric]) for r in built if metric in r.errors]
        if errs:
            out.append(f"- {metric}: {len(errs)} records, median |error| {100 * statistics.median(errs):.2f} %, "
                       f"worst {100 * max(errs):.2f} %")
    starts = [r for r in built if "start" in r.cells]
    agree = sum(r.cells["start"].startswith("ok") for r in starts)
    out.append(f"- start/refusal agrees: {agree} of {len(starts)}")
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Prints the calibration side's table and summary; the unseen side's "
                                            "errors only with --unseen.")
    parser.add_argument("--unseen", action="store_true",
                        help="print the unseen side's errors too (once, at the end of a round: never tune on them)")
    parser.add_argument("--before", action="store_true",
                        help="every record without its engine_version and with the weight format given by hand "
                             "(the tool before issue 27's rules)")
    args = parser.parse_args(argv)
    before, show_unseen = args.before, args.unseen
    records = json.loads(LOGS.read_text())["records"]
    split = json.loads(SPLIT.read_text())["logs"]
    with tempfile.TemporaryDirectory() as tmp:
        rows = [compare(rec, Path(tmp), before) for rec in records]
    print("| side | record | engine | weights GiB (ours / log) | activation GiB | non-torch GiB | KV pool | start | |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        rec = r.rec
        eng = f"{rec['engine']} {rec.get('engine_version') or (f'~{v} (sites)' if (v := dated(rec)) else '?')}"
        if r.refused:
            print(f"| {rec['side'][:3]} | {rec['id']} | {eng} | refused: {r.refused} | | | | | |")
            continue
        if rec["side"] == "unseen" and not show_unseen:
            print(f"| uns | {rec['id']} | {eng} | built (errors shown with --unseen) | | | | | |")
            continue
        c, e = r.cells, r.errors
        print(f"| {rec['side'][:3]} | {rec['id']} | {eng} | {c.get('weights', '')} {pct(e.get('weights'))} | "
              f"{c.get('activation', '')} {pct(e.get('activation'))} | {c.get('non_torch', '')} | "
              f"{c.get('kv', '')} {pct(e.get('kv'))} | "
              f"{c.get('start', '')} | {c.get('note', '')} |")
    print()
    for side in ("calibration", "unseen"):
        listed = sum(e["side"] == side for e in split)
        lines = summary(rows, side, listed)
        print("\n".join(lines if side == "calibration" or show_unseen else lines[:1]))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
