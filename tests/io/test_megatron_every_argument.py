"""Every argument of Megatron-LM's parser (every version the table holds, ``tests/data/megatron/parser_args.json``),
given alone on top of a small dense job and a small MoE job with its default and a few values of its type,
converts to a run file that loads and simulates — or is refused with a UserError. Never a traceback: a
launch script's unusual value (a size of 0, a shared-expert width tp does not divide) gets a message naming
the argument, as users of the tool expect."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from timeline.errors import UserError
from timeline.graph.source import model_source
from timeline.io.megatron_args import from_mapping
from timeline.io.megatron_write import UnschedulableJob, convert, run_file_text
from timeline.io.runfile import load_run
from timeline.result.build import build_timeline

ARGS = json.loads((Path(__file__).parents[1] / "data" / "megatron" / "parser_args.json").read_text())["arguments"]
DENSE = {"--num-layers": 4, "--hidden-size": 256, "--num-attention-heads": 8, "--seq-length": 512,
         "--max-position-embeddings": 512, "--micro-batch-size": 2, "--global-batch-size": 16, "--bf16": True}
MOE = DENSE | {"--num-experts": 8, "--moe-router-topk": 2, "--expert-model-parallel-size": 2,
               "--tensor-model-parallel-size": 2, "--pipeline-model-parallel-size": 2, "--sequence-parallel": True,
               "--use-distributed-optimizer": True, "--multi-latent-attention": True, "--moe-grouped-gemm": True}


def values(spec: dict[str, Any]) -> list[Any]:
    """The argument's default (as the parser table prints it) and two values of its type."""
    if spec["action"] in ("store_true", "store_false"):
        return [True]
    out: list[Any] = []
    if spec["default"] not in (None, "None", ""):
        try:
            v = ast.literal_eval(spec["default"])
        except (ValueError, SyntaxError):
            v = spec["default"]
        if isinstance(v, list | tuple):
            v = [str(x) for x in v] or None
        if v is not None:
            out.append(v)
    typ = str(spec["type"])
    out += [2, 0, 1] if "int" in typ else [0.5, 0.0] if "float" in typ else ["1", "none"]
    nargs = spec["nargs"]
    if nargs in ("+", "*") or (isinstance(nargs, int) and nargs > 1):
        out = [v if isinstance(v, list) else [str(v)] for v in out]
    return out[:3]


@pytest.mark.parametrize(("base", "world"), [(DENSE, 2), (MOE, 8)], ids=["dense", "moe"])
def test_every_argument_converts_and_simulates_or_is_refused(tmp_path, base, world):
    crashed, simulated, refused = [], 0, 0
    path = tmp_path / "run.toml"
    for name, spec in ARGS.items():
        for v in values(spec):
            try:
                conv = convert(from_mapping(base | {name: v}, {}), world_size=world)
                path.write_text(run_file_text(conv, name="arg", source=name, world_size=world, notes=[]))
                build_timeline(load_run(path), model_source, summary_only=True)
                simulated += 1
            except (UserError, UnschedulableJob):
                refused += 1
            except Exception as exc:  # noqa: BLE001 — the test lists every crash at once
                crashed.append(f"{name} {v!r}: {type(exc).__name__}: {exc}")
    assert not crashed, "\n".join(crashed)
    # most arguments are memory-neutral or mapped: the job still simulates with them
    assert simulated > 1500 and refused > 100, (simulated, refused)


def test_a_size_of_zero_is_refused_naming_it():
    for name in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
                 "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--micro-batch-size"):
        with pytest.raises(UserError, match=f"^{name} 0: "):
            convert(from_mapping(MOE | {name: 0}, {}), world_size=8)


def test_shared_experts_tp_does_not_divide_is_refused_naming_it(tmp_path):
    conv = convert(from_mapping(MOE | {"--moe-shared-expert-intermediate-size": 1}, {}), world_size=8)
    path = tmp_path / "run.toml"
    path.write_text(run_file_text(conv, name="arg", source="test", world_size=8, notes=[]))
    with pytest.raises(UserError, match=r"parallel\.tp.*shared experts' intermediate size 1"):
        load_run(path)


def test_a_run_file_problem_names_the_launch_arguments_behind_it(tmp_path, capsys):
    from timeline.cli import main

    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 4 --hidden-size 256 "
                      "--num-attention-heads 8 --seq-length 512 --max-position-embeddings 512 --micro-batch-size 2 "
                      "--global-batch-size 16 --bf16 --num-experts 8 --moe-ffn-hidden-size 3 "
                      "--expert-model-parallel-size 2 --expert-tensor-parallel-size 2\n")
    out = tmp_path / "run.toml"
    assert main(["from-megatron", str(script), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "parallel.etp (from --expert-tensor-parallel-size 2): 2 does not divide moe_intermediate_size=3" in err
    assert not out.exists()  # nothing half-written
