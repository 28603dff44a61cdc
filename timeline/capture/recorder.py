"""The recorder: every aten op of one forward + backward, with the storages it makes, reads and frees.

A :class:`Recorder` is a ``TorchDispatchMode`` (it sees each aten op after autograd), combined with
``saved_tensors_hooks`` (what autograd keeps for backward), ``ModTracker`` (which module runs an op,
forward and backward) and weakref finalizers on storages (when each one dies). Storages are keyed
by their ``UntypedStorage`` object (views share it), so bytes are counted once per storage, as the
CUDA caching allocator and ``MemTracker`` count them. Decoder layers (``…layers.N``, ``…h.N``,
``…blocks.N``) get hooks recording the hidden states that cross their boundary and the gradients
of those.

It does not choose kernels (see :mod:`timeline.capture.gpu`) nor build models (see
:mod:`timeline.capture.run`); it only watches.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.graph import Node
from torch.distributed._tools.mod_tracker import ModTracker
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry
from torch.utils.weak import WeakIdKeyDictionary

from timeline.spec.trace import TraceLayer, TraceOp, TraceParam, TraceStorage, TraceTensor

#: module paths of decoder layers: the repeated blocks of a model
LAYER_RE = re.compile(r"(?:^|\.)(?:layers|h|blocks|block)\.(\d+)$")
_IN_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|h|blocks|block)\.(\d+)(?:\.|$)")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def layer_of(path: str) -> int:
    m = _IN_LAYER_RE.search(path)
    return int(m.group(1)) if m else -1


class NodeLabels(TorchFunctionMode):
    """Labels each autograd node with the module whose forward created it.

    ``ModTracker``'s module boundaries in backward come from gradient hooks and drift by a few
    ops; the node being executed (``torch._C._current_autograd_node``) is exact. Runs above
    autograd, so the outputs of each torch call already carry their ``grad_fn``; the walk back
    stops at nodes labelled earlier, so each node is visited once.
    """

    def __init__(self, module_fn: Callable[[], str]) -> None:
        super().__init__()
        self.module_fn = module_fn
        self.labels: dict[Any, str] = {}

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if torch.is_grad_enabled():
            todo: list[Node | None] = [t.grad_fn for t in tree_flatten(out)[0]
                                       if isinstance(t, torch.Tensor) and t.grad_fn]
            if todo:
                module = self.module_fn()
                while todo:
                    node = todo.pop()
                    if node is None or node in self.labels:
                        continue
                    self.labels[node] = module
                    todo.extend(n for n, _ in node.next_functions)
        return out

    def module_of_current_node(self) -> str | None:
        node = torch._C._current_autograd_node()
        return None if node is None else self.labels.get(node)


class Recorder(TorchDispatchMode):
    """Records ops while active; ``phase`` ("F"/"B") is set by the driver around forward/backward."""

    def __init__(self, tracker: ModTracker) -> None:
        super().__init__()
        self.tracker = tracker
        self.phase = "F"
        self.recording = True
        self.ops: list[TraceOp] = []
        self._ids: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._nbytes: list[int] = []
        self._kind: list[str] = []
        self._alloc: dict[int, int] = {}
        self._free: dict[int, int] = {}
        self._saved: dict[int, str] = {}
        self._saves_at: dict[int, list[int]] = {}
        self._closed = False
        self._finalizers: list[weakref.finalize] = []
        self.params: list[TraceParam] = []
        self.layers: dict[int, dict[str, Any]] = {}
        self._handles: list[Any] = []
        self._root = ""
        self.nodes = NodeLabels(self.module)
        self._last_bw_module = ""

    # -- storages ---------------------------------------------------------------------------
    def sid(self, t: torch.Tensor, kind: str = "external") -> int:
        """The id of ``t``'s storage, registering it (as ``kind``) on first sight."""
        st = t.untyped_storage()
        i = self._ids.get(st)
        if i is None:
            i = len(self._nbytes)
            self._ids[st] = i
            self._nbytes.append(st.nbytes())
            self._kind.append(kind)
            self._finalizers.append(weakref.finalize(st, self._died, i))
        return i

    def known(self, t: torch.Tensor) -> bool:
        return t.untyped_storage() in self._ids

    def _died(self, i: int) -> None:
        if not self._closed and i not in self._free:
            self._free[i] = len(self.ops) - 1

    def register_model(self, model: torch.nn.Module, inputs: list[torch.Tensor]) -> None:
        """Parameters, buffers and inputs exist before the first op; decoder layers get boundary hooks."""
        self._root = type(model).__name__ + "."
        for name, p in model.named_parameters():
            self.params.append(TraceParam(name=name, shape=tuple(p.shape), dtype=dtype_name(p.dtype),
                                          nbytes=p.numel() * p.element_size(), layer=layer_of(name),
                                          trainable=p.requires_grad, storage=self.sid(p, "param")))
        for name, b in model.named_buffers():
            self.params.append(TraceParam(name=name, shape=tuple(b.shape), dtype=dtype_name(b.dtype),
                                          nbytes=b.numel() * b.element_size(), layer=layer_of(name),
                                          trainable=False, storage=self.sid(b, "buffer")))
        for t in inputs:
            self.sid(t, "input")
        for name, mod in model.named_modules():
            m = LAYER_RE.search(name)
            if m:
                self._hook_layer(int(m.group(1)), name, mod)

    def register_grads(self, model: torch.nn.Module) -> None:
        for p in model.parameters():
            if p.grad is not None:
                self.sid(p.grad, "grad")

    def _hook_layer(self, index: int, name: str, mod: torch.nn.Module) -> None:
        entry = self.layers.setdefault(index, {"module": name, "hidden_in": -1, "hidden_out": -1,
                                               "grad_in": -1, "grad_out": -1})

        def grad_hook(key: str) -> Callable[[torch.Tensor], None]:
            def hook(g: torch.Tensor) -> None:
                if entry[key] < 0:
                    entry[key] = self.sid(g)
            return hook

        def pre(_mod: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            x = args[0] if args else kwargs.get("hidden_states")
            if isinstance(x, torch.Tensor) and entry["hidden_in"] < 0:
                entry["hidden_in"] = self.sid(x)
                if x.requires_grad:
                    x.register_hook(grad_hook("grad_in"))

        def post(_mod: torch.nn.Module, _args: tuple, _kwargs: dict, out: Any) -> None:
            y = out if isinstance(out, torch.Tensor) else next(
                (t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)), None)
            if y is not None and entry["hidden_out"] < 0:
                entry["hidden_out"] = self.sid(y)
                if y.requires_grad:
                    y.register_hook(grad_hook("grad_out"))

        self._handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        self._handles.append(mod.register_forward_hook(post, with_kwargs=True))

    # -- saved tensors ----------------------------------------------------------------------
    def pack(self, t: torch.Tensor) -> torch.Tensor:
        i = self.sid(t)
        if self._kind[i] == "op" and i not in self._saved:
            self._saved[i] = self.module()
            self._saves_at.setdefault(max(len(self.ops) - 1, 0), []).append(i)
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    # -- ops --------------------------------------------------------------------------------
    def module(self) -> str:
        """The deepest module running, as seen from the decoder layer running it: a submodule
        shared by every layer (one rotary embedding registered in each attention) has a single
        name in ``ModTracker``, one layer's, so its path is re-rooted under the active layer."""
        paths = [p.removeprefix(self._root) for p in self.tracker.parents if p not in ("Global", self._root[:-1])]
        best = max(paths, key=lambda p: (p.count("."), len(p)), default="")
        layers = [p for p in paths if (lm := LAYER_RE.search(p)) and not _IN_LAYER_RE.search(p[:lm.start()])]
        if not layers or layer_of(best) < 0:
            return best
        active = max(layers, key=len)
        if best.startswith(active + ".") or best == active:
            return best
        m = _IN_LAYER_RE.search(best)
        return active + best[m.end() - 1:] if m and best[m.end() - 1:m.end()] == "." else best

    def op_module(self) -> str:
        """The forward module, or in backward the forward module of the autograd node running."""
        if self.phase == "F":
            return self.module()
        m = self.nodes.module_of_current_node()
        if m is not None:
            self._last_bw_module = m
        return self._last_bw_module

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if not self.recording or func.namespace == "prim":  # prim.device & co: metadata queries
            return func(*args, **kwargs)
        flat_in = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        inputs = list(dict.fromkeys(self.sid(t) for t in flat_in))
        out = func(*args, **kwargs)
        index = len(self.ops)
        outputs, allocs = [], []
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            new = not self.known(t)
            i = self.sid(t, "op")
            if new:
                self._alloc[i] = index
                allocs.append(i)
            outputs.append(TraceTensor(storage=i, shape=tuple(int(d) for d in t.shape),
                                       dtype=dtype_name(t.dtype), nbytes=t.numel() * t.element_size()))
        module = self.op_module()
        self.ops.append(TraceOp(index=index, name=str(func), module=module, phase=self.phase,
                                layer=layer_of(module), flops=_flops(func, args, kwargs, out),
                                outputs=tuple(outputs), allocs=tuple(allocs), inputs=tuple(inputs), frees=()))
        return out

    # -- result -----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop recording deaths (what is alive now stays alive) and remove the layer hooks."""
        self._closed = True
        for h in self._handles:
            h.remove()
        self.nodes.labels.clear()
        for f in self._finalizers:
            f.detach()

    def result(self) -> tuple[tuple[TraceOp, ...], dict[int, TraceStorage], tuple[TraceParam, ...],
                              tuple[TraceLayer, ...]]:
        frees: dict[int, list[int]] = {}
        for i, k in self._free.items():
            if k >= 0:
                frees.setdefault(k, []).append(i)
        ops = tuple(TraceOp(index=o.index, name=o.name, module=o.module, phase=o.phase, layer=o.layer,
                            flops=o.flops, outputs=o.outputs, allocs=o.allocs, inputs=o.inputs,
                            frees=tuple(sorted(frees.get(o.index, ()))),
                            saves=tuple(self._saves_at.get(o.index, ())))
                    for o in self.ops)
        storages = {i: TraceStorage(id=i, nbytes=n, kind=self._kind[i], alloc_op=self._alloc.get(i, -1),
                                    free_op=self._free.get(i, -1), saved=i in self._saved,
                                    saved_by=self._saved.get(i, ""))
                    for i, n in enumerate(self._nbytes)}
        layers = tuple(TraceLayer(index=k, **v) for k, v in sorted(self.layers.items()))
        return ops, storages, tuple(self.params), layers


def _flops(func: Any, args: tuple, kwargs: dict, out: Any) -> float:
    fn = flop_registry.get(func._overloadpacket)
    if fn is None:
        return 0.0
    try:
        return float(fn(*args, **kwargs, out_val=out))
    except Exception:  # a counter that cannot read these arguments: FLOPs unknown
        return 0.0
