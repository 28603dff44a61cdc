"""Which Megatron-LM versions have an argument, and the one-line errors for one that no version has.

Reads ``megatron_parser_versions.json`` beside this module: per option string of ``pretrain_gpt.py``'s
parser, which of the releases core_v0.12.0 … core_v0.19.0 and main (d98e8a64dd) have it (derived
by ``tools/megatron_parser_args.py``; the full fact table is ``tests/data/megatron/parser_args.json``).
A Megatron-Core version is matched to the release of the same X.Y.Z, else the newest release before
it (a release candidate to its release); one newer than every release is main. ``megatron_parser_between.json``
lists the option strings only main had, between releases (``tools/megatron_parser_history.py``): they are
arguments, of no release. Nothing here knows what an argument does: that is :mod:`timeline.io.megatron_table`'s.
"""

from __future__ import annotations

import difflib
import json
import re
from functools import cache
from pathlib import Path

from timeline.errors import UserError

INDEX = Path(__file__).with_name("megatron_parser_versions.json")
BETWEEN = Path(__file__).with_name("megatron_parser_between.json")


@cache
def _index() -> tuple[list[tuple[str, tuple[int, int, int]]], dict[str, str]]:
    data = json.loads(INDEX.read_text(encoding="utf-8"))
    versions = [(label, release_of(core)) for label, core, _ in data["versions"]]
    return versions, data["arguments"]


def release_of(text: str) -> tuple[int, int, int]:
    """X.Y[.Z][rcN] → (X, Y, Z): a release candidate is read as its release."""
    major, minor, patch = ([int(p) for p in re.findall(r"\d+", text.split("rc")[0])[:3]] + [0, 0, 0])[:3]
    return major, minor, patch


@cache
def between() -> dict[str, tuple[str, str, str, str]]:
    """Option strings only main had between releases → (first commit, its date, last commit, its date)."""
    rows = json.loads(BETWEEN.read_text(encoding="utf-8"))["arguments"]
    return {k: (v[0], v[1], v[2], v[3]) for k, v in rows.items()}


def between_note(name: str) -> str:
    """" (an argument of main or dev only between releases: FIRST DATE … LAST DATE)" for such a name, else ""."""
    row = between().get(name)
    return f" (an argument of Megatron-LM main or dev only between releases: {row[0]} {row[1]} … {row[2]} {row[3]})" \
        if row else ""


def known(name: str) -> bool:
    """Whether any version's parser, or main's between releases, has the option string ``name``."""
    return name in _index()[1] or name in between()


def names() -> list[str]:
    return list(_index()[1]) + list(between())


def version_index(megatron_core: str) -> int:
    """The position of the release ``megatron_core`` (X.Y, X.Y.Z or X.Y.ZrcN) is read as."""
    versions, _ = _index()
    want = release_of(megatron_core)
    best = 0
    for i, (_, core) in enumerate(versions):
        if core <= want:
            best = i
    return best


def _describe(i: int) -> str:
    label, core = _index()[0][i]
    return f"Megatron-Core {'.'.join(map(str, core))} ({label})"


def is_megatron_argument(name: str) -> bool:
    """Whether some version of Megatron-LM's training parser (a release, or main between releases) has ``name``."""
    return name in _index()[1] or name in between()


def _close(name: str) -> list[str]:
    """The parser's arguments nearest ``name`` (a typo's likely intent), best first."""
    return difflib.get_close_matches(name, _index()[1], n=3, cutoff=0.75)


def after_every_parser(megatron_core: str | None) -> bool:
    """Whether ``megatron_core`` is the newest parser's release or later (main's snapshot reads as the release it
    names, 0.20.0 at d98e8a64dd): a job of that release may have arguments added after every parser read."""
    return megatron_core is not None and release_of(megatron_core) >= _index()[0][-1][1]


