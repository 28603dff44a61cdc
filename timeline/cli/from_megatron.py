"""``timeline from-megatron CONFIG --world-size N``: write the run file of a Megatron-LM job from
its own arguments (a functional test's ``model_config.yaml``, a launch script's argument list, or a job's
log with the arguments block Megatron prints)."""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from timeline.cli.common import add_gpu_arguments, emit_checked_run_file, gpu_fields, positive, script_env
from timeline.errors import UserError
from timeline.io.megatron_map import ASSUMED_VOCAB
from timeline.io.megatron_table import FORK_FAMILIES
from timeline.spec.framework import OPTIMIZER_IMPLS

if TYPE_CHECKING:
    from collections.abc import Callable

    from timeline.io.megatron_args import MegatronArgs
    from timeline.io.megatron_map import Conversion
    from timeline.spec.run import RunSpec

HELP = ("write a run file from Megatron-LM arguments (model_config.yaml, a launch script, a job's log or a "
        "Megatron-Bridge config)")
DESCRIPTION = """\
Read Megatron-LM's arguments and write the run file that simulates that job (stdout without -o).
CONFIG is YAML when it ends in .yaml/.yml — MODEL_ARGS (keys with or without the leading --;
true = a bare flag, false = absent) and optional ENV_VARS, the format of Megatron-LM's functional
tests — a bash launch script (variables, arrays of arguments, ${ARR[@]}, ${X:-default}, $((…)), if blocks on
[ … ] tests; read, never run: the torchrun … pretrain_gpt.py command's arguments, its nproc_per_node × nnodes
as the world size) — or an argument list as a launch script passes it to pretrain_gpt.py (several per line,
\\ continuations, # comments) — or a job's log: the arguments block every Megatron-LM job prints
("------ arguments ------", each attribute after dots) is the whole job, its world size included; the
Megatron-Core version is the one whose parser printed those names (--megatron-core overrides it), and
the log's report_memory lines ("memory (MB) | allocated: …") go to the run file's notes, to compare
with what simulate predicts — or a Megatron-Bridge (NeMo) job's ConfigContainer: the "------- Task Configuration
-------" block its log prints, the run_config.yaml a checkpoint saves, or the "Configuration Summary (Non-Default
Values vs Megatron Core)" later logs print (every field it leaves out is Megatron-Core's dataclass default at
--megatron-core; the model provider's own fields it never prints — tied output layer, position embedding,
vocabulary rows — are the choice under which the run counts the log's "number of parameters" lines, or what
--script-args gives); each field is read as the Megatron-LM argument that sets it (give --world-size). Absent arguments take Megatron's command-line defaults; every
argument is mapped to a run-file key, listed as memory-neutral in the file's header, or refused
with one line naming it. The vocabulary is the tokenizer's as Megatron builds it: a --tokenizer-model
file on this machine (SentencePiece .model, a Hugging Face folder or a hub name in the local cache) is
read; otherwise --vocab-size stands in for it.

examples:
  timeline from-megatron tests/functional_tests/test_cases/gpt/gpt3_mcore_te_tp2_pp2/model_config.yaml --world-size 8
  timeline from-megatron train_args.txt --world-size 64 --gpu h100 -o job.toml && timeline simulate job.toml
  timeline from-megatron examples/mixtral/train_mixtral_8x7b_distributed.sh --world-size 64 -o mixtral.toml
  timeline from-megatron logs/train_rank0.log --gpu h100 -o job.toml    a log: arguments, world size, version
  timeline from-megatron checkpoints/iter_0001000/run_config.yaml --world-size 64 -o job.toml    Megatron-Bridge
"""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG",
                        help="model_config.yaml, a launch script, a file of pretrain_gpt.py arguments, or a job's log "
                             "holding Megatron's printed arguments block")
    parser.add_argument("--world-size", type=positive, metavar="N",
                        help="GPUs of the job (dp = N / (tp·pp·cp)); a launch script's torchrun --nproc_per_node × "
                             "--nnodes when it gives both")
    add_gpu_arguments(parser)
    parser.add_argument("--megatron-core", metavar="X.Y.Z",
                        help="Megatron-Core version the job ran (megatron/core/package_info.py; default: a log's "
                             "own, else the newest release read, 0.19.0, with a note); from 0.15 Megatron's own "
                             "output layer reuses TE's cached dummy weight gradient; given as 0.20.0 (main at "
                             "d98e8a64dd, the newest parser read) or later, an argument no parser read has is "
                             "passed over with a note (it may be newer), not refused")
    parser.add_argument("--te-version", metavar="X.Y", help="Transformer Engine version the job ran (default 2.6)")
    parser.add_argument("--pytorch-version", metavar="X.Y",
                        help="PyTorch version the job ran (default 2.13); sizes PyTorch's default cuBLAS "
                             "workspace, which on Blackwell is 8.125 MiB before 2.12 and 32 MiB from it")
    parser.add_argument("--optimizer-impl", choices=OPTIMIZER_IMPLS,
                        help="the Adam Megatron-Core imported (default te_fused: Transformer Engine installed); "
                             "apex_fused: Apex without TE; torch_foreach: neither, the log warns 'Transformer "
                             "Engine and Apex are not installed. Falling back to Torch optimizers.'")
    parser.add_argument("--script-args", metavar="'ARG …'", default=None,
                        help="the positional arguments a launch script is run with ($1, $2, …, $#, \"$@\"; one "
                             "string, split as a shell splits it), e.g. --script-args 'dsw 8B 1 8 1e-5'; without it "
                             "the script reads as run with none; for a Megatron-Bridge configuration summary, "
                             "Megatron-LM options for the provider fields it leaves out, e.g. --script-args "
                             "'--untie-embeddings-and-output-weights --position-embedding-type rope "
                             "--padded-vocab-size 128256'")
    parser.add_argument("--script-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a variable of the environment the launch script starts in (repeat it), as in "
                             "`MP_PP0_LAYERS=6 bash run.sh`: the script reads it as bash would, and it is the "
                             "job's environment (e.g. NVTE_FUSED_ATTN=0); for a YAML config, what fills its "
                             "${NAME} placeholders, as envsubst would")
    parser.add_argument("--job", type=positive, metavar="K", default=None,
                        help="of a launch script that launches several jobs (a sweep's loop), the K-th (from 1; "
                             "default the first, with a note)")
    parser.add_argument("--vocab-size", type=positive, metavar="N", default=None,
                        help="the tokenizer's vocabulary, as if the job's arguments held --vocab-size N: where its "
                             "--tokenizer-model file is not on this machine (a SentencePiece or Hugging Face "
                             "tokenizer the job reads at its start)")
    parser.add_argument("--entry", metavar="NAME.py", default=None,
                        help="the launch script's entry script where it is not named as Megatron's are "
                             "(pretrain_*.py, train*.py, finetune*.py): e.g. --entry sft.py")
    parser.add_argument("--family", choices=sorted(FORK_FAMILIES), default=None,
                        help="what a fork's entry script (not one of Megatron-LM's own: Pai-Megatron-Patch's "
                             "pretrain_qwen.py, a train_*.py) builds, as the Megatron-LM entry script it stands for "
                             f"({', '.join(f'{k}: {v}' for k, v in FORK_FAMILIES.items())}); without it such a "
                             "script is read as pretrain_gpt.py (GPTModel), with a note")
    parser.add_argument("--ignore-arg", action="append", default=[], metavar="NAME",
                        help="pass over an argument of no Megatron-LM version — a fork's own (Pai-Megatron-Patch, "
                             "Megatron-DeepSpeed, …) — listed in the run file as not modelled: its name without the "
                             "dashes (or --ignore-arg=--NAME); repeat it or give several, comma-separated, e.g. "
                             "--ignore-arg extra-vocab-size,train-mode (Megatron-LM's own arguments cannot be "
                             "passed over)")
    parser.add_argument("--resumed", action="store_true",
                        help="the job's --load holds a checkpoint of this training: it loads the optimizer's state "
                             "(unless --finetune / --no-load-optim) before its first iteration")
    parser.add_argument("--compare", action="store_true",
                        help="for a log with report_memory lines: simulate the run file written and print, per logged "
                             "rank, the log's max allocated / max reserved beside the simulated peaks")
    parser.add_argument("-o", "--output", metavar="RUN.toml", help="write the run file here (default: stdout)")
    parser.add_argument("--force", action="store_true", help="replace RUN.toml if it exists")
    parser.add_argument("--name", help="the run's name (default: the config's folder or file name)")


