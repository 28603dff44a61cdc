"""``timeline from-vllm`` / ``from-sglang``: write the serving run file of a vLLM or SGLang launch command."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from timeline.cli.common import add_gpu_arguments, emit_checked_run_file, gpu_fields, script_env
from timeline.errors import UserError

if TYPE_CHECKING:
    from timeline.serve.budget import Budget

HELP = "write a serving run file from a vLLM or SGLang launch command or startup log"
DESCRIPTION = """\
Read a serving engine's launch command — `vllm serve MODEL …`, `python -m vllm.entrypoints.openai.api_server …`,
`docker run … vllm/vllm-openai:TAG …`, `python -m sglang.launch_server …` — given as the command line itself or as a
shell script that runs it (read as bash would, never run), a Kubernetes manifest or Compose file whose container
runs it, or a Python program that builds the engine (`LLM(model=…, tensor_parallel_size=…)`, `sgl.Engine(…)`:
its keywords read without running it) — or the engine's startup log: vLLM's "non-default args: {…}" line (with
its version) or SGLang's "server_args=ServerArgs(…)" (the fields the rules read, as SGLang set them), its memory
lines copied to the run file's notes — and write the run file `timeline serve` takes (stdout without -o). Every
option is looked up in the engine's own command-line surface, read from its source: mapped to a run-file key,
listed as memory-neutral in the file's header, or refused in one line (a typo gets "did you mean").
The model's config.json is the checkpoint's: the local folder the command names, the Hugging Face cache on this
machine, or --hf-config. A container image's tag gives the engine version; else --engine-version.

examples:
  timeline from-vllm "vllm serve Qwen/Qwen3-8B --max-model-len 32k -tp 2" --gpu h100 -o qwen3.toml
  timeline from-vllm launch.sh --hf-config ./Llama-3.1-8B/config.json --engine-version 0.10.1 -o run.toml
  timeline from-vllm deployment.yaml --gpu h100 -o run.toml          # the container running vllm serve
  timeline from-vllm offline.py --engine-version 0.11.0 -o run.toml  # LLM(model=..., ...) in a script
  timeline from-vllm server.log --gpu h100 -o run.toml               # a startup log: its non-default args
  timeline from-sglang "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 8" --gpu h200
  timeline serve run.toml
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("launch", metavar="COMMAND", help="the launch command line, or a file that runs it: a shell "
                                                           "script, a docker command, a Kubernetes manifest or "
                                                           "Compose file, a Python program")
    parser.add_argument("--hf-config", metavar="PATH", help="the checkpoint's config.json (or its folder), where the "
                                                            "model is neither a local folder nor in the Hugging Face "
                                                            "cache on this machine")
    parser.add_argument("--engine-version", metavar="X.Y.Z", help="the engine version the command ran (default: the "
                                                                   "image tag's, else the tool's default rules)")
    add_gpu_arguments(parser)
    parser.add_argument("--script-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a variable of the environment the script starts in (repeat it), as in "
                             "`ENGINE=vllm MODEL=Qwen/Qwen3-8B bash serve.sh`; for a Compose file the variables it "
                             "is interpolated with (over its .env), for a container one its env lacks, for a "
                             "Python program what os.environ gives")
    parser.add_argument("--job", type=int, default=1, metavar="K",
                        help="of a file holding several (containers that serve, LLM(...) calls), the K-th (from 1)")
    parser.add_argument("--ignore-arg", action="append", default=[], metavar="NAME",
                        help="pass over an option whose memory is not modelled (listed in the run file's header); "
                             "comma-separated or repeated")
    parser.add_argument("--compare", action="store_true",
                        help="for a startup log: print the engine's own measured weights / KV pool beside the "
                             "budget of the run file written")
    parser.add_argument("-o", "--output", metavar="RUN.toml", help="write the run file here (default: stdout)")
    parser.add_argument("--force", action="store_true", help="replace RUN.toml if it exists")
    parser.add_argument("--name", help="the run's name (default: the model's name)")


def _read(command: str) -> tuple[str, str]:
    """The command's text and what names it in errors: a file's, or the command line given itself."""
    path = Path(command)
    looks_like_command = any(c.isspace() for c in command.strip()) or command.startswith("-")
    if not looks_like_command:
        if path.is_file():
            from timeline.io.text import read_user_text

            return read_user_text(path, "a launch command or a script that runs one"), str(path)
        raise UserError(f"{command}: no such file (give the launch command in quotes, or the file that holds it)")
    return command, "the command"


