"""The files ``timeline plan`` writes: ``plan.parquet``, ``plan.log`` and ``best/NN.toml``.

A best run file is the user's run file (with ``--set`` applied) with the candidate's settings
written over it — the derived dp, num_microbatches and layout included, ``sp`` and ``etp``
explicit, the ``[recompute]`` table replaced — so that ``timeline simulate best/01.toml``
simulates exactly the run the plan simulated. Relative paths in it (``hf_config``, ``trace``,
``schedule.csv``) are rewritten relative to ``best/``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from timeline.cli.common import write_dir_atomically
from timeline.io.runfile import parse_override, read_toml
from timeline.io.runfile_write import run_file_text
from timeline.plan.search import PlanResult, Row, known
from timeline.spec.run import RecomputeSpec, RunSpec


def default_output(name: str) -> Path:
    """``runs/NAME-plan``: the run-file reader has checked NAME."""
    return Path("runs") / f"{name}-plan"


def recompute_table(spec: RecomputeSpec) -> dict[str, Any]:
    if spec.policy == "none":
        return {"policy": "none"}
    if spec.policy == "selective":
        return {"policy": "selective", "modules": list(spec.modules)}
    n = spec.num_layers
    return {"policy": "full", "method": spec.method, "num_layers": list(n) if isinstance(n, tuple) else n}


def run_data(args: argparse.Namespace) -> dict[str, Any]:
    """The run file's data with ``--set`` applied, as the run-file reader applies it."""
    data = read_toml(Path(args.run))
    for text in args.overrides:
        section, key, value = parse_override(text)
        data.setdefault(section, {})[key] = value
    return data


def best_file_data(data: dict[str, Any], run: RunSpec, r: Row, run_dir: Path, best_dir: Path,
                   index: int) -> dict[str, Any]:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    out["name"] = f"{run.name}-plan-{index:02d}"[:100]
    par, tr = run.parallel, run.training
    p = out.setdefault("parallel", {})
    p.update(tp=par.tp, pp=par.pp, vpp=par.vpp, cp=par.cp, ep=par.ep, etp=par.etp, dp=par.dp, sp=par.sp,
             layout=list(par.layout) if par.layout is not None else None)
    if p["layout"] is None:
        del p["layout"]
    t = out.setdefault("training", {})
    t.update(micro_batch_size=tr.micro_batch_size, num_microbatches=tr.num_microbatches)
    for key, _value in r.candidate.settings:
        section, _, name = key.partition(".")
        if key != "recompute" and section not in ("parallel",) and name not in ("micro_batch_size",):
            out.setdefault(section, {})[name] = getattr(getattr(run, section), name)
    out.setdefault("schedule", {})["kind"] = run.schedule.kind
    out["recompute"] = recompute_table(run.recompute)
    out.setdefault("hardware", {})["capacity_gib"] = run.hardware.capacity_gib
    rel = os.path.relpath(run_dir, best_dir)
    model = out.get("model", {})
    for key in ("hf_config", "trace"):
        if isinstance(model.get(key), str) and not os.path.isabs(model[key]):
            model[key] = os.path.normpath(os.path.join(rel, model[key]))
    sched = out.get("schedule", {})
    if isinstance(sched.get("csv"), str) and not os.path.isabs(sched["csv"]):
        sched["csv"] = os.path.normpath(os.path.join(rel, sched["csv"]))
    return out


def write_outputs(out: Path, force: bool, res: PlanResult, base: RunSpec, args: argparse.Namespace,
                  log: Callable[[], str]) -> None:
    """Write DIR; ``log`` gives plan.log's text once everything else is written."""
    from timeline.exporters import plan_parquet

    data = run_data(args)
    run_dir = Path(args.run).resolve().parent
    best_dir = Path(os.path.abspath(out)) / "best"
    files = []
    for i, r in enumerate(res.ranked[:args.top], 1):
        run = res.runs[r.name]
        header = (f"timeline plan: #{i} of {len(res.ranked)} fitting candidates for {args.world_size} GPUs\n"
                  f"{r.name}\nmax peak reserved {r.peak_reserved_bytes:,} bytes; "
                  f"iteration {known(r.iteration_time_us) / 1e3:,.1f} ms")
        files.append((f"{i:02d}.toml", run_file_text(best_file_data(data, run, r, run_dir, best_dir, i), header)))

    def write(folder: Path) -> None:
        with open(folder / plan_parquet.FILENAME, "wb") as handle:
            plan_parquet.write(res, handle)
        (folder / "best").mkdir()
        for name, text in files:
            (folder / "best" / name).write_text(text, encoding="utf-8")
        (folder / "plan.log").write_text(log(), encoding="utf-8")

    write_dir_atomically(out, force, write, command="plan")
