"""``timeline capture --step``: whole training steps on the fake CUDA stand-in, and their simulation."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

import cs336  # noqa: E402

from timeline.errors import UserError  # noqa: E402

RUN = """\
[model]
trace = "step.parquet"
profile = "hf"
[training]
num_microbatches = 1
dtype = "fp32"
warmup_iterations = {warmup}
iterations = {iterations}
"""


@pytest.fixture(scope="module")
def trace():
    from timeline.capture.step import capture_step

    return capture_step(cs336.tiny_torch_adamw, steps=2)


def test_gradients_appear_in_backward_and_go_with_zero_grad(trace):
    grads = [s for s in trace.storages.values() if s.kind == "grad"]
    params = [p for p in trace.params if p.trainable]
    assert len(grads) == 2 * len(params)  # one per parameter per step: set_to_none drops them
    for g in grads:
        assert trace.ops[g.alloc_op].phase == "B"
        # zero_grad runs no device op: the death lands after the optimizer's last op, same step
        freed = trace.ops[g.free_op]
        assert freed.phase in ("O", "Z") and freed.step == trace.ops[g.alloc_op].step
    by_name = {p.name: p.nbytes for p in params}
    assert all(g.nbytes == by_name[g.role.removeprefix("grad:")] for g in grads)


def test_torch_optim_runs_foreach_with_host_step_counters(trace):
    states = [s for s in trace.storages.values() if s.kind == "state"]
    keys = sorted({s.role.rsplit(":", 1)[1] for s in states})
    assert keys == ["exp_avg", "exp_avg_sq"]  # `step` stays a host tensor (capturable=False)
    params = [p for p in trace.params if p.trainable]
    assert sum(s.nbytes for s in states) == 2 * sum(p.nbytes for p in params)
    assert all(trace.ops[s.alloc_op].phase == "O" and trace.ops[s.alloc_op].step == 1 for s in states)
    names = {o.name for o in trace.ops if o.phase == "O"}
    assert "aten._foreach_sqrt.default" in names
    # _foreach_sqrt makes one temporary per parameter, a full copy of exp_avg_sq
    sqrt = next(o for o in trace.ops if o.phase == "O" and o.name == "aten._foreach_sqrt.default" and o.step == 2)
    assert sum(trace.storages[s].nbytes for s in sqrt.allocs) == sum(p.nbytes for p in params)


def test_parameters_are_named_by_module_in_creation_order(trace):
    names = [p.name for p in trace.params]
    assert names[0] == "token_embeddings.weight"
    assert "positional_encoder._freq_cis_cache" in names  # one buffer shared by every attention
    allocs = [trace.storages[p.storage].alloc_op for p in trace.params if p.trainable]
    assert allocs == sorted(allocs)


def test_cuda_only_calls_fail_in_one_line_naming_the_call():
    from timeline.capture.step import capture_step

    with pytest.raises(UserError, match=r"^capture: torch\.cuda\.CUDAGraph needs a real GPU"):
        capture_step(cs336.cuda_graph_step, steps=1)


def test_item_in_a_step_reads_zero_and_says_where():
    from timeline.capture.step import capture_step

    trace = capture_step(cs336.item_in_step, steps=1)
    [note] = trace.provenance["notes"]
    assert note.startswith("floating-point or bool tensor values read in the step") and "cs336.py:" in note
    # `if y.item() > 0` read 0: the step skipped its backward, so no gradient was made
    assert not any(s.kind == "grad" for s in trace.storages.values())


def test_warm_up_is_simulated_and_left_out_of_the_peaks(trace, tmp_path: Path):
    from timeline.io.runfile import load_run
    from timeline.io.trace_file import write_trace
    from timeline.result.build import build_timeline

    write_trace(trace, tmp_path / "step.parquet")
    (tmp_path / "run.toml").write_text(RUN.format(warmup=2, iterations=3))
    tl = build_timeline(load_run(tmp_path / "run.toml"), None)
    per = tl.iteration_peaks(0)
    assert [p["iteration"] for p in per] == [2, 3, 4]
    # repetitions of the steady step are identical; the first step (with lazy state) is not reported
    assert len({(p["peak_requested_bytes"], p["peak_allocated_bytes"]) for p in per}) == 1
    assert tl.peak(0).requested_bytes == per[0]["peak_requested_bytes"]
    assert tl.peak(0).requested_time_us >= tl.sim.report_start_us > 0
    (tmp_path / "run.toml").write_text(RUN.format(warmup=0, iterations=1))
    first = build_timeline(load_run(tmp_path / "run.toml"), None).iteration_peaks(0)
    assert first[0]["iteration"] == 0
    # every tensor is allocated once and freed once, names never shared by two live tensors
    ev, live = tl.events(0), set()
    for sign, name in zip(ev.sign.tolist(), ev.tensor.tolist(), strict=True):
        assert (name not in live) if sign > 0 else (name in live)
        (live.add if sign > 0 else live.remove)(name)


def test_step_traces_refuse_sharding(trace, tmp_path: Path):
    from timeline.errors import SpecError
    from timeline.io.runfile import load_run
    from timeline.io.trace_file import write_trace

    write_trace(trace, tmp_path / "step.parquet")
    (tmp_path / "run.toml").write_text(RUN.format(warmup=0, iterations=1) + "[parallel]\ntp = 2\n")
    with pytest.raises(SpecError, match="tp must be 1"):
        load_run(tmp_path / "run.toml")


def test_cli_capture_step_writes_a_trace(tmp_path: Path, capsys):
    from timeline.cli import main
    from timeline.io.trace_file import read_trace

    spec = f"{Path(cs336.__file__)}:tiny_torch_adamw"
    assert main(["capture", "--step", spec, "--steps", "2", "-o", str(tmp_path / "t.parquet")]) == 0
    tr = read_trace(tmp_path / "t.parquet")
    assert tr.is_step and tr.num_steps == 2 and tr.provenance["dtype"] == "fp32"
    assert main(["capture", "--step", "nowhere.py:f", "-o", str(tmp_path / "u.parquet")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error:") and "no such file" in err[-1]


def test_hf_config_with_optimizer_and_autocast_captures_whole_steps(tmp_path: Path, capsys):
    import json

    pytest.importorskip("transformers")
    from timeline.cli import main
    from timeline.io.trace_file import read_trace

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                               "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100}))
    out = tmp_path / "t.parquet"
    assert main(["capture", "--hf-config", str(cfg), "--micro-batch-size", "2", "--seq-len", "16", "--dtype", "fp32",
                 "--autocast", "bf16", "--optimizer", "adamw", "-o", str(out)]) == 0
    tr = read_trace(out)
    assert tr.is_step and tr.provenance["optimizer"] == "adamw"
    assert any(o.name == "aten._foreach_sqrt.default" for o in tr.ops)
    assert any(t.dtype == "bfloat16" for o in tr.ops if o.name == "aten.mm.default" for t in o.outputs)
    assert main(["capture", "--module", "captures:tiny_factory", "--optimizer", "adamw",
                 "-o", str(tmp_path / "m.parquet")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: --optimizer")


@pytest.mark.parametrize("command", [["static"], ["fit", "--capacity", "80GiB"], ["compare", "--recompute", "none,full:uniform:1"]])
def test_commands_that_vary_the_step_refuse_step_traces(trace, tmp_path: Path, capsys, command):
    from timeline.cli import main
    from timeline.io.trace_file import write_trace

    write_trace(trace, tmp_path / "step.parquet")
    (tmp_path / "run.toml").write_text(RUN.format(warmup=0, iterations=1))
    assert main([command[0], str(tmp_path / "run.toml"), *command[1:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "whole-step trace" in err[0]


def test_zero_fill_rules_write_what_the_scatter_ops_return():
    # the in-place stand-ins of select_scatter / slice_scatter fill the zeros as the out-of-place ops would
    import torch

    from timeline.capture.gpu_rules import _select_into, _slice_into

    zeros, row, cols = torch.zeros(4, 6), torch.ones(6), torch.ones(4, 2)
    assert torch.equal(_select_into(zeros.clone(), row, 0, 1), torch.select_scatter(zeros, row, 0, 1))
    assert torch.equal(_slice_into(zeros.clone(), cols, 1, 2, 6, 2), torch.slice_scatter(zeros, cols, 1, 2, 6, 2))
