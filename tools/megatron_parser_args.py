"""Every command-line argument of Megatron-LM's training parser, at every release from core_v0.12.0 to main.

Writes ``tests/data/megatron/parser_args.json``: per option string its aliases (the other option
strings of the same argparse action), dest, action, type, nargs, default, the versions that have it
and where it is added (file:function, and the config dataclass for arguments generated from one).
Facts about the parser only; no Megatron-LM code is kept.

How the parser is read. From core_v0.16 ``megatron/training/arguments.py`` builds part of its
parser from config dataclasses (``megatron/training/argument_utils.py: ArgumentGroupFactory``:
field types, ``--no-X``/``--disable-X`` for booleans that default to True, ``argparse_meta``
overrides, exclude lists), and optional packages add arguments (``_add_kitchen_quantization_arguments``
only when NVIDIA Kitchen imports; ``pretrain_gpt.py`` passes ``add_modelopt_args`` as its
``extra_args_provider`` only when ModelOpt imports). So each version's parser is *built*, as
``pretrain_gpt.py`` builds it: ``git archive`` of ``megatron/`` and ``pretrain_gpt.py`` into a
temporary folder, then a subprocess imports ``megatron.training.arguments`` with every package the
checkout imports but this machine lacks (Transformer Engine, Apex, ModelOpt, Kitchen, …) replaced by
a stub that imports (so optional arguments are all present: a user's container has those packages),
calls ``add_megatron_arguments`` and the ``extra_args_provider`` named in ``pretrain_gpt.py``, and
reads ``parser._actions``. A static pass (``ast``) over the ``add_argument`` calls with literal
option strings cross-checks it: an option string the source names but the built parser lacks fails
the run. Needs torch (the ``capture`` extra); nothing is executed outside the subprocess.

    .venv/bin/python tools/megatron_parser_args.py [--git-dir /work/.mirror/NVIDIA+Megatron-LM/repo]
        [--main HEAD] [-o tests/data/megatron/parser_args.json]
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_GIT = "/work/.mirror/NVIDIA+Megatron-LM/repo"
OUT = ROOT / "tests/data/megatron/parser_args.json"
#: the compact index from-megatron reads at run time: per option string, the versions having it
INDEX = ROOT / "timeline/io/megatron_parser_versions.json"
#: what from-megatron reads a log's printed arguments with: per dest, its options (action, nargs, default, versions),
#: and the attributes parse_args / validate_args assign that are no parser dest (``args.world_size = …``)
DESTS = ROOT / "timeline/io/megatron_parser_dests.json"
#: where Megatron's training code assigns attributes of ``args`` (parse_args, validate_args and the helpers they call)
ASSIGNING_TREE = "megatron/training"


def assigned_names(text: str) -> set[str]:
    """Attributes of a variable named ``args`` that ``text`` assigns: ``args.X = …``, ``args.X += …``, tuple
    targets ``(args.X, args.Y) = …``, and ``setattr(args, "X", …)``."""
    out: set[str] = set()

    def targets(node: ast.AST) -> None:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "args":
            out.add(node.attr)
        elif isinstance(node, ast.Tuple | ast.List):
            for elt in node.elts:
                targets(elt)

    try:
        tree = ast.parse(text)
    except SyntaxError:
        return out
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                targets(t)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets(node.target)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
              and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and node.args[0].id == "args"
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            out.add(node.args[1].value)
    return out
RELEASE_RE = re.compile(r"core_v0\.(\d+)\.(\d+)$")
#: the parser's own file; the static pass also reads the modules of pretrain_gpt.py's extra_args_provider
PARSER_FILE = "megatron/training/arguments.py"
INNER = Path(__file__).resolve().parent / "megatron_parser_build.py"


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "-C", git_dir, *args], check=True, capture_output=True, text=True).stdout


def package_version(git_dir: str, commit: str) -> str:
    """Megatron-Core's version at ``commit`` (megatron/core/package_info.py: MAJOR.MINOR.PATCH)."""
    text = git(git_dir, "show", f"{commit}:megatron/core/package_info.py")
    parts = [re.search(rf"^{k} = (\d+)", text, re.M) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) if m else "0" for m in parts)


