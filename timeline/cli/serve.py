"""``timeline serve RUN.toml [-o DIR]``: an inference engine's memory budget and its memory over
time under a request load; writes summary.json, memory.parquet and requests.parquet."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from timeline.cli.common import SET_HELP, check_output_dir, console, gib, positive, write_dir_atomically
from timeline.cli.simulate import default_output
from timeline.errors import UserError
from timeline.io.serve_runfile import load_serve_run
from timeline.serve.work import DEFAULT_MAX_STEPS

if TYPE_CHECKING:  # the serving core (graph, numpy, allocator) is imported when a run starts, not with the CLI
    from timeline.serve.run import ServeResult

HELP = "simulate an inference engine (vLLM, SGLang): its memory budget and memory over time under a load"
DESCRIPTION = """\
Compute the engine's startup budget as the engine does (weights with quantization scales,
non-PyTorch memory, the profile run's activation peak, the KV pool and its blocks), then run a
continuous-batching scheduler over the run's requests (serving.requests = "trace.csv" or a
[serving.load]) and write DIR (default runs/<run name>/):

  summary.json      schema timeline.serve/1: budget, KV bytes per token, blocks, max concurrency,
                    longest context, peaks and when, TTFT / TPOT percentiles
  memory.parquet    one row per engine step: bytes by part, KV blocks used/free, requests
                    running/waiting, preemptions
  requests.parquet  one row per request: arrival, first token, finish, preemptions, rejected
  events.parquet    every allocator event: weights, KV tensors, eager steps' transients, segments
  trace.json        Chrome trace for ui.perfetto.dev: engine steps, one track per request,
                    memory / KV-block / request counters
  snapshot.pickle   PyTorch memory snapshot for pytorch.org/memory_viz (the last 200,000
                    allocator entries; segments with the weights and KV pool allocated)

examples:
  timeline serve schedules/llama3.1-8b-h100-serve.toml
  timeline serve RUN.toml --set serving.gpu_memory_utilization=0.8 --set serving.load.rate_per_s=40
