"""Text lines from columns: one template per kind of line, its slots filled from whole columns.

A template is a string with ``SLOT`` where each value goes; each :class:`Slot` says how its
column is spelled — ``d`` an int, ``u`` integer ns as µs with exactly three decimals
(:func:`trace_common.fmt_us`), ``s`` an index into a table of texts, ``r`` a float as ``repr``
spells it. :func:`render` writes every row, each preceded by ``sep``, as UTF-8 bytes: with the
compiled writer (:mod:`timeline.exporters.compiled`) no Python string is made per row; the
Python path below is the reference, and the tests hold the two to the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from timeline.exporters import compiled
from timeline.exporters.trace_common import fmt_us

#: where a value goes in a template
SLOT = "\0"


@dataclass(frozen=True, slots=True)
class Slot:
    kind: str  # "d" | "u" | "s" | "r"
    values: np.ndarray  # int64 ("d", "u", "s": table indices) or float64 ("r")
    table: Sequence[str] = ()


def render(write: Callable[[bytes], Any], template: str, slots: Sequence[Slot], sep: str = ",\n",
           writer: Any = None) -> None:
    """Every row of ``slots`` through ``template``, each row preceded by ``sep``, to ``write``
    in chunks (``writer``: the compiled writers, default the active ones; False: the Python path)."""
    pieces = template.split(SLOT)
    if len(pieces) != len(slots) + 1:
        raise ValueError(f"the template has {len(pieces) - 1} slots for {len(slots)} columns")
    if writer is None:
        writer = compiled.writers()
    if writer:
        writer.format_rows([p.encode() for p in pieces],
                           [(s.kind.encode(), _column(s), [t.encode() for t in s.table]) for s in slots],
                           sep.encode(), write)
    else:
        write(_render_python(pieces, slots, sep).encode())


def _column(slot: Slot) -> np.ndarray:
    return np.ascontiguousarray(slot.values, dtype=np.float64 if slot.kind == "r" else np.int64)


def _render_python(pieces: list[str], slots: Sequence[Slot], sep: str) -> str:
    fmt = [sep + pieces[0].replace("%", "%%")]
    cols: list[list[Any]] = []
    for slot, piece in zip(slots, pieces[1:], strict=True):
        values = _column(slot)
        if slot.kind == "d":
            spec = "%d"
            cols.append(values.tolist())
        elif slot.kind == "u" and (not len(values) or values.min() >= 0):
            spec = "%d.%03d"
            cols += [(values // 1000).tolist(), (values % 1000).tolist()]
        elif slot.kind == "u":
            spec = "%s"
            cols.append([fmt_us(v) for v in values.tolist()])
        elif slot.kind == "s":
            spec = "%s"
            cols.append(list(map(list(slot.table).__getitem__, values.tolist())))
        elif slot.kind == "r":  # each distinct value's repr once (a counter column repeats few values)
            spec = "%s"
            bits, index = np.unique(values.view(np.int64), return_inverse=True)
            texts = [repr(v) for v in bits.view(np.float64).tolist()]
            cols.append([texts[i] for i in index.reshape(-1).tolist()])
        else:
            raise ValueError(f"unknown slot kind {slot.kind!r}")
        fmt.append(spec + piece.replace("%", "%%"))
    template = "".join(fmt)
    if not cols:
        return ""
    return "".join(map(template.__mod__, zip(*cols, strict=True)))
