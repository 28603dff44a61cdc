"""What each pipeline schedule requires of ``pp``, ``vpp``, the micro-batch count and the
interleaved group size — one pure function, read by run validation (so messages name the key)
and by the schedule generators (as a guard when they are called directly).

This module does not order actions; :mod:`timeline.pipeline` does.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ScheduleKind:
    """One ``[schedule] kind``: what run validation, the placement of chunks, the generator
    dispatch (:data:`timeline.pipeline.GENERATORS`) and the CLI help know of it."""

    name: str
    #: where a rank's chunks lie: "one" (chunk r on rank r), "looped" (r, r + pp, …), "v" (r and
    #: 2·pp − 1 − r), "dualpipe" (r and pp − 1 − r: two model copies in opposite directions)
    placement: str
    #: chunks per rank the kind requires (None: any ``vpp``; interleaved needs at least 2)
    fixed_vpp: int | None
    #: the backward splits into an input gradient I and a weight gradient W
    split_backward: bool
    summary: str


#: every schedule kind, in the order the help and error messages list them
SCHEDULES: tuple[ScheduleKind, ...] = (
    ScheduleKind("gpipe", "one", 1, False, "all forwards, then all backwards"),
    ScheduleKind("1f1b", "one", 1, False, "one forward, one backward (Megatron's default)"),
    ScheduleKind("interleaved", "looped", None, False, "interleaved 1F1B over vpp ≥ 2 chunks per rank"),
    ScheduleKind("zb-h1", "one", 1, True, "zero-bubble H1: backward split into I and W"),
    ScheduleKind("zbv", "v", 2, True, "zero-bubble V: two chunks per rank folded into a V"),
    ScheduleKind("dualpipe", "dualpipe", 1, False, "DualPipe: two directions, overlapped F&B pairs"),
    ScheduleKind("dualpipev", "v", 2, False, "DualPipeV: DualPipe folded into a V"),
    ScheduleKind("csv", "looped", None, False, "hand-written rows (PyTorch pipelining CSV, schedule.csv)"),
)
SCHEDULE_KINDS: dict[str, ScheduleKind] = {k.name: k for k in SCHEDULES}
#: chunks per rank (vpp) a schedule requires, where it fixes it
FIXED_VPP: dict[str, int] = {k.name: k.fixed_vpp for k in SCHEDULES if k.fixed_vpp is not None}


def kinds_help() -> str:
    """One line per schedule kind, for the CLI's help."""
    width = max(len(k.name) for k in SCHEDULES)
    return "\n".join(f"  {k.name:<{width}}  {k.summary}" for k in SCHEDULES)


def _vpp(kind: str, vpp: int) -> list[tuple[str, str]]:
    if kind == "interleaved" and vpp < 2:
        return [("parallel.vpp", f'schedule "interleaved" needs vpp ≥ 2 model chunks per rank, not {vpp}; '
                 'set parallel.vpp or use schedule.kind = "1f1b"')]
    fixed = FIXED_VPP.get(kind)
    if fixed == 2 and vpp != 2:
        return [("parallel.vpp", f'schedule "{kind}" places exactly 2 chunks per rank (a V), not {vpp}; '
                 "set parallel.vpp = 2")]
    if fixed == 1 and vpp != 1:
        return [("parallel.vpp", f'schedule "{kind}" holds one chunk per rank, not {vpp}; set parallel.vpp = 1 '
                 'or use schedule.kind = "interleaved"')]
    return []


def _interleaved(pp: int, m: int, group_size: int) -> list[tuple[str, str]]:
    if m < pp:
        return [("training.num_microbatches", f"interleaved 1F1B needs at least pp = {pp} micro-batches, "
                 f"not {m} (Megatron's rule); raise it to {pp} or more")]
    group = group_size or pp
    if not pp <= group <= m:
        return [("schedule.microbatch_group_size", f"{group} must lie in [pp, num_microbatches] = [{pp}, {m}]; "
                 "0 means pp")]
    if 0 < m % group < pp:
        return [("training.num_microbatches", f"{m} leaves a last group of {m % group} micro-batches, fewer "
                 f"than pp = {pp} (Megatron rejects the dependency bubbles this causes); use a multiple of "
                 f"{group}, or a schedule.microbatch_group_size that divides {m}")]
    return []


def _dualpipe(pp: int, m: int) -> list[tuple[str, str]]:
    out = []
    if pp % 2:
        out.append(("parallel.pp", f'schedule "dualpipe" needs an even pp (its two directions meet in the '
                    f'middle), not {pp}; use pp = {pp + 1}, or schedule.kind = "dualpipev" which has no such rule'))
    if m % 2 or m < 2 * pp:
        out.append(("training.num_microbatches", f'schedule "dualpipe" needs an even num_microbatches of at '
                    f"least 2·pp = {2 * pp} (half go each way), not {m}; use {max(2 * pp, m + m % 2)}"))
    return out


def _combined(kind: str, pp: int) -> list[tuple[str, str]]:
    """Megatron runs combined 1F1B without pipelining or in the interleaved schedule only
    (``transformer_config.py: TransformerConfig.__post_init__`` asserts a virtual pipeline size
    when pp > 1; ``schedules.py``: ``forward_backward_no_pipelining`` and
    ``forward_backward_pipelining_with_interleaving`` call ``combined_1f1b.py``)."""
    if kind == "interleaved" or (kind == "1f1b" and pp == 1):
        return []
    where = f'schedule "1f1b" at pp = {pp}' if kind == "1f1b" else f'schedule "{kind}"'
    return [("schedule.combined_1f1b", f"Megatron runs combined 1F1B only without pipelining (1f1b at pp = 1) "
             f'or interleaved, not {where}; set schedule.kind = "interleaved" with vpp ≥ 2, or remove it')]


def schedule_problems(kind: str, *, pp: int, vpp: int, num_microbatches: int,
                      microbatch_group_size: int = 0, combined_1f1b: bool = False) -> list[tuple[str, str]]:
    """Every (key path, message) that makes ``kind`` impossible with these counts; empty if it runs.

    ``microbatch_group_size`` 0 means pp (interleaved only). Counts are assumed ≥ 1 (the
    sections check that); ``csv`` schedules are checked against their rows when read.
    ``combined_1f1b``: Megatron's combined 1F1B pairs (:func:`_combined`).
    """
    m = num_microbatches
    out = _vpp(kind, vpp) + (_combined(kind, pp) if combined_1f1b else [])
    if microbatch_group_size and kind != "interleaved":
        out.append(("schedule.microbatch_group_size", f'applies to interleaved only, not "{kind}"; '
                    "remove it or set 0"))
    if out:
        return out
    if kind == "interleaved":
        out += _interleaved(pp, m, microbatch_group_size)
    elif kind == "dualpipe":
        out += _dualpipe(pp, m)
    elif kind == "dualpipev" and m < 2 * pp:
        out.append(("training.num_microbatches", f'schedule "dualpipev" needs at least 2·pp = {2 * pp} '
                    f"micro-batches (one per chunk), not {m}; raise it to {2 * pp}"))
    return out
