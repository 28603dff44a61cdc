"""Which measured Megatron-LM cases are *calibration* and which are *unseen*: ``tools/megatron_split.json``.

The split is decided from names alone, before any golden's numbers are read, and is committed:

- A **case** is a functional-test directory of NVIDIA/Megatron-LM that ever held a golden file:
  ``tests/functional_tests/test_cases/<family>/<case>/golden_values_*.json`` → ``family/case``
  (``test_cases/moe2.0/golden_values/<case>/…`` → ``moe2.0/<case>``), over ``git log --all`` (every
  branch: release branches ``core_r0.x``, deleted and renamed directories, every GPU platform's golden).
- **Renamed directories are one case**: when one commit deletes a file (``golden_values_*.json`` or
  ``model_config.yaml``) under one case directory and adds the byte-identical blob under another, and
  that blob is deleted under exactly one directory and added under exactly one in that commit, the
  two names are linked (a rename, not a copy: the old one is gone). A **group** is a connected
  component of links; its **key** is its alphabetically first name.
- **Side**: a group holding one of the calibration dataset's 181 names
  (``../shared/measured/megatron_calibration.json``) is ``calibration``, with every commit and
  platform of it; any other group goes by a fixed hash of its key,
  ``int(sha256(b"timeline-heldout-v1:" + key.encode()).hexdigest(), 16) % 3`` →
  0 or 1: ``unseen``, 2: ``calibration``.

Neither a golden's values nor a configuration's content enter the split: only paths and blob ids.

    .venv/bin/python tools/megatron_split.py [GIT_DIR] [--data SHARED_JSON] [-o tools/megatron_split.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_GIT = ROOT.parent / ".mirror" / "NVIDIA+Megatron-LM" / "repo"
DEFAULT_DATA = ROOT.parent / "shared" / "measured" / "megatron_calibration.json"
DEFAULT_OUT = ROOT / "tools" / "megatron_split.json"
SALT = b"timeline-heldout-v1:"
CASES = "tests/functional_tests/test_cases"
#: git pathspecs (a ``*`` matches across ``/`` in git's default pathspec)
PATHSPECS = (f"{CASES}/*golden_values*.json", f"{CASES}/*model_config.yaml")
RULE = ("case = test_cases/<family>/<case>/ directory (moe2.0: golden_values/<case>/); directories linked by a "
        "commit that deletes a golden_values_*.json or model_config.yaml blob under exactly one directory and adds "
        "it under exactly one other are one group, keyed by its alphabetically first name; a group holding one of "
        "the shared dataset's names is calibration, else int(sha256(b'timeline-heldout-v1:' + key).hexdigest(), 16) "
        "% 3: 0, 1 unseen, 2 calibration")


def git(git_dir: str | Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], check=True, capture_output=True,
                          text=True).stdout


def case_of(path: str) -> tuple[str, str] | None:
    """(case name, kind: "golden" | "config") of a path under test_cases, or None for any other file."""
    parts = path.split("/")
    if len(parts) < 6 or "/".join(parts[:3]) != CASES:
        return None
    leaf = parts[-1]
    if parts[3] == "moe2.0" and parts[4] == "golden_values" and len(parts) == 7 and leaf.startswith("golden_values"):
        return f"moe2.0/{parts[5]}", "golden"
    if len(parts) != 6:
        return None
    if leaf.startswith("golden_values") and leaf.endswith(".json"):
        return f"{parts[3]}/{parts[4]}", "golden"
    return (f"{parts[3]}/{parts[4]}", "config") if leaf == "model_config.yaml" else None


def history(git_dir: str | Path) -> str:
    """``git log --all`` of every golden and model_config.yaml change, with blob ids, no rename detection."""
    return git(git_dir, "log", "--all", "--format=C %H %ct %cs", "--raw", "--no-abbrev", "--no-renames", "--",
               *PATHSPECS)


Change = tuple[str, str, str, str]  # (old blob, new blob, status, path)


def raw_changes(log: str) -> list[tuple[str, int, str, list[Change]]]:
    """Per commit of :func:`history`, newest first: (sha, committer time, date, changes)."""
    out: list[tuple[str, int, str, list[Change]]] = []
    for line in log.splitlines():
        if line.startswith("C "):
            _, sha, ct, date = line.split()
            out.append((sha, int(ct), date, []))
        elif line.startswith(":") and out:
            meta, path = line.split("\t", 1)
            fields = meta.split()
            out[-1][3].append((fields[2], fields[3], fields[4], path))
    return out


def names_and_links(log: str) -> tuple[set[str], set[tuple[str, str]]]:
    """Case names that ever held a golden, and the rename links between case directories."""
    names: set[str] = set()
    links: set[tuple[str, str]] = set()
    for _sha, _ct, _date, changes in raw_changes(log):
        deleted: dict[str, set[str]] = defaultdict(set)
        added: dict[str, set[str]] = defaultdict(set)
        for old, new, status, path in changes:
            found = case_of(path)
            if found is None:
                continue
            name, kind = found
            if kind == "golden":
                names.add(name)
            if status == "D":
                deleted[old].add(name)
            elif status == "A":
                added[new].add(name)
        for blob, gone in deleted.items():
            came = added.get(blob, set())
            if len(gone) == 1 and len(came) == 1 and gone != came:
                a, b = sorted(gone | came)
                links.add((a, b))
    return names, links


def groups(names: set[str], links: set[tuple[str, str]]) -> dict[str, str]:
    """Case name → its group's key (the alphabetically first name of its connected component)."""
    parent = {n: n for n in names}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in sorted(links):
        if a in parent and b in parent:
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    members: dict[str, list[str]] = defaultdict(list)
    for n in names:
        members[find(n)].append(n)
    return {n: min(ms) for ms in members.values() for n in ms}


