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


def _adamw_step(model: torch.nn.Module):
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(B, D).to("cuda")

    def step():
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def plain_step():
    return _adamw_step(_mlp())


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


def data_parallel_step():
    """pytorch-cifar's main.py: DataParallel whenever the device is cuda (one GPU here)."""
    return _adamw_step(torch.nn.DataParallel(_mlp()))


def default_device_step():
    """llama's model.py under torch.set_default_device("cuda") / set_default_tensor_type(torch.cuda.HalfTensor):
    factories without a device make device tensors; a view's .device is the device."""
    torch.set_default_tensor_type(torch.cuda.HalfTensor)
    torch.set_default_device("cuda")
    freqs = torch.arange(0, D, 2)[: D // 4].float()
    t = torch.arange(B, device=freqs.device)
    assert t.is_cuda and torch.get_default_device().type == "cuda"
    model = nn.Sequential(nn.Linear(D, F), nn.GELU(), nn.Linear(F, D))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(B, D)

    def step():
        model(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def normal_gate_step():
    """A noisy top-k gate's Normal(0, 1).cdf (davidmrau/mixture-of-experts): validation reads values."""
    model = _mlp()
    normal = torch.distributions.normal.Normal(torch.tensor([0.0], device="cuda"), torch.tensor([1.0], device="cuda"))
    x = torch.randn(B, D, device="cuda")

    def step():
        normal.cdf(model(x)).mean().backward()
    return step


def host_model_step():
    """nanoDiffusion's train.py as written: the model is never moved, the batch is on the device."""
    model = nn.Linear(D, D)
    x = torch.randn(B, D, device="cuda")

    def step():
        model(x).sum().backward()
    return step


def test_data_parallel_on_one_device_is_its_module():
    wrapped, plain = _capture(data_parallel_step), _capture(plain_step)
    # the same steps (DataParallel's construction adds views of the parameters, which hold no bytes)
    assert [x for x in _shape(wrapped) if x[1] != "init"] == [x for x in _shape(plain) if x[1] != "init"]
    assert sorted(s.nbytes for s in wrapped.storages.values()) == sorted(s.nbytes for s in plain.storages.values())


def test_a_default_cuda_device_and_tensor_type_put_the_model_on_the_device_in_half():
    before = torch.get_default_dtype()
    trace = _capture(default_device_step, steps=1)
    params = [p for p in trace.params if p.trainable]
    assert sum(p.nbytes for p in params) == (D * F + F + F * D + D) * 2  # fp16 from the default tensor type
    assert torch.get_default_dtype() == before and torch.get_default_device().type == "cpu"


def test_distributions_capture_without_validating_values():
    trace = _capture(normal_gate_step, steps=1)
    assert any(n.startswith("torch.distributions: argument validation is off") for n in trace.provenance["notes"])


def test_a_model_left_in_host_memory_is_refused_as_a_gpu_would():
    with pytest.raises(UserError, match=r"^capture: RuntimeError at test_cuda_surface\.py:\d+ in step 1: Expected all "
                                        r"tensors to be on the same device"):
        _capture(host_model_step)


def test_a_step_file_named_like_the_package_it_imports(tmp_path: Path, capsys):
    from timeline.cli import main

    pkg = tmp_path / "src" / "mygpt"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "model.py").write_text("import torch\n\ndef build():\n    return torch.nn.Linear(8, 8).cuda()\n")
    steps = tmp_path / "steps"
    steps.mkdir()
    (steps / "mygpt.py").write_text(
        f"import sys\nsys.path.insert(0, {str(tmp_path / 'src')!r})\nimport torch\nfrom mygpt.model import build\n\n"
        "def make_step():\n    m = build()\n    x = torch.randn(4, 8, device='cuda')\n"
        "    return lambda: m(x).sum().backward()\n")
    assert main(["capture", "--step", f"{steps / 'mygpt.py'}:make_step", "-o", str(tmp_path / "t.parquet")]) == 0
    assert "error" not in capsys.readouterr().err


def test_a_family_the_run_file_reader_lacks_is_captured_through_transformers(tmp_path: Path, capsys):
    pytest.importorskip("transformers")
    from timeline.cli import main

    cfg = {"model_type": "gpt_neox", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 256, "vocab_size": 512, "max_position_embeddings": 128, "rotary_pct": 0.25,
           "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    out = tmp_path / "neox.parquet"
    assert main(["capture", "--hf-config", str(path), "--micro-batch-size", "1", "--seq-len", "32", "--dtype", "fp32",
                 "-o", str(out)]) == 0
    assert "'gpt_neox' is captured through transformers' own class" in capsys.readouterr().err
    from timeline.io.trace_file import read_trace

    trace = read_trace(out)
    # embed_in and embed_out (untied) 512×64 each; per layer: qkv 64×192+192, dense 64×64+64, MLP 64×256+256 and
    # 256×64+64, two LayerNorms 2×(64+64); the final LayerNorm 64+64
    layer = 64 * 192 + 192 + 64 * 64 + 64 + 64 * 256 + 256 + 256 * 64 + 64 + 4 * 64
    assert sum(p.nbytes for p in trace.params if p.trainable) == 4 * (2 * 512 * 64 + 2 * layer + 128)