def default_name(path: Path) -> str:
    """A functional test's case folder (``…/gpt3_mcore_te_tp2_pp2/model_config.yaml``), else the file's stem; made a
    valid run name (other characters as "-", at most 100 of them: :func:`timeline.io.runfile.default_name`)."""
    from timeline.io.runfile import default_name as run_name

    stem = path.parent.name if path.stem == "model_config" and path.parent.name else path.stem
    return run_name(Path(stem + ".toml"))


def run(args: argparse.Namespace) -> int:
    from timeline.io.megatron_args import read_megatron_config
    from timeline.io.megatron_write import check_names, convert, run_file_text
    from timeline.io.runfile import load_run

    path = Path(args.config)
    out = Path(args.output) if args.output else None
    if out is not None and out.exists() and not args.force:
        raise UserError(f"{out} exists; pass --force to replace it")
    script_args = None
    if args.script_args is not None:
        try:
            script_args = shlex.split(args.script_args)
        except ValueError as exc:
            raise UserError(f"--script-args: {exc} (quote it as a shell would)") from None
    fields = gpu_fields(args.gpu_field)
    env = script_env(args.script_env)
    if args.entry is not None and not re.fullmatch(r"[^/\s]+\.py", args.entry):
        raise UserError(f"--entry {args.entry}: give the entry script's file name, e.g. --entry sft.py")
    margs = read_megatron_config(path, script_args=script_args, script_env=env, job=args.job,
                                 entry=args.entry, megatron_core=args.megatron_core)
    megatron_core = args.megatron_core or margs.megatron_core
    if args.vocab_size is not None:
        margs = dataclasses.replace(margs, args={**margs.args, "--vocab-size": str(args.vocab_size)})
    notes = list(margs.notes)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if args.family is not None:
        if margs.family is not None and margs.family != args.family:
            raise UserError(f"--family {args.family}: {margs.family_source} already says the job trains a "
                            f"{margs.family} model (drop --family)")
        margs = dataclasses.replace(margs, family=args.family, family_source=f"--family {args.family}",
                                    fork_entry=None)
    elif margs.fork_entry is not None:
        notes.append(f"{margs.fork_entry} is not one of Megatron-LM's entry scripts (a fork's): read as "
                     "pretrain_gpt.py, building GPTModel; if it builds another model (a vision-language one), "
                     "give --family")
        print(f"note: {notes[-1]}", file=sys.stderr)
    from timeline.io.device_name import run_gpu

    gpu, device = run_gpu(margs.device_name, args.gpu)
    if device:
        notes.append(device)
        print(f"note: {device}", file=sys.stderr)
    resumed = args.resumed
    if margs.loaded_checkpoint and not args.resumed:
        resumed = True
        notes.append("the job loaded a checkpoint before its iterations (the log's 'successfully loaded checkpoint "
                     "from …', checkpointing.py: load_checkpoint): read as --resumed")
        print(f"note: {notes[-1]}", file=sys.stderr)
    world_size = args.world_size or margs.world_size
    ignored = tuple("--" + n.strip().lstrip("-") for item in args.ignore_arg for n in item.split(",")
                    if n.strip().lstrip("-"))
    if world_size is None:
        # the names first: a fork's arguments are one line to pass over, before the world size is asked for
        check_names(dataclasses.replace(margs, args={k: v for k, v in margs.args.items() if k not in ignored}),
                    megatron_core)
        raise UserError("--world-size N is needed: give the job's GPU count (its launcher's nproc_per_node × nnodes "
                        f"is not in {path})")
    if args.world_size and margs.world_size and args.world_size != margs.world_size:
        print(f"note: --world-size {args.world_size} replaces the script's torchrun {margs.world_size}",
              file=sys.stderr)
    if args.compare and not margs.measured:
        raise UserError(f"--compare: {path} holds no report_memory line ('[Rank R] (after N iterations) memory (MB) "
                        "| allocated: …'); drop --compare")

    def converted(m: MegatronArgs) -> Conversion:
        return convert(m, world_size=world_size, gpu=gpu, te_version=args.te_version,
                       pytorch_version=args.pytorch_version, megatron_core=megatron_core, resumed=resumed,
                       optimizer_impl=args.optimizer_impl, gpu_fields=fields, ignored=ignored,
                       version_given=args.megatron_core is not None)

    conv = converted(margs)
    for note in conv.notes:
        print(f"note: {note}", file=sys.stderr)
    notes += conv.notes
    source = str(path)  # the header's command line: what reproduces the run file
    if args.script_args is not None:
        source += f" --script-args {shlex.quote(args.script_args)}"
    for name, value in env.items():
        source += f" --script-env {shlex.quote(f'{name}={value}')}"
    if args.job is not None:
        source += f" --job {args.job}"
    if args.entry is not None:
        source += f" --entry {args.entry}"
    if args.vocab_size is not None:
        source += f" --vocab-size {args.vocab_size}"
    if conv.passed_over:
        source += f" --ignore-arg {','.join(n.lstrip('-') for n in conv.passed_over)}"
    if args.family is not None:
        source += f" --family {args.family}"
    def rendered(c: Conversion, with_notes: list[str]) -> str:
        return run_file_text(c, name=args.name or default_name(path), source=source, world_size=world_size,
                             notes=with_notes)

    text = rendered(conv, notes)
    if margs.alternatives and margs.param_counts:
        found = provider_by_counts(margs, converted, rendered, notes, solve_vocab=args.vocab_size is None)
        if found is not None:
            margs, conv, said = found
            notes = [*notes, *(n for n in conv.notes if n not in notes), said]
            print(f"note: {said}", file=sys.stderr)
            text = rendered(conv, notes)
    if margs.param_counts and args.vocab_size is None and any(n.startswith(ASSUMED_VOCAB) for n in conv.notes):
        solved = solved_vocab(text, margs.param_counts)
        if solved is not None:  # the vocabulary the log's own parameter count gives, in place of the assumed one
            margs = dataclasses.replace(margs, args={**margs.args, "--vocab-size": str(solved)})
            conv = converted(margs)
            notes = [n for n in notes if not n.startswith(ASSUMED_VOCAB)] + [
                n for n in conv.notes if n not in notes] + [
                f"the vocabulary is {solved:,} tokens (the rows it pads to are what the log's parameter count on "
                "(tensor, pipeline) rank (0, 0) gives): the arguments name no tokenizer"]
            print(f"note: {notes[-1]}", file=sys.stderr)
            text = rendered(conv, notes)
    if margs.param_counts:  # a log's own parameter counts, held against the run's
        checked = param_count_notes(text, margs.param_counts)
        for note in checked:
            print(f"note: {note}", file=sys.stderr)
        text = rendered(conv, [*notes, *checked])
    try:
        emit_checked_run_file(text, out, args.force, str(path), load_run)
    except UserError as exc:
        raise UserError(with_arguments(str(exc), conv.mapped, margs.args)) from None
    if args.compare:
        lines = compare_lines(text, margs.measured)
        print("\n".join(lines), file=sys.stderr if out is None else sys.stdout)
    return 0


