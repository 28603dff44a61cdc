"""The CUDA stand-in: run a user's GPU training script on fake CPU tensors as if it had a GPU.

A user's ``--step`` function builds its model with ``device="cuda"`` / ``.cuda()`` / ``.to(device)``
and calls ``torch.cuda`` helpers. On the CPU-only capture:

- every tensor is a fake CPU tensor, but the stand-in remembers which storages live on *the
  device*: those a factory made with a ``cuda`` device, a ``.to("cuda")`` / ``.cuda()`` copy, and
  every output of an op that reads a device tensor (PyTorch puts an op's result on its
  inputs' device; CPU scalars mix with CUDA tensors). Everything else is host memory, which a
  GPU's allocator never sees (the optimizer's ``step`` counters, a CPU-built RoPE cache before
  ``model.to``);
- ``tensor.device`` / ``.is_cuda`` read by user code report ``cuda:0`` for device tensors, so
  ``device=x.device`` in the step stays on the device; torch's own kernels and the fake mode
  keep seeing ``cpu`` (they run inside a call, where the stand-in steps aside);
- ``torch.cuda`` memory, statistics, seeding, NVTX and synchronisation calls are no-ops
  (``is_available()`` is true); events, streams, device properties, RNG state, pinned memory and
  ``torch.compile`` are served by :mod:`timeline.capture.cuda_api`; any other CUDA-only call fails
  as it would without a GPU and the capture turns that into one line naming the call;
- ``torch.set_default_device("cuda")`` and ``torch.set_default_tensor_type(torch.cuda.HalfTensor)`` make a
  factory without a device a device one (and the legacy type its dtype the default, restored after);
  ``nn.DataParallel`` on its one device calls its module (``forward`` with one device id, after a scatter
  that is a view); ``torch.distributions`` skip argument validation, which reads values (a note);
- a layer's call (``linear``, ``conv*``, ``embedding``, norms, ``matmul``) with tensors on the device and in
  host memory raises as PyTorch does on a GPU ("Expected all tensors to be on the same device"): a model left
  on the CPU fed a device batch is the user's bug, not a trace.

It records nothing itself (:mod:`timeline.capture.step` asks it which storages are device ones).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.autograd.graph import Node
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from timeline.capture import cuda_api

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")

#: torch.cuda calls that change nothing a memory trace sees: (name, value returned)
NO_OPS: tuple[tuple[str, Any], ...] = (
    ("synchronize", None), ("empty_cache", None), ("reset_peak_memory_stats", None),
    ("reset_max_memory_allocated", None), ("reset_accumulated_memory_stats", None),
    ("memory_allocated", 0), ("max_memory_allocated", 0), ("memory_reserved", 0), ("max_memory_reserved", 0),
    ("memory_stats", {}), ("memory_summary", ""), ("is_available", True), ("device_count", 1),
    ("current_device", 0), ("set_device", None), ("manual_seed", None), ("manual_seed_all", None),
    ("seed", None), ("seed_all", None), ("is_bf16_supported", True), ("get_device_name", "fake GPU (timeline)"),
    ("get_device_capability", (9, 0)), ("init", None), ("is_initialized", True),
)
MEMORY_NO_OPS = ("_record_memory_history", "_dump_snapshot")
NVTX_NO_OPS = ("range_push", "range_pop", "mark")


def _is_cuda(device: Any) -> bool:
    if device is None:
        return False
    if isinstance(device, int):
        return True  # a bare index names a CUDA device in torch's API
    return torch.device(device).type == "cuda"


class StandIn(TorchFunctionMode):
    """Maps CUDA devices to the fake CPU and tracks which storages are device storages."""

    def __init__(self) -> None:
        super().__init__()
        self.device_storages: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.depth = 0  # > 0 while torch code runs (a call, a dispatch): it sees the real cpu device
        self.force: bool | None = None  # True: new storages of this call are device ones; False: host
        self.on_nodes: Any = None  # called with the autograd nodes each user-level call creates
        # nodes take no weak references: held (by id) until the backward that runs them ends
        self._nodes: dict[int, Any] = {}
        self.notes = cuda_api.Notes()  # what the capture served differently from a GPU, a line each
        #: torch.set_default_device("cuda") / set_default_tensor_type(torch.cuda.*Tensor): factories without a
        #: device make device tensors (PyTorch's DeviceContext sits below this mode, so it is served here)
        self.default_cuda = False

    # -- what lives on the device ------------------------------------------------------
    def is_device(self, t: torch.Tensor) -> bool:
        return t.untyped_storage() in self.device_storages

    def mark(self, t: torch.Tensor) -> None:
        self.device_storages[t.untyped_storage()] = True

    def user_view(self) -> bool:
        return self.depth == 0

    # -- calls ---------------------------------------------------------------------------
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if self.depth == 0:
            # the C property's getter: the stubs type ``Tensor.is_cuda`` as a plain bool
            if func is torch.Tensor.is_cuda.__get__:  # type: ignore[attr-defined]
                return self.is_device(args[0])
            if func in (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu):
                return self._to(func, args, kwargs)
        force = None
        dev = kwargs.get("device")
        if self.depth == 0 and func in WEIGHTED:
            _same_place(self, args, kwargs)
        if dev is None and self.default_cuda and func in _constructors():
            kwargs["device"], force = CPU, True
        elif dev is not None and not isinstance(dev, torch.Tensor):
            if _is_cuda(dev):
                kwargs["device"], force = CPU, True
        elif self.depth == 0 and self._reads_device(args, kwargs):
            # a call on device tensors makes its tensors there, the ones its C++ body creates from
            # an input's options too (``where(cond, x, scalar)``'s ``scalar_tensor``)
            force = True
        out = self._call(func, args, kwargs, force)
        if self.depth == 0 and self.on_nodes is not None and torch.is_grad_enabled():
            self._new_nodes(out)
        return out

    def _reads_device(self, args: Any, kwargs: dict) -> bool:
        from torch.utils._pytree import tree_flatten

        return any(isinstance(t, torch.Tensor) and self.is_device(t) for t in tree_flatten((args, kwargs))[0])

    def _new_nodes(self, out: Any) -> None:
        """Hand autograd nodes made by a user-level call to ``on_nodes`` (each once)."""
        from torch.utils._pytree import tree_flatten

        todo: list[Node | None] = [t.grad_fn for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        fresh: list[Node] = []
        while todo:
            node = todo.pop()
            if node is None or id(node) in self._nodes:
                continue
            self._nodes[id(node)] = node
            fresh.append(node)
            todo.extend(n for n, _ in node.next_functions)
        if fresh:
            self.on_nodes(fresh)

    def forget_nodes(self) -> None:
        self._nodes.clear()

    def _call(self, func: Any, args: tuple, kwargs: dict, force: bool | None) -> Any:
        saved, self.force = self.force, force if force is not None else self.force
        self.depth += 1
        try:
            return func(*args, **kwargs)
        finally:
            self.depth -= 1
            self.force = saved

    def _to(self, func: Any, args: tuple, kwargs: dict) -> Any:
        t = args[0]
        if func is torch.Tensor.cuda:
            target, dtype, copy = CUDA, None, False
        elif func is torch.Tensor.cpu:
            target, dtype, copy = CPU, None, False
        else:
            copy = bool(kwargs.pop("copy", False))
            kwargs.pop("non_blocking", None)
            target, dtype, _, memory_format = torch._C._nn._parse_to(*args[1:], **kwargs)
            other = args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) else kwargs.get("other")
            if isinstance(other, torch.Tensor):  # x.to(y): y's place, as the stand-in knows it
                target = CUDA if self.is_device(other) else CPU
            if memory_format is not None:
                kwargs = {"memory_format": memory_format}
            else:
                kwargs = {}
        here = self.is_device(t)
        if target is None or _is_cuda(target) == here:  # same place: a dtype change or nothing
            call = {"dtype": dtype} if dtype is not None else {}
            return self._call(torch.Tensor.to, (t,), {**call, **kwargs, "copy": copy}, None)
        call = {"dtype": dtype} if dtype is not None else {}
        return self._call(torch.Tensor.to, (t, CPU), {**call, **kwargs, "copy": True}, _is_cuda(target))


def _constructors() -> Any:
    """The factory functions PyTorch's default device applies to (``torch.utils._device``)."""
    from torch.utils._device import _device_constructors

    return _device_constructors()


