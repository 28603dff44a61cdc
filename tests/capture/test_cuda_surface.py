"""The CUDA surface a training script touches, served by the capture's stand-in (issue 28 item 2):
device properties, events, side streams, RNG state under activation checkpointing, pinned batches,
``GradScaler``, ``torch.compile`` and value reads — each captured as the eager step on one stream would
run, each difference one note, and an exception in the user's code one line naming its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from timeline.errors import UserError  # noqa: E402

D, F, B = 64, 256, 8


def _mlp() -> torch.nn.Module:
    return nn.Sequential(nn.Linear(D, F), nn.GELU(), nn.Dropout(0.1), nn.Linear(F, D)).to("cuda")


def plain_step():
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(B, D).to("cuda")

    def step():
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def busy_step():
    """plain_step as a benchmarking script writes it: compiled, timed, sized by the device's memory,
    with a pinned host batch and a side stream, and the loss logged."""
    props = torch.cuda.get_device_properties(0)
    batch = B if props.total_memory >= 40 * 2**30 else B // 2
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    model = torch.compile(_mlp())
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(batch, D).pin_memory().to("cuda", non_blocking=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    free, total = torch.cuda.mem_get_info()
    assert free <= total == props.total_memory

    def step():
        start.record()
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        end.record()
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            assert torch.cuda.current_stream() is side
        assert start.elapsed_time(end) == 0.0
        torch.cuda.reset_peak_memory_stats()
    return step


def scaled_step():
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    scaler = torch.amp.GradScaler("cuda")
    x = torch.randn(B, D, device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)  # reads found_inf: 0 on fake tensors, so the step runs
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.item()
    return step


def _checkpointed(use: bool):
    def build():
        blocks = nn.ModuleList(_mlp() for _ in range(3))
        x = torch.randn(B, D, device="cuda", requires_grad=True)

        def step():
            h = x
            for blk in blocks:  # preserve_rng_state (the default) reads and restores the CUDA RNG state
                h = torch.utils.checkpoint.checkpoint(blk, h, use_reentrant=False) if use else blk(h)
            h.sum().backward()
        return step
    return build


def broken_step():
    model = _mlp()

    def step():
        model(torch.ones(B, D, device="cuda")).sum().backward()
        raise ValueError("the user's own bug")
    return step


def _capture(func, steps=2):
    from timeline.capture.step import capture_step

    return capture_step(func, steps=steps)


def _shape(trace):
    return [(o.name, o.phase, tuple(t.shape for t in o.outputs)) for o in trace.ops]


def test_a_compiled_timed_streamed_step_captures_as_the_eager_one():
    busy, plain = _capture(busy_step), _capture(plain_step)
    # get_device_properties said 80 GiB, so the script chose the large batch: the same ops, shapes and
    # storages as the plain step (compile → eager, events/streams/pinning/queries add no device op)
    assert _shape(busy) == _shape(plain)
    assert sorted(s.nbytes for s in busy.storages.values()) == sorted(s.nbytes for s in plain.storages.values())
    notes = busy.provenance["notes"]
    assert any(n.startswith("torch.compile: the step is captured eager") for n in notes)
    assert any(n.startswith("torch.cuda.stream: side-stream work is captured on the one stream") for n in notes)
    assert "notes" not in plain.provenance


def test_grad_scaler_runs_the_optimizer_step_with_its_scale_on_the_device():
    trace = _capture(scaled_step)
    params = [p for p in trace.params if p.trainable]
    states = [s for s in trace.storages.values() if s.kind == "state"]
    assert sum(s.nbytes for s in states) == 2 * sum(p.nbytes for p in params)  # AdamW's moments: not skipped
    # the scaler's fp32 scale and int32 growth tracker are device tensors created in step 1's scale()/update()
    step1 = [trace.storages[i] for o in trace.ops if o.step == 1 for i in o.allocs]
    assert [s.nbytes for s in step1 if s.free_op == -1 and s.kind == "op"].count(4) >= 2
    [note] = trace.provenance["notes"]
    assert note.startswith("floating-point or bool tensor values read in the step") and "test_cuda_surface.py:" in note


def _held_into_backward(trace) -> int:
    """Bytes the forward made that are still alive when the backward starts."""
    first_b = next(o.index for o in trace.ops if o.phase == "B")
    return sum(s.nbytes for s in trace.storages.values() if s.kind == "op" and trace.ops[s.alloc_op].phase == "F"
               and (s.free_op == -1 or s.free_op >= first_b))


def test_activation_checkpointing_reads_the_cuda_rng_state_and_holds_less():
    held = {use: _held_into_backward(_capture(_checkpointed(use), steps=1)) for use in (True, False)}
    # checkpointed, each block keeps only its input; the output's sum is a scalar. Without it each block
    # keeps its GEMM inputs, the GELU input (B·F fp32), the dropout mask (B·F bool) and its output.
    blocks = 3
    assert held[True] == blocks * B * D * 4 + 4
    assert held[False] - held[True] >= blocks * (B * F * 4 + B * F)


def test_an_exception_in_the_users_step_is_one_line_naming_its_line():
    with pytest.raises(UserError, match=r"^capture: ValueError at test_cuda_surface\.py:\d+ in step 1: the "
                                        r"user's own bug$"):
        _capture(broken_step)


def test_the_command_line_prints_the_notes_and_simulates_with_one_micro_batch(tmp_path: Path, capsys):
    from timeline.cli import main

    trace = tmp_path / "busy.parquet"
    assert main(["capture", "--step", f"{Path(__file__)}:busy_step", "-o", str(trace)]) == 0
    err = capsys.readouterr().err
    assert "note: torch.compile: the step is captured eager" in err and "Traceback" not in err
    # no num_microbatches: a whole-step trace's default is its own loop, one
    (tmp_path / "run.toml").write_text(f'[model]\ntrace = "{trace.name}"\nprofile = "hf"\n'
                                       "[training]\nwarmup_iterations = 1\niterations = 1\n")
    assert main(["simulate", str(tmp_path / "run.toml"), "-o", str(tmp_path / "out"), "--no-progress"]) == 0
    dev = json.loads((tmp_path / "out" / "summary.json").read_text())["devices"][0]
    weights = (D * F + F + F * D + D) * 4  # the two Linear layers, fp32
    # steady state after warm-up: weights, AdamW's two moments, and the step's own tensors on top
    assert dev["peak_allocated_bytes"] >= 3 * weights
