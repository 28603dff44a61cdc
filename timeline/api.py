"""The Python interface: load a run file and simulate it, as ``timeline simulate`` does.

    import timeline
    run = timeline.load_run("schedules/deepseek-v3-pp16-tp2-ep8.toml", {"model.profile": "megatron"})
    tl = timeline.simulate(run)
    tl.peak(0).reserved_bytes

``import timeline`` loads nothing heavy: this module is imported on first use of one of its names
(``timeline.__getattr__``), and each function imports the layers it needs when called.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from timeline.result.timeline import Timeline
    from timeline.spec.run import RunSpec

__all__ = ["load_run", "simulate"]


def load_run(path: str | Path, overrides: Mapping[str, Any] | Sequence[str] = ()) -> RunSpec:
    """The validated run of a run file (TOML), with ``overrides`` — ``{"parallel.tp": 4}`` or
    ``["parallel.tp=4"]`` as ``--set`` takes them — applied first. Raises
    :class:`timeline.errors.SpecError` naming every bad field."""
    from timeline.io.runfile import load_run as load

    return load(path, overrides)


def simulate(run: RunSpec, *, progress: Callable[[str, int, int], None] | None = None) -> Timeline:
    """Simulate a run and pass every device's allocations through its allocator model: the
    :class:`timeline.result.Timeline` that ``timeline simulate`` writes its outputs from.
    ``progress(stage, done, total)`` is called as the stages advance."""
    from timeline.result.build import build_timeline

    return build_timeline(run, progress=progress)
