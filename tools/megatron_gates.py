"""Which recording commits hold a rule's Megatron-LM commit although their date says otherwise:
``tools/megatron_gates.json``.

``tools/validate_measured.py`` gates a rule on the Megatron-LM commit that introduced it (``KEEPS_BATCH``,
``PROBS_IN_EXPERTS``, ``RELEASES_NODES``, ``ROUTER_TE_GEMM``: (date, commit, "yes")) and decides by the
recording commit's date: on main, a commit dated after the rule's commit has it. Megatron-LM's ``dev``
branch breaks that: it merges main only now and then, so a dev commit of 2026-05-29 (1fe78252e9) lacks main's
5e4fc931ba of 2026-05-21, and a dev commit of 2026-04-08 whose ``package_info.py`` still says 0.16.0rc0
(06ecac391e) already has d3528a2130, which main first released in 0.17.

This script reads only Megatron-LM's git graph (no measured data): over every commit reachable from
``refs/heads/main`` or ``refs/heads/dev`` that changed a golden value or ``model_config.yaml`` (the commits
a collected record can be recorded at), it lists, per rule commit, those whose ancestry disagrees with the
date rule (``committer date > since`` or the commit itself), and every such commit within
:data:`MARGIN_DAYS` of ``since`` either way (a record's date may be its author's). ``True``: the commit
holds the rule's commit; ``False``: it does not.

    .venv/bin/python tools/megatron_gates.py /work/.mirror/NVIDIA+Megatron-LM/repo [-o FILE]

Regenerate it when a gate is added to ``validate_measured``; the output is deterministic.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import megatron_split as ms  # noqa: E402  (the golden pathspecs and git runner live there)

OUT = ROOT / "tools" / "megatron_gates.json"
REFS = ("refs/heads/main", "refs/heads/dev")
#: commits this close to a gate's date are listed whatever the date rule says (author vs committer dates)
MARGIN_DAYS = 31


def gates() -> dict[str, str]:
    """Rule commit → the date ``validate_measured`` gates it from."""
    import validate_measured as vm

    return {bump: since for table in vm.GATES for since, bump, _ in table}


def universe(git_dir: str) -> list[tuple[str, str]]:
    """(sha, committer date) of every commit on :data:`REFS` that changed a golden or model_config.yaml."""
    log = ms.git(git_dir, "log", "--format=%H %cs", *REFS, "--", *ms.PATHSPECS)
    return [tuple(line.split()) for line in log.splitlines() if line.strip()]  # type: ignore[misc]


def holders(git_dir: str, bump: str) -> set[str]:
    """Commits on :data:`REFS` that hold ``bump`` (its descendants and itself)."""
    full = ms.git(git_dir, "rev-parse", bump).strip()
    return set(ms.git(git_dir, "rev-list", "--ancestry-path", f"^{full}", *REFS).split()) | {full}


def disagreements(git_dir: str) -> dict[str, dict]:
    commits = universe(git_dir)
    out: dict[str, dict] = {}
    for bump, since in sorted(gates().items()):
        day = datetime.date.fromisoformat(since)
        near = (day - datetime.timedelta(days=MARGIN_DAYS)).isoformat(), (day + datetime.timedelta(days=MARGIN_DAYS)).isoformat()
        have = holders(git_dir, bump)
        listed = {}
        for sha, date in commits:
            holds = sha in have
            by_date = date > since or sha.startswith(bump)
            if holds != by_date or near[0] <= date <= near[1]:
                listed[sha[:10]] = holds
        subject = ms.git(git_dir, "log", "-1", "--format=%cs %s", bump).strip()
        out[bump] = {"since": since, "commit": subject, "holds": dict(sorted(listed.items()))}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("git_dir", help="a Megatron-LM git directory (bare is fine)")
    parser.add_argument("-o", "--out", default=str(OUT))
    args = parser.parse_args()
    head = ms.git(args.git_dir, "rev-parse", "refs/heads/main").strip()
    data = {"source": "NVIDIA/Megatron-LM git graph (tools/megatron_gates.py)", "refs": list(REFS),
            "main_head": head, "margin_days": MARGIN_DAYS,
            "rule": "per gate commit: commits of refs that changed a golden or model_config.yaml whose ancestry "
                    "disagrees with 'committer date > since', or dated within margin_days of since; "
                    "true = holds the gate commit",
            "gates": disagreements(args.git_dir)}
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