"""
FORMATS = ("summary", "memory", "requests", "events", "trace", "snapshot")
#: memory_viz slows down past a few hundred thousand entries (as `timeline simulate`)
SNAPSHOT_ENTRIES = 200_000


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN.toml", help="serving run file (with a [serving] section)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help=SET_HELP)
    parser.add_argument("-o", "--output", metavar="DIR", help="run directory (default: runs/<run name>/)")
    parser.add_argument("--force", action="store_true", help="replace DIR if it exists")
    parser.add_argument("--format", default=",".join(FORMATS),
                        help=f"comma-separated outputs to write (default: {','.join(FORMATS)})")
    parser.add_argument("--max-steps", type=positive, default=DEFAULT_MAX_STEPS, metavar="N",
                        help="refuse, before any work, a load needing more than N engine steps "
                             f"(default {DEFAULT_MAX_STEPS:,}, about 7 minutes)")


def parse_formats(text: str) -> list[str]:
    formats = [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise UserError(f"--format: {'unknown output ' + repr(unknown[0]) if unknown else 'name at least one output'}; "
                        f"choose from {', '.join(FORMATS)}")
    return formats


def writer(res: ServeResult, formats: list[str]) -> Callable[[Path], None]:
    serve_snapshot = importlib.import_module("timeline.exporters.serve_snapshot")
    serve_summary = importlib.import_module("timeline.exporters.serve_summary")
    serve_trace = importlib.import_module("timeline.exporters.serve_trace")
    parquet = importlib.import_module("timeline.exporters.serve_parquet")
    write_events, write_memory, write_requests = parquet.write_events, parquet.write_memory, parquet.write_requests

    def write(folder: Path) -> None:
        for fmt in formats:
            if fmt == "summary":
                with open(folder / serve_summary.FILENAME, "wb") as h:
                    serve_summary.write(res, h)
            elif fmt == "snapshot":
                with open(folder / serve_snapshot.FILENAME, "wb") as h:
                    serve_snapshot.write(res, h, {"max_entries": SNAPSHOT_ENTRIES})
            elif fmt == "trace":
                with open(folder / serve_trace.FILENAME, "wb") as h:
                    serve_trace.write(res, h)
            elif fmt == "events":
                with open(folder / "events.parquet", "wb") as h:
                    write_events(res, h)
            elif fmt == "memory":
                with open(folder / "memory.parquet", "wb") as h:
                    write_memory(res, h)
            else:
                with open(folder / "requests.parquet", "wb") as h:
                    write_requests(res, h)
    return write


def print_summary(res: ServeResult) -> None:
    from timeline.exporters.serve_summary import summary

    b, con = res.budget, console()
    s = summary(res)
    dev, rq = s["devices"][0], s["requests"]
    sv, blocks = res.run.serving, f"{b.num_kv_blocks:,} blocks of {b.block_size} tokens × {b.kv_bytes_per_token:,} B/token"
    given = " (kv_cache_memory_bytes)" if sv.kv_cache_memory_bytes and b.engine == "vllm" else ""
    pool = (f"KV pool {gib(b.kv_pool_bytes)}{given} available, num_gpu_blocks_override {blocks}"
            if sv.num_gpu_blocks_override and b.engine == "vllm" else f"KV pool {gib(b.kv_pool_bytes)}{given} ({blocks})")
    con.print(f"{res.run.name}: {b.engine} budget per device (GiB): total {gib(b.total_bytes)}, requested "
              f"{gib(b.requested_bytes)}, weights {gib(b.weights_bytes)}"
              + (f" (vision tower and projector {gib(b.vision_weights_bytes)})" if b.vision_weights_bytes else "")
              + f", non-torch {gib(b.non_torch_bytes)}, "
              + (f"activation peak {gib(b.activation_peak_bytes)}, " if b.engine != "sglang" else
                 # SGLang runs no profile: ModelRunner.profile_max_num_token sizes the pool from mem_fraction_static,
                 # and what the pool and weights leave is the activations' and graphs' room
                 f"no profile run ({gib(max(0, b.total_bytes - b.requested_bytes - b.non_torch_bytes))} left beside "
                 "weights and pool), ")
              + f"{pool}; "
              + (f"CUDA-graph pool {gib(b.cuda_graph_bytes)}; the engine's CUDA-graph estimate "
                 f"{gib(b.cuda_graph_estimate_bytes)} subtracted" if b.cuda_graph_subtracted else
                 f"CUDA-graph pool {gib(b.cuda_graph_bytes)} (not subtracted by the engine)"))
    if "data_parallel" in s:
        _print_ranks(s)
    for row in s["devices"] if len(s["devices"]) > 1 and "data_parallel" not in s else []:
        rb = row["budget"]
        con.print(f"  pp stage {row['pp_stage']} (layers {row['layers'][0]}–{row['layers'][1] - 1}): weights "
                  f"{gib(rb['weights_bytes'])}, activation peak {gib(rb['activation_peak_bytes'])}, KV available "
                  f"{gib(rb['kv_pool_bytes'])} GiB = {row['worker_num_kv_blocks']:,} blocks of its own; peak allocated "
                  f"{gib(row['peak_allocated_bytes'])} GiB")
    if len(s["devices"]) > 1 and "data_parallel" not in s:
        con.print(f"  the pool is the smallest over the stages: {b.num_kv_blocks:,} blocks (vLLM get_kv_cache_configs); "
                  "the memory timeline is stage 0's")
    if "kv_cache_groups" in dev:
        kg = dev["kv_cache_groups"]
        kinds = ", ".join(f"{g['kind']}" + (f" (window {g['sliding_window']})" if g["sliding_window"] else "")
                          for g in kg["groups"])
        con.print(f"KV cache groups: {len(kg['groups'])} of {kg['num_tensors']} layers ({kinds}); a block is one "
                  f"group's {b.block_size} tokens over its layers, {kg['block_bytes']:,} B; longest context "
                  f"{dev['longest_context_tokens']:,} tokens")
    if b.failure:
        con.print(f"the engine would refuse to start: {b.failure}")
    conc = dev["max_concurrency_at_max_model_len"]
    con.print(f"max concurrency at max_model_len={res.run.max_model_len:,}: "
              f"{'-' if conc is None else f'{conc:,}'}; peak allocated {gib(res.peak_allocated_bytes)} GiB at "
              f"{res.peak_time_us / 1e3:,.1f} ms; {rq['finished']:,}/{rq['total']:,} requests finished, "
              f"{rq['rejected']:,} rejected, {rq['preemptions']:,} preemptions; TTFT p50 {_ms(rq['ttft_ms']['p50'])}, "
              f"TPOT p50 {_ms(rq['tpot_ms']['p50'])}")


def _print_ranks(s: dict) -> None:
    """One line per DP rank: its requests, steps, blocks used and peak."""
    con, dp = console(), s["data_parallel"]
    what = "DP attention" if dp["dp_attention"] else "data-parallel replicas"
    con.print(f"  {what}: {dp['ranks']} ranks of {dp['attention_tp']} GPU(s) each"
              + (f", MoE over {dp['moe_tp']} GPUs" if dp["moe_tp"] else "")
              + f"; requests routed {dp['routing'].replace('_', '-')}"
              + ("; the ranks step together (MoE collectives)" if dp["lockstep"] else ""))
    for row in s["devices"]:
        dummy = f" ({row['dummy_steps']:,} dummy batches)" if row["dummy_steps"] else ""
        con.print(f"  DP rank {row['dp_rank']}: {row['requests']:,} requests, {row['steps']:,} steps{dummy}, at most "
                  f"{row['max_kv_blocks_used']:,}/{row['num_kv_blocks']:,} KV blocks used; peak allocated "
                  f"{gib(row['peak_allocated_bytes'])} GiB at {row['peak_time_us'] / 1e3:,.1f} ms")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f} ms"


def run(args: argparse.Namespace) -> int:
    formats = parse_formats(args.format)
    from timeline.serve.budget import with_engine_requests

    spec = with_engine_requests(load_serve_run(args.run, args.overrides))
    for note in spec.notes:
        print(f"note: {args.run}: {note}", file=sys.stderr)
    out = Path(args.output) if args.output else default_output(spec.name)
    check_output_dir(out, args.force)
    from timeline.serve.work import check_steps

    check_steps(spec, args.max_steps)
    from timeline.alloc.caching import AddressSpaceError
    from timeline.serve.run import serve

    try:
        res = serve(spec, -1 if "events" in formats else SNAPSHOT_ENTRIES if "snapshot" in formats else 0)
    except AddressSpaceError:
        raise UserError(f"{args.run}: the device would reserve more than the 256 TiB a device can address; "
                        "shard the model or shrink the run") from None
    write_dir_atomically(out, args.force, writer(res, formats), command="serve")
    print_summary(res)
    console().print(f"wrote {out}/")
    return 0
