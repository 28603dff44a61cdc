"""The whole-step recorder: every aten op that touches device memory, from model construction
through K training steps, with each device storage's birth, death and role.

Unlike :class:`~timeline.capture.recorder.Recorder` (one forward + backward of a module whose
parameters exist before it starts), it sees the user's script build everything: parameters are
born in ``init``, gradients when backward first produces them, optimizer state in the first
``step()``. Only device storages are recorded (the :class:`~timeline.capture.stand_in.StandIn`
says which); host-only ops are left out, as a GPU's allocator never sees them. Roles (which
parameter a ``.grad`` or an optimizer state belongs to) are read at phase boundaries, before
``zero_grad`` can drop them. It does not drive the steps (:mod:`timeline.capture.step` does).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from timeline.capture.cuda_api import user_frame
from timeline.capture.gpu_rules import accumulates_in_place, accumulation_counts, in_place_variant, int_histc
from timeline.capture.recorder import _flops, dtype_name, layer_of
from timeline.capture.stand_in import StandIn
from timeline.spec.trace import TraceOp, TraceParam, TraceStorage, TraceTensor


def _zero(dtype: torch.dtype) -> Any:
    if dtype.is_floating_point or dtype.is_complex:
        return 0.0
    return False if dtype == torch.bool else 0


class StepRecorder(TorchDispatchMode):
    """Records device ops while active; the driver sets ``phase`` and ``step``."""

    def __init__(self, stand_in: StandIn) -> None:
        super().__init__()
        self.stand_in = stand_in
        self.phase, self.step = "init", 0
        self.ops: list[TraceOp] = []
        self._ids: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._nbytes: list[int] = []
        self._alloc: list[int] = []
        self._free: dict[int, int] = {}
        self._role: dict[int, str] = {}
        self._finalizers: list[weakref.finalize] = []
        self._closed = False
        self.modules: weakref.WeakSet = weakref.WeakSet()
        self.optimizers: weakref.WeakSet = weakref.WeakSet()
        self.stack: list[str] = []  # module paths of the forwards running
        self._paths: dict[int, str] = {}
        self._node_module: dict[int, str] = {}  # autograd node id → the forward module that made it
        self.in_apply = False  # an autograd node's apply is running (else the engine is between nodes)
        self.last_reference: tuple[int, int] | None = None  # use counts of a buffer's sole reference
        self.scalar_reads: dict[bool, list[str]] = {}  # value reads in the steps: floating/bool? → sites
        stand_in.on_nodes = self._hook_nodes

    # -- module paths --------------------------------------------------------------------
    def enter_module(self, module: torch.nn.Module) -> None:
        self.modules.add(module)
        if id(module) not in self._paths:
            children = {id(c) for m in self.modules for c in m.modules() if c is not m}
            for root in (m for m in self.modules if id(m) not in children):
                for name, m in root.named_modules():
                    self._paths.setdefault(id(m), name)
        self.stack.append(self._paths.get(id(module), type(module).__name__))

    def exit_module(self) -> None:
        if self.stack:
            self.stack.pop()

    def op_module(self) -> str:
        """The module an op runs in: the innermost forward running; in backward, the forward
        module that made the autograd node running; the optimizer's step."""
        if self.phase == "B":
            node = torch._C._current_autograd_node()
            return self._node_module.get(id(node), "") if node is not None else ""
        if self.phase == "O":
            return "optimizer"
        return self.stack[-1] if self.stack else ""

    # -- the engine's gradient accumulation ----------------------------------------------
    def _hook_nodes(self, nodes: list) -> None:
        here = self.stack[-1] if self.stack else ""
        for node in nodes:
            self._node_module[id(node)] = here
            node.register_prehook(self._pre)
            node.register_hook(self._post)

    def _pre(self, grad_outputs: tuple) -> None:
        self.in_apply = True

    def _post(self, grad_inputs: tuple, grad_outputs: tuple) -> None:
        self.in_apply = False

    def calibrate(self) -> None:
        """Measure the use counts an accumulation sees when the engine's buffer holds the last
        reference to the gradient (two fresh products summed into one input), as seen from here."""
        w = torch.ones(2, requires_grad=True)
        y = w * 1.0
        self.phase = "calibrate"
        try:
            torch.autograd.backward((y * 2.0 + y * 3.0).sum())
        finally:
            self.phase = "init"
            self.stand_in.forget_nodes()

    def _in_place_variant(self, func: Any, args: tuple) -> Any:
        if self.phase != "B" or not self.ops:
            return None
        return in_place_variant(func, args, self.ops[-1], self.sid)

    def _accumulates_in_place(self, func: Any, args: tuple) -> bool:
        if func is not torch.ops.aten.add.Tensor or self.in_apply or torch.is_grad_enabled():
            return False
        counts = accumulation_counts(args)
        if counts is not None and self.phase == "calibrate":
            self.last_reference = counts
            return False
        return self.phase == "B" and counts is not None and counts == self.last_reference \
            and accumulates_in_place(args)

    # -- storages ----------------------------------------------------------------------
    def _register(self, t: torch.Tensor, index: int) -> int:
        st = t.untyped_storage()
        i = len(self._nbytes)
        self._ids[st] = i
        self._nbytes.append(st.nbytes())
        self._alloc.append(index)
        self._finalizers.append(weakref.finalize(st, self._died, i))
        self.stand_in.mark(t)
        return i

    def _died(self, i: int) -> None:
        if not self._closed and i not in self._free:
            self._free[i] = len(self.ops) - 1

    def _scalar_read(self, dtype: torch.dtype) -> None:
        """A step reads a tensor's value (``loss.item()``, ``if found_inf``, ``.tolist()``): fake tensors
        hold none, so it reads 0 — the branch a healthy step takes (no inf, no NaN, nothing to skip) and
        harmless for logging. An integer read may size a tensor, which 0 would then get wrong: said."""
        where = user_frame() or "the step"
        self.scalar_reads.setdefault(dtype.is_floating_point or dtype == torch.bool, []).append(where)

    def scalar_notes(self) -> list[str]:
        """One line per kind of value read in the steps (floating/bool, integer), naming where."""
        out = []
        for exact, label in ((True, "floating-point or bool"), (False, "integer")):
            sites = list(dict.fromkeys(self.scalar_reads.get(exact, [])))
            if not sites:
                continue
            shown = ", ".join(sites[:3]) + (f" and {len(sites) - 3} more" if len(sites) > 3 else "")
            tail = ("logging, loss-scaler and NaN checks take a healthy step's branch" if exact else
                    "if one of them sizes a tensor, that tensor's bytes are wrong in the trace")
            out.append(f"{label} tensor values read in the step (.item(), bool(), .tolist()) read 0 on fake "
                       f"tensors at {shown}: {tail}")
        return out

    def sid(self, t: torch.Tensor) -> int | None:
        return self._ids.get(t.untyped_storage())

    # -- ops ---------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:
            if self.phase in ("init", "calibrate"):
                return _zero(args[0].dtype)  # `.item()` while building: values do not matter for memory
            try:  # a constant the fake mode tracks (an optimizer's host step counter) has its value
                return func(*args, **kwargs)
            except DataDependentOutputException:
                self._scalar_read(args[0].dtype)
                return _zero(args[0].dtype)
        if func.namespace == "prim":
            return func(*args, **kwargs)
        flat = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        inputs = list(dict.fromkeys(i for t in flat if (i := self.sid(t)) is not None))
        call = func
        if func is torch.ops.aten.histc.default and not args[0].is_floating_point():
            call = int_histc
        elif self._accumulates_in_place(func, args):
            func = call = torch.ops.aten.add_.Tensor
        elif (variant := self._in_place_variant(func, args)) is not None:
            call = variant
            func = variant if isinstance(variant, torch._ops.OpOverload) else func
        self.stand_in.depth += 1
        try:
            out = call(*args, **kwargs)
        finally:
            self.stand_in.depth -= 1
        force = self.stand_in.force
        # a training step's backward runs on the device (the engine's zeros for missing gradients
        # take their options from recorded metadata, not from a tensor the stand-in knows)
        on_device = force if force is not None else bool(inputs) or self.phase == "B"
        index = len(self.ops)
        outputs, allocs = [], []
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            i = self.sid(t)
            if i is None:
                if not on_device:
                    continue
                i = self._register(t, index)
                allocs.append(i)
            outputs.append(TraceTensor(storage=i, shape=tuple(int(d) for d in t.shape),
                                       dtype=dtype_name(t.dtype), nbytes=t.numel() * t.element_size()))
        if inputs or outputs:
            module = self.op_module()
            self.ops.append(TraceOp(index=index, name=str(func), module=module, phase=self.phase,
                                    layer=layer_of(module),
                                    flops=_flops(func, args, kwargs, out), outputs=tuple(outputs),
                                    allocs=tuple(allocs), inputs=tuple(inputs), frees=(), step=self.step))
        return out

    # -- roles -------------------------------------------------------------------------
    def named_params(self) -> list[tuple[str, torch.Tensor, bool]]:
        """(name, tensor, trainable) of every parameter and buffer of the root modules seen in a
        forward, then optimizer parameters no module named."""
        seen: set[int] = set()
        out: list[tuple[str, torch.Tensor, bool]] = []
        children = {id(c) for m in self.modules for c in m.modules() if c is not m}
        roots = sorted((m for m in self.modules if id(m) not in children), key=lambda m: type(m).__name__)
        prefix = len(roots) > 1
        for r, root in enumerate(roots):
            head = f"{type(root).__name__}{r}." if prefix else ""
            for name, p in root.named_parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append((head + name, p, p.requires_grad))
            for name, b in root.named_buffers():
                if id(b) not in seen:
                    seen.add(id(b))
                    out.append((head + name, b, False))
        for o, opt in enumerate(self.optimizers):
            for g, group in enumerate(opt.param_groups):
                for k, p in enumerate(group["params"]):
                    if id(p) not in seen:
                        seen.add(id(p))
                        out.append((f"optimizer{o}.group{g}.param{k}", p, True))
        return out

    def note_roles(self) -> None:
        """Name the storages of parameters, their ``.grad`` and optimizer state (first name wins)."""
        names: dict[int, str] = {}
        for name, p, trainable in self.named_params():
            names[id(p)] = name
            self._set_role(p, ("param:" if trainable else "buffer:") + name)
            if p.grad is not None:
                self._set_role(p.grad, "grad:" + name)
        for opt in self.optimizers:
            for p, state in opt.state.items():
                for key, v in state.items():
                    if isinstance(v, torch.Tensor):
                        self._set_role(v, f"state:{names.get(id(p), '?')}:{key}")

    def _set_role(self, t: torch.Tensor, role: str) -> None:
        i = self.sid(t)
        # a parameter first met through its optimizer is renamed once a forward shows its module
        if i is not None and (i not in self._role or ".group" in self._role[i] and ".group" not in role):
            self._role[i] = role

    # -- result ------------------------------------------------------------------------
    def close(self) -> None:
        self.note_roles()
        self._closed = True
        for f in self._finalizers:
            f.detach()

    def result(self) -> tuple[tuple[TraceOp, ...], dict[int, TraceStorage], tuple[TraceParam, ...]]:
        frees: dict[int, list[int]] = {}
        for i, k in self._free.items():
            frees.setdefault(k, []).append(i)
        # ops are recorded only when they touch the device; a death after an unrecorded op
        # belongs to the last recorded one before it
        ops = tuple(TraceOp(index=o.index, name=o.name, module=o.module, phase=o.phase, layer=o.layer,
                            flops=o.flops, outputs=o.outputs, allocs=o.allocs, inputs=o.inputs,
                            frees=tuple(sorted(frees.get(o.index, ()))), step=o.step) for o in self.ops)
        kinds = {"param": "param", "buffer": "buffer", "grad": "grad", "state": "state"}
        storages = {i: TraceStorage(id=i, nbytes=n, kind=kinds.get(self._role.get(i, "").split(":")[0], "op"),
                                    alloc_op=self._alloc[i], free_op=self._free.get(i, -1),
                                    role=self._role.get(i, "")) for i, n in enumerate(self._nbytes)}
        params = tuple(TraceParam(name=name, shape=tuple(p.shape), dtype=dtype_name(p.dtype),
                                  nbytes=p.numel() * p.element_size(), layer=layer_of(name), trainable=trainable,
                                  storage=st) for name, p, trainable in self.named_params()
                       if (st := self.sid(p)) is not None)
        return ops, storages, params