def _engine_v1(cmd: Any, serving: dict[str, Any], mapped: dict[str, str], notes: list[str]) -> None:
    """``serving.engine_v1`` of a vLLM command: the engine its log says started, else its ``VLLM_USE_V1`` (vLLM's
    ``envs.py``: ``bool(int(...))``); unset, the run's oracle decides (:mod:`timeline.spec.engine_versions`)."""
    if cmd.engine_v1 is not None:
        serving["engine_v1"] = cmd.engine_v1
        mapped["Initializing a V1 LLM engine" if cmd.engine_v1 == "on" else "Initializing an LLM engine"] = (
            f"serving.engine_v1 = {cmd.engine_v1} (the engine the log says started)")
        return
    raw = cmd.env.get("VLLM_USE_V1")
    if raw is None:
        return
    try:
        on = bool(int(raw))
    except ValueError:
        notes.append(f"VLLM_USE_V1={raw!r} is not an integer (vLLM would fail to read it): not taken")
        return
    from timeline.spec.engine_versions import VLLM_V0_REMOVED, VLLM_V1_DEFAULT, parse_version

    v = parse_version(str(serving.get("engine_version") or "")) or VLLM_V0_REMOVED
    if (on and v >= VLLM_V0_REMOVED) or (not on and v < VLLM_V1_DEFAULT):  # the one engine that version has
        mapped["$VLLM_USE_V1"] = f"(not used: vLLM {serving.get('engine_version')} has that engine only)"
        return
    serving["engine_v1"] = "on" if on else "off"
    mapped["$VLLM_USE_V1"] = f"serving.engine_v1 = {serving['engine_v1']}"


