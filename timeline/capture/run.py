"""Drive one captured training step: build the model on fake CPU tensors, run forward and backward
under the recorder, and return a :class:`~timeline.spec.trace.CapturedTrace`.

The step is what a training loop does for one micro-batch: forward to a scalar loss (a Hugging
Face model's ``loss`` with ``use_cache=False``; a plain module's output, summed when it is not a
scalar), then backward. Gradients are materialised (zeros) between forward and backward, as they
stand in every iteration after the first (and as the ``hf`` lifecycle holds them from the first
backward): autograd then accumulates each weight gradient in place and the freshly computed one
is a temporary. Model construction runs inside ``FakeTensorMode`` on device ``cpu`` — no weights
are materialised, no GPU is needed (groundtruth.md §2: fake mode = real mode, byte for byte).

Errors a user can act on (data-dependent shapes, ops without fake kernels) become
:class:`~timeline.errors.UserError` naming the op and what to do. This module writes no files.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import platform
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.distributed._tools.mod_tracker import ModTracker
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from timeline.capture.gpu import gpu_kernels
from timeline.capture.recorder import Recorder
from timeline.errors import UserError
from timeline.spec.trace import TRACE_SCHEMA, CapturedTrace, check_one_stack

#: (model, positional args, keyword args) of one step
Built = tuple[torch.nn.Module, tuple, dict]

DATA_DEPENDENT_HINT = (
    "its output shape depends on tensor values, which fake tensors do not have. For a Hugging Face MoE "
    "model use the grouped expert implementation (--set experts_implementation=grouped_mm, the "
    "transformers 5 default; 'eager' loops over experts with nonzero/where); in your own module avoid "
    "data-dependent ops (nonzero, masked_select, boolean indexing, .item()) in the captured step")


def step_loss(out: Any) -> torch.Tensor:
    """The scalar a step differentiates: ``out.loss``, ``out["loss"]``, a scalar, or the sum of ``out``."""
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if loss is None:
        loss = out if isinstance(out, torch.Tensor) else next(
            (t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)), None)
    if loss is None:
        raise UserError("the captured module returned no tensor to differentiate")
    return loss if loss.dim() == 0 else loss.sum()


def training_step(model: torch.nn.Module, args: tuple, kwargs: dict, *, recorder: Recorder | None = None,
                  between: Callable[[], None] | None = None) -> None:
    """Forward, materialise gradients, backward (``recorder.phase`` follows along)."""
    model.train()
    loss = step_loss(model(*args, **kwargs))
    if between is not None:
        between()
    if recorder is not None:
        recorder.recording = False
    for p in model.parameters():
        if p.requires_grad and p.grad is None:
            p.grad = torch.zeros_like(p)
    if recorder is not None:
        recorder.recording = True
        recorder.register_grads(model)
        recorder.phase = "B"
    loss.backward()
    del loss


@contextlib.contextmanager
def fake_cpu() -> Iterator[FakeTensorMode]:
    """Fake tensors on the CPU, default device ``cpu`` (never fake ``cuda``: its backward fails)."""
    with FakeTensorMode(allow_non_fake_inputs=True) as mode, torch.device("cpu"):
        yield mode


def _user_error(exc: Exception) -> UserError:
    op = getattr(exc, "func", None) or (exc.args[0] if exc.args else "an op")
    if isinstance(exc, (DynamicOutputShapeException, DataDependentOutputException)):
        return UserError(f"capture failed at {op}: {DATA_DEPENDENT_HINT}")
    return UserError(f"capture failed at {op}: it has no fake-tensor (meta) kernel, so it cannot run without "
                     "real data; replace it in the module, or capture the part of the model around it")


class InitScalars(TorchDispatchMode):
    """While a model is built, ``.item()`` reads 0: init ops such as ``trunc_normal_`` read
    scalars that fake tensors do not have, and values do not matter for memory."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            dtype = args[0].dtype
            return 0.0 if dtype.is_floating_point else (False if dtype == torch.bool else 0)
        return func(*args, **(kwargs or {}))


