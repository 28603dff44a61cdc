"""The step corpus (``tests/data/steps/``): public training scripts' steps, each captured (2 steps) with
``capture --step`` and simulated (1 warm-up iteration + 1), checked against numbers computed without the
simulator: parameter and buffer bytes counted on the model built on the meta device, gradient bytes
for the parameters that train, optimizer state as each optimizer defines it, and the structural quirk
each file exists for (tied weights once, frozen parameters without gradients, an EMA copy, fewer saved
activations under checkpointing, in-place zeroed gradients, accumulation, …).

Skips without torch or the ``steps`` extra (diffusers, peft, pytorch-lightning, x-transformers, accelerate).
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import multiprocessing
import sys
import time
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
for _dep in ("diffusers", "peft", "pytorch_lightning", "x_transformers", "accelerate"):
    pytest.importorskip(_dep, reason=f"the steps extra ({_dep}) is not installed: pip install -e '.[steps]'")

from timeline.capture.step import capture_step  # noqa: E402
from timeline.io.runfile import load_run  # noqa: E402
from timeline.io.trace_file import write_trace  # noqa: E402
from timeline.result.build import build_timeline  # noqa: E402
from timeline.sim.step_sim import step_device  # noqa: E402
from timeline.spec.trace import CapturedTrace  # noqa: E402

STEPS = Path(__file__).parents[1] / "data" / "steps"
RUN = """\
[model]
trace = "step.parquet"
profile = "hf"
[training]
dtype = "fp32"
warmup_iterations = 1
iterations = 1
[hardware]
capacity_gib = 80
"""

#: file:func → the optimizer's state rule (see ``state_bytes``) and, for a known gap, its xfail reason
CASES: dict[str, tuple[str, str | None]] = {
    "nanogpt.py:nanogpt": ("adamw-fused", None),
    "nanogpt.py:nanogpt_fp16": ("adamw-fused", None),
    "mingpt.py:mingpt": ("adam", None),
    "torchtitan_llama3.py:torchtitan_llama3": ("adamw-fused", None),
    "torchtitan_llama3.py:torchtitan_llama3_full_ac": ("adamw-fused", None),
    "torchtitan_moe.py:torchtitan_moe": ("adamw-fused", None),
    "llama2c.py:llama2c": ("adamw-fused", None),
    "x_transformers_enwik8.py:x_transformers_enwik8": ("adam", None),
    "imagenet_resnet.py:imagenet_resnet": ("sgd-momentum", None),
    "dcgan.py:dcgan": ("adam", None),
    "mnist_adadelta.py:mnist_adadelta": ("adadelta", None),
    "word_language_model.py:word_language_model": ("none", None),
    "vae.py:vae": ("adam", None),
    "super_resolution.py:super_resolution": ("adam", None),
    "timm_vit.py:timm_vit": ("adam", None),
    "ddpm_unet.py:ddpm_unet": ("adam", None),
    "open_clip.py:open_clip": ("adam", None),
    "t5_adafactor.py:t5_adafactor": ("adafactor", None),
    "peft_adalora_bart.py:peft_adalora_bart": ("adam", None),
    "lightning_transformer.py:lightning_transformer": ("none", None),
    "hf_trainer_gpt2.py:hf_trainer_gpt2": ("adamw-fused", None),  # TrainingArguments.optim: adamw_torch_fused
    "bert_mlm.py:bert_mlm": ("adam", None),
}


def module(name: str):
    path = STEPS / name
    spec = importlib.util.spec_from_file_location(f"corpus_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _capture(case: str) -> tuple[CapturedTrace, float]:
    name, func = case.split(":")
    t0 = time.perf_counter()
    trace = capture_step(getattr(module(name), func), steps=2)
    return trace, time.perf_counter() - t0


@cache
def captured(case: str) -> tuple[CapturedTrace, float]:
    """The case's trace, captured in a child process (one per case, as ``timeline capture --step`` runs one
    per process): twenty-odd public training stacks (Lightning, timm, diffusers, PEFT, …) run in one
    interpreter left its heap corrupted for a later capture's allocations (a segfault in glibc's malloc,
    reproduced with PYTHONHASHSEED=3, not found yet). The children come from a fork server — a fresh
    interpreter that has imported torch and the corpus's libraries and nothing of this test session — not
    from the test process, whose heap a child forked from it inherits with whatever corrupted it (CI's
    segfault pickling a result in a child forked from pytest); a child that dies fails its case alone."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "transformers", "diffusers", "timm", "pytorch_lightning", "peft"])
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(_capture, case).result()