def compare_lines(text: str, measured: tuple[tuple[int, int, float, float, float, float], ...]) -> list[str]:
    """The run file ``text`` simulated from its first iteration on (no warm-up left out: Megatron's peaks are
    never reset), each logged rank's max allocated / max reserved beside the simulated peaks of the device
    standing for its pipeline rank (global rank R on pipeline rank R // (world / pp), Megatron's default order).
    A line after iteration 1 is held against one simulated iteration (its peak so far: the first step's
    optimizer states made, not yet held through a forward), a later one against two (the steady state)."""
    from timeline.result.build import build_timeline

    run = _run_of(text)
    if run is None:
        return []
    timelines = {}
    for n in sorted({min(it, 2) for _, it, *_ in measured}):
        run_n = dataclasses.replace(run, training=dataclasses.replace(run.training, warmup_iterations=0,
                                                                      iterations=n))
        timelines[n] = build_timeline(run_n, summary_only=True)
    par = run.parallel
    world = par.tp * par.pp * par.cp * par.dp
    mib = 2**20
    out = [f"{'rank':>5} {'pp':>3} {'after':>6}  {'max allocated MiB (log / simulated)':>37}  "
           f"{'max reserved MiB (log / simulated)':>36}"]
    for rank, it, _a, ma, _r, mr in measured:
        tl = timelines[min(it, 2)]
        pp = rank // max(1, world // par.pp)
        d = next((d for d in range(tl.num_devices) if tl.devices[d].pp_rank == pp), None)
        if d is None:
            continue
        pk = tl.peak(d)
        got_a, got_r = pk.allocated_bytes / mib, pk.reserved_bytes / mib
        out.append(f"{rank:>5} {pp:>3} {it:>6}  {ma:>12,.1f} / {got_a:>10,.1f} ({100 * (got_a - ma) / ma:+6.2f} %)  "
                   f"{mr:>11,.1f} / {got_r:>10,.1f} ({100 * (got_r - mr) / mr:+6.2f} %)")
    return out


