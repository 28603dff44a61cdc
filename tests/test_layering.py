"""Imports point one way (DESIGN §1): spec → profiles → graph → pipeline → alloc → sim → result → compare
→ plan → serve → exporters → cli, with io at the edge. Heavy libraries stay in their layer."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "timeline"
ORDER = ["spec", "profiles", "graph", "pipeline", "alloc", "sim", "result", "compare", "plan", "serve", "exporters", "cli"]
BASE = {"errors", "__init__", "__main__"}  # importable from anywhere
# libraries allowed only in these layers (pyarrow also only inside functions)
LIBS = {"networkx": {"graph"}, "simpy": {"sim"}, "pyarrow": {"exporters", "io"}, "matplotlib": {"compare"},
        "torch": {"capture"}, "transformers": {"capture"}}


def layer_of(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(module, line, top_level) for every import in a file."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, node.lineno, id(node) in top))
    return out


def allowed(src: str, dst: str) -> bool:
    if dst in BASE or src == dst:
        return True
    if src in BASE:
        return src == "__main__" and dst == "cli"
    if src in ("io", "capture"):  # the edges: readers/writers and the torch capture front-end
        return dst == "spec" or (src == "io" and dst == "profiles")  # io validates a run by its profile
    if dst in ("io", "capture"):
        return src == "cli"
    return ORDER.index(dst) <= ORDER.index(src)


def test_layers_import_one_way():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        src = layer_of(path)
        for module, line, _ in imports(path):
            parts = module.split(".")
            if parts[0] != "timeline" or len(parts) < 2:
                continue
            if not allowed(src, parts[1]):
                bad.append(f"{path.relative_to(PKG.parent)}:{line}: {src} imports {module}")
    assert not bad, "imports against DESIGN §1:\n" + "\n".join(bad)


def test_heavy_libraries_stay_in_their_layer():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        src = layer_of(path)
        for module, line, top in imports(path):
            lib = module.split(".")[0]
            if lib in LIBS and src not in LIBS[lib]:
                bad.append(f"{path.relative_to(PKG.parent)}:{line}: {lib} outside {sorted(LIBS[lib])}")
            if lib in ("pyarrow", "matplotlib") and top:
                bad.append(f"{path.relative_to(PKG.parent)}:{line}: import {lib} inside the function")
    assert not bad, "\n".join(bad)


def test_profiles_sit_on_spec_alone():
    """A profile's rules are data over the spec: nothing in ``profiles/`` reaches into graph or sim."""
    bad = []
    for path in sorted((PKG / "profiles").rglob("*.py")):
        for module, line, _ in imports(path):
            parts = module.split(".")
            if parts[0] == "timeline" and len(parts) > 1 and parts[1] not in ("spec", "errors", "profiles"):
                bad.append(f"{path.relative_to(PKG.parent)}:{line}: profiles imports {module}")
    assert not bad, "\n".join(bad)


def test_rule_catches_a_backward_edge():
    assert not allowed("graph", "sim") and not allowed("spec", "graph") and not allowed("sim", "io")
    assert allowed("cli", "io") and allowed("sim", "alloc") and allowed("io", "spec")
    assert allowed("graph", "profiles") and not allowed("profiles", "graph") and not allowed("spec", "profiles")