#: calls that take a layer's weights with its input: PyTorch refuses tensors on two devices in them ("Expected all
#: tensors to be on the same device"); on the fake CPU both would run, so the stand-in says it as a GPU would
WEIGHTED = frozenset({
    torch.nn.functional.linear, torch.nn.functional.bilinear, torch.nn.functional.embedding,
    torch.nn.functional.conv1d, torch.nn.functional.conv2d, torch.nn.functional.conv3d,
    torch.nn.functional.conv_transpose1d, torch.nn.functional.conv_transpose2d, torch.nn.functional.conv_transpose3d,
    torch.nn.functional.layer_norm, torch.nn.functional.group_norm, torch.nn.functional.batch_norm,
    torch.matmul, torch.mm, torch.bmm, torch.addmm, torch.baddbmm, torch.Tensor.matmul, torch.Tensor.__matmul__,
    torch.Tensor.mm, torch.Tensor.bmm,
})


def _same_place(mode: StandIn, args: tuple, kwargs: dict) -> None:
    """Raise as PyTorch does on a GPU when a layer's tensors (not 0-dim scalars) sit on the device and in host
    memory: a model left on the CPU fed a device batch."""
    from torch.utils._pytree import tree_flatten

    places = {mode.is_device(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.dim()}
    if len(places) > 1:
        raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and "
                           "cpu! (a module or tensor left in host memory meets device tensors)")


