"""Capture whole training steps as the user wrote them (``timeline capture --step MODULE:FUNC``).

``FUNC()`` builds the model, optimizer and batch as the user's script does (``device="cuda"``,
``.cuda()`` included) and returns a zero-argument callable running one training step: forward
under whatever autocast the user wrote, loss, backward, ``optimizer.step()``, ``zero_grad``.
The capture calls it K times and records construction (phase ``init``) and each call (step
1…K): every aten op that touches device memory, phases F (everything outside the others:
forward and loss), B (inside ``torch.autograd.backward``/``grad``), O (``Optimizer.step``), Z
(``zero_grad``). On the CPU-only capture:

- CUDA devices map to fake CPU tensors (:mod:`timeline.capture.stand_in`);
- ``torch.optim`` runs its CUDA default implementation: where the user left ``foreach`` unset,
  ``_default_to_fused_or_foreach`` (``torch/optim/optimizer.py``) picks foreach, as it does for
  CUDA tensors (it rejects fake tensors' type); ``step`` counters stay host tensors
  (``capturable=False``: ``torch.tensor(0.0)`` in ``_init_group``), so the device never sees them;
- GPU kernels (SDPA, dropout) are chosen as on a GPU (:mod:`timeline.capture.gpu`), and
  ``torch.autocast("cuda", …)`` regions apply CUDA's op lists (:mod:`timeline.capture.autocast`);
- ``.item()`` reads 0 (fake tensors hold no values): while building (``trunc_normal_`` reads
  scalars) and in a step (``loss.item()`` for logging, ``GradScaler``'s ``found_inf``), the
  trace's provenance ``notes`` naming where; events, streams, ``torch.compile`` and the rest of
  the CUDA surface are served by :mod:`timeline.capture.cuda_api`, each difference a note;
- an exception out of the user's code is one line naming it and the user's line.

This module writes no files.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    UnsupportedOperatorException,
)

from timeline.capture.autocast import cuda_autocast
from timeline.capture.gpu import gpu_kernels, unpacked_batches
from timeline.capture.run import _user_error, fake_cpu, load_callable, versions
from timeline.capture.stand_in import cuda_stand_in
from timeline.capture.step_recorder import StepRecorder
from timeline.errors import UserError
from timeline.spec.trace import TRACE_SCHEMA, CapturedTrace

StepFn = Callable[[], Callable[[], Any]]


def load_step(spec: str) -> StepFn:
    """``MODULE:FUNC`` (a dotted module or a path to a ``.py`` file) → FUNC."""
    return load_callable(spec, "--step", "mypkg.train:step or train.py:step")


def _foreach_default(real: Callable[..., tuple[bool, bool]]) -> Callable[..., tuple[bool, bool]]:
    def choose(params: Any, differentiable: bool, use_fused: bool = False) -> tuple[bool, bool]:
        fused, foreach = real(params, differentiable, use_fused)
        return fused, not fused and not differentiable
    return choose


@contextlib.contextmanager
def _phases(rec: StepRecorder) -> Iterator[None]:
    """Label ops by the training-loop phase running them, and note roles at each boundary."""
    import torch.optim as optim
    import torch.optim.optimizer as optimizer_mod

    def within(phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            outer = rec.phase
            rec.note_roles()
            rec.phase = phase if outer not in ("init", "calibrate") else outer
            try:
                return fn(*args, **kwargs)
            finally:
                rec.phase = outer
                rec.note_roles()
                if phase == "B":
                    rec.stand_in.forget_nodes()
        return run

    patches: list[tuple[object, str, object]] = [
        (torch.autograd, "backward", within("B", torch.autograd.backward)),
        (torch.autograd, "grad", within("B", torch.autograd.grad)),
        (optim.Optimizer, "zero_grad", within("Z", optim.Optimizer.zero_grad)),
        (torch.nn.Module, "zero_grad", within("Z", torch.nn.Module.zero_grad))]
    real = optimizer_mod._default_to_fused_or_foreach
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("torch.optim") and \
                getattr(mod, "_default_to_fused_or_foreach", None) is real:
            patches.append((mod, "_default_to_fused_or_foreach", _foreach_default(real)))
    real_init = optim.Optimizer.__init__

    def init(self: optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        rec.optimizers.add(self)

    patches.append((optim.Optimizer, "__init__", init))
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]

    def pre(opt: optim.Optimizer, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        rec.optimizers.add(opt)
        rec.note_roles()
        rec.phase = "O"
        # ``step(closure)`` (Lightning's automatic optimization, LBFGS) runs the forward, zero_grad and
        # backward inside the step: the closure's work keeps its own phases (F, Z, B), not the step's O
        closure = kwargs.get("closure", args[0] if args else None)
        if not callable(closure):
            return None

        def phased(*a: Any, **k: Any) -> Any:
            outer = rec.phase
            rec.note_roles()
            rec.phase = "F"
            try:
                return closure(*a, **k)
            finally:
                rec.note_roles()
                rec.phase = outer
        if "closure" in kwargs:
            return args, {**kwargs, "closure": phased}
        return (phased, *args[1:]), kwargs

    def post(opt: optim.Optimizer, args: tuple, kwargs: dict) -> None:
        rec.phase = "F"
        rec.note_roles()

    def seen(module: torch.nn.Module, args: tuple) -> None:
        rec.enter_module(module)

    def done(module: torch.nn.Module, args: tuple, out: Any) -> None:
        rec.exit_module()

    handles = [optimizer_mod.register_optimizer_step_pre_hook(pre),
               optimizer_mod.register_optimizer_step_post_hook(post),
               torch.nn.modules.module.register_module_forward_pre_hook(seen),
               torch.nn.modules.module.register_module_forward_hook(done)]
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        yield
    finally:
        for h in handles:
            h.remove()
        for obj, name, value in saved:
            setattr(obj, name, value)


def _cuda_only(exc: BaseException) -> UserError | None:
    """A CUDA-only call the stand-in cannot serve, as one line naming it (None: another error)."""
    text = str(exc)
    frames = traceback.extract_tb(exc.__traceback__)
    torch_cuda = [f for f in frames if "torch/cuda/" in f.filename.replace("\\", "/")]
    dummy = text.startswith("Tried to instantiate dummy base class")  # torch.cuda.Event/Stream on CPU builds
    if "CUDA" not in text and not torch_cuda and not dummy:
        return None
    if dummy:
        return UserError(f"capture: torch.cuda.{text.rsplit(' ', 1)[-1]} needs a real GPU; the fake stand-in "
                         "serves torch.cuda memory, statistics, seeding and synchronisation calls only (remove it "
                         "from the step)")
    user = [f for f in frames if "site-packages" not in f.filename and "/timeline/" not in f.filename]
    where = f"torch.cuda.{torch_cuda[0].name}" if torch_cuda else (user[-1].line if user else "a CUDA call")
    return UserError(f"capture: {where} needs a real GPU; the fake stand-in serves torch.cuda memory, "
                     "statistics, seeding and synchronisation calls only (remove it from the step)")


def _step_error(exc: BaseException, rec: StepRecorder) -> UserError:
    """An exception out of the user's step (or torch under it) as one line: what, and where in their code."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "/torch/" not in f.filename.replace("\\", "/") and "/timeline/" not in f.filename.replace("\\", "/")]
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    text = " ".join(str(exc).split()) or type(exc).__name__
    when = "while the --step function built the model, optimizer or batch" if rec.phase == "init" else \
        f"in step {rec.step}"
    hint = ""
    if rec.scalar_reads.get(False):
        hint = (f" (integer tensor values read earlier in the step read 0 on fake tensors, at "
                f"{rec.scalar_reads[False][0]}: a size built from one is unknown here)")
    return UserError(f"capture: {type(exc).__name__}{where} {when}: {text}{hint}")