@cache
def expected(name: str) -> dict[str, object]:
    """Parameters and buffers of the file's ``model()`` built on the meta device (each tensor once)."""
    with torch.device("meta"):
        built = module(name).model()
    roots = built if isinstance(built, tuple) else (built,)
    params = list({id(p): p for r in roots for p in r.parameters()}.values())
    buffers = list({id(b): b for r in roots for b in r.buffers()}.values())
    trainable = [p for p in params if p.requires_grad]
    nbytes = sum(p.numel() * p.element_size() for p in trainable)
    frozen = sum(p.numel() * p.element_size() for p in params if not p.requires_grad)
    return {"trainable": trainable, "param_bytes": nbytes, "frozen_bytes": frozen, "tensors": len(params) + len(buffers),
            "buffer_bytes": sum(b.numel() * b.element_size() for b in buffers)}


def state_bytes(rule: str, params: list) -> int:
    """Optimizer state bytes of ``params`` as each torch.optim / transformers optimizer allocates it on the
    device (``torch/optim/adamw.py: _init_group``: exp_avg and exp_avg_sq like the parameter, and the ``step``
    a device fp32 scalar only when fused or capturable; ``sgd.py``: one momentum buffer; ``adadelta.py``:
    square_avg and acc_delta; ``transformers/optimization.py: Adafactor.step``: ≥2-D factored into fp32
    row and column vectors, else a full exp_avg_sq, no exp_avg with beta1=None, and ``state["RMS"]`` the
    parameter's RMS, a device fp32 scalar)."""
    total = 0
    for p in params:
        size = p.numel() * p.element_size()
        if rule in ("adam", "adadelta"):
            total += 2 * size
        elif rule == "adamw-fused":
            total += 2 * size + 4
        elif rule == "sgd-momentum":
            total += size
        elif rule == "adafactor":
            shape = tuple(p.shape)
            total += 4 * ((p.numel() // shape[-1]) + (p.numel() // shape[-2]) if len(shape) >= 2 else p.numel()) + 4
    return total


def simulate(trace: CapturedTrace, tmp: Path) -> dict[str, int]:
    write_trace(trace, tmp / "step.parquet")
    (tmp / "run.toml").write_text(RUN)
    pk = build_timeline(load_run(tmp / "run.toml")).peak(0)
    return {"allocated": pk.allocated_bytes, "reserved": pk.reserved_bytes}


def roles(trace: CapturedTrace, kind: str) -> dict[str, int]:
    return {st.role: st.nbytes for st in trace.storages.values() if st.role.startswith(kind + ":")}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.xfail(reason=why, strict=True)) if why else c
                                  for c, (_, why) in CASES.items()])
def test_corpus_step_captures_simulates_and_holds_its_state(case, tmp_path):
    trace, _ = captured(case)
    peak = simulate(trace, tmp_path)
    want = expected(case.split(":")[0])
    dev = step_device(trace)
    assert sum(roles(trace, "param").values()) == want["param_bytes"]
    assert sum(roles(trace, "buffer").values()) == want["frozen_bytes"] + want["buffer_bytes"]
    assert dev.weights_bytes == want["param_bytes"] + want["frozen_bytes"] + want["buffer_bytes"]  # summary.json
    assert dev.grads_bytes == want["param_bytes"]
    assert dev.optimizer_bytes == state_bytes(CASES[case][0], want["trainable"])
    assert peak["allocated"] >= dev.weights_bytes + dev.grads_bytes + dev.optimizer_bytes
    assert peak["reserved"] >= peak["allocated"]
    # every parameter and buffer once: a tied weight is one storage (nanoGPT, llama2.c, T5, the tied LSTM)
    assert len(roles(trace, "param")) + len(roles(trace, "buffer")) == want["tensors"]


