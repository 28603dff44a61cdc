"""A unit-time executor: when each action of a schedule starts if actions of one kind all take
the same time and communication is free.

Each rank runs its actions in the given order. An action starts once its rank is free and its
dependencies have finished, wherever they ran:

- ``F`` of (stage ``s``, micro-batch ``k``) needs ``F`` of (``s − 1``, ``k``);
- ``B`` or ``I`` of (``s``, ``k``) needs ``F`` of (``s``, ``k``) and ``B`` or ``I`` of
  (``s + 1``, ``k``) (the last stage only its own ``F``, which computes the loss);
- ``W`` of (``s``, ``k``) needs ``I`` of (``s``, ``k``).

Default durations are the zero-bubble paper's units: ``F = 1``, ``I = 1``, ``W = 1`` and a full
backward ``B = I + W = 2``. With these, 1F1B on ``p`` ranks takes ``(m + p − 1)·(F + B)``.

This module does not model communication, compute/communication overlap (DualPipe's ``F&B``
pairs run one after the other here) or memory; the simulator in ``sim/`` does. It serves the
validator (deadlock detection), the text renderer and the tests' bubble formulas.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from timeline.pipeline.actions import Action

#: F = I = W = 1 and B = I + W (time units)
DEFAULT_DURATIONS: Mapping[str, float] = MappingProxyType({"F": 1, "B": 2, "I": 1, "W": 1})

# A finished-work key: ("F" | "BI" | "I", stage, micro-batch). "BI" is any input-gradient
# backward (B or I), which is what the previous stage waits for.
_Key = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class Timed:
    """One action with its unit-time start and end."""

    action: Action
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Execution:
    """Per rank, the timed actions in execution order."""

    rows: tuple[tuple[Timed, ...], ...]

    @property
    def makespan(self) -> float:
        """When the last action on any rank ends."""
        return max((row[-1].end for row in self.rows if row), default=0)

    def busy(self, rank: int) -> float:
        """Total time rank ``rank`` spends computing."""
        return sum(t.end - t.start for t in self.rows[rank])


class Deadlock(ValueError):
    """No rank can start its next action: each waits for work that never runs before it."""

    def __init__(self, stuck: Sequence[tuple[int, int, str, str]]) -> None:
        #: (rank, position, action, what it waits for) for every rank that still has actions
        self.stuck = tuple(stuck)
        rank, position, action, needs = self.stuck[0]
        super().__init__(f"rank {rank}, position {position}: {action} waits for {needs}, which never runs")


def _needs(action: Action, num_chunks: int) -> tuple[_Key, ...]:
    s, k = action.stage, action.microbatch
    if action.kind == "F":
        return (("F", s - 1, k),) if s > 0 else ()
    if action.kind in ("B", "I"):
        return (("F", s, k), ("BI", s + 1, k)) if s + 1 < num_chunks else (("F", s, k),)
    return (("I", s, k),)


def _provides(action: Action) -> tuple[_Key, ...]:
    s, k = action.stage, action.microbatch
    if action.kind == "F":
        return (("F", s, k),)
    if action.kind == "B":
        return (("BI", s, k),)
    if action.kind == "I":
        return (("BI", s, k), ("I", s, k))
    return (("W", s, k),)


def _group_needs(group: Sequence[Action], num_chunks: int) -> list[_Key]:
    """What an action, or an overlapped pair as a whole, waits for from other work."""
    own = {key for action in group for key in _provides(action)}
    return [key for action in group for key in _needs(action, num_chunks) if key not in own]


def _describe(key: _Key) -> str:
    kind, s, k = key
    return f"{s}B{k} or {s}I{k}" if kind == "BI" else f"{s}{kind}{k}"


def execute(
    actions: Sequence[Sequence[Action]],
    *,
    num_chunks: int,
    durations: Mapping[str, float] | None = None,
    overlapped: Sequence[Sequence[int]] = (),
) -> Execution:
    """Time every rank's actions; raise :class:`Deadlock` if the order cannot complete.

    ``num_chunks`` is the number of model chunks (the last one starts the backward pass).
    ``durations`` maps ``F``/``B``/``I``/``W`` to times; missing kinds take the defaults.
    ``overlapped[rank]`` lists positions ``i`` where actions ``i`` and ``i + 1`` form one
    overlapped ``F&B`` pair: the pair starts only when both can (DualPipe receives both inputs,
    then computes), and here runs as its two parts back to back.
    """
    cost = {**DEFAULT_DURATIONS, **(durations or {})}
    paired = [set(overlapped[rank]) if rank < len(overlapped) else set() for rank in range(len(actions))]
    finished: dict[_Key, float] = {}
    rows: list[list[Timed]] = [[] for _ in actions]
    clock: list[float] = [0 for _ in actions]
    progress = True
    while progress:
        progress = False
        for rank, row in enumerate(actions):
            # Run as far as this rank can; the start time does not depend on visiting order,
            # only on the finish times of the rank's previous action and of the dependencies.
            while len(rows[rank]) < len(row):
                position = len(rows[rank])
                group = (
                    row[position : position + 2] if position in paired[rank] else row[position : position + 1]
                )
                needs = _group_needs(group, num_chunks)
                if any(key not in finished for key in needs):
                    break
                start = max([clock[rank], *(finished[key] for key in needs)])
                for action in group:
                    end = start + cost[action.kind]
                    rows[rank].append(Timed(action, start, end))
                    for key in _provides(action):
                        finished[key] = end
                    start = end
                clock[rank] = start
                progress = True
    stuck = []
    for rank, row in enumerate(actions):
        position = len(rows[rank])
        if position < len(row):
            group = row[position : position + 2] if position in paired[rank] else row[position : position + 1]
            missing = next(key for key in _group_needs(group, num_chunks) if key not in finished)
            stuck.append((rank, position, "&".join(map(str, group)), _describe(missing)))
    if stuck:
        raise Deadlock(stuck)
    return Execution(tuple(tuple(row) for row in rows))
