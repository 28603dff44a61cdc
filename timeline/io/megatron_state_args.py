"""Megatron-LM arguments that change how a job's static state comes into being rather than its model:
the first chunk's parameter all-gather launched inside the optimizer step.

Each function reads its arguments off an :class:`~timeline.io.megatron_map.ArgReader`, refuses what
Megatron-LM itself rejects (``megatron/training/arguments.py: validate_args``) in one line, and puts the
run-file keys the ``megatron`` profile's rules read. Nothing here simulates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from timeline.errors import UserError

if TYPE_CHECKING:
    from timeline.io.megatron_map import ArgReader, Conversion

#: the arguments that make ``args.virtual_pipeline_model_parallel_size`` (an interleaved schedule)
INTERLEAVING = ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                "--pipeline-model-parallel-layout")


#: memory-neutral arguments read only to refuse a combination Megatron-LM rejects (they stay listed neutral)
CHECKED_ONLY = ("--overlap-param-gather", "--ckpt-format")


def _given(a: ArgReader, name: str) -> object:
    """An argument's value without marking it read: a memory-neutral argument checked only for a
    combination Megatron rejects stays listed neutral in the run file's header."""
    v = a.raw.get(name)
    return False if isinstance(v, str) and v.strip().lower() in ("false", "0", "no") else v


def param_gather_with_step(a: ArgReader, c: Conversion) -> None:
    """``--overlap-param-gather-with-optimizer-step`` → ``framework.overlap_param_gather_with_optimizer_step``.

    ``arguments.py: validate_args`` (46fdcd5b7e … d98e8a64dd) asserts the distributed optimizer,
    ``--overlap-param-gather``, an interleaved schedule and no distributed checkpointing
    (``use_dist_ckpt = ckpt_format != "torch"``, ``training/utils``: ``update_use_dist_ckpt``; the
    default format is ``torch_dist`` from core_v0.12.0 on). What the flag changes in memory is the DDP
    buckets and the optimizer chain (:mod:`timeline.graph.dp_buffers`); the all-gather itself is in place."""
    if not a.flag("--overlap-param-gather-with-optimizer-step"):
        c.put("framework.overlap_param_gather_with_optimizer_step", False)
        return
    needs = [name for name, ok in (
        ("--use-distributed-optimizer", a.flag("--use-distributed-optimizer")),
        ("--overlap-param-gather", bool(_given(a, "--overlap-param-gather"))),
        ("an interleaved schedule (" + " / ".join(INTERLEAVING) + ")",
         any(a.value(n) not in (None, False) for n in INTERLEAVING)),
        ("--ckpt-format torch", str(_given(a, "--ckpt-format") or "torch_dist") == "torch")) if not ok]
    if needs:
        raise UserError(f"--overlap-param-gather-with-optimizer-step: Megatron-LM rejects it without {needs[0]} "
                        "(arguments.py: validate_args)")
    c.put("framework.overlap_param_gather_with_optimizer_step", True, "--overlap-param-gather-with-optimizer-step")