def newer_note(names: list[str], megatron_core: str) -> str:
    """The note for arguments no parser read has, given a job at :func:`after_every_parser`'s release."""
    label, core = _index()[0][-1]
    hints = [f"{n} (or a typo of {' / '.join(_close(n))}?)" if _close(n) else n for n in names]
    return (f"{', '.join(hints)}: in no parser read (core_v0.12.0 … {label}, Megatron-Core {'.'.join(map(str, core))}); "
            f"--megatron-core {megatron_core} is that release or later, so {'they' if len(names) > 1 else 'it'} may be "
            "its own: passed over as memory-neutral, unverified — if one moves memory, these numbers miss it")


def unknown_arguments(names: list[str]) -> str:
    """One line for arguments no version of the parser has: each with the closest real ones (a typo), and the
    ``--ignore-arg`` that passes over them all (a fork's own arguments)."""
    versions = _index()[0]
    span = f"Megatron-LM's training parser ({versions[0][0]} … {versions[-1][0]})"
    ignore = ",".join(n.lstrip("-") for n in names)
    if len(names) == 1:
        close = _close(names[0])
        hint = f"; did you mean {close[0]}?" if close else ""
        hint += f" (or {', '.join(close[1:])})" if len(close) > 1 else ""
        return (f"{names[0]}: not an argument of {span}{hint}; if it is a fork's (or a pre-core_v0.12 Megatron-LM's) "
                f"own argument, --ignore-arg {ignore} passes over it{_later(versions)}")
    listed = []
    for n in names:
        close = _close(n)
        listed.append(f"{n} (did you mean {' or '.join(close)}?)" if close else n)
    return (f"{len(names)} arguments are not arguments of {span}: {', '.join(listed)}; if they are a fork's (or a "
            f"pre-core_v0.12 Megatron-LM's) own arguments, --ignore-arg {ignore} passes over them{_later(versions)}")


def _later(versions: list[tuple[str, tuple[int, int, int]]]) -> str:
    label, core = versions[-1]
    return (f"; a job of a Megatron-LM later than {label} (--megatron-core {'.'.join(map(str, core))} or later) "
            "has them passed over with a note")


def check_argument(name: str, megatron_core: str | None) -> None:
    """Raise a one-line UserError when no version's parser has ``name`` (naming the closest ones), or
    when ``megatron_core`` is given and its version lacks it (naming when it came or went)."""
    versions, rows = _index()
    present = rows.get(name)
    if present is None and name in between():
        # a main snapshot's package_info names the next release as a pre-release (X.Y.0rcN)
        if megatron_core is not None and not re.search(r"[a-z]", megatron_core):
            raise UserError(f"{name}: in no release{between_note(name)}; --megatron-core {megatron_core} is a release "
                            "(give the main snapshot's version, e.g. 0.16.0rc0, or drop the argument)")
        return
    if present is None:
        raise UserError(unknown_arguments([name]))
    if megatron_core is None:
        return
    i = version_index(megatron_core)
    if present[i] == "1":
        return
    if re.search(r"[a-z]", megatron_core):
        # a pre-release (X.Y.ZrcN) is a main snapshot after the release before X.Y.Z: it may still have what
        # X.Y.Z removed, and — its package_info lagging behind main (0.16.0rc0 into 2026) — anything a later
        # release added; only what was gone before that earlier release is certainly absent
        lo = i - 1 if i > 0 and versions[i][1] == release_of(megatron_core) else i
        if any(p == "1" for p in present[lo:]):
            return
    later = [j for j in range(i + 1, len(present)) if present[j] == "1"]
    earlier = [j for j in range(i) if present[j] == "1"]
    if later and not earlier:
        raise UserError(f"{name}: introduced in {_describe(later[0])}; --megatron-core {megatron_core} does not "
                        "have it (give the version the job ran, or drop the argument)")
    if earlier and not later:
        raise UserError(f"{name}: removed after {_describe(earlier[-1])}; --megatron-core {megatron_core} does not "
                        "have it (give the version the job ran, or drop the argument)")
    raise UserError(f"{name}: {_describe(i)} does not have it (present in {_describe(earlier[-1])} and "
                    f"{_describe(later[0])}); give the version the job ran")