def run(args: argparse.Namespace) -> int:
    from timeline.io.runfile_write import run_file_text
    from timeline.io.serve_command import (
        after_every_table,
        async_scheduling_refusal,
        classify,
        map_options,
        model_config,
        newer_options_note,
        parse_words,
        read_command,
        unknown_line,
        version_line,
    )
    from timeline.io.serve_runfile import load_serve_run

    hint = "sglang" if args.command == "from-sglang" else "vllm"
    text, source = _read(args.launch)
    cmd = read_command(text, source, hint, script_env(args.script_env), job=args.job)
    parsed = parse_words(cmd.engine, cmd.words, args.engine_version or cmd.version)
    ignored = tuple("--" + n.strip().lstrip("-") for item in args.ignore_arg for n in item.split(",")
                    if n.strip().lstrip("-"))
    unknown = [n for n in parsed.unknown if n.split(".")[0] not in ignored]
    newer: list[str] = []
    if unknown and after_every_table(cmd.engine, args.engine_version or cmd.version):
        newer, unknown = unknown, []  # options of a release later than every table read: maybe its own
    if unknown:
        raise UserError(unknown_line(cmd.engine, unknown))
    if parsed.other_version:
        raise UserError(version_line(cmd.engine, args.engine_version or cmd.version or "", parsed.other_version))
    neutral, passed = classify(cmd.engine, parsed, ignored)
    passed += [n for n in parsed.unknown if n.split(".")[0] in ignored]
    for name in newer:
        neutral[name] = "of no command line read, the engine later (unverified)"
    config = model_config(parsed.model, args.hf_config)
    try:
        cfg = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{config}: not a readable config.json ({exc})") from None
    # a quantization_config, or ModelOpt's hf_quant_config.json beside config.json (read as vLLM reads it)
    quantized = isinstance(cfg, dict) and (isinstance(cfg.get("quantization_config"), dict)
                                           or (config.parent / "hf_quant_config.json").is_file())
    m = map_options(cmd.engine, parsed, quantized)
    from timeline.spec.serving import ENGINE_VERSIONS

    version = args.engine_version or cmd.version
    notes = list(cmd.notes)
    if newer:
        notes.append(newer_options_note(cmd.engine, str(version), newer))
    if version is None:  # the defaults of the version whose source the rules are read at
        version = ENGINE_VERSIONS[cmd.engine][0]
        notes.append(f"the command does not say which {cmd.engine} ran it: read as {cmd.engine} {version}, whose "
                     "source the rules are read at (give --engine-version)")
    m.sections["serving"]["engine_version"] = version
    if cmd.engine == "vllm":
        _engine_v1(cmd, m.sections["serving"], m.mapped, notes)
    if cmd.engine == "vllm" and parsed.values.get("async_scheduling") is True:
        why = async_scheduling_refusal(version, int(m.sections.get("parallel", {}).get("pp", 1)),
                                       bool(m.sections["serving"].get("speculative_method")))
        if why:
            raise UserError(why)
    if cmd.usage_context != "openai_api_server":
        m.sections["serving"]["usage_context"] = cmd.usage_context
        m.mapped["LLM(...)" if cmd.usage_context == "llm_class" else "EngineArgs(...)"] = (
            f"serving.usage_context = {cmd.usage_context} (its own V1 scheduler defaults, engine/arg_utils.py "
            "_set_default_args)")
    from timeline.io.device_name import run_gpu

    gpu, device = run_gpu(cmd.device_name, args.gpu)
    notes += [device] if device else []
    hardware: dict[str, Any] = {"gpu": gpu, **gpu_fields(args.gpu_field)}
    if cmd.capacity_gib is not None and "capacity_gib" not in hardware:  # the log's own total, as PyTorch gave it
        hardware["capacity_gib"] = cmd.capacity_gib
        notes.append(f"hardware.capacity_gib = {cmd.capacity_gib}: the device total the log prints")
    out = Path(args.output) if args.output else None
    if out is not None and out.exists() and not args.force:
        raise UserError(f"{out} exists; pass --force to replace it")
    base = (out.parent if out is not None else Path.cwd()).resolve()
    hf = os.path.relpath(config.resolve(), base) if config.is_absolute() or out is not None else str(config)
    name = args.name or (parsed.model or "").rstrip("/").split("/")[-1]
    if not re.fullmatch(r"[A-Za-z0-9][\w.+-]*", name):  # an unset $MODEL, a path: the checkpoint folder's name
        name = config.parent.name if re.fullmatch(r"[A-Za-z0-9][\w.+-]*", config.parent.name) else "serve"
    header = [f"written by `timeline from-{cmd.engine} {shlex.quote(args.launch)}"
              + (f" --hf-config {shlex.quote(args.hf_config)}" if args.hf_config else "")
              + (f" --engine-version {args.engine_version}" if args.engine_version else "")
              + "".join(f" --script-env {shlex.quote(e)}" for e in args.script_env)
              + "".join(f" --ignore-arg {shlex.quote(e)}" for e in args.ignore_arg)
              + (f" --job {args.job}" if args.job != 1 else "")
              + f" --gpu {gpu}`",
              *(f"note: {n}" for n in notes),
              f"{cmd.engine} option -> run-file key:",
              *(f"  {k} -> {v}" for k, v in sorted(m.mapped.items()))]
    if neutral:
        header.append("memory-neutral, skipped:")
        header += [f"  {k} ({why})" for k, why in sorted(neutral.items())]
    if passed:
        header.append("passed over (--ignore-arg): their memory is not modelled:")
        header += [f"  {k}" for k in sorted(passed)]
    mml = m.sections["serving"].get("max_model_len") or 0
    total = min(1152, mml) if mml else 1152  # a 1,024-token prompt and 128 answer tokens, shrunk to fit the context
    header.append("the load, serving.load: the tool's defaults (edit it, or give serving.requests = \"trace.csv\")")
    load = {"num_requests": 100, "rate_per_s": 10, "prompt_tokens": {"dist": "fixed", "value": total - total // 9},
            "output_tokens": {"dist": "fixed", "value": total // 9}, "seed": 0}
    # one comment line each, a pasted multi-line command included
    comment = "\n".join(h.replace("\r", " ").replace("\n", " ") for h in header)

    def file_text(hf_path: str) -> str:
        data: dict[str, Any] = {"name": name, "model": {"hf_config": hf_path}}
        if m.sections["parallel"]:
            data["parallel"] = m.sections["parallel"]
        data["hardware"] = hardware
        data["serving"] = {**m.sections["serving"], "load": load}
        return run_file_text(data, comment)

    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    body, hf_abs = file_text(hf), file_text(str(config.resolve()))  # printed, its paths are checked from here
    if args.compare and not cmd.measured:
        raise UserError(f"--compare: {source} is no startup log with the engine's own memory lines (Model loading "
                        "took …, Available KV cache memory, GPU KV cache size, # GPU blocks, #tokens); drop --compare")
    emit_checked_run_file(body, out, args.force, source, load_serve_run, stdout_check_text=hf_abs)
    if args.compare:
        print("\n".join(compare_lines(hf_abs, cmd.measured)), file=sys.stderr if out is None else sys.stdout)
    return 0


#: a log's quantity → (its label, the budget's value in that unit)
_COMPARED: dict[str, tuple[str, Callable[[Budget], float]]] = {
    "weights_gib": ("weights GiB", lambda b: b.weights_bytes / 2**30),
    "kv_pool_gib": ("KV pool GiB", lambda b: b.kv_pool_bytes / 2**30),
    "kv_tokens": ("KV tokens", lambda b: b.num_kv_blocks * b.block_size),
    "kv_blocks": ("KV blocks", lambda b: b.num_kv_blocks),
}


def compare_lines(text: str, measured: dict[str, float]) -> list[str]:
    """The run file ``text``'s budget (its first worker), each quantity the engine's log measured beside it."""
    import tomllib

    from timeline.io.serve_runfile import load_serve_run
    from timeline.serve.budget import compute_budget

    budget = compute_budget(load_serve_run(Path("<from-serve>"), data=tomllib.loads(text)))
    out = [f"{'':<12} {'log':>12} {'simulated':>12}"]
    for key, value in measured.items():
        label, ours = _COMPARED[key]
        got = ours(budget)
        err = f" ({100 * (got - value) / value:+.2f} %)" if value else ""
        fmt = ",.2f" if label.endswith("GiB") else ",.0f"
        out.append(f"{label:<12} {value:>12{fmt}} {got:>12{fmt}}{err}")
    if budget.failure:
        out.append(f"the engine would refuse to start: {budget.failure}")
    return out