def releases(git_dir: str, main: str) -> list[tuple[str, str]]:
    """(label, commit): the final releases core_v0.12.0 … (no release candidates), then main."""
    tags = []
    for tag in git(git_dir, "tag", "-l", "core_v0.*").split():
        m = RELEASE_RE.match(tag)
        if m and int(m.group(1)) >= 12:
            tags.append(((int(m.group(1)), int(m.group(2))), tag))
    out = [(tag, git(git_dir, "rev-list", "-n1", tag).strip()) for _, tag in sorted(tags)]
    out.append(("main", git(git_dir, "rev-parse", main).strip()))
    return out


def static_options(folder: Path, files: list[str]) -> dict[str, tuple[str | None, str]]:
    """Literal option strings of every ``add_argument`` call in ``files`` → (the source text of its
    ``default=`` or None, ``path:function`` of the call)."""
    found: dict[str, tuple[str | None, str]] = {}
    for rel in files:
        path = folder / rel
        if not path.exists():
            continue
        text = path.read_text()
        for func in ast.walk(ast.parse(text)):
            if not isinstance(func, ast.FunctionDef):
                continue
            for node in ast.walk(func):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "add_argument"):
                    continue
                default = next((ast.get_source_segment(text, k.value) for k in node.keywords if k.arg == "default"),
                               None)
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("-"):
                        found[arg.value] = (default, f"{rel}:{func.name}")
    return found


