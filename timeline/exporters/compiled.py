"""Which writers format ``snapshot.pickle`` and ``trace.json``: the optional compiled ones
(:mod:`timeline.exporters._cpickle` and :mod:`timeline.exporters._ctext`, built from their ``.c``
files when a compiler is there) or the Python ones. Both write the same bytes; the tests compare
them on every run they build. ``TIMELINE_EXPORT_CORE=python`` forces the Python writers. This
module decides nothing about the formats.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

try:  # the optional compiled writers
    from timeline.exporters import _cpickle, _ctext  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the install
    _cpickle = _ctext = None

CORES = ("compiled", "python")


@dataclass(frozen=True, slots=True)
class Writers:
    """The compiled functions (see their docstrings in the C files)."""

    pickle_graph: Any
    format_rows: Any
    clip_nested: Any


_WRITERS = None if _cpickle is None or _ctext is None else Writers(
    pickle_graph=_cpickle.pickle_graph, format_rows=_ctext.format_rows, clip_nested=_ctext.clip_nested)


def compiled_available() -> bool:
    return _WRITERS is not None


def active_core() -> str:
    """``compiled`` when the extensions are built and not switched off by
    ``TIMELINE_EXPORT_CORE=python``, else ``python``."""
    wanted = os.environ.get("TIMELINE_EXPORT_CORE", "").strip().lower()
    return "compiled" if _WRITERS is not None and wanted != "python" else "python"


def writers() -> Writers | None:
    """The compiled writers when they are the active core, else None."""
    return _WRITERS if active_core() == "compiled" else None


def extension() -> Writers | None:
    """The compiled writers whenever they are built (the tests compare them with the Python ones)."""
    return _WRITERS
