"""``timeline capture``: record a PyTorch model's operator trace on fake CPU tensors into Parquet."""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from timeline.cli.common import check_output_file, positive, write_file_atomically
from timeline.errors import UserError
from timeline.io.hf_config import check_hf_config, family
from timeline.spec.trace import CapturedTrace

HELP = "record one forward + backward of a model's aten ops (fake CPU tensors) into a trace file"
DESCRIPTION = """\
Run one training step (forward to the loss, backward) of a model on fake tensors on the CPU — no
GPU, no weights — and record every aten op in order: op, module path, output tensors (shape,
dtype, bytes, storage), the storages autograd saved and when each one dies, FLOPs, decoder-layer
boundaries. GPU kernels that CPU execution would change are recorded as a GPU runs them (SDPA
flash/memory-efficient kernels, GQA, bool dropout masks). Simulate the trace with
[model] trace = "traces/NAME.parquet" (num_layers repeats the last captured layer).

Needs the capture extra: pip install -e '.[capture]'

examples:
  timeline capture --preset llama3-8b --set num_hidden_layers=1 --micro-batch-size 1 --seq-len 4096 \\
      -o traces/llama3-8b-layer.parquet
  timeline capture --hf-config config.json --micro-batch-size 2 --seq-len 512 -o traces/mine.parquet
  timeline capture --module mypkg.models:build -o traces/custom.parquet
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--hf-config", metavar="CONFIG.json", help="a Hugging Face config.json (random init)")
    src.add_argument("--preset", metavar="NAME", help="a model preset (see `timeline presets`)")
    src.add_argument("--module", metavar="MODULE:FACTORY",
                     help="an importable factory returning (nn.Module, args[, kwargs]); the step sums its output")
    src.add_argument("--step", metavar="MODULE:FUNC",
                     help="whole training steps as you wrote them: FUNC() builds model, optimizer and batch "
                          "(device='cuda' is fine) and returns a callable running one step; MODULE is dotted or "
                          "a path to a .py file")
    parser.add_argument("--optimizer", default="none", choices=("adamw", "adam", "sgd", "none"),
                        help="--hf-config/--preset: capture whole steps with this torch.optim optimizer (torch "
                             "defaults, foreach as on CUDA): loss.backward(); opt.step(); opt.zero_grad()")
    parser.add_argument("--autocast", default="off", choices=("bf16", "fp16", "off"),
                        help="--hf-config/--preset: capture whole steps with the forward under "
                             "torch.autocast('cuda', dtype) (CUDA's op lists); use with --dtype fp32")
    parser.add_argument("--steps", type=positive, default=2, metavar="K",
                        help="--step: how many steps to record (default 2: the first creates gradients and "
                             "optimizer state, the second is the steady state later iterations repeat)")
    parser.add_argument("--micro-batch-size", type=positive, metavar="B",
                        help=f"batch size (default {DEFAULT_MICRO_BATCH_SIZE} for HF models; a --module factory's "
                             "inputs decide theirs)")
    parser.add_argument("--seq-len", type=positive, metavar="S",
                        help=f"sequence length (default {DEFAULT_SEQ_LEN} for HF models)")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"),
                        help="model dtype (HF models; --module and --step traces take their parameters' dtype)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of the Hugging Face config, e.g. num_hidden_layers=1 or "
                             "experts_implementation=grouped_mm (repeatable; values are JSON/TOML literals, "
                             "bare words are strings)")
    parser.add_argument("--cpu-kernels", action="store_true",
                        help="keep CPU kernel choices (math SDPA, input-dtype dropout masks) instead of GPU ones")
    parser.add_argument("-o", "--output", required=True, metavar="TRACE.parquet", help="trace file to write")
    parser.add_argument("--force", action="store_true", help="replace TRACE.parquet if it exists")


DEFAULT_MICRO_BATCH_SIZE = 1
DEFAULT_SEQ_LEN = 4096


def parse_set(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` → (key, value); the value is a TOML literal, a bare word a string."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or not key.isidentifier():
        raise UserError(f"--set {text!r}: expected KEY=VALUE with a config key, e.g. --set num_hidden_layers=1")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key, value


def _overrides(items: list[str]) -> dict[str, Any]:
    return dict(parse_set(text) for text in items)


def _check_keys(overrides: dict[str, Any], model_type: str) -> None:
    """Reject --set keys the model type's Hugging Face config class does not know."""
    from timeline.capture.hf import config_keys

    unknown = sorted(set(overrides) - config_keys(model_type))
    if unknown:
        raise UserError(f"--set {unknown[0]}: not a key of the {model_type} config"
                        + (f" (nor {', '.join(unknown[1:])})" if len(unknown) > 1 else ""))


