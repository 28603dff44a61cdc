"""Pipeline actions and schedules in PyTorch pipelining's notation, and their validation.

An action is ``[stage][type][micro-batch]``: the *global* stage (model chunk) index, the type
``F`` (forward), ``B`` (full backward), ``I`` (input-gradient backward) or ``W`` (weight
gradient), and the micro-batch, e.g. ``0F0``, ``3I2``, ``5W2``. A :class:`Schedule` holds one
row of actions per pipeline rank in execution order (idle steps are not actions).

:func:`validate` checks what every schedule must satisfy, whoever wrote it. This module does not
generate schedules (one module per schedule does), time them (``unit_time``) or read files
(``timeline.io.csv_schedule``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from timeline.errors import UserError
from timeline.pipeline import unit_time
from timeline.spec.schedule_rules import schedule_problems

#: action types: forward, full backward, input-gradient backward, weight gradient
ACTION_KINDS = ("F", "B", "I", "W")

_ACTION = re.compile(r"(\d+)([FBIW])(\d+)")
_SYNTAX = "expected [stage][F|B|I|W][micro-batch], e.g. 0F3"


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    """One unit of pipeline work: ``kind`` of global ``stage`` on ``microbatch``."""

    stage: int
    kind: str
    microbatch: int

    def __post_init__(self) -> None:
        if self.kind not in ACTION_KINDS:
            raise ValueError(f"action kind must be one of {ACTION_KINDS}, not {self.kind!r}")
        if self.stage < 0 or self.microbatch < 0:
            raise ValueError(f"stage and micro-batch must be >= 0: {self.stage}, {self.microbatch}")

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> Action:
        """Read ``"0F3"`` back into an action; surrounding blanks are ignored."""
        match = _ACTION.fullmatch(text.strip())
        if match is None:
            raise UserError(f"unknown action {text.strip()!r}: {_SYNTAX}")
        stage, kind, microbatch = match.groups()
        return cls(stage=int(stage), kind=kind, microbatch=int(microbatch))


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """Per pipeline rank, the chunks it holds and its actions in execution order."""

    kind: str
    pp: int
    num_chunks: int
    num_microbatches: int
    stages_of_rank: tuple[tuple[int, ...], ...]
    actions: tuple[tuple[Action, ...], ...]
    #: per rank, positions ``i`` where actions ``i`` (an F) and ``i + 1`` (a B or I of another
    #: chunk or micro-batch) run as one overlapped F&B pair, as DualPipe runs them; () if none
    overlapped: tuple[tuple[int, ...], ...] = ()
    #: the overlapped pairs are Megatron's combined 1F1B (``combined_1f1b.py``): their halves
    #: interleave layer by layer as ``TransformerModelChunkSchedulePlan.run`` orders them, not
    #: proportionally in time as DualPipe's
    combined: bool = False


class ScheduleError(UserError):
    """A schedule that cannot run: names the rank, the 0-based position in its row and why."""

    def __init__(
        self, rank: int | None, position: int | None, reason: str, source: str | None = None
    ) -> None:
        self.rank = rank
        self.position = position
        self.reason = reason
        self.source = source
        where = [f"{source}:"] if source else []
        if rank is not None:
            where.append(f"rank {rank}," if position is not None else f"rank {rank}:")
        if position is not None:
            where.append(f"position {position}:")
        super().__init__(" ".join([*where, reason]))

    def with_source(self, source: str) -> ScheduleError:
        """The same error, prefixed with the file it came from."""
        return ScheduleError(self.rank, self.position, self.reason, source)


def require_positive(**counts: int) -> None:
    """Raise :class:`UserError` unless every count (``pp=4``, ``num_microbatches=8``) is >= 1."""
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an int, not {value!r}")
        if value < 1:
            raise UserError(f"{name} must be at least 1, not {value}")


def require_rules(kind: str, *, pp: int, vpp: int, num_microbatches: int, microbatch_group_size: int = 0,
                  combined_1f1b: bool = False) -> None:
    """Raise :class:`UserError` with the first rule of :func:`~timeline.spec.schedule_rules.schedule_problems`
    that ``kind`` breaks, naming its key. Run validation reports these first (with the file); this
    guards generators called directly."""
    problems = schedule_problems(kind, pp=pp, vpp=vpp, num_microbatches=num_microbatches,
                                 microbatch_group_size=microbatch_group_size, combined_1f1b=combined_1f1b)
    if problems:
        key, message = problems[0]
        raise UserError(f"{key}: {message}")


def in_flight(row: Sequence[Action], *, held_until: str = "I") -> list[int]:
    """After each action of one rank's row, how many (stage, micro-batch) pairs hold activations.

    A pair enters at its ``F`` and leaves at its ``B``, or at its ``I`` (``held_until="I"``,
    where most activations die) or its ``W`` (``held_until="W"``, the inputs a weight gradient
    still needs). Units: one micro-batch through one chunk.
    """
    if held_until not in ("I", "W"):
        raise ValueError(f"held_until must be 'I' or 'W', not {held_until!r}")
    live: set[tuple[int, int]] = set()
    counts = []
    for action in row:
        pair = (action.stage, action.microbatch)
        if action.kind == "F":
            live.add(pair)
        elif action.kind == "B" or action.kind == held_until:
            live.discard(pair)
        counts.append(len(live))
    return counts


def validate(schedule: Schedule, *, columns: Sequence[Sequence[int]] | None = None) -> None:
    """Raise :class:`ScheduleError` for the first problem that would stop the schedule running.

    Checks, rank by rank and position by position: stages and micro-batches exist; each action
    runs on a rank that holds its stage; every (stage, micro-batch) has exactly one ``F`` and
    either one ``B`` or one ``I`` and one ``W``, all on the rank of its ``F``, backward after
    forward and ``W`` after ``I``; then that the ranks' orders together cannot deadlock.
    ``columns[rank][i]`` is the column to report for action ``i`` (a CSV's, which has idle cells).
    """

    def column(rank: int, index: int) -> int:
        return index if columns is None else columns[rank][index]

    def fail(rank: int, index: int | None, reason: str) -> ScheduleError:
        return ScheduleError(rank, None if index is None else column(rank, index), reason)

    if len(schedule.actions) != schedule.pp or len(schedule.stages_of_rank) != schedule.pp:
        raise ValueError(f"schedule has {len(schedule.actions)} rows for pp = {schedule.pp}")
    for rank, pairs in enumerate(schedule.overlapped):
        for index in pairs:
            row = schedule.actions[rank]
            if not (index + 1 < len(row) and row[index].kind == "F" and row[index + 1].kind in ("B", "I")):
                raise fail(rank, index, "an overlapped pair must be an F followed by a B or an I")
    anywhere: dict[tuple[str, int, int], tuple[int, int]] = {}
    for rank, row in enumerate(schedule.actions):
        for index, action in enumerate(row):
            anywhere.setdefault((action.kind, action.stage, action.microbatch), (rank, column(rank, index)))
    seen: dict[tuple[str, int, int], tuple[int, int]] = {}
    for rank, row in enumerate(schedule.actions):
        for index, action in enumerate(row):
            problem = _check_action(schedule, rank, action, seen, anywhere)
            if problem:
                raise fail(rank, index, problem)
            seen[(action.kind, action.stage, action.microbatch)] = (rank, column(rank, index))
    for stage in range(schedule.num_chunks):
        for mb in range(schedule.num_microbatches):
            missing = _check_complete(schedule, stage, mb, seen)
            if missing:
                raise fail(*missing)
    try:
        unit_time.execute(schedule.actions, num_chunks=schedule.num_chunks, overlapped=schedule.overlapped)
    except unit_time.Deadlock as stuck:
        rank, index, action_text, needs = stuck.stuck[0]
        others = "; ".join(f"rank {r} waits at {a} for {n}" for r, _, a, n in stuck.stuck[1:])
        reason = f"deadlock: {action_text} waits for {needs}, which never runs first"
        raise fail(rank, index, reason + (f" ({others})" if others else "")) from None


def _check_action(
    schedule: Schedule,
    rank: int,
    action: Action,
    seen: dict[tuple[str, int, int], tuple[int, int]],
    anywhere: dict[tuple[str, int, int], tuple[int, int]],
) -> str | None:
    """Why ``action`` cannot run where it stands, or None.

    ``seen`` holds the actions checked before it (earlier ranks, earlier positions);
    ``anywhere`` the first place each action occurs in the whole schedule.
    """
    s, k = action.stage, action.microbatch
    if s >= schedule.num_chunks:
        return f"{action}: stage {s} does not exist (the model has {schedule.num_chunks} chunks)"
    if k >= schedule.num_microbatches:
        return f"{action}: micro-batch {k} does not exist (num_microbatches = {schedule.num_microbatches})"
    if s not in schedule.stages_of_rank[rank]:
        held = ", ".join(map(str, schedule.stages_of_rank[rank])) or "none"
        return f"{action}: stage {s} is not on this rank (it holds stages {held})"
    if (action.kind, s, k) in seen:
        r, i = seen[(action.kind, s, k)]
        return f"{action} runs twice (first at rank {r}, position {i})"
    if action.kind == "F":
        return None
    other = {"B": "I", "I": "B", "W": "B"}[action.kind]
    if (other, s, k) in seen:
        return f"{action}: micro-batch {k} of stage {s} already has {s}{other}{k}; use B, or I and W"
    needed = "I" if action.kind == "W" else "F"
    if (needed, s, k) not in anywhere:
        return f"{action} has no {s}{needed}{k} to follow"
    r, i = anywhere[(needed, s, k)]
    if r != rank:
        return f"{action} must run on rank {r}, where {s}{needed}{k} runs (position {i})"
    if (needed, s, k) not in seen:
        return f"{action} runs before its {s}{needed}{k} (position {i})"
    return None


def _check_complete(
    schedule: Schedule, stage: int, mb: int, seen: dict[tuple[str, int, int], tuple[int, int]]
) -> tuple[int, int | None, str] | None:
    """(rank, index, reason) if (stage, micro-batch) lacks its F or its backward, else None."""
    if ("F", stage, mb) not in seen:
        holders = [r for r, stages in enumerate(schedule.stages_of_rank) if stage in stages]
        rank = holders[0] if holders else 0
        return rank, None, f"micro-batch {mb} of stage {stage} never runs forward ({stage}F{mb} is missing)"
    rank, _ = seen[("F", stage, mb)]
    if ("B", stage, mb) in seen:
        return None
    if ("I", stage, mb) not in seen:
        return rank, None, f"micro-batch {mb} of stage {stage} never runs backward ({stage}B{mb} is missing)"
    if ("W", stage, mb) not in seen:
        return rank, None, f"micro-batch {mb} of stage {stage} has {stage}I{mb} but no {stage}W{mb}"
    return None