def hashed_side(key: str) -> str:
    """The fixed hash rule for a group with no calibration-dataset name."""
    bucket = int(hashlib.sha256(SALT + key.encode()).hexdigest(), 16) % 3
    return "calibration" if bucket == 2 else "unseen"


def sides(group_of: dict[str, str], shared: set[str]) -> dict[str, str]:
    calibrated = {group_of[n] for n in shared if n in group_of}
    return {n: "calibration" if key in calibrated else hashed_side(key) for n, key in group_of.items()}


def refs_digest(git_dir: str | Path) -> str:
    """sha256 of every ref tip ``git log --all`` walks: a later mirror with moved refs gives another digest."""
    tips = git(git_dir, "for-each-ref", "--format=%(objectname) %(refname)")
    return hashlib.sha256("\n".join(sorted(tips.splitlines())).encode()).hexdigest()


def split(git_dir: str | Path, shared: set[str]) -> dict:
    names, links = names_and_links(history(git_dir))
    group_of = groups(names, links)
    side = sides(group_of, shared)
    cases = {n: {"side": side[n], "group": group_of[n]} for n in sorted(names)}
    return {"source": "NVIDIA/Megatron-LM git history (tools/megatron_split.py)", "rule": RULE,
            "salt": SALT.decode(), "mirror_head": git(git_dir, "rev-parse", "HEAD").strip(),
            "refs_digest": refs_digest(git_dir), "shared_names": len(shared),
            "counts": {s: sum(1 for c in cases.values() if c["side"] == s) for s in ("calibration", "unseen")},
            "links": [list(link) for link in sorted(links)], "cases": cases}


def dumps(manifest: dict) -> str:
    """The manifest as JSON with one line per case and per link (diffs stay readable)."""
    head = {k: v for k, v in manifest.items() if k not in ("links", "cases")}
    lines = ["{"] + [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    lines.append(' "links": [')
    lines += [f"  {json.dumps(link)}{',' if i < len(manifest['links']) - 1 else ''}"
              for i, link in enumerate(manifest["links"])]
    lines.append(" ],")
    lines.append(' "cases": {')
    items = list(manifest["cases"].items())
    lines += [f"  {json.dumps(n)}: {json.dumps(c)}{',' if i < len(items) - 1 else ''}" for i, (n, c) in enumerate(items)]
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def shared_names(path: Path) -> set[str]:
    return {r["name"] for r in json.loads(path.read_text())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("git_dir", nargs="?", default=str(DEFAULT_GIT), help="a Megatron-LM git directory")
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="the calibration dataset (for its case names)")
    parser.add_argument("-o", "--output", default=str(DEFAULT_OUT))
    args = parser.parse_args()
    for flag, path in (("GIT_DIR", Path(args.git_dir) / "HEAD"), ("--data", Path(args.data))):
        if not path.exists():
            print(f"megatron_split: {flag} {path.parent if flag == 'GIT_DIR' else path}: not found", file=sys.stderr)
            return 2
    out = split(args.git_dir, shared_names(Path(args.data)))
    Path(args.output).write_text(dumps(out))
    print(f"{len(out['cases'])} case names ({out['counts']['calibration']} calibration, "
          f"{out['counts']['unseen']} unseen), {len(out['links'])} rename links; written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
