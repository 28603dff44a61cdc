"""``--capacity SIZE`` for every command that takes one (simulate, compare, fit, replay): a size
with its unit (``80GiB``, ``80GB``, ``81920MiB``, ``85899345920B``) or a bare number of GiB, and
``--capacity-gib N``, its older spelling, kept as an alias. A problem names the flag as given."""

from __future__ import annotations

import argparse
import re
from dataclasses import replace

from timeline.errors import SpecError, UserError
from timeline.profiles import LIMITS
from timeline.spec.run import RunSpec
from timeline.spec.validate import validate_run

#: a size: a number and a unit; a bare number is GiB (``--capacity 80`` = 80 GiB)
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMGT]i?B|B)?\s*", re.IGNORECASE)
_UNIT_BYTES = {"b": 1, "kib": 2**10, "kb": 10**3, "mib": 2**20, "mb": 10**6, "gib": 2**30, "gb": 10**9,
               "tib": 2**40, "tb": 10**12}
#: the largest capacity a run file takes (hardware.capacity_gib ≤ 2**20)
MAX_CAPACITY_BYTES = 2**50


def parse_size(text: str, flag: str = "--capacity") -> int:
    """``80GiB``, ``80GB``, ``81920MiB``, ``85899345920B`` or a bare number of GiB → bytes."""
    m = _SIZE.fullmatch(text)
    if not m:
        raise UserError(f"{flag} {text!r}: give a size such as 80GiB, 80GB, 81920MiB or 85899345920B")
    value = float(m.group(1)) * _UNIT_BYTES[(m.group(2) or "gib").lower()]
    if not 1 <= value <= MAX_CAPACITY_BYTES:
        raise UserError(f"{flag} {text!r}: give a size from 1B to 1PiB")
    return int(value)


def add_capacity(parser: argparse.ArgumentParser, default: str) -> None:
    """``--capacity SIZE`` (units as :func:`parse_size`), ``--capacity-gib N`` its older alias."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--capacity", metavar="SIZE", help="device memory: 80GiB, 80GB, 81920MiB, 85899345920B, or "
                       f"a bare number of GiB (80 = 80GiB); default: {default}")
    group.add_argument("--capacity-gib", metavar="GIB", help="the same in GiB (kept for older scripts)")


def capacity_arg(args: argparse.Namespace) -> tuple[str, int] | None:
    """(the flag as given, bytes) of ``--capacity``/``--capacity-gib``, or None."""
    if getattr(args, "capacity", None) is not None:
        return f"--capacity {args.capacity}", parse_size(args.capacity)
    if getattr(args, "capacity_gib", None) is not None:
        text = args.capacity_gib
        try:
            value = float(text)
        except ValueError:
            raise UserError(f"--capacity-gib {text!r}: give a number of GiB, e.g. 80") from None
        return f"--capacity-gib {text}", parse_size(f"{value!r}GiB", "--capacity-gib")
    return None


def with_capacity(spec: RunSpec, args: argparse.Namespace) -> RunSpec:
    """``spec`` with ``hardware.capacity_gib`` from ``--capacity``, validated; a problem names the flag.
    (``hardware.non_pytorch_gib`` is still subtracted, as the run file's capacity.)"""
    given = capacity_arg(args)
    if given is None:
        return spec
    flag, size = given
    out = replace(spec, hardware=replace(spec.hardware, capacity_gib=size / 2**30))
    problems = validate_run(out, LIMITS)
    if problems:
        raise SpecError([(k, f"{m} (with {flag})") for k, m in problems], spec.source)
    return out
