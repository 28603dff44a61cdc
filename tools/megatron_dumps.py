"""Write the arguments blocks Megatron-LM itself prints for the calibration dataset's jobs, at given versions.

For each version (a release tag or ``main``) this archives ``megatron/`` and ``pretrain_gpt.py`` from a
Megatron-LM git dir, then runs ``tools/megatron_dump_build.py`` there: Megatron's own ``parse_args`` and
``validate_args`` on each job's arguments (the dataset's ``model_args``, as the functional tests' harness passes
them) and its world size. What comes back is the block a log of that job holds (``_print_args``). Jobs Megatron
refuses at that version (an argument it does not have yet, an assertion) are left out, counted. Output: one xz-compressed
JSON file per version under ``tests/data/megatron/dumps/`` with its provenance (commit, tool, dataset) and, per
job, its name, world size, environment, argument vector and block — the data ``tests/io/test_megatron_dump.py`` reads a log with.

    .venv/bin/python tools/megatron_dumps.py --data ../shared/measured/megatron_calibration.json \\
        [--git-dir /work/.mirror/NVIDIA+Megatron-LM/repo] [--versions core_v0.13.0,core_v0.15.0,main] [--limit N]
    .venv/bin/python tools/megatron_dumps.py --data ~/.cache/timeline/megatron-cases.json --prefix collected- \\
        --versions core_v0.15.0,main
"""

from __future__ import annotations

import argparse
import json
import lzma
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
INNER = Path(__file__).resolve().parent / "megatron_dump_build.py"
OUT = ROOT / "tests/data/megatron/dumps"
DEFAULT_GIT = "/work/.mirror/NVIDIA+Megatron-LM/repo"


def argv_of(model_args: dict, nargs: dict[str, object]) -> list[str]:
    """The argument vector the functional tests' harness builds from ``MODEL_ARGS`` (key, then the value split as
    the shell splits it for an option taking several values)."""
    from timeline.io.megatron_args import from_mapping

    out: list[str] = []
    for key, value in from_mapping(model_args).args.items():
        if value is True:
            out.append(key)
        elif isinstance(value, tuple):
            out += [key, *map(str, value)]
        elif nargs.get(key) not in (None, 0):  # "[a b]" / "[a,b]" as from-megatron reads a YAML list value
            out += [key, *shlex.split(str(value).strip().strip("[]").replace(",", " "))]
        else:
            out += [key, str(value)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True,
                    help="the calibration dataset (megatron_calibration.json), or collected records (their "
                         "calibration side only; each distinct argument set once)")
    ap.add_argument("--git-dir", default=DEFAULT_GIT)
    ap.add_argument("--versions", default="core_v0.13.0,core_v0.15.0,main")
    ap.add_argument("--prefix", default="", help="before each output file's name (collected-: the collected records')")
    ap.add_argument("--limit", type=int, default=0, help="at most N jobs per version (0: all)")
    ap.add_argument("-o", "--output", default=str(OUT))
    opts = ap.parse_args(argv)
    table = json.loads((ROOT / "tests/data/megatron/parser_args.json").read_text())
    nargs = {k: v["nargs"] for k, v in table["arguments"].items()}
    commits = {v["label"]: v["commit"] for v in table["provenance"]["versions"]}
    # collected records (tools/collect_megatron_cases.py) carry a side: only the calibration side's are used
    records = [r for r in json.loads(Path(opts.data).read_text()) if r.get("side", "calibration") == "calibration"]
    distinct: dict[str, dict] = {}
    for r in records:  # the first record of each argument set
        distinct.setdefault(json.dumps(r["model_args"], sort_keys=True), r)
    records = list(distinct.values())
    jobs = [{"name": r["name"], "world_size": r["parallel"]["world_size"], "env": r.get("env") or {},
             "argv": argv_of(r["model_args"], nargs)} for r in records if (r.get("parallel") or {}).get("world_size")]
    if opts.limit:
        jobs = jobs[:opts.limit]
    out_dir = Path(opts.output)
    out_dir.mkdir(parents=True, exist_ok=True)
    for label in opts.versions.split(","):
        commit = commits[label]
        with tempfile.TemporaryDirectory(prefix="megatron-dump-") as tmp:
            archive = subprocess.run(["git", "-C", opts.git_dir, "archive", commit, "megatron", "pretrain_gpt.py"],
                                     check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            feed = "".join(json.dumps({k: j[k] for k in ("argv", "world_size", "env")}) + "\n" for j in jobs)
            done = subprocess.run([sys.executable, str(INNER)], cwd=tmp, input=feed, capture_output=True, text=True,
                                  timeout=1800)
        answers = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        if len(answers) != len(jobs):
            raise SystemExit(f"{label}: {len(answers)} answers for {len(jobs)} jobs:\n{done.stderr[-3000:]}")
        kept = [{"name": j["name"], "world_size": j["world_size"], "env": j["env"], "argv": j["argv"],
                 "block": a["block"]}
                for j, a in zip(jobs, answers, strict=True) if "block" in a]
        refused = sorted({a["error"].splitlines()[0][:160] for a in answers if "error" in a})
        data = {"provenance": {"repo": "NVIDIA/Megatron-LM", "version": label, "commit": commit,
                               "tool": "tools/megatron_dumps.py (tools/megatron_dump_build.py: parse_args + "
                                       "validate_args of that checkout, global rank 0, an H100)",
                               "dataset": f"{Path(opts.data).name} (model_args, world size, env of each job; "
                                          "calibration side)",
                               "jobs": len(jobs), "kept": len(kept), "refused_by_megatron": refused},
                "jobs": kept}
        path = out_dir / f"{opts.prefix}{label}.json.xz"  # xz: its dictionary spans the blocks, which differ in a few lines each
        path.write_bytes(lzma.compress(json.dumps(data, indent=0, sort_keys=True).encode(), preset=9))
        print(f"{label} {commit[:10]}: {len(kept)} of {len(jobs)} jobs printed a block; {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
