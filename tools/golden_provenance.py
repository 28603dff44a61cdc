"""Where each measured case's golden values were really recorded: ``tools/golden_provenance.json``.

The calibration dataset (``../shared/measured/megatron_calibration.json``) names, per case, the
Megatron-LM commit that first wrote its golden file's *path* (``memory_values_first_commit``). Many
goldens were moved without being re-recorded — Megatron-LM's adc69dba2d (2025-10-21) renamed the
``gpt3_mr_*_dgx_a100_1N8G`` and ``gpt3_345m_nightly_*`` test directories and their
``golden_values_dev.json`` files — so the bytes of those files were measured months earlier, under
another directory whose ``model_config.yaml`` then was not the one the dataset read.

This script is derived from Megatron-LM's public git history only (not from ``../shared``: the
dataset just lists which cases and golden files to follow). For every expressible case it takes the
git blob of ``measured.golden_file`` at ``memory_values_first_commit`` and the earliest commit (by
committer time) that wrote that same blob under any path of
``tests/functional_tests/test_cases/*/*/golden_values_*.json``
(``git log --no-renames --raw --no-abbrev`` over those paths, up to the dataset's head commit). Where
that commit is not the dataset's, the entry gives the directory it was written under, whether that
directory still exists at the dataset's commit (``kind``: ``renamed`` — it does not, the golden moved
with its test; ``copied`` — it does, the golden of another test was copied; ``same directory``), the
Megatron-Core version (``megatron/core/package_info.py``) at the recording commit, and the
differences between that directory's ``model_config.yaml`` at the recording commit and the record's
``model_args`` / ``env``: argument → [value then, value in the record], ``null`` = absent
(``ENV_VARS`` keys of either config only: the record's ``env`` also holds the runner's defaults).

    .venv/bin/python tools/golden_provenance.py /path/to/Megatron-LM/.git [--data PATH] [-o FILE]

Regenerate it when the dataset changes; the output is deterministic (sorted, no timestamps).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from megatron_case_record import note_now  # noqa: E402  (the notes' kinds live with the collection)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "measured" / "megatron_calibration.json"
DEFAULT_OUT = ROOT / "tools" / "golden_provenance.json"
GOLDENS = "tests/functional_tests/test_cases/*/*/golden_values_*.json"


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True, text=True).stdout


def git_or_none(git_dir: str, *args: str) -> str | None:
    try:
        return git(git_dir, *args)
    except subprocess.CalledProcessError:
        return None


def blob_writes(git_dir: str, head: str) -> dict[str, tuple[int, int, str, str, str]]:
    """Blob id → (committer time, log position, commit, committer date, path) of the earliest commit
    that wrote it (added or modified) under a golden path; the log position (larger = older in
    ``git log``'s order) breaks ties of equal committer times."""
    text = git(git_dir, "log", "--format=C %H %ct %cd", "--date=short", "--raw", "--no-abbrev", "--no-renames",
               head, "--", GOLDENS)
    first: dict[str, tuple[int, int, str, str, str]] = {}
    commit = ("", 0, "")
    pos = 0
    for line in text.splitlines():
        if line.startswith("C "):
            _, sha, ct, date = line.split()
            commit = (sha, int(ct), date)
            pos += 1
        elif line.startswith(":"):
            meta, path = line.split("\t", 1)
            new = meta.split()[3]
            if set(new) == {"0"}:
                continue
            key = (commit[1], -pos)
            old = first.get(new)
            if old is None or key < (old[0], -old[1]):
                first[new] = (commit[1], pos, commit[0], commit[2], path)
    return first


def yaml_at(git_dir: str, commit: str, path: str) -> dict | None:
    text = git_or_none(git_dir, "show", f"{commit}:{path}")
    return None if text is None else (yaml.safe_load(text) or {})


def env_text(value: object) -> str:
    """An ``ENV_VARS`` value as the shell exports it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def megatron_core_at(git_dir: str, commit: str) -> str | None:
    text = git_or_none(git_dir, "show", f"{commit}:megatron/core/package_info.py")
    if text is None:
        return None
    parts = {k: v for k, v in re.findall(r"^(MAJOR|MINOR|PATCH|PRE_RELEASE)\s*=\s*['\"]?([\w.]*)['\"]?", text, re.M)}
    return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}{parts.get('PRE_RELEASE', '')}"


def differences(then: dict, now: dict) -> dict[str, list]:
    keys = sorted(set(then) | set(now))
    return {k: [then.get(k), now.get(k)] for k in keys if then.get(k) != now.get(k)}


def provenance(git_dir: str, records: list[dict]) -> dict:
    heads = sorted({str(r.get("repo_head_commit")) for r in records if r.get("repo_head_commit")})
    head = heads[-1] if len(heads) == 1 else "HEAD"
    writes = blob_writes(git_dir, head)
    cases = {}
    for r in records:
        if not r.get("model_args") or note_now(r):  # the kinds modelled now count as expressible
            continue
        commit, golden = r["memory_values_first_commit"], r["measured"]["golden_file"]
        blob = git(git_dir, "rev-parse", f"{commit}:{golden}").strip()
        _, _, first, date, path = writes[blob]
        entry: dict = {"golden_file": golden, "blob": blob, "recorded_commit": first, "recorded_date": date,
                       "recorded_earlier": first != commit}
        if first != commit:
            directory = path.rsplit("/", 1)[0]
            own = golden.rsplit("/", 1)[0]
            still = git_or_none(git_dir, "cat-file", "-e", f"{commit}:{directory}/model_config.yaml") is not None
            kind = "same directory" if directory == own else "copied" if still else "renamed"
            config = yaml_at(git_dir, first, f"{directory}/model_config.yaml") or {}
            current = yaml_at(git_dir, r["config_commit"], r["config_file"]) or {}
            then_env = {k: env_text(v) for k, v in (config.get("ENV_VARS") or {}).items()}
            env_keys = set(then_env) | set(current.get("ENV_VARS") or {})
            rec_env = {k: v for k, v in (r.get("env") or {}).items() if k in env_keys}
            entry.update({
                "recorded_path": path, "kind": kind, "subject": git(git_dir, "log", "-1", "--format=%s", first).strip(),
                "megatron_core": megatron_core_at(git_dir, first),
                "model_args": differences(config.get("MODEL_ARGS") or {}, r["model_args"]),
                "env": differences(then_env, rec_env)})
        cases[r["name"]] = entry
    return {"source": "NVIDIA/Megatron-LM git history (see tools/golden_provenance.py)", "head": head,
            "cases": dict(sorted(cases.items()))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("git_dir", help="a Megatron-LM clone's git directory (a bare mirror works)")
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("-o", "--output", default=str(DEFAULT_OUT))
    args = parser.parse_args()
    out = provenance(args.git_dir, json.loads(Path(args.data).read_text()))
    Path(args.output).write_text(json.dumps(out, indent=1, sort_keys=False) + "\n")
    earlier = [n for n, e in out["cases"].items() if e["recorded_earlier"]]
    print(f"{len(out['cases'])} cases, {len(earlier)} recorded at an earlier commit than the dataset's; "
          f"written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
