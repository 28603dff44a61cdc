"""Read ``torch.cuda.memory._dump_snapshot`` pickles safely, without torch.

A snapshot pickle holds only plain containers and scalars, so it is read with an unpickler whose
``find_class`` admits ``builtins.{dict,list,tuple,set,frozenset,int,float,str,bytes,bool}`` and
``collections.OrderedDict`` and refuses everything else: nothing in the file is executed. The
result is normalised to ``{"segments": [...], "device_traces": [[...], ...],
"allocator_settings": {...} | None, ...}`` (a very old dump — a bare list of segments — gets an
empty trace). Truncated, foreign or hostile files raise :class:`~timeline.errors.UserError` with a
one-line message. This module does not interpret the snapshot (see :mod:`timeline.alloc.replay`).
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from timeline.errors import UserError

_ALLOWED = {
    ("builtins", name) for name in ("dict", "list", "tuple", "set", "frozenset", "int", "float", "str", "bytes", "bool")
} | {("collections", "OrderedDict")}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def loads_snapshot(data: bytes, source: str = "snapshot") -> dict[str, Any]:
    """Parse snapshot pickle bytes; ``source`` names the file in error messages."""
    try:
        obj = _RestrictedUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise UserError(f"{source}: not a memory snapshot pickle ({exc})") from None
    except (EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError, MemoryError,
            RecursionError, OverflowError, UnicodeDecodeError) as exc:
        kind = "truncated" if isinstance(exc, EOFError) else "corrupt"
        raise UserError(f"{source}: {kind} pickle ({type(exc).__name__}: {exc})") from None
    return normalize_snapshot(obj, source)


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """Read and validate the snapshot pickle at ``path`` (plain or gzip-compressed)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if data[:2] == b"\x1f\x8b":  # a gzip-compressed pickle (``gzip NAME.pickle``), as traces/ keeps them
        import gzip

        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise UserError(f"{path}: corrupt gzip ({exc})") from None
    return loads_snapshot(data, str(path))


def _check_entries(items: Any, what: str, source: str, keys: tuple[str, ...]) -> None:
    if not isinstance(items, list):
        raise UserError(f"{source}: {what} is {type(items).__name__}, not a list")
    for item in items:
        if not isinstance(item, Mapping) or any(k not in item for k in keys):
            raise UserError(f"{source}: {what} holds an entry without {', '.join(keys)}; not a memory snapshot")


def normalize_snapshot(obj: Any, source: str = "snapshot") -> dict[str, Any]:
    """Check the structure of an unpickled snapshot and fill in what old formats lack."""
    if isinstance(obj, list):
        obj = {"segments": obj, "device_traces": []}
    if not isinstance(obj, Mapping) or "segments" not in obj:
        raise UserError(f"{source}: not a memory snapshot (expected a dict with 'segments', "
                        f"got {type(obj).__name__})")
    segments = obj["segments"]
    _check_entries(segments, "segments", source, ("address", "total_size"))
    for seg in segments:
        _check_entries(seg.get("blocks", []), "a segment's blocks", source, ("address", "size", "state"))
    traces = obj.get("device_traces") or []
    if not isinstance(traces, list):
        raise UserError(f"{source}: device_traces is {type(traces).__name__}, not a list")
    for trace in traces:
        _check_entries(trace, "a device trace", source, ("action",))
        for entry in trace:
            if entry["action"] != "oom" and ("addr" not in entry or "size" not in entry) and \
                    entry["action"] != "snapshot":
                raise UserError(f"{source}: trace entry {entry['action']!r} lacks addr/size")
    settings = obj.get("allocator_settings")
    if settings is not None and not isinstance(settings, Mapping):
        raise UserError(f"{source}: allocator_settings is {type(settings).__name__}, not a dict")
    out = dict(obj)
    out["segments"] = segments
    out["device_traces"] = traces
    out["allocator_settings"] = settings
    return out