def _source(args: argparse.Namespace, overrides: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """(capture_args text, HF config dict or None)."""
    sets = "".join(f" --set {shlex.quote(f'{k}={json.dumps(v)}')}" for k, v in overrides.items())
    if args.hf_config:
        try:
            cfg = json.loads(Path(args.hf_config).read_text(encoding="utf-8"))
        except OSError as exc:
            raise UserError(f"--hf-config {args.hf_config}: cannot read ({exc.strerror or exc})") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"--hf-config {args.hf_config}: not a JSON config ({exc})") from None
        if not isinstance(cfg, dict):
            raise UserError(f"--hf-config {args.hf_config}: expected a JSON object")
        cfg = {**cfg, **overrides}
        try:
            check_hf_config(cfg, f"--hf-config {args.hf_config}")
            known, note = family(cfg)
        except UserError:
            # a family the run-file reader does not build (gpt_neox, olmoe …): transformers' own class captures
            # it all the same, with its config class's defaults for what the file leaves out
            from timeline.capture.hf import transformers_knows

            if not transformers_knows(cfg.get("model_type")):
                raise
            known, note = str(cfg["model_type"]), (f"model_type {cfg['model_type']!r} is captured through "
                                                   "transformers' own class (the run-file reader does not build "
                                                   "this family)")
        if note:  # e.g. Kimi-K2: transformers builds it by the class its architectures name
            print(f"note: --hf-config {args.hf_config}: {note}", file=sys.stderr)
            cfg = {**cfg, "model_type": known}
        return f"--hf-config {shlex.quote(args.hf_config)}{sets}", cfg
    if args.preset:
        from timeline.spec.presets import PRESETS

        if args.preset not in PRESETS:
            raise UserError(f"unknown preset {args.preset!r}; use one of {', '.join(PRESETS)}")
        from timeline.capture.hf import preset_config

        return f"--preset {args.preset}{sets}", {**preset_config(PRESETS[args.preset]), **overrides}
    return f"--module {shlex.quote(args.module)}", None