def _run_of(text: str) -> RunSpec | None:
    import tomllib

    from timeline.io.runfile import run_from_data

    try:
        return run_from_data(tomllib.loads(text), Path("<from-megatron>"))
    except UserError:
        return None  # the run file's own check reports it


def _stage_params(run: RunSpec) -> list[int]:
    """Parameters on each pipeline rank (every chunk it holds), as ``get_model`` sums ``p.nelement()``."""
    from timeline.graph.source import model_source
    from timeline.pipeline.placement import stage_placement
    from timeline.placement.devices import chunk_params

    par = run.parallel
    placed = stage_placement(run.schedule.kind, par.pp, par.vpp)
    params = chunk_params(model_source(run), (c for st in placed for c in st))
    return [sum(t.numel for c in placed[p] for t in params[c]) for p in range(par.pp)]


def provider_by_counts(margs: MegatronArgs, converted: Callable[[MegatronArgs], Conversion],
                       rendered: Callable[[Conversion, list[str]], str], notes: list[str], *,
                       solve_vocab: bool) -> tuple[MegatronArgs, Conversion, str] | None:
    """The first of ``margs.alternatives`` (a Megatron-Bridge summary's model-provider fields: tied output layer,
    position embedding, vocabulary padding) under which the run counts the log's parameters on every logged
    pipeline rank (the vocabulary solved from the counts too where the arguments name none): (the arguments, their
    conversion, the note saying so). None where none does: the first stays, with a note."""
    from timeline.io.megatron_bridge import PROVIDER

    logged = margs.param_counts
    for overlay in margs.alternatives:
        args = {o: v for o, v in margs.args.items() if o not in overlay}
        args.update({o: v for o, v in overlay.items() if v is not None})
        if args.get("--position-embedding-type") == "learned_absolute":
            args.setdefault("--max-position-embeddings", args.get("--seq-length"))
        m = dataclasses.replace(margs, args=args)
        try:
            c = converted(m)
            text = rendered(c, notes)
            if solve_vocab and any(n.startswith(ASSUMED_VOCAB) for n in c.notes):
                solved = solved_vocab(text, logged)
                if solved is None:
                    continue
                m = dataclasses.replace(m, args={**m.args, "--vocab-size": str(solved)})
                c = converted(m)
                text = rendered(c, notes)
        except UserError:
            continue
        run = _run_of(text)
        if run is None:
            continue
        ours = _stage_params(run)
        if all(pp < len(ours) and ours[pp] == n for tp, pp, n in logged if tp == 0):
            said = ", ".join(f"{o} {'absent' if overlay[o] is None else overlay[o]}" for o in overlay
                             if overlay[o] is not None and PROVIDER.get(o) != overlay[o]) or \
                "GPTModelProvider's defaults"
            vocab = f"; vocabulary {m.args['--vocab-size']}" if "--vocab-size" in m.args and solve_vocab else ""
            return m, c, (f"the model-provider fields the summary leaves out are what the log's parameter counts on "
                          f"(tensor, pipeline) rank{'s' if len(logged) > 1 else ''} "
                          f"{', '.join(f'({t}, {p})' for t, p, _ in logged)} give: {said}{vocab}")
    return None