# -- the quirk each file exists for ------------------------------------------------------------


def step_ops(trace: CapturedTrace, k: int) -> list:
    return [o for o in trace.ops if o.step == k]


def born(trace: CapturedTrace, s: int) -> tuple[int, str]:
    op = trace.ops[trace.storages[s].alloc_op]
    return op.step, op.phase


def saved_activation_bytes(trace: CapturedTrace) -> int:
    """Bytes made by the last step's forward and freed by its backward (what autograd kept)."""
    return sum(st.nbytes for st in trace.storages.values() if st.alloc_op >= 0 and st.free_op >= 0
               and born(trace, st.id) == (2, "F") and trace.ops[st.free_op].phase == "B"
               and trace.ops[st.free_op].step == 2)


def test_activation_checkpointing_saves_fewer_activations_and_peaks_lower(tmp_path):
    plain, _ = captured("torchtitan_llama3.py:torchtitan_llama3")
    ac, _ = captured("torchtitan_llama3.py:torchtitan_llama3_full_ac")
    assert saved_activation_bytes(ac) < saved_activation_bytes(plain)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert simulate(ac, tmp_path / "a")["allocated"] < simulate(plain, tmp_path / "b")["allocated"]
    # the same static state either way
    assert step_device(ac).optimizer_bytes == step_device(plain).optimizer_bytes


@pytest.mark.parametrize("case", ["torchtitan_llama3.py:torchtitan_llama3", "torchtitan_moe.py:torchtitan_moe"])
def test_zero_grad_without_set_to_none_keeps_the_first_steps_gradients(case):
    trace, _ = captured(case)
    grads = [s for s, st in trace.storages.items() if st.role.startswith("grad:")]
    assert grads and all(born(trace, s)[0] == 1 and trace.storages[s].free_op < 0 for s in grads)
    assert any(o.phase == "Z" and o.name.startswith("aten._foreach_zero_") for o in step_ops(trace, 2))


@pytest.mark.parametrize(("case", "micro"), [("nanogpt.py:nanogpt", 2), ("llama2c.py:llama2c", 2),
                                             ("x_transformers_enwik8.py:x_transformers_enwik8", 4)])
def test_gradient_accumulation_runs_each_micro_batch_and_allocates_gradients_once(case, micro):
    trace, _ = captured(case)
    ops = step_ops(trace, 2)
    backwards = sum(1 for a, b in zip(ops, ops[1:], strict=False) if b.phase == "B" and a.phase != "B")
    assert backwards == micro + (ops[0].phase == "B")
    grads = [s for s, st in trace.storages.items() if st.role.startswith("grad:") and born(trace, s)[0] == 2]
    assert len(grads) == len(roles(trace, "param"))  # set_to_none=True: made again by the first micro-batch


def test_mingpt_drops_the_last_gradients_after_the_forward_before_the_backward():
    trace, _ = captured("mingpt.py:mingpt")
    ops = step_ops(trace, 2)
    first_b = next(o.index for o in ops if o.phase == "B")
    old = [st for st in trace.storages.values() if st.role.startswith("grad:") and born(trace, st.id)[0] == 1]
    assert old and all(ops[0].index < st.free_op < first_b for st in old)


@pytest.mark.parametrize("case", ["peft_adalora_bart.py:peft_adalora_bart"])
def test_a_frozen_base_gets_no_gradients_and_no_optimizer_state(case):
    trace, _ = captured(case)
    want = expected(case.split(":")[0])
    assert want["frozen_bytes"] > want["param_bytes"] > 0  # the adapters are the smaller part
    frozen = {r.split(":", 1)[1] for r in roles(trace, "buffer")}
    assert not any(r.split(":", 1)[1] in frozen for r in roles(trace, "grad"))
    assert not any(r.split(":")[1] in frozen for r in roles(trace, "state"))


