"""Run ``from-megatron``'s conversion over every functional-test configuration Megatron-LM ships, and
count what it refuses and why.

Collects each ``tests/functional_tests/**/model_config.yaml`` at the releases core_v0.12.0 …
core_v0.19.0 and main (the versions of ``tests/data/megatron/parser_args.json``) from a Megatron-LM
git dir, once per distinct (content, path), converts it with ``--megatron-core`` of the first
version that has it (main is 0.20.0) on 8 GPUs (tp·pp·cp when 8 does not divide), and prints the
outcomes: converted, or refused, grouped by the refusal with digits folded (``--fp8-format`` and
``--fp4-format`` are one reason). A refusal for an argument in no version of the parser ("not an
argument of Megatron-LM's training parser") exits 1. Simulates nothing; never reads golden values.

    .venv/bin/python tools/megatron_config_check.py [--git-dir /work/.mirror/NVIDIA+Megatron-LM/repo]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
from pathlib import Path

from timeline.errors import UserError
from timeline.io.megatron_args import parse_yaml
from timeline.io.megatron_write import convert

ROOT = Path(__file__).resolve().parent.parent
FACTS = ROOT / "tests/data/megatron/parser_args.json"
UNKNOWN = "not an argument of Megatron-LM's training parser"


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "-C", git_dir, *args], check=True, capture_output=True, text=True).stdout


def configs(git_dir: str) -> dict[tuple[str, str], str]:
    """(blob, path) → the Megatron-Core version of the first release (or main) that has it."""
    seen: dict[tuple[str, str], str] = {}
    for v in json.loads(FACTS.read_text())["provenance"]["versions"]:
        core = v["label"].removeprefix("core_v") if v["label"] != "main" else v["megatron_core"]
        listing = git(git_dir, "ls-tree", "-r", v["commit"], "--format=%(objectname) %(path)",
                      "--", "tests/functional_tests")
        for line in listing.splitlines():
            blob, path = line.split(" ", 1)
            if path.endswith("/model_config.yaml"):
                seen.setdefault((blob, path), core)
    return seen


def world_size(args: dict) -> int:
    def size(name: str) -> int:
        try:
            return int(str(args.get(name, 1)))
        except ValueError:
            return 1
    model = size("--tensor-model-parallel-size") * size("--pipeline-model-parallel-size") * size(
        "--context-parallel-size")
    return 8 if 8 % model == 0 else model


def outcome(text: str, path: str, core: str) -> str:
    try:
        margs = parse_yaml(text, Path("/") / path)
        convert(margs, world_size=world_size(margs.args), megatron_core=core)
    except UserError as exc:
        return "refused: " + re.sub(r"\d+", "N", str(exc))[:140]
    return "converted"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--git-dir", default="/work/.mirror/NVIDIA+Megatron-LM/repo")
    opts = ap.parse_args()
    found = configs(opts.git_dir)
    counts: collections.Counter[str] = collections.Counter()
    family: collections.Counter[tuple[str, bool]] = collections.Counter()
    for (blob, path), core in sorted(found.items()):
        result = outcome(git(opts.git_dir, "cat-file", "-p", blob), path, core)
        counts[result] += 1
        family[(path.split("/")[3], result == "converted")] += 1
    print(f"{len(found)} distinct configurations ({len({p for _, p in found})} paths)")
    for result, n in counts.most_common():
        print(f"{n:5d}  {result}")
    print("by family (converted / refused):")
    for name in sorted({f for f, _ in family}):
        print(f"  {name}: {family[(name, True)]} / {family[(name, False)]}")
    unknown = sum(n for r, n in counts.items() if UNKNOWN in r)
    print(f"refused as an unknown argument: {unknown}")
    return 1 if unknown else 0


if __name__ == "__main__":
    raise SystemExit(main())
