"""An object graph in arrays, pickled by the compiled writer with ``pickle.dump``'s own bytes.

A pickle's bytes depend on the objects' values and on which of them are the *same object* (the
second time an object is saved it is a memo reference; two equal strings that are distinct
objects are both written out). :class:`Graph` holds the objects as numbered nodes — kind, two
int64 fields, children, UTF-8 string bytes — and keeps identity: :meth:`Graph.node` converts a
Python object once per ``id()`` (so shared objects stay shared), the vectorised adders make many
fresh objects at once, and :meth:`Graph.records` is a list of dicts with the same keys whose
values come from columns (never made as dicts). :meth:`Graph.dump` hands the arrays to
``_cpickle.pickle_graph``, which walks them as CPython's C pickler walks the objects.

Only the types a snapshot holds are taken: ``int`` (within int64), ``float``, ``bool``,
``None``, ``str``, and exact ``list``, ``tuple`` and ``dict``; anything else raises
:class:`Unsupported` and the caller falls back to ``pickle.dump``. This module knows nothing of
snapshots.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

INT, STR, LIST, DICT, TUPLE, FLOAT, TRUE, FALSE, NONE, RECORDS = range(10)
#: a record column value that leaves the key out of that record
ABSENT = np.iinfo(np.int64).min
_INT64 = (-(2**63), 2**63 - 1)


class Unsupported(TypeError):
    """An object the compiled writer does not pickle (the caller uses ``pickle.dump``)."""


@dataclass(frozen=True, slots=True)
class Ref:
    """A node already in the graph, standing in for its object inside a Python structure."""

    node: int


class Graph:
    def __init__(self) -> None:
        # nodes and children in chunks: numpy arrays from the vectorised adders, Python lists
        # for objects converted one at a time (flushed into a chunk before the next array)
        self._nodes: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._one: tuple[list[int], list[int], list[int]] = ([], [], [])
        self._children: list[np.ndarray] = []
        self._one_children: list[int] = []
        self._blob: list[bytes] = []
        self._n = self._nchildren = self._nblob = 0
        self._ids: dict[int, int] = {}  # id(obj) → node
        self._alive: list[Any] = []  # the objects behind _ids: an id is unique only while its object lives
        self._tables: list[Any] = []  # (keys, kinds, columns), or a function that returns them
        self._atoms: dict[Any, int] = {}

    # -- adding nodes -----------------------------------------------------------------------
    def _flush(self) -> None:
        kind, a, b = self._one
        if kind:
            self._nodes.append((np.array(kind, dtype=np.uint8), np.array(a, dtype=np.int64),
                                np.array(b, dtype=np.int64)))
            self._one = ([], [], [])
        if self._one_children:
            self._children.append(np.array(self._one_children, dtype=np.int64))
            self._one_children = []

    def _add_one(self, kind: int, a: int, b: int) -> int:
        self._one[0].append(kind)
        self._one[1].append(a)
        self._one[2].append(b)
        self._n += 1
        return self._n - 1

    def _add(self, kind: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        self._flush()
        a = np.asarray(a, dtype=np.int64)
        self._nodes.append((np.full(len(a), kind, dtype=np.uint8), a, np.asarray(b, dtype=np.int64)))
        first = self._n
        self._n += len(a)
        return np.arange(first, self._n, dtype=np.int64)

    def _text(self, text: str) -> tuple[int, int]:
        data = text.encode("utf-8", "surrogatepass")
        self._blob.append(data)
        self._nblob += len(data)
        return self._nblob - len(data), len(data)

    def strings(self, texts: Sequence[str]) -> np.ndarray:
        """A new string node per text (distinct objects, as strings built one by one are)."""
        if not len(texts):
            return np.zeros(0, dtype=np.int64)
        data = [t.encode("utf-8", "surrogatepass") for t in texts]
        lengths = np.fromiter(map(len, data), dtype=np.int64, count=len(data))
        offsets = self._nblob + np.cumsum(lengths) - lengths
        self._blob.extend(data)
        self._nblob += int(lengths.sum())
        return self._add(STR, offsets, lengths)

    def containers(self, kind: int, children: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """New list/tuple nodes (``counts[i]`` items each, in order from ``children``) or dict
        nodes (``counts[i]`` key/value pairs each)."""
        if not len(counts):
            return np.zeros(0, dtype=np.int64)
        self._flush()
        counts = np.asarray(counts, dtype=np.int64)
        start = self._nchildren
        self._children.append(np.asarray(children, dtype=np.int64))
        self._nchildren += len(children)
        width = 2 if kind == DICT else 1
        return self._add(kind, start + width * (np.cumsum(counts) - counts), counts)

    def records(self, keys: Sequence[int], kinds: str,
                columns: Sequence[np.ndarray] | Callable[[], Sequence[np.ndarray]]) -> int:
        """A new list whose items are new dicts, one per row: key ``keys[c]`` (a node) maps to
        ``columns[c][row]`` — an int (kind ``i``) or a node (kind ``n``) — unless that is ABSENT.
        ``columns`` may be a function that makes them: called when the list is written, its
        columns freed after (one device's entries in memory at a time)."""
        key_nodes, kind_bytes = np.asarray(keys, dtype=np.int64), kinds.encode()

        def table(cols: Sequence[np.ndarray]) -> tuple[np.ndarray, bytes, tuple[np.ndarray, ...]]:
            return key_nodes, kind_bytes, tuple(np.ascontiguousarray(c, dtype=np.int64) for c in cols)

        self._tables.append((lambda: table(columns())) if callable(columns) else table(columns))
        return self._add_one(RECORDS, len(self._tables) - 1, 0)

    def node(self, obj: Any) -> int:
        """The node of ``obj``: a new one the first time an object is met (containers with
        their items), the same one after; atoms (int, float, bool, None) are never memoized by
        pickle, so their nodes are shared by value."""
        t = type(obj)
        if t is Ref:
            return int(obj.node)
        if t is int or t is bool or t is float or obj is None:
            return self._atom(obj)
        got = self._ids.get(id(obj))
        if got is not None:
            return got
        if t is str:
            out = self._add_one(STR, *self._text(obj))
        elif t is list or t is tuple or t is dict:
            items = [self.node(x) for kv in obj.items() for x in kv] if t is dict else [self.node(x) for x in obj]
            out = self._add_one(DICT if t is dict else LIST if t is list else TUPLE,
                                self._nchildren, len(obj))
            self._one_children.extend(items)
            self._nchildren += len(items)
        else:
            raise Unsupported(f"cannot write a {t.__name__} with the compiled writer")
        self._ids[id(obj)] = out
        self._alive.append(obj)
        return out

    def nodes(self, objs: Sequence[Any]) -> np.ndarray:
        """:meth:`node` of each object (a dict lookup for objects already in the graph)."""
        ids, node = self._ids, self.node
        out = [ids.get(id(o)) for o in objs]
        return np.array([node(o) if n is None else n for n, o in zip(out, objs, strict=True)], dtype=np.int64)

    def _atom(self, obj: Any) -> int:
        t = type(obj)
        key = (t, struct.pack("<d", obj) if t is float else obj)
        got = self._atoms.get(key)
        if got is None:
            if obj is None:
                got = self._add_one(NONE, 0, 0)
            elif t is bool:
                got = self._add_one(TRUE if obj else FALSE, 0, 0)
            elif t is float:
                got = self._add_one(FLOAT, struct.unpack("<q", struct.pack("<d", obj))[0], 0)
            elif _INT64[0] <= obj <= _INT64[1]:
                got = self._add_one(INT, obj, 0)
            else:
                raise Unsupported("an int beyond int64")
            self._atoms[key] = got
        return got

    # -- writing --------------------------------------------------------------------------
    def dump(self, root: int, write: Callable[[bytes], Any], writer: Any) -> None:
        """``pickle.dump(<root's object>, file, protocol=4)``'s bytes, through ``write`` (the
        compiled writers are ``writer``, :func:`compiled.writers`)."""

        self._flush()

        def cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
            return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)

        kind, a, b = (cat([chunk[i] for chunk in self._nodes], t) for i, t in enumerate((np.uint8, np.int64, np.int64)))
        writer.pickle_graph(kind, a, b, cat(self._children, np.int64), b"".join(self._blob), self._tables, root,
                            write)