@pytest.mark.parametrize("case", ["ddpm_unet.py:ddpm_unet", "timm_vit.py:timm_vit"])
def test_an_ema_copy_holds_one_more_set_of_weights(case):
    trace, _ = captured(case)
    kept = Counter(st.nbytes for st in trace.storages.values() if not st.role and st.free_op < 0
                   and st.alloc_op >= 0 and born(trace, st.id)[1] == "init")
    weights = Counter(n for n in roles(trace, "param").values())
    assert not weights - kept  # every parameter has a same-sized copy made at construction that lives on


def test_dcgan_two_networks_two_optimizers_three_backwards():
    trace, _ = captured("dcgan.py:dcgan")
    ops = step_ops(trace, 2)
    assert sum(1 for a, b in zip(ops, ops[1:], strict=False) if b.phase == "B" and a.phase != "B") == 3
    assert sum(1 for a, b in zip(ops, ops[1:], strict=False) if b.phase == "O" and a.phase != "O") == 2


def test_the_moe_step_runs_grouped_gemms_and_keeps_its_load_balancing_buffers():
    trace, _ = captured("torchtitan_moe.py:torchtitan_moe")
    assert any("_grouped_mm" in o.name for o in trace.ops)
    assert {r for r in roles(trace, "buffer") if r.endswith(".expert_bias_E")} == \
        {f"buffer:layers.{i}.moe.expert_bias_E" for i in range(2)}


def test_resnet_keeps_batchnorm_statistics_on_the_device():
    trace, _ = captured("imagenet_resnet.py:imagenet_resnet")
    counters = [r for r, n in roles(trace, "buffer").items() if r.endswith("num_batches_tracked") and n == 8]
    assert len(counters) == 20  # ResNet-18's BatchNorms: stem, 2 per block x 8, 3 downsampling shortcuts


def test_lightning_closure_forward_is_a_forward():
    """Lightning's ``optimizer.step(closure)`` runs training_step, zero_grad and backward inside
    ``Optimizer.step``: the closure's ops keep their phases, the step's own update is O."""
    trace, _ = captured("lightning_transformer.py:lightning_transformer")
    ops = step_ops(trace, 2)
    assert any(o.phase == "F" and "transformer" in o.module for o in ops)
    assert any(o.phase == "B" for o in ops) and any(o.phase == "O" for o in ops)
    # the closure's forward comes before the update: no F or B op follows the first O op
    first_o = next(i for i, o in enumerate(ops) if o.phase == "O")
    assert not any(o.phase in ("F", "B") for o in ops[first_o:])


def test_the_users_command_line_path_prints_no_traceback(tmp_path, capsys):
    """``timeline capture --step`` then ``timeline simulate`` as a user runs them; ``plan`` (which lays a
    model's layers out over devices) refuses a whole-step trace in one line instead of a ``KeyError``."""
    from timeline.cli import main

    trace = tmp_path / "step.parquet"
    assert main(["capture", "--step", f"{STEPS / 'mingpt.py'}:mingpt", "-o", str(trace)]) == 0
    (tmp_path / "run.toml").write_text(RUN)
    assert main(["simulate", str(tmp_path / "run.toml"), "-o", str(tmp_path / "out"), "--no-progress"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert main(["plan", str(tmp_path / "run.toml"), "--world-size", "8"]) == 2
    err = capsys.readouterr().err
    assert "timeline plan varies parallel layouts" in err and err.count("\n") == 1


def test_a_second_stack_of_blocks_is_refused_in_one_line_at_capture():
    """T5's ``decoder.block.N`` beside ``encoder.block.N``: a layer trace (``--module``) lays out one stack of
    decoder layers, so the capture names the first op it cannot place (the whole step captures it above)."""
    from timeline.capture.run import capture
    from timeline.errors import UserError

    def build():
        ids = torch.randint(1, 256, (2, 16))
        return module("t5_adafactor.py").model(), (), {"input_ids": ids, "labels": ids}

    with pytest.raises(UserError, match=r"module 'decoder\.block\.0\..*second stack of repeated blocks"):
        capture(build)
