"""Turn Megatron-LM arguments into run-file text: :func:`convert` checks that every argument was
mapped, is memory-neutral or is refused, and :func:`run_file_text` writes the TOML with the
comment block that maps each argument to its key and lists the memory-neutral ones skipped.

The written file is plain run-file TOML: ``timeline simulate`` runs it as it stands, and
:func:`timeline.io.runfile.load_run` validates it like any other (so a layout Megatron accepts
but the simulator cannot express is reported by the same key-path messages).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from timeline.errors import UserError
from timeline.io.megatron_args import MegatronArgs
from timeline.io.megatron_bert import map_bert
from timeline.io.megatron_framework import framework
from timeline.io.megatron_hybrid import PATTERN_ARGS, stack_spec
from timeline.io.megatron_legacy import legacy_model
from timeline.io.megatron_map import (
    ArgReader,
    Conversion,
    map_model,
    map_mup,
    map_parallel,
    map_training,
    refuse_job,
    refuse_unmodelled,
)
from timeline.io.megatron_offload import activation_offload
from timeline.io.megatron_optimizer import cpu_offload, optimizer, precision_aware
from timeline.io.megatron_optimizer import optimizer_impl as optimizer_impl_of
from timeline.io.megatron_state_args import (
    checkpoint_load,
    embedding_wgrad,
    fsdp_main_params,
    megatron_fsdp,
    param_gather_with_step,
)
from timeline.io.megatron_t5 import derived_args, map_t5
from timeline.io.megatron_table import ENV_MAPPED, MAPPED, NEUTRAL_REASON, NOT_MEGATRON, OTHER_SCRIPTS, label
from timeline.io.megatron_versions import (
    after_every_parser,
    check_argument,
    is_megatron_argument,
    newer_note,
    unknown_arguments,
)
from timeline.io.megatron_vlm import VLM_ARGS, is_vlm, map_vlm
from timeline.spec.hardware import GPUS, fill_gpu
from timeline.spec.schedule_rules import schedule_problems

SECTION_ORDER = ("model", "parallel", "training", "recompute", "offload", "schedule", "allocator", "hardware",
                 "framework")


#: what pretrain_gpt.py (GPTModel) reads of the hybrid arguments: only FLOP counting (Megatron-LM
#: training/training.py: num_floating_point_operations reads args.hybrid_override_pattern / is_hybrid_model;
#: pretrain_gpt.py: model_provider builds GPTModel at core_v0.14.0 … core_v0.19.0 and d98e8a64dd)
HYBRID_ARGS = ("--is-hybrid-model", *PATTERN_ARGS)


def without_unbuilt_hybrid(margs: MegatronArgs, c: Conversion) -> dict[str, Any]:
    """The arguments less the hybrid-model ones where the entry script builds GPTModel (``pretrain_gpt.py``, or a
    fork's entry read as it): the layer pattern then sets no layer's kind; a note says so."""
    gpt = margs.family == "gpt" or (margs.family is None and margs.fork_entry is not None)
    given = [n for n in HYBRID_ARGS if n in margs.args and margs.args[n] not in (False, None)]
    if not gpt or not given or stack_spec(margs.args):
        return margs.args
    entry = margs.fork_entry or "pretrain_gpt.py"
    c.notes.append(f"{', '.join(given)}: {entry} builds GPTModel, whose layers these do not set (Megatron-LM reads "
                   "them only to count FLOPs, training.py: num_floating_point_operations); simulated as that GPT "
                   "model — a Mamba hybrid is pretrain_mamba.py's")
    for name in given:
        c.mapped[name] = "(read by FLOP counting only)"
    return {k: v for k, v in margs.args.items() if k not in given}


#: the Megatron-Core release a job that names none is read at: the newest release line whose argument parser
#: (tests/data/megatron/parser_args.json, core_v0.19.0) and version-dependent rules are read. Until stop 59 it was
#: 0.14.0 (the run file's ``framework.megatron_core`` default), which a user of a current Megatron-LM got silently.
MEGATRON_DEFAULT = "0.19.0"

def convert(margs: MegatronArgs, *, world_size: int, gpu: str = "h100", te_version: str | None = None,
            pytorch_version: str | None = None, megatron_core: str | None = None,
            keeps_batch: bool | None = None, probs_in_experts: bool | None = None,
            releases_nodes: bool | None = None, router_te_gemm_fixed: bool = False,
            fsdp_package: bool | None = None, resumed: bool = False, muon_buffer_layout: str | None = None,
            optimizer_impl: str | None = None, null_eod: bool | None = None,
            ignored: tuple[str, ...] = (), gpu_fields: Mapping[str, Any] | None = None,
            version_given: bool = True) -> Conversion:
    """The run-file data of the job ``margs`` describes on ``world_size`` GPUs of kind ``gpu``
    (``keeps_batch``, ``probs_in_experts``, ``releases_nodes``, ``router_te_gemm_fixed``:
    :func:`timeline.io.megatron_framework.framework`; ``fsdp_package``:
    :func:`timeline.io.megatron_state_args.megatron_fsdp`;
    ``resumed``: its ``--load`` holds a checkpoint of this training,
    :func:`timeline.io.megatron_state_args.checkpoint_load`; ``muon_buffer_layout``: how Muon's layer-wise
    optimizer lays out its state, :func:`timeline.io.megatron_optimizer.optimizer`; ``optimizer_impl``: which
    Adam Megatron imported, :func:`timeline.io.megatron_optimizer.optimizer_impl`; ``null_eod``: whether the
    commit's ``NullTokenizer`` counts its EOD on top of ``--vocab-size``, :func:`timeline.io.megatron_tokenizer.vocab_size`;
    ``ignored``: arguments of no Megatron-LM version — a fork's own (Pai-Megatron-Patch, Megatron-DeepSpeed) — the user
    chose to pass over, listed in the run file as not modelled; ``gpu_fields``: ``[hardware]`` values over the
    preset's — for a kind no preset holds, every field its rules read, :func:`timeline.spec.hardware.fill_gpu`;
    ``version_given``: ``megatron_core`` is the user's word, not a version a log's names were matched to — only
    then are arguments of no parser, under a release at or after the newest parser read, passed over with a note:
    :func:`timeline.io.megatron_versions.after_every_parser`)."""
    if world_size < 1:
        raise UserError(f"--world-size must be 1 or more, got {world_size}")
    hardware = {**(gpu_fields or {}), "gpu": gpu}
    missing = fill_gpu(hardware, world_size)
    if missing:
        needs = missing[0][1].split(" — ", 1)[1].replace(" = ", ": ")
        raise UserError(f"--gpu {gpu}: no preset ({', '.join(GPUS)}); give each field its rules read as --gpu-field "
                        f"KEY=VALUE: {needs}")
    for flag, version in (("--te-version", te_version), ("--pytorch-version", pytorch_version)):
        if version is not None and not re.fullmatch(r"\d+\.\d+(\.\d+)?", version):
            raise UserError(f"{flag} {version!r}: expected X.Y or X.Y.Z")
    if megatron_core is not None and not re.fullmatch(r"\d+\.\d+(\.\d+)?(rc\d+)?", megatron_core):
        raise UserError(f"--megatron-core {megatron_core!r}: expected X.Y, X.Y.Z or X.Y.ZrcN")
    refuse_job(margs)
    for name in ignored:
        if is_megatron_argument(name):
            raise UserError(f"--ignore-arg {name}: a Megatron-LM argument, which timeline maps, lists as memory-neutral "
                            "or refuses with its reason; only a fork's own arguments can be passed over")
    passed_over = [name for name in ignored if name in margs.args]
    if passed_over:
        margs = replace(margs, args={k: v for k, v in margs.args.items() if k not in ignored})
    newer: list[str] = []
    if version_given and after_every_parser(megatron_core):
        # a job at or after the newest parser read: an argument no parser has may be one added since (not a typo)
        newer = [n for n in margs.args if not is_megatron_argument(n) and n not in VLM_ARGS and n not in OTHER_SCRIPTS
                 and n not in NOT_MEGATRON]
        margs = replace(margs, args={k: v for k, v in margs.args.items() if k not in newer})
    check_names(margs, megatron_core)
    c = Conversion()
    if newer:
        assert megatron_core is not None
        c.notes.append(newer_note(newer, megatron_core))
        for name in newer:
            c.neutral[name] = "in no parser read, the job's release later (unverified)"
    if megatron_core is None:  # every version-dependent rule at one release, said in a note
        megatron_core = MEGATRON_DEFAULT
        c.notes.append(f"no Megatron-Core version given: read as {MEGATRON_DEFAULT}, the newest release whose parser "
                       "and rules are read; give --megatron-core X.Y.Z (megatron/core/package_info.py) for yours")
    a = ArgReader(derived_args(without_unbuilt_hybrid(margs, c), margs.family))
    refuse_unmodelled(margs, a)
    map_model(a, c, margs.family, megatron_core=megatron_core, null_eod=null_eod)
    map_mup(a, c, margs.family)
    dp, _ = map_parallel(a, c, world_size, megatron_core=megatron_core, family=margs.family)
    refuse_expert_layout(c, world_size)
    map_training(a, c, dp)
    optimizer(a, c, megatron_core=megatron_core, buffer_layout=muon_buffer_layout)
    refuse_unschedulable(c, dp, world_size)
    framework(a, c, margs.env, gpu=gpu, sm=int(hardware["sm"]), te_version=te_version, pytorch_version=pytorch_version,
              megatron_core=megatron_core, keeps_batch=keeps_batch, probs_in_experts=probs_in_experts,
              releases_nodes=releases_nodes, router_te_gemm_fixed=router_te_gemm_fixed)
    map_bert(a, c, margs.family)
    map_t5(a, c, margs.family)
    map_vlm(a, c, margs.family)
    legacy_model(a, c)
    param_gather_with_step(a, c)
    megatron_fsdp(a, c, package=fsdp_package)
    for key, value in (gpu_fields or {}).items():  # what the user gave goes into the run file as given
        c.put(f"hardware.{key}", value)
    embedding_wgrad(a, c)
    checkpoint_load(a, c, resumed=resumed, dp_cp=dp * c.sections["parallel"]["cp"])
    if margs.optimizer_stepped and c.sections["training"].get("optimizer_step") is False:
        # fp16's first iterations skip the step while the loss scale comes down (see map_training); the job's log
        # shows a step taken before its memory line, so the moments are there
        c.put("training.optimizer_step", True)
        c.notes.append("the log's iteration lines show optimizer steps taken (fewer skipped iterations than run) "
                       "before its report_memory line: the Adam moments are counted")
    precision_aware(a, c, megatron_core=megatron_core)
    cpu_offload(a, c)
    activation_offload(a, c, margs.env)
    optimizer_impl_of(a, c, optimizer_impl)
    fsdp_main_params(a, c)
    given = {k: v for k, v in c.mapped.items() if k in margs.args}
    for name in margs.args:
        if name in c.neutral:  # a rule read it and found it memory-neutral in this job (megatron_bert.no_qk_norms)
            continue
        if name in a.read or name in given:
            given.setdefault(name, "(read; sets no key of its own)")
            continue
        if name in NEUTRAL_REASON:
            c.neutral[name] = NEUTRAL_REASON[name]
            continue
        if name in MAPPED:  # read only in other configurations (an MLA size without MLA)
            given[name] = "(not used by this configuration)"
            continue
        raise UserError(f"{name}: a Megatron-LM argument timeline has not classified (mapped, memory-neutral or "
                        "refused); please report it")
    c.mapped = given
    for name in margs.env:
        if name not in ENV_MAPPED:
            c.neutral[f"${name}"] = "environment outside PyTorch's allocator"
    c.passed_over = sorted(passed_over)
    return c


def check_names(margs: MegatronArgs, megatron_core: str | None) -> None:
    """Every argument is one of some version of Megatron-LM's training parser (and of ``megatron_core``'s
    when given), else a one-line error: another script's argument, a name from another framework, a
    typo (with the closest real arguments), or an argument of another version."""
    unknown = []
    for name in margs.args:
        if name in VLM_ARGS:  # pretrain_vlm.py's own parser group (io/megatron_vlm.py)
            if is_vlm(margs.family):
                continue
            raise UserError(f"{name}: pretrain_vlm.py's own argument (add_vlm_extra_args); name the job's family as "
                            "LLaVA (pretrain_vlm.py, or a test_cases/multimodal-llava/ folder) or drop it")
        if name in OTHER_SCRIPTS:
            raise UserError(f"{name}: {OTHER_SCRIPTS[name]}")
        if name in NOT_MEGATRON:
            raise UserError(f"{name}: not a Megatron-LM argument; use {NOT_MEGATRON[name]}")
        if not is_megatron_argument(name):
            unknown.append(name)  # all of them in one line: a fork's script has several
            continue
        check_argument(name, megatron_core)
    if unknown:
        raise UserError(unknown_arguments(unknown))


class UnschedulableJob(UserError):
    """The job Megatron refuses at this world size (its pipeline schedule, its expert rank layout)."""


def refuse_expert_layout(c: Conversion, world_size: int) -> None:
    """``megatron/core/parallel_state.py: initialize_model_parallel`` (core_r0.12.0 … d48bd6be0a) raises unless
    the world size is a multiple of etp·ep·pp (the expert ranks' generator; under an encoder stage, the decoder's
    ranks and stages: ``expert_decoder_rank_generator``, 2024-08 … 2025-07)."""
    par = c.sections["parallel"]
    # under a ViT stage of its own the expert ranks' generator covers the decoder's ranks alone (its pp stages)
    encoder = par.get("encoder_pp", 0)
    world_size -= encoder * par["dp"] * par.get("encoder_tp", par["tp"]) * par["cp"]
    size = par["etp"] * par["ep"] * (par["pp"] - encoder)
    if world_size % size:
        raise UnschedulableJob(f"--world-size {world_size} is not divisible by etp·ep·pp = {par['etp']}·{par['ep']}·"
                               f"{par['pp'] - encoder} (--expert-tensor-parallel-size · --expert-model-parallel-size · "
                               "--pipeline-model-parallel-size): Megatron's initialize_model_parallel refuses it")


def refuse_unschedulable(c: Conversion, dp: int, world_size: int) -> None:
    """Refuse a job whose micro-batch count Megatron's pipeline schedule itself rejects at this world
    size (``megatron/core/pipeline_parallel/schedules.py``: ``forward_backward_pipelining_with_interleaving``
    raises when the last group of ``microbatch_group_size_per_vp_stage`` micro-batches is shorter
    than pp), naming the arguments that set the count rather than the run-file key."""
    sched, par, tr = c.sections.get("schedule", {}), c.sections["parallel"], c.sections["training"]
    problems = schedule_problems(sched.get("kind", "1f1b"), pp=par["pp"], vpp=par.get("vpp", 1),
                                 num_microbatches=tr["num_microbatches"],
                                 microbatch_group_size=sched.get("microbatch_group_size", 0))
    if problems:
        m, mbs = tr["num_microbatches"], tr["micro_batch_size"]
        why = problems[0][1].replace("schedule.microbatch_group_size", "--microbatch-group-size-per-virtual-pipeline-stage")
        raise UnschedulableJob(f"--world-size {world_size}: data-parallel size {dp} gives {m} micro-batches "
                               f"(global batch {m * mbs * dp} / (micro-batch {mbs} · dp {dp})), and Megatron's "
                               f"schedule refuses that: {why}; or choose a world size (or --global-batch-size) "
                               "Megatron runs this job at")


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")


def _comment(text: str) -> str:
    return "# " + text.replace("\n", " ")


def run_file_text(c: Conversion, *, name: str, source: str, world_size: int, notes: Sequence[str] = ()) -> str:
    """The run file: the header comment block (``notes``: what the conversion assumed), then ``name`` and each
    section."""
    lines = [_comment(f"written by `timeline from-megatron {source} --world-size {world_size}`"),
             *(_comment(f"note: {n}") for n in notes),
             _comment("Megatron-LM argument -> run-file key:")]
    for arg in sorted(c.mapped):
        lines.append(_comment(f"  {arg} -> {c.mapped[arg]}"))
    for env in sorted(c.env_mapped):
        lines.append(_comment(f"  ${env} -> {c.env_mapped[env]}"))
    if c.neutral:
        lines.append(_comment("memory-neutral, skipped:"))
        for arg in sorted(c.neutral):
            lines.append(_comment(f"  {arg} ({label(c.neutral[arg])})"))
    if c.passed_over:
        lines.append(_comment("passed over (--ignore-arg): not Megatron-LM arguments, their memory effect is not "
                              "modelled:"))
        lines += [_comment(f"  {arg}") for arg in c.passed_over]
    lines.append(f"name = {_toml_value(name)}")
    for section in SECTION_ORDER:
        values = c.sections.get(section)
        if not values:
            continue
        lines.append("")
        lines.append(f"[{section}]")
        for key, value in values.items():
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"
