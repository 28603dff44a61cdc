#!/usr/bin/env python3
"""Rewrite the exporter golden files (tests/exporters/golden/) from the current code.

    .venv/bin/python tools/regen_goldens.py          # all
    .venv/bin/python tools/regen_goldens.py trace.json

Run it after a deliberate change of an exporter's output (or of the simulator/allocator that
feeds it), then review the diff. The run is tests/exporters/tiny.py's OOM run.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "exporters"))

from tiny import GOLDEN, GOLDENS, golden_bytes  # noqa: E402


def main(names: list[str]) -> int:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name in names or sorted(GOLDENS):
        if name not in GOLDENS:
            print(f"unknown golden {name!r}; choose from {', '.join(sorted(GOLDENS))}", file=sys.stderr)
            return 2
        data = golden_bytes(name)
        path = GOLDEN / name
        old = path.read_bytes() if path.exists() else None
        path.write_bytes(data)
        print(f"{'unchanged' if old == data else 'wrote'} {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path} ({len(data):,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