#: torch.cuda's legacy tensor types → their dtype (``torch.set_default_tensor_type(torch.cuda.HalfTensor)``)
CUDA_TENSOR_TYPES = {"torch.cuda.HalfTensor": torch.float16, "torch.cuda.BFloat16Tensor": torch.bfloat16,
                     "torch.cuda.FloatTensor": torch.float32, "torch.cuda.DoubleTensor": torch.float64}


class _NoRange(contextlib.ContextDecorator):
    """``torch.cuda.nvtx.range(msg)`` as a context manager or decorator that marks nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


@contextlib.contextmanager
def cuda_stand_in() -> Iterator[StandIn]:
    """Activate the stand-in: the function mode, the ``.device`` view and the ``torch.cuda`` no-ops."""
    from torch._subclasses.fake_tensor import FakeTensor

    mode = StandIn()
    real_device = FakeTensor.device

    def device(self: FakeTensor) -> torch.device:
        d = real_device.fget(self)  # type: ignore[attr-defined]  # FakeTensor.device is a property
        if mode.user_view() and not self.fake_mode.in_kernel_invocation and mode.is_device(self):
            return CUDA
        return d

    real_swap = torch.utils.swap_tensors

    def swap(t1: torch.Tensor, t2: torch.Tensor) -> None:
        # Module.to / .cuda() swap a fake parameter for its converted copy, which the fake mode's
        # own weak reference forbids; moving the data in (what `param.data = new` does) is the
        # same for memory: the parameter object stays, its storage is the copy's
        if isinstance(t1, FakeTensor) and isinstance(t2, FakeTensor):
            with torch.no_grad():
                t1.data = t2
            return
        real_swap(t1, t2)

    base = torch._C.TensorBase

    def plain_device(self: torch.Tensor) -> torch.device:  # real tensors (the ground-truth runs)
        if mode.user_view() and mode.is_device(self):
            return CUDA
        return base.device.__get__(self)

    def is_cuda(self: torch.Tensor) -> bool:
        # the C property's getter: the stubs type ``TensorBase.is_cuda`` as a plain bool
        return mode.is_device(self) if mode.user_view() else base.is_cuda.__get__(self)  # type: ignore[attr-defined]

    patches: list[tuple[object, str, object]] = [(FakeTensor, "device", property(device)),
                                                 (torch.Tensor, "device", property(plain_device)),
                                                 (torch.Tensor, "is_cuda", property(is_cuda)),
                                                 (torch.utils, "swap_tensors", swap)]
    for name, value in NO_OPS:
        patches.append((torch.cuda, name, (lambda v: lambda *a, **k: v)(value)))
    patches += [(torch.cuda.memory, name, lambda *a, **k: None) for name in MEMORY_NO_OPS]
    patches += [(torch.cuda.nvtx, name, lambda *a, **k: None) for name in NVTX_NO_OPS]
    patches.append((torch.cuda.nvtx, "range", _NoRange))
    patches += cuda_api.patches(mode.notes)
    real_default_device, real_get_default, real_tensor_type = (torch.set_default_device, torch.get_default_device,
                                                               torch.set_default_tensor_type)

    def set_default_device(device: Any) -> None:
        mode.default_cuda = device is not None and _is_cuda(device)
        real_default_device(None if mode.default_cuda else device)

    def get_default_device() -> torch.device:
        return CUDA if mode.default_cuda else real_get_default()

    def set_default_tensor_type(t: Any) -> None:
        name = t if isinstance(t, str) else f"{getattr(t, '__module__', '')}.{getattr(t, '__name__', '')}"
        if name in CUDA_TENSOR_TYPES:  # llama's generation.py: torch.set_default_tensor_type(torch.cuda.HalfTensor)
            torch.set_default_dtype(CUDA_TENSOR_TYPES[name])
            mode.default_cuda = True
            return
        mode.default_cuda = False
        real_tensor_type(t)

    real_dp_forward = torch.nn.DataParallel.forward

    def dp_forward(self: torch.nn.DataParallel, *inputs: Any, **kwargs: Any) -> Any:
        # one device (the stand-in has one): DataParallel scatters to device 0 (a view of what is already there) and
        # calls its module (torch/nn/parallel/data_parallel.py: forward, len(device_ids) == 1)
        if len(self.device_ids) <= 1:
            return self.module(*inputs, **kwargs)
        return real_dp_forward(self, *inputs, **kwargs)

    real_dist_init = torch.distributions.Distribution.__init__

    def dist_init(self: Any, batch_shape: Any = None, event_shape: Any = None,
                  validate_args: bool | None = None) -> None:
        # argument validation compares tensor values, which fake tensors do not hold: off (memory holds the same)
        if validate_args is not False:
            mode.notes.add("torch.distributions: argument validation is off (it reads tensor values, which fake "
                           "tensors do not hold); its small boolean checks are not in the trace")
        real_dist_init(self, torch.Size() if batch_shape is None else batch_shape,
                       torch.Size() if event_shape is None else event_shape, validate_args=False)

    patches += [(torch, "set_default_device", set_default_device), (torch, "get_default_device", get_default_device),
                (torch, "set_default_tensor_type", set_default_tensor_type),
                (torch.nn.DataParallel, "forward", dp_forward),
                (torch.distributions.Distribution, "__init__", dist_init)]
    missing = object()
    dtype = torch.get_default_dtype()
    saved = [(obj, name, obj.__dict__.get(name, missing) if isinstance(obj, type) else getattr(obj, name))
             for obj, name, _ in patches]
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        with mode:
            yield mode
    finally:
        for obj, name, value in saved:
            if value is missing:
                delattr(obj, name)  # an inherited attribute (torch.Tensor.device is TensorBase's)
            else:
                setattr(obj, name, value)
        torch.set_default_dtype(dtype)  # a default tensor type the step set
        if mode.default_cuda:
            real_default_device(None)
