"""The package under its base install alone: every module imports and every subcommand's ``--help``
runs with only the packages ``pyproject.toml``'s ``dependencies`` bring (and theirs).

The test environment has the extras too, so the check runs in a subprocess whose import system
refuses every top-level module that is neither the standard library, ``timeline`` nor a
distribution the base dependencies reach. A module that imports an optional package at its top
level, outside the extra it belongs to, fails here. The capture front-end is the ``capture``
extra (DESIGN §4): its modules may need torch and transformers, and nothing else outside the base.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: modules that belong to an extra, and the only packages beyond the base each may import
EXTRA_MODULES = {"timeline.capture": {"torch", "transformers"}}


def _name(requirement: str) -> str:
    from packaging.requirements import Requirement

    return Requirement(requirement).name


def base_distributions() -> set[str]:
    """Every distribution the package's base dependencies reach, by their own metadata (extras and
    environment markers that do not apply here left out)."""
    from packaging.requirements import Requirement

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    todo = [_name(r) for r in declared]
    seen: set[str] = set()
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for raw in reqs:
            req = Requirement(raw)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def allowed_top_levels() -> set[str]:
    dists = base_distributions() | {"timeline"}
    allowed = {"timeline"}
    for module, owners in metadata.packages_distributions().items():
        if any(o.lower().replace("_", "-") in dists for o in owners):
            allowed.add(module)
    return allowed


CHILD = textwrap.dedent("""
    import importlib, importlib.abc, json, pkgutil, sys
    allowed = set(json.loads(sys.argv[1]))
    extras = {k: set(v) for k, v in json.loads(sys.argv[2]).items()}
    std = set(sys.stdlib_module_names) | set(sys.builtin_module_names)

    class Base(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            top = name.split(".")[0]
            if top in allowed or top in std or top.startswith("_") or top in sys.modules:
                return None
            raise ModuleNotFoundError(f"No module named {top!r} (not in the base install)", name=top)

    sys.meta_path.insert(0, Base())
    import timeline
    problems = []
    names = sorted(m.name for m in pkgutil.walk_packages(timeline.__path__, "timeline.")
                   if not m.name.endswith(".__main__"))  # runs the command line when imported
    for name in names:
        owner = next((k for k in extras if name == k or name.startswith(k + ".")), None)
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if owner is None or exc.name.split(".")[0] not in extras[owner]:
                problems.append(f"import {name}: {exc}")
    from timeline.cli import COMMANDS, main
    for command in [[]] + [[c] for c in COMMANDS]:
        try:
            main(command + ["--help"])
        except SystemExit as exc:
            if exc.code not in (0, None):
                problems.append(f"timeline {' '.join(command)} --help: exit {exc.code}")
        except Exception as exc:
            problems.append(f"timeline {' '.join(command)} --help: {type(exc).__name__}: {exc}")
    print(json.dumps({"modules": len(names), "problems": problems}), file=sys.__stderr__)
""")


def test_every_module_and_help_under_the_base_install():
    pytest.importorskip("packaging", reason="reads the dependencies' metadata")
    allowed = allowed_top_levels()
    for optional in ("torch", "transformers", "ray", "perfetto", "duckdb", "hypothesis", "viztracer"):
        assert optional not in allowed, f"{optional} is not a base dependency"
    assert {"numpy", "simpy", "networkx", "pyarrow", "yaml"} <= allowed
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(sorted(allowed)),
                           json.dumps({k: sorted(v) for k, v in EXTRA_MODULES.items()})],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report["modules"] > 150
    assert report["problems"] == []


def test_the_blocker_catches_an_optional_import(tmp_path):
    """The check itself can fail: a module importing an extra's package at its top level is caught."""
    pytest.importorskip("packaging", reason="reads the dependencies' metadata")
    probe = "import importlib, importlib.abc, json, sys\n" + CHILD.split("import timeline")[0] + (
        "try:\n    import duckdb\nexcept ModuleNotFoundError as exc:\n    print(exc.name, file=sys.__stderr__)\n")
    proc = subprocess.run([sys.executable, "-c", probe, json.dumps(sorted(allowed_top_levels())), "{}"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.stderr.strip().splitlines()[-1] == "duckdb"
