"""Which of timeline's modules a run passes through from run file to summary.json (issue 17's
before/after map): runs ``timeline simulate RUN --format summary`` under a profiler and prints each
``timeline.*`` module whose functions are called, in the order of their first call, with the number of
distinct functions called in it (a first, unprofiled run does the imports).

    python tools/data_path.py schedules/llama-3.1-8b-tp8.toml
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    run = argv[0] if argv else "schedules/llama-3.1-8b-tp8.toml"
    sys.path.insert(0, str(ROOT))
    from timeline.cli import main as cli

    first: dict[str, int] = {}
    funcs: dict[str, set[str]] = {}

    def prof(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        mod = frame.f_globals.get("__name__", "")
        if mod.startswith("timeline.") and not mod.startswith("timeline.cli") and frame.f_code.co_name != "<module>":
            first.setdefault(mod, len(first))
            funcs.setdefault(mod, set()).add(frame.f_code.co_name)

    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        args = ["simulate", run, "--format", "summary", "--no-progress"]
        # imports done by another run first, so import-time calls are not counted (and no cache is warm)
        warm = ["simulate", str(ROOT / "schedules/llama3-8b-csv.toml"), "--format", "summary", "--no-progress"]
        cli([*warm, "-o", f"{tmp}/warm"])
        sys.setprofile(prof)
        try:
            rc = cli([*args, "-o", f"{tmp}/out"])
        finally:
            sys.setprofile(None)
    for mod in sorted(first, key=first.__getitem__):
        print(f"{mod:45s} {len(funcs[mod]):3d} functions")
    print(f"{len(first)} modules")
    return rc


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
