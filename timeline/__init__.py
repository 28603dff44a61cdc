"""timeline: a trace-driven GPU memory timeline simulator for large-model training and serving.

The package is a stack of one-way layers (see README): ``spec → profiles → graph → pipeline →
placement → alloc → sim → result → exporters → cli``, with ``io`` at the edge. Importing the package does no work;
its Python interface (:mod:`timeline.api`) is imported on first use:

    import timeline
    tl = timeline.simulate(timeline.load_run("schedules/deepseek-v3-pp16-tp2-ep8.toml"))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["load_run", "simulate"]

if TYPE_CHECKING:
    from timeline.api import load_run, simulate


def __getattr__(name: str) -> Any:
    if name in __all__:
        from timeline import api

        return getattr(api, name)
    raise AttributeError(f"module 'timeline' has no attribute {name!r}")
