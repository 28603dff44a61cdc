"""Arguments of Megatron-LM's training parser that existed only between releases, on the release lines' history.

``tools/megatron_parser_args.py`` builds the parser at every release core_v0.12.0 … core_v0.19.0 and at main
d98e8a64dd. Measured jobs were also recorded at main commits between them, whose parser had arguments later
renamed or removed before any release. This pass reads every commit reachable from those releases or main and
not from core_v0.12.0 that touches the parser's files (``megatron/training/arguments.py`` and ModelOpt's
``megatron/post_training/arguments.py``, pretrain_gpt.py's extra_args_provider), statically (``ast``: the
literal option strings of each ``add_argument`` call, as the builder's cross-check reads them), the same on the
``dev`` branch (``--dev``: Megatron-LM's development line, whose commits measured jobs also ran), plus the parser
*built* at the dev head (``megatron_parser_args.build``) for the names it generates from config dataclasses
(recorded with that head as first and last commit), and writes
``tests/data/megatron/parser_args_between.json`` — per option string in no built version: the first and last
commit (by commit date) whose parser file names it, and where — and the run-time copy
``timeline/io/megatron_parser_between.json``. Not covered: names generated from config dataclasses
(``argument_utils.py: ArgumentGroupFactory``, from 639c08ab82, 2026-01-30) that never reached a release and are gone
from the dev head; only the executing builder sees those (about a minute per commit here, for ~240 commits).

    .venv/bin/python tools/megatron_parser_history.py [--git-dir /work/.mirror/NVIDIA+Megatron-LM/repo]
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_GIT = "/work/.mirror/NVIDIA+Megatron-LM/repo"
FACTS = ROOT / "tests/data/megatron/parser_args.json"
OUT = ROOT / "tests/data/megatron/parser_args_between.json"
INDEX = ROOT / "timeline/io/megatron_parser_between.json"
FILES = ("megatron/training/arguments.py", "megatron/post_training/arguments.py")
RELEASE_RE = re.compile(r"core_v0\.(\d+)\.(\d+)$")


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "-C", git_dir, *args], check=True, capture_output=True, text=True).stdout


def literal_options(text: str, rel: str) -> dict[str, str]:
    """Literal option strings of every ``add_argument`` call → ``path:function``."""
    out: dict[str, str] = {}
    for func in ast.walk(ast.parse(text)):
        if not isinstance(func, ast.FunctionDef):
            continue
        for node in ast.walk(func):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--"):
                        out[arg.value] = f"{rel}:{func.name}"
    return out


def scan(git_dir: str, main: str, dev: str | None = None) -> tuple[list[str], dict[str, dict[str, str]]]:
    """(the heads read, per option string its first and last commit by date and where it is added)."""
    tags = sorted(t for t in git(git_dir, "tag", "-l", "core_v0.*").split()
                  if (m := RELEASE_RE.match(t)) and int(m.group(1)) >= 12)
    heads = [*tags, main, *([dev] if dev else [])]
    lines = git(git_dir, "log", "--format=%H %cI", *heads, "--not", "core_v0.12.0", "--", *FILES).split("\n")
    commits = sorted((line.split()[1], line.split()[0]) for line in lines if line.strip())
    found: dict[str, dict[str, str]] = {}
    for when, commit in commits:
        for rel in FILES:
            try:
                text = git(git_dir, "show", f"{commit}:{rel}")
                opts = literal_options(text, rel)
            except (subprocess.CalledProcessError, SyntaxError):
                continue
            for opt, where in opts.items():
                row = found.setdefault(opt, {"first": commit, "first_date": when[:10], "source": where})
                row.update(last=commit, last_date=when[:10])
    return heads, found


def built_at(git_dir: str, commit: str, found: dict[str, dict[str, str]]) -> None:
    """Add the option strings of the parser built at ``commit`` that ``found`` lacks (names generated from
    config dataclasses), with ``commit`` as their first and last commit."""
    import sys
    import tempfile

    sys.path.insert(0, str(ROOT / "tools"))
    import megatron_parser_args as mpa

    when = git(git_dir, "log", "-1", "--format=%cI", commit).strip()[:10]
    with tempfile.TemporaryDirectory() as tmp:
        data = mpa.build(git_dir, "dev", commit, Path(tmp), None)
    for act in data["actions"]:
        for opt in act["option_strings"]:
            if opt.startswith("--") and opt not in found:
                found[opt] = {"first": commit, "first_date": when, "source": str(act.get("source") or "built"),
                              "last": commit, "last_date": when}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--git-dir", default=DEFAULT_GIT)
    ap.add_argument("--main", default="d98e8a64ddf34856e74b24714e3bedb2f5a39553")
    ap.add_argument("--dev", default="d48bd6be0a85cc0d6d3cc71e8750cf357cc6bdb1",
                    help="the dev branch head read (its parser is also built: needs torch, about a minute)")
    opts = ap.parse_args(argv)
    built = json.loads(FACTS.read_text())["arguments"]
    heads, found = scan(opts.git_dir, opts.main, opts.dev)
    if opts.dev:
        built_at(opts.git_dir, opts.dev, found)
    between = {k: found[k] for k in sorted(found) if k not in built}
    prov = {"repo": "NVIDIA/Megatron-LM", "tool": "tools/megatron_parser_history.py", "files": list(FILES),
            "heads": heads, "not": "core_v0.12.0", "rule": "literal option strings of add_argument calls at every "
            "commit touching the files, and the parser built at the dev head; kept: those in no version of "
            "tests/data/megatron/parser_args.json"}
    OUT.write_text(json.dumps({"provenance": prov, "arguments": between}, indent=1) + "\n")
    INDEX.write_text(json.dumps({"source": "NVIDIA/Megatron-LM main and dev between releases; derived by "
                                           "tools/megatron_parser_history.py", "arguments": {
        k: [r["first"][:10], r["first_date"], r["last"][:10], r["last_date"]] for k, r in between.items()}},
        indent=1) + "\n")
    print(f"wrote {OUT} and {INDEX}: {len(between)} option strings of main only between releases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
