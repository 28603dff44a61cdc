#!/usr/bin/env python3
"""Set every key of a run file, one at a time, to its choices, boundaries and a few ordinary values, and simulate
each at summary level: every outcome must be a simulation or a UserError naming the field — never a traceback.
Each is first held to ``timeline simulate --format summary``'s work guard (``--max-events``' default), as the CLI
holds it. Prints the counts and each crash (exception, where, the keys and values that raise it). Run on purpose (about a
minute on the Llama CSV run, several on the shipped DeepSeek-V3 run); the tests hold the same property for
from-megatron's arguments (``tests/io/test_megatron_every_argument.py``).

    python tools/sweep_run_keys.py schedules/llama3-8b-csv.toml
"""

from __future__ import annotations

import collections
import dataclasses
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timeline.api import load_run  # noqa: E402
from timeline.cli.common import DEFAULT_MAX_EVENTS, check_work  # noqa: E402
from timeline.errors import UserError  # noqa: E402
from timeline.graph.source import model_source  # noqa: E402
from timeline.result.build import build_timeline  # noqa: E402
from timeline.spec.run import RunSpec  # noqa: E402


def values(f: dataclasses.Field, current: Any) -> list[Any]:
    """The field's choices, then boundary and ordinary values of its type (at most eight)."""
    md = f.metadata or {}
    out: list[Any] = list(md.get("choices") or ())
    if isinstance(current, bool):
        return [not current]
    if isinstance(current, int):
        out += [0, 1, 3, current * 2 if current else 7]
        if md.get("maximum") is not None:
            out.append(int(md["maximum"]))
    elif isinstance(current, float):
        out += [0.0, 0.5, 1.0, 2.0]
        if md.get("maximum") is not None:
            out.append(float(md["maximum"]))
    elif isinstance(current, str) and not md.get("choices"):
        out.append("x")
    return out[:8]


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    path = sys.argv[1]
    base = load_run(path)
    crashes: dict[str, list[tuple[str, Any]]] = collections.OrderedDict()
    counts: collections.Counter[str] = collections.Counter()
    t0 = time.perf_counter()
    for sec in dataclasses.fields(RunSpec):
        section = getattr(base, sec.name)
        if not dataclasses.is_dataclass(section):
            continue
        for f in dataclasses.fields(section):
            key = f"{sec.name}.{f.name}"
            for v in values(f, getattr(section, f.name)):
                try:
                    run = load_run(path, {key: v})
                    # the CLI's own guard (--max-events): a boundary value can ask for billions of events
                    check_work(run, DEFAULT_MAX_EVENTS, per_device=True)
                    build_timeline(run, model_source, summary_only=True)
                    counts["simulated"] += 1
                except UserError:
                    counts["refused"] += 1
                except Exception as exc:  # noqa: BLE001 — a sweep lists every crash
                    where = traceback.format_exc().strip().splitlines()[-3].strip()
                    crashes.setdefault(f"{type(exc).__name__}: {str(exc)[:150]} @ {where[:150]}", []).append((key, v))
    n = sum(len(v) for v in crashes.values())
    print(f"{path}: {counts['simulated']:,} simulated, {counts['refused']:,} refused, {n} crashed "
          f"({time.perf_counter() - t0:,.0f} s)")
    for what, keys in crashes.items():
        print(f"  {len(keys)} × {what}: {keys[:5]}")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
