"""Which writers format ``snapshot.pickle`` and ``trace.json``: the optional compiled ones
(:mod:`timeline.exporters._cwrite`, built from ``_cwrite.c`` when a compiler is there) or the
Python ones. Both write the same bytes; the tests compare them on every run they build.
``TIMELINE_EXPORT_CORE=python`` forces the Python writers. This module decides nothing about
the formats.
"""

from __future__ import annotations

import os
from types import ModuleType

try:  # the optional compiled writers
    from timeline.exporters import _cwrite as _module  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the install
    _module = None

CORES = ("compiled", "python")


def compiled_available() -> bool:
    return _module is not None


def active_core() -> str:
    """``compiled`` when the extension is built and not switched off by
    ``TIMELINE_EXPORT_CORE=python``, else ``python``."""
    wanted = os.environ.get("TIMELINE_EXPORT_CORE", "").strip().lower()
    return "compiled" if _module is not None and wanted != "python" else "python"


def writers() -> ModuleType | None:
    """The compiled writers when they are the active core, else None."""
    return _module if active_core() == "compiled" else None


def extension() -> ModuleType | None:
    """The compiled writers whenever they are built (the tests compare them with the Python ones)."""
    return _module
