"""The compiled pickler against ``pickle.dump`` of the same objects, on this interpreter.

Random object graphs with shared objects (a memo reference the second time), equal strings that
are distinct objects (written twice), every int encoding, strings of 255/256 bytes and of 64 KiB
or more (written outside a frame), lists and dicts at the 1000-item batch boundary (a dict of
exactly 1000 pairs ends with an empty MARK SETITEMS), one-item lists and dicts (APPEND,
SETITEM), tuples of 0–5 items, memo indices past 256 (LONG_BINGET) and pickles of several
frames; then lists of records (columns, absent keys, tables made on demand). Without the
extension built, the module skips and says so.
"""

from __future__ import annotations

import io
import pickle
import random

import numpy as np
import pytest

from timeline.exporters import compiled
from timeline.exporters.pickle_graph import ABSENT, Graph, Ref, Unsupported

pytestmark = pytest.mark.skipif(not compiled.compiled_available(), reason="the compiled writers are not built "
                                "(no C compiler at install time): only the Python writers run")

INTS = [0, 1, 255, 256, 65535, 65536, -1, -255, -256, -(2**31), 2**31 - 1, 2**31, -(2**31) - 1, 2**32, 2**39,
        -(2**39), -(2**39) - 1, 2**40, 2**63 - 1, -(2**63), 68719476736]


def _dump_compiled(g: Graph, root: int) -> bytes:
    out = io.BytesIO()
    g.dump(root, out.write, compiled.extension())
    return out.getvalue()


def _check(obj: object) -> None:
    g = Graph()
    assert _dump_compiled(g, g.node(obj)) == pickle.dumps(obj, protocol=4)


def _random_object(r: random.Random, pool: list, depth: int = 0) -> object:
    if pool and r.random() < 0.15:
        return r.choice(pool)  # the same object again: a memo reference
    if depth > 3 or r.random() < 0.4:
        kind = r.randrange(6)
        if kind == 0:
            return r.choice(INTS + [r.randrange(-(2**63), 2**63)])
        if kind == 1:  # a new string object each time, even when equal to an earlier one
            s = "".join(r.choice("ab\u00e9\u4e2dx") for _ in range(r.choice([0, 1, 3, 255, 256, 300])))
            pool.append(s)
            return s
        if kind == 2:
            return r.choice([0.0, -0.0, 1.5, 1e300, float("inf"), r.random()])
        if kind == 3:
            return r.choice([True, False, None])
        return r.randrange(1 << 20)
    n = r.choice([0, 1, 2, 3, 4, 5, 999, 1000, 1001, 2500]) if depth == 0 else r.randrange(6)
    kind = r.randrange(3)
    if kind == 0:
        obj: object = [_random_object(r, pool, depth + 1) for _ in range(n)]
    elif kind == 1:
        obj = tuple(_random_object(r, pool, depth + 1) for _ in range(min(n, 5)))
    else:
        obj = {f"k{i}" if r.random() < 0.5 else r.randrange(100_000): _random_object(r, pool, depth + 1)
               for i in range(n)}
    pool.append(obj)
    return obj


@pytest.mark.parametrize("seed", range(6))
def test_random_graphs_pickle_as_pickle_does(seed):
    r = random.Random(seed)
    for _ in range(25):
        _check(_random_object(r, []))


def test_batch_and_frame_boundaries():
    shared = "shared"
    for obj in ([1], {"a": 1}, (), ((), ()), (1, 2, 3, 4), {i: i for i in range(1000)}, {i: i for i in range(2000)},
                list(range(1000)), list(range(1001)), ["x" * 65_535, "y" * 65_536, "z" * 70_000, "tail"],
                [[shared, "shared"] for _ in range(400)], [str(i) for i in range(70_000)], INTS,
                "\ud800 lone surrogate"):
        _check(obj)
    data = pickle.dumps([str(i) for i in range(70_000)], protocol=4)
    assert data.count(b"\x95") > 5  # several frames, and memo indices far past 256 (LONG_BINGET)


def test_records_are_lists_of_new_dicts():
    r = random.Random(1)
    acts, frames = ["alloc", "free"], [[{"filename": "m", "line": 0, "name": f"n{i}"}] for i in range(5)]
    keys = ["action", "addr", "size", "frames", "extra"]
    for n in (0, 1, 2, 999, 1000, 1001, 3000):
        rows, cols = [], [np.zeros(n, dtype=np.int64) for _ in keys]
        for i in range(n):
            a, addr, f, has = r.randrange(2), r.randrange(-(2**40), 2**40), r.randrange(5), r.random() < 0.3
            row = {"action": acts[a], "addr": addr, "size": i, "frames": frames[f]}
            if has:
                row["extra"] = addr // 3
            rows.append(row)
            cols[0][i], cols[1][i], cols[2][i], cols[3][i] = a, addr, i, f
            cols[4][i] = addr // 3 if has else ABSENT
        for lazy in (False, True):
            g = Graph()
            key_nodes = g.nodes(keys)
            act_nodes, frame_nodes = g.nodes(acts), g.nodes(frames)
            columns = [act_nodes[cols[0]], cols[1], cols[2], frame_nodes[cols[3]], cols[4]]
            head = g.node(frames[:2])
            table = g.records(key_nodes, "niini", (lambda c=columns: c) if lazy else columns)
            root = g.node({"head": Ref(head), "rows": Ref(table), "tail": [acts, frames]})
            obj = {"head": frames[:2], "rows": rows, "tail": [acts, frames]}
            assert _dump_compiled(g, root) == pickle.dumps(obj, protocol=4), (n, lazy)


def test_one_key_records_and_unsupported_objects():
    g = Graph()
    table = g.records([g.node("only")], "i", [np.array([5, ABSENT, 70_000], dtype=np.int64)])
    assert _dump_compiled(g, table) == pickle.dumps([{"only": 5}, {}, {"only": 70_000}], protocol=4)
    for bad in (np.int64(3), 2**64, b"bytes", {1, 2}, type("D", (dict,), {})()):
        with pytest.raises(Unsupported):
            Graph().node([bad])


def test_version_names_the_writers(monkeypatch):
    from timeline.cli import version_line

    monkeypatch.setenv("TIMELINE_EXPORT_CORE", "python")
    assert version_line().endswith("; writers: python, TIMELINE_EXPORT_CORE=python)")
    assert compiled.writers() is None
    monkeypatch.delenv("TIMELINE_EXPORT_CORE")
    assert version_line().endswith("; writers: compiled)") and compiled.writers() is compiled.extension()