def solved_vocab(text: str, logged: tuple[tuple[int, int, int], ...]) -> int | None:
    """The vocabulary that gives the log's parameter count on the first pipeline rank, where the run's vocabulary
    was assumed: the rank's count is affine in the padded vocabulary (the embedding's rows, and the output layer's
    where one stage holds both), which pads in steps of ``make_vocab_size_divisible_by`` × tp (Megatron-LM
    ``vocab_utils.py: _vocab_size_with_padding``). None unless the solution is a whole number of steps and every
    logged pipeline rank then counts as the log does."""
    run = _run_of(text)
    first = next((n for tp, pp, n in logged if tp == 0 and pp == 0), None)
    if run is None or first is None:
        return None
    step = run.framework.make_vocab_size_divisible_by * run.parallel.tp
    vocab = run.model.vocab_size

    def counts(v: int) -> list[int]:
        return _stage_params(dataclasses.replace(run, model=dataclasses.replace(run.model, vocab_size=v)))

    c1, c2 = counts(vocab)[0], counts(vocab + step)[0]
    if c2 == c1 or (first - c1) % (c2 - c1):
        return None
    solved = vocab + step * (first - c1) // (c2 - c1)
    if solved <= 0 or solved > 2**24:
        return None
    ours = counts(solved)
    return solved if all(ours[pp] == n for tp, pp, n in logged if tp == 0 and pp < len(ours)) else None