def run(args: argparse.Namespace) -> int:
    out = Path(args.output)
    check_output_file(out, force=args.force)
    if _missing("torch"):
        raise UserError("timeline capture needs PyTorch: pip install -e '.[capture]' (CPU torch + transformers)")
    from timeline.capture.hf import hf_builder
    from timeline.capture.run import capture, load_factory
    from timeline.io.trace_file import write_trace

    start = time.perf_counter()
    if args.step:
        return _run_step(args, out, start)
    overrides = _overrides(args.set)
    if overrides and args.module:
        raise UserError("--set changes a Hugging Face config; a --module factory builds its own model")
    capture_args, config = _source(args, overrides)
    prov: dict[str, Any] = {"capture_args": capture_args, "name": out.stem, "dtype": args.dtype,
                            "gpu_kernels": not args.cpu_kernels}
    if config is not None:
        _check_keys(overrides, config["model_type"])
        b = DEFAULT_MICRO_BATCH_SIZE if args.micro_batch_size is None else args.micro_batch_size
        s = DEFAULT_SEQ_LEN if args.seq_len is None else args.seq_len
        prov.update(config=config, micro_batch_size=b, seq_len=s, model_type=config["model_type"])
        if args.optimizer != "none" or args.autocast != "off":
            return _run_hf_step(args, out, start, config, b, s, prov, capture_args)
        build = hf_builder(config, micro_batch_size=b, seq_len=s, dtype=args.dtype)
    else:
        if args.optimizer != "none" or args.autocast != "off":
            raise UserError("--optimizer and --autocast build a training step for --hf-config/--preset; "
                            "write your own step with --step MODULE:FUNC")
        build = load_factory(args.module)
    trace = capture(build, gpu=not args.cpu_kernels, provenance=prov)
    if config is None:  # a --module factory chose its dtype: label the trace by its parameters
        trace.provenance["dtype"] = params_dtype(trace)
    hidden = _hidden_shape(trace)
    if config is None and hidden:
        trace.provenance.update(
            micro_batch_size=hidden[0] if args.micro_batch_size is None else args.micro_batch_size,
            seq_len=(hidden[1] if len(hidden) > 2 else 1) if args.seq_len is None else args.seq_len)
    trace.provenance["hidden_size"] = hidden[-1] if hidden else 0
    trace.provenance["command"] = (f"timeline capture {capture_args} --micro-batch-size {trace.micro_batch_size} "
                                   f"--seq-len {trace.seq_len} --dtype {trace.provenance['dtype']} -o {args.output}")
    write_file_atomically(out, lambda path: write_trace(trace, path), force=args.force)
    saved = sum(st.nbytes for st in trace.storages.values() if st.saved)
    print(f"{args.output}: {len(trace.ops)} ops, {len(trace.layers)} decoder layers, "
          f"{sum(p.nbytes for p in trace.params):,} parameter bytes, {saved:,} saved bytes, "
          f"b={trace.micro_batch_size} s={trace.seq_len} ({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    return 0


def _run_step(args: argparse.Namespace, out: Path, start: float) -> int:
    """``--step MODULE:FUNC``: record construction and K whole steps."""
    from timeline.capture.step import capture_step, load_step
    from timeline.io.trace_file import write_trace

    if args.set:
        raise UserError("--set changes a Hugging Face config; a --step function builds its own model")
    prov: dict[str, Any] = {"capture_args": f"--step {shlex.quote(args.step)} --steps {args.steps}",
                            "name": out.stem, "gpu_kernels": not args.cpu_kernels}
    trace = capture_step(load_step(args.step), steps=args.steps, gpu=not args.cpu_kernels, provenance=prov)
    trace.provenance["dtype"] = params_dtype(trace)
    trace.provenance["command"] = f"timeline capture {prov['capture_args']} -o {args.output}"
    write_file_atomically(out, lambda path: write_trace(trace, path), force=args.force)
    _print_notes(trace)
    print(f"{args.output}: {len(trace.ops)} ops over {args.steps} steps, {len(trace.params)} parameters and buffers "
          f"({sum(p.nbytes for p in trace.params):,} bytes) ({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    return 0


def _run_hf_step(args: argparse.Namespace, out: Path, start: float, config: dict[str, Any], b: int, s: int,
                 prov: dict[str, Any], capture_args: str) -> int:
    """``--hf-config``/``--preset`` with ``--optimizer``/``--autocast``: whole steps of the HF model."""
    from timeline.capture.hf import hf_step_builder
    from timeline.capture.step import capture_step
    from timeline.io.trace_file import write_trace

    func = hf_step_builder(config, micro_batch_size=b, seq_len=s, dtype=args.dtype, optimizer=args.optimizer,
                           autocast=args.autocast)
    extra = f" --optimizer {args.optimizer} --autocast {args.autocast} --steps {args.steps}"
    prov = {**prov, "capture_args": capture_args + extra, "optimizer": args.optimizer, "autocast": args.autocast}
    trace = capture_step(func, steps=args.steps, gpu=not args.cpu_kernels, provenance=prov)
    trace.provenance["command"] = (f"timeline capture {capture_args}{extra} --micro-batch-size {b} --seq-len {s} "
                                   f"--dtype {args.dtype} -o {args.output}")
    write_file_atomically(out, lambda path: write_trace(trace, path), force=args.force)
    _print_notes(trace)
    print(f"{args.output}: {len(trace.ops)} ops over {args.steps} steps, {len(trace.params)} parameters and buffers "
          f"({sum(p.nbytes for p in trace.params):,} bytes) ({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    return 0


def _print_notes(trace: CapturedTrace) -> None:
    """What the capture served differently from a GPU (the trace keeps them in its provenance)."""
    for line in trace.provenance.get("notes", []):
        print(f"note: {line}", file=sys.stderr)


def params_dtype(trace: CapturedTrace) -> str:
    """The run dtype of a trace's trainable parameters (bf16, fp16, fp32), or "mixed"."""
    names = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
    dtypes = sorted({names.get(p.dtype, p.dtype) for p in trace.params if p.trainable})
    return dtypes[0] if len(dtypes) == 1 else "mixed"


def _missing(name: str) -> bool:
    """Whether ``name`` cannot be imported (without importing it: torch takes seconds)."""
    if name in sys.modules:
        return sys.modules[name] is None
    return importlib.util.find_spec(name) is None


def _hidden_shape(trace: CapturedTrace) -> tuple[int, ...]:
    """Shape of the first decoder layer's output hidden state (b, s, h), or ()."""
    target = trace.layers[0].hidden_out
    for op in trace.ops:
        for t in op.outputs:
            if t.storage == target:
                return t.shape
    return ()
