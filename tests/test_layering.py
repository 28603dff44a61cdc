"""Imports point one way (DESIGN §1): spec → profiles → graph → pipeline → placement → alloc → sim → result
→ compare → plan → serve → exporters → cli, with io at the edge. Heavy libraries stay in their layer."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "timeline"
ORDER = ["spec", "profiles", "graph", "pipeline", "placement", "alloc", "sim", "result", "compare", "plan", "serve",
         "exporters", "cli", "api"]
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
    if src in BASE:  # the package imports its Python interface lazily, __main__ the command line
        return (src, dst) in (("__main__", "cli"), ("__init__", "api"))
    if src in ("io", "capture"):  # the edges: readers/writers and the torch capture front-end
        return dst == "spec" or (src == "io" and dst == "profiles")  # io validates a run by its profile
    if dst in ("io", "capture"):
        return src in ("cli", "api")
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


#: what an exporter may import from ``timeline`` besides ``timeline.result…``, ``timeline.errors``
#: and other exporters: the result types of the commands that are not ``simulate``, module → reason
EXPORTER_ALLOWED: dict[str, str] = {
    "timeline.serve.run": "ServeResult, what `timeline serve` returns (serve_* exporters format it)",
    "timeline.serve.budget": "Budget, the engine's startup budget a ServeResult carries (ServeResult.budget)",
    "timeline.plan.search": "PlanResult, what `timeline plan` returns (plan_parquet formats it)",
    "timeline.plan.space": "SHORT, the plan's own column names for its searched settings (plan.parquet's schema)",
}


def exporter_import_ok(module: str) -> bool:
    """May a module in ``timeline/exporters/`` import ``module``?"""
    parts = module.split(".")
    if parts[0] != "timeline" or len(parts) < 2:
        return True  # not ours (numpy, pyarrow: the library rule above decides)
    return parts[1] in ("result", "errors", "exporters") or module in EXPORTER_ALLOWED


def exporter_bad_imports(path: Path) -> list[str]:
    return [f"{path.relative_to(PKG.parent)}:{line}: exporter imports {module}"
            for module, line, _ in imports(path) if not exporter_import_ok(module)]


def test_exporters_import_only_the_result():
    """Exporters format a result: they take the Timeline, the category list and the errors from
    ``timeline.result`` / ``timeline.errors``, never the simulator, the graph or the pipeline."""
    bad = [b for path in sorted((PKG / "exporters").rglob("*.py")) for b in exporter_bad_imports(path)]
    assert not bad, "\n".join(bad)


def test_exporter_rule_catches_a_bad_edge(tmp_path):
    assert not exporter_import_ok("timeline.sim.memory") and not exporter_import_ok("timeline.graph.tensors")
    assert not exporter_import_ok("timeline.pipeline.devices") and not exporter_import_ok("timeline.plan.bound")
    assert exporter_import_ok("timeline.result.timeline") and exporter_import_ok("timeline.plan.search")
    bad = tmp_path / "bad.py"
    bad.write_text("from timeline.result.timeline import Timeline\n\n\ndef f():\n"
                   "    from timeline.sim.memory import allocator_config\n")
    found = [(m, line) for m, line, _ in imports(bad) if not exporter_import_ok(m)]
    assert found == [("timeline.sim.memory", 5)]


def sim_reads(path: Path) -> list[int]:
    """Lines reading an attribute named ``sim`` (a Timeline's simulator output) in one file."""
    tree = ast.parse(path.read_text())
    return sorted({n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "sim"})


def test_only_result_and_sim_read_the_simulator_output():
    """Outside ``result/`` and ``sim/`` a Timeline is read through its own attributes and queries,
    never through ``tl.sim`` (the raw simulator output it may keep for the simulator's tests)."""
    bad = [f"{path.relative_to(PKG.parent)}:{line}: reads .sim"
           for path in sorted(PKG.rglob("*.py")) if layer_of(path) not in ("result", "sim")
           for line in sim_reads(path)]
    assert not bad, "\n".join(bad)


def test_sim_rule_catches_a_read(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(tl):\n    import timeline.sim\n    return tl.sim.names, tl.names\n")
    assert sim_reads(bad) == [3]


def test_pipeline_does_not_import_graph():
    """Schedules are pure functions of counts: the graph reaches the devices through ``placement``."""
    bad = [f"{path.relative_to(PKG.parent)}:{line}: {module}"
           for path in sorted((PKG / "pipeline").rglob("*.py"))
           for module, line, _ in imports(path) if module.split(".")[:2] == ["timeline", "graph"]]
    assert not bad, "\n".join(bad)


def test_graph_imports_its_own_modules_at_top_level():
    """No import cycle hides inside the graph layer: every graph module (the trace front-end and
    ``graph/build.py`` included) imports graph modules at top level only."""
    bad = [f"{path.relative_to(PKG.parent)}:{line}: {module} imported inside a function"
           for path in sorted((PKG / "graph").rglob("*.py"))
           for module, line, top in imports(path) if module.startswith("timeline.graph") and not top]
    assert not bad, "\n".join(bad)


def test_each_trace_module_imports_first():
    """Each module of the trace front-end imports on its own, in a fresh interpreter (a cycle through
    ``graph/build.py`` would fail whichever side is imported first)."""
    import subprocess
    import sys

    trace = sorted(f"timeline.graph.trace.{p.stem}" for p in (PKG / "graph" / "trace").glob("*.py")
                   if p.stem != "__init__")
    assert {"timeline.graph.trace.lowering", "timeline.graph.trace.params"} <= set(trace)
    for module in ["timeline.graph.trace", *trace, "timeline.graph.build", "timeline.graph.source"]:
        done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True,
                              cwd=PKG.parent)
        assert done.returncode == 0, f"import {module}: {done.stderr[-2000:]}"


#: the functions below the CLI and ``io`` that take a whole ``RunSpec`` — each a door where a run
#: enters a layer, which hands every component below it its slice (``ModelSpec``, ``ParallelSpec``,
#: ``TrainingSpec``, a ``ModelSource``, a ``StateRules`` …). Qualified name → why it reads a whole run.
RUNSPEC_DOORS: dict[str, str] = {
    "spec.validate.validate_run": "validation reads a whole run by nature: its checks cross every section",
    "spec.validate.validate_all_but_recompute": "validate_run without its recompute section, so that the "
                                                "planner checks a layout once for all its recompute policies",
    "graph.source.model_source": "the graph layer's door: picks the analytic or trace source once and hands "
                                 "it the slices its layer builders and templates read",
    "result.build.build_timeline": "the simulation's door: one run becomes the plan stage's slices (schedule, "
                                   "model source, state rules), the allocator's spec and the Timeline's meta",
    "plan.search.plan": "the planner's door: derives, bounds and simulates candidate runs around a base run",
    "plan.search.simulate_summary": "a planner worker's entry: a candidate run crosses the process boundary "
                                    "whole and is simulated through build_timeline",
    "plan.search.time_summary": "a planner worker's entry: a candidate run crosses the process boundary "
                                "whole and is timed through build_timeline (no memory events)",
    "plan.search.exact_block": "a planner worker's entry: candidate runs cross the process boundary whole to "
                               "be bounded exactly",
    "plan.search.derive": "the planner's derivation of a candidate run from the base run (a worker's and "
                          "the parent's, alike)",
    "plan.search.run_bound": "the bound's door: one candidate run becomes its probe's model source and the "
                             "bound's slices",
}


def runspec_functions(root: Path) -> list[str]:
    """``layer.module.function`` of every function under ``root`` (a ``timeline`` package) below the
    CLI and ``io`` with a parameter annotated ``RunSpec`` (``ServeRunSpec`` is the serving layer's own);
    methods are named by their class (``compare.fit.Statics.__init__``)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in ("cli", "io", "api.py"):
            continue
        module = ".".join(rel.with_suffix("").parts)
        tree = ast.parse(path.read_text())
        owner: dict[int, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for child in node.body:
                    owner[id(child)] = node.name
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            if any(a.annotation is not None and "RunSpec" in ast.unparse(a.annotation)
                   and "Serve" not in ast.unparse(a.annotation) for a in args):
                name = f"{owner[id(node)]}.{node.name}" if id(node) in owner else node.name
                out.append(f"{module}.{name}")
    return out


def test_few_functions_take_a_whole_run():
    """Step 6 of issue 17: each component gets its slice of the configuration; a whole run enters
    only through the doors of :data:`RUNSPEC_DOORS`."""
    found = runspec_functions(PKG)
    extra = sorted(set(found) - set(RUNSPEC_DOORS))
    assert not extra, ("take the slice of the run you read, or make the function a door (RUNSPEC_DOORS, "
                       "with its reason):\n" + "\n".join(extra))
    assert sorted(set(RUNSPEC_DOORS) - set(found)) == [], "a door that no longer takes a run: remove it"
    assert all(reason.strip() for reason in RUNSPEC_DOORS.values())


def test_the_run_scan_catches_a_new_function(tmp_path):
    pkg = tmp_path / "timeline"
    (pkg / "sim").mkdir(parents=True)
    (pkg / "cli").mkdir()
    (pkg / "sim" / "extra.py").write_text(
        "from timeline.spec.run import RunSpec, ParallelSpec\n"
        "def reads_everything(run: RunSpec, n: int) -> int:\n    return n\n"
        "def reads_a_slice(par: ParallelSpec) -> int:\n    return par.tp\n"
        "class Holder:\n    def __init__(self, run: 'RunSpec | None') -> None:\n        self.run = run\n"
        "def serves(run: ServeRunSpec) -> None:\n    pass\n")
    (pkg / "cli" / "main.py").write_text("def run(spec: RunSpec) -> None:\n    pass\n")
    assert runspec_functions(pkg) == ["sim.extra.reads_everything", "sim.extra.Holder.__init__"]