def param_count_notes(text: str, logged: tuple[tuple[int, int, int], ...]) -> list[str]:
    """The log's ``number of parameters on (tensor, pipeline) model parallel rank (0, P)`` against the run's own
    count on pipeline rank P: equal says the model is the job's; a difference names the ranks, before any memory is
    simulated. Where the run cannot be built here, nothing is said."""
    run = _run_of(text)
    if run is None:
        return []
    ours = _stage_params(run)
    same: list[tuple[int, int, int]] = []
    differ: list[tuple[int, int, int]] = []
    for tp, pp, n in logged:
        if tp != 0 or pp >= len(ours):
            continue
        (same if ours[pp] == n else differ).append((pp, n, ours[pp]))
    out = []
    if same:
        out.append(f"the log's parameter count equals the run's on pipeline rank(s) "
                   f"{', '.join(str(p) for p, _, _ in same)} ({', '.join(f'{n:,}' for _, n, _ in same)})")
    for pp, n, mine in differ:
        out.append(f"the log counts {n:,} parameters on (tensor, pipeline) rank (0, {pp}), the run {mine:,} "
                   f"({100 * (mine - n) / n:+.2f} %): the model is not the job's (a fork's own layers, a vocabulary "
                   "the arguments do not give: --vocab-size), so neither are its weights' bytes")
    return out


_KEY = re.compile(r"\b([a-z_]+\.[a-z_0-9]+): ")


def with_arguments(message: str, mapped: dict[str, str], given: dict[str, object]) -> str:
    """A run file's problem (``model.vocab_size: must be positive``) with the launch arguments that set each key it
    names (``model.vocab_size (from --vocab-size 0): …``): the user fixes the script, not the run file."""

    def name(m: re.Match[str]) -> str:
        key = m.group(1)
        args = [a for a, keys in mapped.items() if key in keys.split(", ")]
        if not args:
            return m.group(0)
        shown = ", ".join(a if given.get(a) is True else f"{a} {_shown(given.get(a))}" for a in sorted(args))
        return f"{key} (from {shown}): "

    return _KEY.sub(name, message)


def _shown(value: object) -> str:
    return " ".join(str(v) for v in value) if isinstance(value, tuple | list) else str(value)

