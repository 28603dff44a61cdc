"""Explain each device's peak reserved memory from the event stream: reserved beside allocated at
the reserved peak, and the gap (free space inside segments) by what last occupied it.

    .venv/bin/python tools/explain_reserved.py RUN.toml [--set section.key=value …] [--top 3]

Simulates with summary output only (no files); see ``timeline.result.reserved_gap``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"


def explain(tl, top: int = 3) -> list[str]:
    from timeline.result.reserved_gap import reserved_gap

    out = []
    for d, dev in enumerate(tl.devices):
        g = reserved_gap(tl, d, top=top)
        causes = ", ".join(f"{k} {gib(v)}" for k, v in g["by_last_occupant"].items())
        out.append(f"pp rank {dev.pp_rank} (device {dev.device}): reserved {gib(g['reserved_bytes'])}, allocated "
                   f"{gib(g['allocated_bytes'])} at the reserved peak; gap {gib(g['gap_bytes'])} = {causes or '-'}")
        for gap in g["gaps"]:
            what = gap["last_tensor"] or "never used (segment rounding)"
            out.append(f"    {gib(gap['bytes'])} free where {what} was")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--top", type=int, default=3)
    args = parser.parse_args()
    from timeline.io.runfile import load_run
    from timeline.result.build import build_timeline

    tl = build_timeline(load_run(args.run, args.overrides))
    print("\n".join(explain(tl, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
