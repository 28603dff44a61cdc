"""The training parser of the Megatron-LM releases before core_v0.12.0 (core_v0.4.0 … core_v0.11.0), read statically.

``tools/megatron_parser_args.py`` builds each parser from core_v0.12.0 on by running it under stubs; the older
releases do not build there (their imports compare Transformer Engine's version, a stub's), so their parser is read
from the source: every ``parser.add_argument(...)`` call of the parser file (``megatron/training/arguments.py`` from
core_v0.7.0, ``megatron/arguments.py`` before), with its literal option strings, ``dest=`` (else the first long
option's name), ``action=`` and ``default=`` (its source text; an action's own default where none is given:
``store_true`` → False, ``store_false`` → True, else None). Also the attributes of ``args`` the training code of
those releases assigns (``args.X = …`` in ``megatron/training/``, or ``megatron/*.py`` before the move), as
:func:`megatron_parser_args.assigned_names` reads them.

Writes ``timeline/io/megatron_parser_older.json``: ``versions`` ([tag, Megatron-Core version, commit]), ``dests``
(per dest its options as ``[option, action, nargs, default (source text), versions]``, the versions a bit string
over ``versions``) and ``assigned`` (per attribute its bit string). ``timeline/io/megatron_dump.py`` reads a log a
release before core_v0.12.0 printed with it.

    .venv/bin/python tools/megatron_parser_older.py [--git-dir /work/.mirror/NVIDIA+Megatron-LM/repo]
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from megatron_parser_args import DEFAULT_GIT, assigned_names, git, package_version  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "timeline/io/megatron_parser_older.json"
RELEASES = tuple(f"core_v0.{minor}.0" for minor in range(4, 12))
PARSER_FILES = ("megatron/training/arguments.py", "megatron/arguments.py")
ACTION_DEFAULTS = {"store_true": "False", "store_false": "True"}


def parser_rows(text: str) -> dict[str, list[list[Any]]]:
    """dest → [option, action, nargs, default source text] of every ``add_argument`` call in ``text``."""
    out: dict[str, list[list[Any]]] = {}
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        options = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                   and a.value.startswith("-")]
        if not options:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        longs = [o for o in options if o.startswith("--")] or options
        dest_node = kw.get("dest")
        dest = (dest_node.value if isinstance(dest_node, ast.Constant) and isinstance(dest_node.value, str)
                else longs[0].lstrip("-").replace("-", "_"))
        action_node = kw.get("action")
        action = (action_node.value if isinstance(action_node, ast.Constant) and isinstance(action_node.value, str)
                  else "store")
        nargs_node = kw.get("nargs")
        nargs = nargs_node.value if isinstance(nargs_node, ast.Constant) else None
        default = ast.unparse(kw["default"]) if "default" in kw else ACTION_DEFAULTS.get(action, "None")
        for option in options:
            out.setdefault(dest, []).append([option, action, nargs, default])
    return out


def assigned_at(git_dir: str, commit: str) -> set[str]:
    """Attributes of ``args`` the training code at ``commit`` assigns (not megatron/core, not the parser's dests)."""
    files = git(git_dir, "ls-tree", "-r", "--name-only", commit, "megatron").split()
    tree = "megatron/training/" if any(f.startswith("megatron/training/") for f in files) else "megatron/"
    out: set[str] = set()
    for f in files:
        if f.endswith(".py") and f.startswith(tree) and not f.startswith("megatron/core/") \
                and (tree != "megatron/" or f.count("/") == 1):
            out |= assigned_names(git(git_dir, "show", f"{commit}:{f}"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--git-dir", default=DEFAULT_GIT)
    ap.add_argument("-o", "--out", default=str(OUT))
    args = ap.parse_args(argv)
    versions: list[list[str]] = []
    per: list[tuple[dict[str, list[list[Any]]], set[str]]] = []
    for tag in RELEASES:
        commit = git(args.git_dir, "rev-list", "-n1", tag).strip()
        text = next(t for f in PARSER_FILES
                    if (t := _show(args.git_dir, f"{commit}:{f}")) is not None)
        rows = parser_rows(text)
        versions.append([tag, package_version(args.git_dir, commit), commit[:10]])
        per.append((rows, assigned_at(args.git_dir, commit) - set(rows)))
    dests: dict[str, list[list[Any]]] = {}
    for dest in sorted({d for rows, _ in per for d in rows}):
        seen: dict[tuple[Any, ...], list[str]] = {}
        for i, (rows, _) in enumerate(per):
            for row in rows.get(dest, []):
                bits = seen.setdefault(tuple(row), ["0"] * len(per))
                bits[i] = "1"
        dests[dest] = [[*row, "".join(bits)] for row, bits in seen.items()]
    assigned = {a: "".join("1" if a in names else "0" for _, names in per)
                for a in sorted({a for _, names in per for a in names})}
    out = {"source": "NVIDIA/Megatron-LM's training parser and the args attributes its training code assigns at "
                     f"{', '.join(RELEASES)}, read statically by tools/megatron_parser_older.py",
           "versions": versions, "row": ["option", "action", "nargs", "default (source text)", "versions"],
           "dests": dests, "assigned": assigned}
    Path(args.out).write_text(json.dumps(out, indent=0, sort_keys=False) + "\n")
    print(f"wrote {args.out}: {len(dests)} dests, {len(assigned)} assigned, {len(versions)} releases")
    return 0


def _show(git_dir: str, spec: str) -> str | None:
    try:
        return git(git_dir, "show", spec)
    except Exception:  # noqa: BLE001 - the file is not at that commit
        return None


if __name__ == "__main__":
    raise SystemExit(main())