def capture(build: Callable[[], Built], *, gpu: bool = True, provenance: dict[str, Any] | None = None
            ) -> CapturedTrace:
    """Build (inside fake mode), run one step under the recorder, and return the trace."""
    kernels = gpu_kernels() if gpu else contextlib.nullcontext()
    with fake_cpu(), kernels:
        try:
            with InitScalars():
                model, args, kwargs = build()
        except (DynamicOutputShapeException, DataDependentOutputException, UnsupportedOperatorException) as exc:
            raise UserError(f"{_user_error(exc)} (while building the model, before the step)") from None
        tracker = ModTracker()
        rec = Recorder(tracker)
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        rec.register_model(model, inputs)
        try:
            with tracker, rec.nodes, torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack), rec:
                training_step(model, args, kwargs, recorder=rec)
        except (DynamicOutputShapeException, DataDependentOutputException, UnsupportedOperatorException) as exc:
            raise _user_error(exc) from None
        rec.close()
        ops, storages, params, layers = rec.result()
    if not layers:
        raise UserError("no decoder layers found: the lowering repeats modules named layers.N (or h.N, "
                        "blocks.N); name the repeated blocks of your module that way (an nn.ModuleList "
                        "attribute called 'layers')")
    prov = {"schema": TRACE_SCHEMA, **versions(), **(provenance or {})}
    trace = CapturedTrace(ops=ops, storages=storages, params=params, layers=layers, provenance=prov)
    check_one_stack(trace)  # refused at capture, not later in the simulation
    return trace


def versions() -> dict[str, str]:
    out = {"torch": torch.__version__, "python": platform.python_version()}
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except ImportError:
        out["transformers"] = ""
    return out


def load_callable(spec: str, flag: str, example: str) -> Callable[..., Any]:
    """``MODULE:NAME`` (a dotted module or a path to a ``.py`` file) → that attribute, callable."""
    mod_name, sep, attr = spec.rpartition(":")
    if not sep or not mod_name or not attr:
        raise UserError(f"{flag} {spec!r}: expected MODULE:NAME (e.g. {example})")
    try:
        if mod_name.endswith(".py"):
            path = Path(mod_name)
            if not path.is_file():
                raise UserError(f"{flag} {spec!r}: no such file {mod_name}")
            # registered under a name of its own: a step file named like a package it imports (mingpt.py
            # importing mingpt.model) must not stand for that package, as `python mingpt.py` does not
            name = f"_timeline_step_{path.stem}"
            loader = importlib.util.spec_from_file_location(name, path)
            assert loader is not None and loader.loader is not None
            module = importlib.util.module_from_spec(loader)
            sys.modules[name] = module
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_name)
        fn = getattr(module, attr)
    except (ImportError, AttributeError, SyntaxError) as exc:
        raise UserError(f"{flag} {spec!r}: {exc}") from None
    if not callable(fn):
        raise UserError(f"{flag} {spec!r}: {attr} is not callable")
    return fn


def load_factory(spec: str) -> Callable[[], Built]:
    """``module:factory`` (dotted, or a path to a ``.py`` file) → a callable returning (nn.Module, example
    args[, kwargs])."""
    fn = load_callable(spec, "--module", "mypkg.models:build or models.py:build")

    def build() -> Built:
        result = fn()
        if isinstance(result, torch.nn.Module) or not isinstance(result, tuple) or len(result) not in (2, 3):
            raise UserError(f"--module {spec!r}: the factory must return (module, args) or (module, args, kwargs)")
        model, args = result[0], result[1]
        if not isinstance(model, torch.nn.Module):
            raise UserError(f"--module {spec!r}: the factory's first value is not an nn.Module")
        args = args if isinstance(args, tuple) else (args,)
        return model, args, dict(result[2]) if len(result) == 3 else {}

    return build
