"""Collect every measured Megatron-LM functional-test case that is not one of the calibration dataset's 181.

Walks a Megatron-LM git directory (``git log --all``: every branch, deleted and renamed test
directories, every GPU platform's golden) for golden files
(``tests/functional_tests/test_cases/<family>/<case>/golden_values_*.json``) that log memory, and
writes one record per distinct golden blob, at the commit that first wrote it (a golden moved or
copied unchanged is one measurement, kept under the path it was first written to), in the schema of
``../shared/measured/megatron_calibration.json`` wherever ``tools/validate_measured.py`` reads a field
(``tools/megatron_case_record.py`` builds each). The calibration dataset's own goldens (the blob at
each record's ``memory_values_first_commit``) are left out: they are the dataset. The world size is the
CI recipe product's that ran the golden (``tools/megatron_recipes.py``: at the recording commit, else the
nearest listing in the release lines' recipe history, ``parallel.recipe_commit`` naming the commit read).

Each record carries its side of the held-out split, read from the committed manifest
``tools/megatron_split.json`` (the rule is in ``tools/megatron_split.py``: renamed directories are
one case; a group holding one of the 181 names is calibration, any other goes by
``int(sha256(b"timeline-heldout-v1:" + key).hexdigest(), 16) % 3`` → 0, 1 unseen, 2 calibration).
That manifest was committed before this extraction read any golden's numbers. A case the manifest
lacks (a mirror newer than it) gets its side by the same rule and ``"in_manifest": false``.

The records are fetched data and stay out of the repository: they go to a cache file
(default ``~/.cache/timeline/megatron-cases.json``).

    .venv/bin/python tools/collect_megatron_cases.py [--git DIR] [--out PATH]   # extract the records
    .venv/bin/python tools/collect_megatron_cases.py split [GIT_DIR]           # rewrite the manifest
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import megatron_case_record as rec  # noqa: E402
import megatron_recipes  # noqa: E402
import megatron_split as ms  # noqa: E402

DEFAULT_OUT = Path.home() / ".cache" / "timeline" / "megatron-cases.json"
MEMORY_KEYS = ("mem-allocated-bytes", "mem-max-allocated-bytes")


class Repo:
    """Reads blobs of a git directory through one ``git cat-file --batch`` process."""

    def __init__(self, git_dir: str | Path) -> None:
        self.git_dir = str(git_dir)
        self.proc = subprocess.Popen(["git", "--git-dir", self.git_dir, "cat-file", "--batch"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def read(self, spec: str) -> str | None:
        """The text of ``rev:path`` or of a blob id (None: no such object)."""
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(spec.encode() + b"\n")
        self.proc.stdin.flush()
        header = self.proc.stdout.readline().split()
        if len(header) < 3 or header[1] != b"blob":
            if len(header) >= 3:
                self.proc.stdout.read(int(header[2]) + 1)
            return None
        data = self.proc.stdout.read(int(header[2]) + 1)[:-1]
        return data.decode("utf-8", "replace")

    def yaml(self, spec: str) -> dict | None:
        text = self.read(spec)
        try:
            data = yaml.safe_load(text) if text is not None else None
        except yaml.YAMLError:
            return None
        return data if isinstance(data, dict) else None

    def git(self, *args: str) -> str:
        return ms.git(self.git_dir, *args)


Write = tuple[int, int, str, str, str]  # (committer time, -log position, commit, date, path): sorts oldest first

#: the lines Megatron-LM releases from: main, its dev integration branch, the release branches and tags;
#: any other ref (refs/pull/*, refs/heads/pull-request/*, feature and cherry-pick branches) carries code
#: that no release line may have
RELEASE_REFS = ("refs/heads/main", "refs/heads/dev", "refs/heads/core_r*", "refs/heads/core_dev_r*", "refs/tags")


def golden_writes(log: str) -> dict[str, list[Write]]:
    """Golden blob → every commit that wrote it (added or modified) under a golden path."""
    out: dict[str, list[Write]] = collections.defaultdict(list)
    for pos, (sha, ct, date, changes) in enumerate(ms.raw_changes(log)):
        for _old, new, status, path in changes:
            found = ms.case_of(path)
            if status != "D" and found is not None and found[1] == "golden":
                out[new].append((ct, -pos, sha, date, path))
    return out


def memory_key(golden: dict) -> str:
    """What identifies one measurement: the golden's memory series as numbers. A golden rewritten for
    another metric (Megatron-LM 824f3392c0 dropped leading NaN iteration times from 272 goldens) or
    copied to another path is a new blob but the same measurement."""
    return json.dumps([rec.series(golden, k) for k in MEMORY_KEYS])


def release_refs(repo: Repo) -> list[str]:
    """The refs :data:`RELEASE_REFS` names in ``repo``."""
    return repo.git("for-each-ref", "--format=%(refname)", *RELEASE_REFS).split()


def on_release_lines(repo: Repo) -> set[str]:
    """Commits reachable from :data:`RELEASE_REFS`."""
    refs = release_refs(repo)
    return set(repo.git("rev-list", *refs).split()) if refs else set()


def shared_keys(repo: Repo, shared: list[dict]) -> set[str]:
    """The memory measurements the calibration dataset's records hold (their golden at
    ``memory_values_first_commit``)."""
    out = set()
    for r in shared:
        commit, golden = r.get("memory_values_first_commit"), (r.get("measured") or {}).get("golden_file")
        data = json.loads(repo.read(f"{commit}:{golden}") or "{}") if commit and golden else {}
        if isinstance(data, dict) and data:
            out.add(memory_key(data))
    return out


class AtCommit:
    """What one commit of Megatron-LM says about how its tests ran (recipes, runner, software), cached; the
    recipes of the release lines' other commits where the commit's own list no product for a golden."""

    def __init__(self, repo: Repo) -> None:
        self.repo = repo
        self.recipes = megatron_recipes.Recipes(repo, release_refs(repo))

    def software(self, commit: str, environment: str) -> dict[str, str | None]:
        return {"megatron_core": rec.package_version(self.repo.read(f"{commit}:megatron/core/package_info.py")),
                "container": rec.container(environment, self.repo.read(f"{commit}:docker/.ngc_version.{environment}"),
                                           self.repo.read(f"{commit}:.gitlab/stages/01.build.yml"),
                                           self.repo.read(f"{commit}:.gitlab/stages/01.test.yml"))}


def _config(repo: Repo, commit: str, name: str, product: dict | None) -> tuple[dict | None, str]:
    """(model_config as the test ran it, its path): the case's model_config.yaml, or for moe2.0 the
    merge of the base, model and runtime configs its recipe product names."""
    family, case = name.split("/", 1)
    base = f"{ms.CASES}/{family}"
    if family == "moe2.0":
        if not product or not product.get("model_config") or not product.get("runtime_config"):
            return None, f"{base}/{case}/model_config.yaml"
        parts = [repo.yaml(f"{commit}:{p}") or {} for p in (
            f"{ms.CASES}/ci_base_config.yml", f"{base}/model_configs/{product['model_config']}.yaml",
            f"{base}/runtime_configs/{product['runtime_config']}.yaml")]
        return rec.merged_config(*parts), f"{base}/runtime_configs/{product['runtime_config']}.yaml"
    path = f"{base}/{case}/model_config.yaml"
    return repo.yaml(f"{commit}:{path}"), path


def record(repo: Repo, at: AtCommit, blob: str, commit: str, date: str, path: str, side: dict,
           head: str) -> dict[str, Any] | None:
    """The record of one golden blob, or None when the golden logs no peak at two iterations."""
    golden = json.loads(repo.read(blob) or "{}")
    meas = rec.measured(golden) if isinstance(golden, dict) else None
    if meas is None:
        return None
    name = ms.case_of(path)[0]  # type: ignore[index]
    tag = rec.golden_tag(path)
    product, recipe_commit, unknown = at.recipes.product(name, tag, commit)
    config, config_file = _config(repo, commit, name, product)
    gpu = tag["gpu"] or (product or {}).get("gpu")
    note = rec.expressible_note(name.split("/")[0], config, tag)
    if product is None:
        note = "; ".join(filter(None, [note, unknown]))
    model_args = (config or {}).get("MODEL_ARGS") or {}
    env = rec.runner_env(repo.read(f"{commit}:{rec.RUNNER}"))
    env.update({str(k): rec.env_text(v) for k, v in ((config or {}).get("ENV_VARS") or {}).items()})
    world = product["nodes"] * product["gpus"] if product else None
    meas.update({"golden_file": path, "golden_tag": tag["tag"], "golden_blob": blob,
                 "gpu": f"{gpu} ({tag['tag'] or 'no platform in the name'}, {tag['environment']} container)"
                 if gpu else "unspecified platform", "global_rank": world - 1 if world else None})
    return {"name": name, "family_dir": name.split("/")[0], "side": side["side"], "group": side["group"],
            "in_manifest": side.get("in_manifest", True), "source": "tools/collect_megatron_cases.py",
            "record_id": f"{name}@{commit[:10]}:{tag['tag']}", "commit": commit, "commit_date": date,
            "memory_values_first_commit": commit, "memory_values_first_commit_date": date,
            "config_commit": commit, "config_file": config_file, "repo_head_commit": head,
            "test_type": (config or {}).get("TEST_TYPE"), "mode": (config or {}).get("MODE"),
            "model_family": (product or {}).get("script_family"), "model_family_source": (product or {}).get("script"),
            "software": at.software(commit, tag["environment"]),
            "parallel": {**rec.layout(model_args), "world_size": world,
                         "nodes": product["nodes"] if product else None,
                         "gpus_per_node": product["gpus"] if product else None, "world_size_inferred": False,
                         "recipe": product["path"] if product else None, "recipe_commit": recipe_commit},
            "model_args": model_args, "env": env, "measured": meas, "expressible_note": note or None}


def collect(git_dir: str | Path, manifest: dict, shared: list[dict]) -> tuple[list[dict], dict[str, int]]:
    """(records, counts of goldens left out by reason): one record per distinct memory measurement, at the
    earliest commit on a release line that wrote it (else the earliest anywhere, with a note)."""
    repo = Repo(git_dir)
    log = ms.history(git_dir)
    names, links = ms.names_and_links(log)
    group_of = ms.groups(names, links)
    fresh = ms.sides(group_of, {r["name"] for r in shared})
    head = repo.git("rev-parse", "HEAD").strip()
    released = on_release_lines(repo)
    skip = shared_keys(repo, shared)
    left_out: collections.Counter[str] = collections.Counter()
    by_key: dict[str, list[tuple[Write, str]]] = collections.defaultdict(list)
    for blob, writes in golden_writes(log).items():
        golden = json.loads(repo.read(blob) or "{}")
        golden = golden if isinstance(golden, dict) else {}
        if any("reserved" in k for k in golden):
            left_out["golden blobs logging reserved bytes (kept)"] += 1
        if not set(golden) & set(MEMORY_KEYS):
            left_out["golden blobs without a memory metric"] += 1
        elif "mem-max-allocated-bytes" not in golden:
            left_out["golden blobs with mem-allocated-bytes only (no peak)"] += 1
        elif rec.measured(golden) is None:
            left_out["golden blobs without a peak series of two logged iterations (inference: one number)"] += 1
        else:
            by_key[memory_key(golden)] += [(w, blob) for w in writes]
    at = AtCommit(repo)
    records: list[dict] = []
    for key, found in sorted(by_key.items(), key=lambda kv: min(kv[1])[0]):
        if key in skip:
            left_out["measurements the calibration dataset holds"] += 1
            continue
        (_ct, _pos, commit, date, path), blob = min(found, key=lambda w: (w[0][2] not in released, w[0]))
        name = ms.case_of(path)[0]  # type: ignore[index]
        side = manifest["cases"].get(name) or {"side": fresh[name], "group": group_of[name], "in_manifest": False}
        made = record(repo, at, blob, commit, date, path, side, head)
        assert made is not None  # the golden's peak series was checked above
        if commit not in released:
            made["expressible_note"] = "; ".join(filter(None, [made["expressible_note"], (
                "recorded only off Megatron-LM's release lines (a pull-request head or side branch: code no "
                "release carries)")]))
        made["other_writes"] = len({w[0][2] for w in found}) - 1
        records.append(made)
    return records, dict(left_out)


def summary(records: list[dict], left_out: dict[str, int]) -> str:
    """Records and case names per side and family, and expressible counts (no measured numbers)."""
    out = [f"{len(records)} records of {len({r['name'] for r in records})} case names"]
    for side in ("calibration", "unseen"):
        rows = [r for r in records if r["side"] == side]
        fams = collections.Counter(r["family_dir"] for r in rows)
        ok = [r for r in rows if not r["expressible_note"]]
        out.append(f"{side}: {len(rows)} records, {len({r['name'] for r in rows})} names; expressible "
                   f"{len(ok)} records, {len({r['name'] for r in ok})} names")
        for fam in sorted(fams):
            fr = [r for r in rows if r["family_dir"] == fam]
            fok = [r for r in fr if not r["expressible_note"]]
            out.append(f"  {fam:<18} {len(fr):>5} records {len({r['name'] for r in fr}):>4} names   expressible "
                       f"{len(fok):>5} records {len({r['name'] for r in fok}):>4} names")
    out += [f"left out: {reason}: {n}" for reason, n in sorted(left_out.items())]
    return "\n".join(out)


def main() -> int:
    if sys.argv[1:2] == ["split"]:
        sys.argv.pop(1)
        return ms.main()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--git", default=str(ms.DEFAULT_GIT), help="a Megatron-LM git directory (full history)")
    parser.add_argument("--data", default=str(ms.DEFAULT_DATA), help="the calibration dataset")
    parser.add_argument("--manifest", default=str(ms.DEFAULT_OUT))
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="where the records go (not the repository)")
    args = parser.parse_args()
    for flag, path, what in (("--git", Path(args.git) / "HEAD", "a Megatron-LM git directory (full history)"),
                             ("--manifest", Path(args.manifest), "the split (tools/megatron_split.py writes it)"),
                             ("--data", Path(args.data), "the calibration dataset")):
        if not path.exists():
            print(f"collect_megatron_cases: {flag} {path.parent if flag == '--git' else path}: not found; "
                  f"give {what}", file=sys.stderr)
            return 2
    records, left_out = collect(args.git, json.loads(Path(args.manifest).read_text()),
                                json.loads(Path(args.data).read_text()))
    out = Path(args.out).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records, indent=1) + "\n")
    print(summary(records, left_out))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