def capture_step(func: StepFn, *, steps: int = 2, gpu: bool = True, fake: bool = True,
                 provenance: dict[str, Any] | None = None) -> CapturedTrace:
    """Run ``func()`` (construction) and ``steps`` calls of the step it returns, under the recorder.
    ``fake=False`` runs on real CPU tensors (slow; the ground truth the fake capture is checked
    against, with ``gpu=False`` since the GPU kernels have no CPU implementation)."""
    kernels = gpu_kernels() if gpu else unpacked_batches()
    tensors = fake_cpu() if fake else torch.device("cpu")
    with tensors, kernels, cuda_stand_in() as stand_in, cuda_autocast(stand_in.is_device):
        rec = StepRecorder(stand_in)
        try:
            with _phases(rec), rec:
                rec.calibrate()
                step = func()
                if not callable(step):
                    raise UserError("--step: the function must return a zero-argument callable running one "
                                    f"training step, not {type(step).__name__}")
                rec.note_roles()
                for k in range(1, steps + 1):
                    rec.phase, rec.step = "F", k
                    step()
                    rec.note_roles()
        except (DynamicOutputShapeException, DataDependentOutputException, UnsupportedOperatorException) as exc:
            err = _user_error(exc)
            if rec.phase == "init":
                op = getattr(exc, "func", None) or (exc.args[0] if exc.args else "an op")
                frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/torch/" not in
                          f.filename.replace("\\", "/") and "/timeline/" not in f.filename.replace("\\", "/")]
                where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
                # host-side setup (fairscale's initialize_model_parallel, a rank grid) runs on fake tensors too
                err = UserError(f"capture failed at {op}{f' ({where})' if where else ''} while the --step function "
                                "built the model, optimizer or batch: its output shape depends on tensor values, "
                                "which fake tensors do not have; run that setup before the --step function is "
                                "called (at import time) or give the values it computes")
            raise err from None
        except UserError:
            raise
        except Exception as exc:  # the user's code raised: one line naming it and where, never a traceback
            raise (_cuda_only(exc) or _step_error(exc, rec)) from None
        rec.close()
        ops, storages, params = rec.result()
        notes = [*stand_in.notes.lines, *rec.scalar_notes()]
        del step
    prov = {"schema": TRACE_SCHEMA, **versions(), **(provenance or {}), "kind": "step", "steps": steps}
    if notes:
        prov["notes"] = notes
    return CapturedTrace(ops=ops, storages=storages, params=params, layers=(), provenance=prov)