def build(git_dir: str, label: str, commit: str, scratch: Path, cache: Path | None) -> dict[str, Any]:
    """The built parser at ``commit``: its ``actions``, the ``stubbed`` packages and the extra
    argument ``providers`` (kept in ``cache``/COMMIT.json when given)."""
    cached = cache / f"{commit}.json" if cache else None
    if cached and cached.exists():
        return dict(json.loads(cached.read_text()))
    folder = scratch / label
    folder.mkdir()
    archive = subprocess.run(["git", "-C", git_dir, "archive", commit, "megatron", "pretrain_gpt.py"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    done = subprocess.run([sys.executable, str(INNER)], cwd=folder, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(f"{label}: building the parser failed:\n{done.stderr[-4000:]}")
    data = json.loads(done.stdout.splitlines()[-1])
    modules = [p.split(":")[0].replace(".", "/") + ".py" for p in data["providers"]]
    static = static_options(folder, [PARSER_FILE, *modules])
    built = {o for act in data["actions"] for o in act["option_strings"]}
    for act in data["actions"]:
        src = next((static[o][0] for o in act["option_strings"] if o in static), None)
        if src is not None:
            act["default_src"] = src
    # in the source, not in the built parser: added only under a condition this build did not meet
    # (core_v0.16's Kitchen extension is a public stub with HAVE_KITCHEN = False); kept, marked
    for opt in sorted(set(static) - built):
        default, where = static[opt]
        print(f"{label}: {opt} ({where}) is in the source but not built", file=sys.stderr)
        data["actions"].append({"option_strings": [opt], "dest": None, "action": "not built (conditional)",
                                "type": None, "nargs": None, "default": None, "source": where,
                                **({"default_src": default} if default is not None else {})})
    if cached:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(data))
    return data


def spans(present: list[bool], labels: list[str]) -> list[list[str]]:
    """Runs of consecutive versions, as [first, last] label pairs."""
    out: list[list[str]] = []
    for i, on in enumerate(present):
        if on and (i == 0 or not present[i - 1]):
            out.append([labels[i], labels[i]])
        elif on:
            out[-1][1] = labels[i]
    return out


def merge(per_version: list[tuple[str, list[dict[str, Any]]]]) -> dict[str, dict[str, Any]]:
    """One row per option string; attributes as of the last version having it, earlier values that
    differ kept under ``changed`` (label → the older value)."""
    labels = [label for label, _ in per_version]
    rows: dict[str, dict[str, Any]] = {}
    present: dict[str, list[bool]] = {}
    for i, (label, actions) in enumerate(per_version):
        for act in actions:
            for opt in act["option_strings"]:
                row = {"aliases": [o for o in act["option_strings"] if o != opt],
                       **{k: act[k] for k in ("dest", "action", "type", "nargs", "default", "source")}}
                if "default_src" in act:
                    row["default_src"] = act["default_src"]
                old = rows.get(opt)
                if old is not None:
                    diffs = {k: old.get(k) for k in row.keys() | old.keys()
                             if k not in ("source", "changed", "default_src") and old.get(k) != row.get(k)}
                    changed = old.pop("changed", {})
                    if diffs:
                        changed[labels[i - 1] if i else label] = diffs
                    if changed:
                        row["changed"] = changed
                rows[opt] = row
                present.setdefault(opt, [False] * len(labels))[i] = True
    for opt, row in rows.items():
        row["versions"] = spans(present[opt], labels)
    return dict(sorted(rows.items()))


def write_index(table: dict[str, Any], path: Path) -> None:
    """The run-time index: versions (label, Megatron-Core version: the tag's, main's package_info, and
    commit) and, per option string, one character per version ("1": the parser has it)."""
    versions = table["provenance"]["versions"]
    labels = [v["label"] for v in versions]
    rows = {name: presence(row["versions"], labels) for name, row in table["arguments"].items()}
    index = {"source": "NVIDIA/Megatron-LM pretrain_gpt.py's parser; derived by tools/megatron_parser_args.py "
                       "from tests/data/megatron/parser_args.json",
             "versions": [[v["label"], v["label"].removeprefix("core_v") if v["label"] != "main" else v["megatron_core"],
                           v["commit"][:10]] for v in versions],
             "arguments": rows}
    body = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in rows.items())
    head = json.dumps({k: index[k] for k in ("source", "versions")})[:-1]
    path.write_text(f'{head},\n"arguments": {{\n{body}\n}}}}\n')


def presence(row_versions: list[list[str]], labels: list[str]) -> str:
    """One character per version of ``labels``: "1" where a [first, last] span of ``row_versions`` covers it."""
    present = ["0"] * len(labels)
    for first, last in row_versions:
        for i in range(labels.index(first), labels.index(last) + 1):
            present[i] = "1"
    return "".join(present)


def dests_of(table: dict[str, Any]) -> dict[str, list[list[Any]]]:
    """Per dest, each option string with its action, nargs, default (repr) and the versions having it: one row per
    version span over which they stay the same (a dest, nargs or default that changed makes another)."""
    labels = [v["label"] for v in table["provenance"]["versions"]]
    dests: dict[str, list[list[Any]]] = {}
    for opt, row in table["arguments"].items():
        present = presence(row["versions"], labels)
        # the option's (dest, action, nargs, default) at each version: ``changed`` keeps, under the last version
        # that had them, the values an option held before a change
        changes = sorted(((labels.index(label), diff) for label, diff in (row.get("changed") or {}).items()),
                         key=lambda c: c[0])
        groups: dict[tuple, list[str]] = {}
        for i in range(len(labels)):
            attrs = {k: row[k] for k in ("dest", "action", "nargs", "default")}
            for at, diff in reversed(changes):
                if at >= i:
                    attrs.update({k: v for k, v in diff.items() if k in attrs})
            if present[i] == "1" and attrs["dest"]:
                key = (attrs["dest"], attrs["action"], attrs["nargs"], attrs["default"])
                groups.setdefault(key, ["0"] * len(labels))[i] = "1"
        for (dest, action, nargs, default), bits in groups.items():
            dests.setdefault(dest, []).append([opt, action, nargs, default, "".join(bits)])
    return dict(sorted(dests.items()))


def write_dests(table: dict[str, Any], git_dir: str, path: Path) -> None:
    """The run-time table of a printed arguments block (``_print_args`` prints ``vars(args)`` at the end of
    ``validate_args``): :func:`dests_of`, and per attribute that Megatron's training code assigns without a parser
    dest at that version (``args.world_size``, ``args.params_dtype``, …: every ``args.NAME =`` under
    megatron/training/ at each version) the versions assigning it."""
    versions = table["provenance"]["versions"]
    labels = [v["label"] for v in versions]
    dests = dests_of(table)
    assigned: dict[str, list[bool]] = {}
    for i, v in enumerate(versions):
        files = [f for f in git(git_dir, "ls-tree", "-r", "--name-only", v["commit"], ASSIGNING_TREE).split()
                 if f.endswith(".py")]
        names = set().union(*(assigned_names(git(git_dir, "show", f"{v['commit']}:{f}")) for f in files))
        for name in sorted(names):
            if not any(r[4][i] == "1" for r in dests.get(name, ())):  # no option of this version sets it
                assigned.setdefault(name, [False] * len(labels))[i] = True
    body = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in dests.items())
    extra = ",\n".join(f" {json.dumps(k)}: {json.dumps(''.join('1' if p else '0' for p in v))}"
                       for k, v in sorted(assigned.items()))
    head = json.dumps({"source": "NVIDIA/Megatron-LM pretrain_gpt.py's parser by dest, and the attributes "
                                 f"{ASSIGNING_TREE}/ assigns (args.NAME = …) that are no dest; derived by "
                                 "tools/megatron_parser_args.py from tests/data/megatron/parser_args.json",
                       "versions": [[v["label"], v["megatron_core"], v["commit"][:10]] for v in versions],
                       "row": ["option", "action", "nargs", "default (repr)", "versions"]})[:-1]
    path.write_text(f'{head},\n"dests": {{\n{body}\n}},\n"assigned": {{\n{extra}\n}}}}\n')


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--git-dir", default=DEFAULT_GIT, help="a Megatron-LM git dir (bare is fine)")
    ap.add_argument("--main", default="HEAD", help="the revision recorded as main (default HEAD)")
    ap.add_argument("-o", "--output", default=str(OUT))
    ap.add_argument("--index", default=str(INDEX), help="where to write the run-time index (presence only)")
    ap.add_argument("--cache", help="a folder to keep each commit's built parser in (rebuilt when absent)")
    ap.add_argument("--dests", default=str(DESTS), help="where to write the run-time dest table")
    ap.add_argument("--dests-only", action="store_true",
                    help="only rewrite the dest table from the existing --output (no parser is built)")
    opts = ap.parse_args(argv)
    if opts.dests_only:
        write_dests(json.loads(Path(opts.output).read_text()), opts.git_dir, Path(opts.dests))
        return 0
    versions = releases(opts.git_dir, opts.main)
    per_version = []
    provenance = []
    with tempfile.TemporaryDirectory(prefix="megatron-args-") as tmp:
        for label, commit in versions:
            data = build(opts.git_dir, label, commit, Path(tmp), Path(opts.cache) if opts.cache else None)
            actions = data["actions"]
            per_version.append((label, actions))
            provenance.append({"label": label, "commit": commit,
                               "megatron_core": package_version(opts.git_dir, commit), "paths": [PARSER_FILE, "pretrain_gpt.py"],
                               "extra_args_providers": data["providers"], "stubbed_packages": data["stubbed"],
                               "options": sum(len(a["option_strings"]) for a in actions)})
            print(f"{label} {commit[:10]}: {len(actions)} arguments", file=sys.stderr)
    table = {
        "provenance": {"repo": "NVIDIA/Megatron-LM", "tool": "tools/megatron_parser_args.py",
                       "parser": "megatron/training/arguments.py: add_megatron_arguments, plus pretrain_gpt.py's "
                                 "extra_args_provider", "versions": provenance},
        "arguments": merge(per_version),
    }
    out = Path(opts.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in table["arguments"].items())
    out.write_text(f'{{"provenance": {json.dumps(table["provenance"], indent=1)},\n"arguments": {{\n{rows}\n}}}}\n')
    print(f"wrote {out}: {len(table['arguments'])} option strings over {len(versions)} versions", file=sys.stderr)
    write_index(table, Path(opts.index))
    write_dests(table, opts.git_dir, Path(opts.dests))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
