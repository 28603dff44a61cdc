"""Static state of the ``hf`` profile as plain PyTorch training holds it: one tensor per parameter.

Without ZeRO, a Hugging Face model trained with ``torch.optim`` holds, in parameter order:

- each weight (and buffer) from model construction;
- each ``.grad`` from the first backward of an iteration, when that backward reaches the
  parameter's layer (AccumulateGrad steals the first incoming gradient;
  ``torch/csrc/autograd/functions/accumulate_grad.h``); with
  ``[training] zero_grad = "set_to_none"`` (``torch.optim.Optimizer.zero_grad``'s default since
  PyTorch 2.0) it is dropped after the optimizer step and made again by the next backward, with
  ``"zeros"`` it stays allocated;
- each parameter's master copy (when ``master_dtype`` differs) and two moments from the first
  ``step()`` (``torch/optim/adam.py`` ``_init_group``: ``exp_avg``, ``exp_avg_sq``, created lazily);
- during every step, foreach Adam's temporaries (:func:`timeline.profiles.torch_adam.foreach_temporaries`:
  ``torch._foreach_sqrt(exp_avg_sqs)``, a full copy of the second moments live at once, at the run's
  ``[framework] pytorch``), from the step's start to its end.

Events are (time, ±1, name, bytes, category, action); times come from the device's spans. With
ZeRO the blocks of :func:`timeline.sim.static_state.static_allocs` stay (DeepSpeed's flat buffers).
No file I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from timeline.graph.static import optimizer_element_bytes
from timeline.graph.tensors import DTYPE_BYTES, Category
from timeline.placement.devices import StaticDevice
from timeline.profiles.torch_adam import foreach_temporaries
from timeline.sim.compiled import CAT_CODE, CompiledPhase
from timeline.sim.engine import Span
from timeline.spec.framework import FrameworkSpec
from timeline.spec.run import TrainingSpec

Event = tuple[float, int, str, int, int, int]


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def grad_offset_us(name: str, ph: CompiledPhase | None) -> float:
    """When, from a backward action's start, the gradient of parameter ``name`` first arrives: the
    first backward op of its decoder layer; the embedding's at the end, the head's at the start."""
    if ph is None or not len(ph.op_start):
        return 0.0
    m = _LAYER.search(name)
    layers = np.asarray(ph.op_layers)
    if m is not None:
        hits = np.flatnonzero(layers == int(m.group(1)))
        if len(hits):
            return float(ph.op_start[hits[0]])
    return float(ph.op_end[-1]) if "embed" in name or "wte" in name or "wpe" in name else 0.0


def hf_state_events(tr: TrainingSpec, dev: StaticDevice, spans: list[Span],
                    backward_of: Callable[[Span], CompiledPhase | None] = lambda sp: None,
                    pytorch: str = FrameworkSpec().pytorch) -> list[Event]:
    """Per-parameter weight, gradient, optimizer-state and step-temporary events of one device;
    ``backward_of`` gives a backward span's compiled ops (for when each layer's gradients arrive),
    ``pytorch`` the version whose optimizer runs."""
    w_cat, g_cat, o_cat = CAT_CODE[Category.WEIGHTS], CAT_CODE[Category.GRADS], CAT_CODE[Category.OPTIMIZER]
    t_cat = CAT_CODE[Category.TEMPORARY]
    out: list[Event] = [(0.0, 1, f"weights.{t.name}", t.numel * DTYPE_BYTES[tr.dtype] if t.trainable
                         else t.size_bytes, w_cat, -1) for t in dev.tensors]
    trainable = [t for t in dev.tensors if t.trainable]
    iterations = tr.warmup_iterations + tr.iterations
    first_bwd: dict[int, tuple[float, int]] = {}
    step: dict[int, tuple[float, float, int]] = {}
    for a, sp in enumerate(spans):
        if sp.kind in ("B", "I") and sp.iteration not in first_bwd:
            first_bwd[sp.iteration] = (sp.start_us, a)
        if sp.kind == "step":
            step[sp.iteration] = (sp.start_us, sp.end_us, a)
    master, moment = optimizer_element_bytes(tr)

    def states(t0: float, a: int) -> list[Event]:
        """Each parameter's master copy (where the step keeps one) and two moments, made at ``t0``."""
        made: list[Event] = []
        for t in trainable:
            if master:
                made.append((t0, 1, f"master.{t.name}", t.numel * master, o_cat, a))
            made += [(t0, 1, f"{t.name}.exp_avg", t.numel * moment, o_cat, a),
                     (t0, 1, f"{t.name}.exp_avg_sq", t.numel * moment, o_cat, a)]
        return made

    if tr.resumed:  # torch.optim.Optimizer.load_state_dict makes every state from the checkpoint's, before any step
        out += states(0.0, -1)
    for it in range(iterations):
        dropped = tr.zero_grad == "set_to_none" and tr.optimizer_step  # zero_grad follows each step
        if it in first_bwd and (it == 0 or dropped):
            t0, a = first_bwd[it]
            ph = backward_of(spans[a])
            k = spans[a].scale  # an overlapped pair stretches its ops
            out += [(t0 + k * grad_offset_us(t.name, ph), 1, f"grad.{t.name}", t.numel * DTYPE_BYTES[tr.grad_dtype],
                     g_cat, a) for t in trainable]
        if not tr.optimizer_step or it not in step:
            continue
        s0, s1, a = step[it]
        if it == 0 and not tr.resumed:
            out += states(s0, a)
        made = foreach_temporaries([(t.name, t.numel) for t in trainable], moment, pytorch)
        out += [(s0, 1, name, size, t_cat, a) for name, size in made]
        out += [(s1, -1, name, size, t_cat, a) for name, size in made]
        if tr.zero_grad == "set_to_none" and it in first_bwd:
            out += [(s1, -1, f"grad.{t.name}", t.numel * DTYPE_BYTES[tr.grad_dtype], g_cat, a) for t in trainable]
    return [e for e in out if e[3] > 0]
