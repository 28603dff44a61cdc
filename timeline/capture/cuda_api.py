"""What a training script asks ``torch.cuda`` for, served on the fake device (part of the CUDA stand-in).

A user's script times its step with CUDA events, moves work to side streams, reads the device's
properties and RNG state (``torch.utils.checkpoint`` does, to replay dropout), pins host batches,
scales fp16 losses with ``GradScaler`` and wraps its model in ``torch.compile``. On a CPU-only build
each of these fails; here each gets the stand-in's answer:

- ``Event``: records and waits do nothing; ``elapsed_time`` is 0.0 (no kernel ran).
- ``Stream``: one object per call; ``with torch.cuda.stream(s)`` runs its ops in program order on the
  one recorded stream (PyTorch keeps a pool per stream; a side stream's blocks are not set apart —
  :attr:`Notes` says so once).
- ``get_device_properties`` / ``mem_get_info``: :data:`PROPERTIES`, an sm90 device of 80 GiB, the
  capability ``get_device_capability`` already reports (what a script reads to size its batch or
  pick a kernel; the simulated capacity is the run file's ``[hardware]``, not this).
- RNG state: a 16-byte host tensor (a CUDA generator's state: seed and Philox offset, both 64-bit;
  ``aten/src/ATen/cuda/CUDAGeneratorImpl.cpp: CUDAGeneratorImpl::get_state``); setting it changes
  nothing a memory trace sees.
- ``Tensor.pin_memory`` returns the tensor (pinned memory is host memory, which a GPU's allocator
  never sees); ``Tensor.record_stream`` does nothing (one stream).
- ``torch.accelerator`` (what Accelerate and the optimizers' graph-capture check ask) names the fake
  CUDA device and answers as ``torch.cuda`` does here.
- ``torch.compile`` / ``Module.compile`` return what they were given: the step is captured eager,
  which holds at least what Inductor's fused kernels hold (a note says so once).
- ``torch.cuda.graph`` / ``CUDAGraph`` / ``make_graphed_callables`` stay refused: a captured graph's
  private memory pool is not modelled.

It records nothing and prints nothing: notes go to :class:`Notes`, which the capture hands on.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

FAKE_NAME = "fake GPU (timeline)"
FAKE_TOTAL_BYTES = 80 * 2**30


@dataclass(frozen=True, slots=True)
class DeviceProperties:
    """The fields of ``torch.cuda.get_device_properties`` that scripts read (``_CudaDeviceProperties``)."""

    name: str = FAKE_NAME
    major: int = 9
    minor: int = 0
    total_memory: int = FAKE_TOTAL_BYTES
    multi_processor_count: int = 132  # an H100 SXM5's SMs (NVIDIA H100 Tensor Core GPU Architecture, 2022)
    is_integrated: int = 0
    is_multi_gpu_board: int = 0
    max_threads_per_multi_processor: int = 2048
    max_threads_per_block: int = 1024
    warp_size: int = 32
    regs_per_multiprocessor: int = 65536
    shared_memory_per_block: int = 48 * 1024
    shared_memory_per_block_optin: int = 227 * 1024
    shared_memory_per_multiprocessor: int = 228 * 1024
    L2_cache_size: int = 50 * 2**20
    gcnArchName: str = ""
    uuid: str = "00000000-0000-0000-0000-000000000000"
    pci_bus_id: int = 0
    pci_device_id: int = 0
    pci_domain_id: int = 0


PROPERTIES = DeviceProperties()


@dataclass
class Notes:
    """One line per kind of thing the capture served differently from a GPU (each said once)."""

    lines: list[str] = field(default_factory=list)

    def add(self, line: str) -> None:
        if line not in self.lines:
            self.lines.append(line)


def user_frame() -> str:
    """``file:line`` of the innermost frame outside torch and timeline (the user's code), or ""."""
    for f in reversed(traceback.extract_stack()):
        path = f.filename.replace("\\", "/")
        if "/torch/" in path or "/timeline/" in path or path.startswith("<"):
            continue
        return f"{path.rsplit('/', 1)[-1]}:{f.lineno}"
    return ""


class Event:
    """``torch.cuda.Event`` on the fake device: nothing is timed, nothing waits."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 external: bool = False) -> None:
        self.enable_timing = enable_timing

    def record(self, stream: Any = None) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end_event: Any) -> float:
        return 0.0


class Stream:
    """``torch.cuda.Stream`` on the fake device (its work is recorded on the one stream)."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.priority = priority
        self.device = torch.device("cuda", 0)
        self.cuda_stream = 0
        self.device_index = 0
        self.device_type = 1  # c10::DeviceType::CUDA

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> Event:
        return event if event is not None else Event()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:  # torch.accelerator's stream API (no CUDA graph is ever being captured)
        return False

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class _Device(contextlib.ContextDecorator):
    """``torch.cuda.device(i)`` / ``device_of(t)``: the one device is always current."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.idx = 0

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def patches(notes: Notes) -> list[tuple[object, str, object]]:
    """(object, attribute, value) for everything above; the stand-in applies and restores them."""
    default = Stream()
    current = [default]

    @contextlib.contextmanager
    def stream(s: Any) -> Iterator[Any]:
        if s is not None and s is not default:
            notes.add("torch.cuda.stream: side-stream work is captured on the one stream (its blocks are not "
                      "kept in a pool of their own, as PyTorch's allocator keeps them per stream)")
        outer = current[0]
        current[0] = s if s is not None else outer
        try:
            yield s
        finally:
            current[0] = outer

    def set_stream(s: Any) -> None:
        current[0] = s if s is not None else default

    def rng_state(device: Any = "cuda") -> torch.Tensor:
        # a host ByteTensor, as on a GPU (the generator's state is read back to the CPU)
        return torch.zeros(16, dtype=torch.uint8)

    def compile_(model: Any = None, **kwargs: Any) -> Any:
        notes.add("torch.compile: the step is captured eager (Inductor's fused kernels may keep fewer "
                  "intermediates; not modelled)")
        if model is None:  # @torch.compile(mode=...) on a function
            return lambda fn: fn
        return model

    def module_compile(self: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        compile_(self)

    def keep(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    def constant(value: Any) -> Callable[..., Any]:
        return lambda *args, **kwargs: value

    cuda = torch.cuda
    out: list[tuple[object, str, object]] = [
        (cuda, "Event", Event), (cuda, "Stream", Stream), (cuda, "stream", stream),
        (cuda, "current_stream", lambda device=None: current[0]),
        (cuda, "default_stream", lambda device=None: default), (cuda, "set_stream", set_stream),
        (cuda, "device", _Device), (cuda, "device_of", _Device),
        (cuda, "get_device_properties", constant(PROPERTIES)),
        (cuda, "mem_get_info", constant((FAKE_TOTAL_BYTES, FAKE_TOTAL_BYTES))),
        (cuda.memory, "mem_get_info", constant((FAKE_TOTAL_BYTES, FAKE_TOTAL_BYTES))),
        (cuda.memory, "set_per_process_memory_fraction", nothing),
        (cuda, "set_per_process_memory_fraction", nothing),
        (cuda, "get_rng_state", rng_state), (cuda, "set_rng_state", nothing),
        (cuda, "get_rng_state_all", lambda: [rng_state()]), (cuda, "set_rng_state_all", nothing),
        (cuda, "initial_seed", constant(0)), (cuda, "ipc_collect", nothing),
        (cuda, "get_arch_list", constant(["sm_90"])), (cuda, "utilization", constant(0)),
        (cuda, "get_sync_debug_mode", constant(0)), (cuda, "set_sync_debug_mode", nothing),
        (torch.Tensor, "pin_memory", keep), (torch.Tensor, "record_stream", nothing),
        (torch, "compile", compile_), (torch.nn.Module, "compile", module_compile),
        (cuda, "is_current_stream_capturing", constant(False)),
    ]
    # torch.accelerator, the device-generic API Accelerate and the optimizers' capture health check use:
    # the accelerator is the fake CUDA device, answering as torch.cuda does above
    acc = torch.accelerator
    memory_reads = ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved")
    out += [(acc, "current_accelerator", lambda check_available=False: torch.device("cuda")),
            (acc, "is_available", constant(True)), (acc, "device_count", constant(1)),
            (acc, "current_device_index", constant(0)), (acc, "current_device_idx", constant(0)),
            (acc, "set_device_index", nothing), (acc, "set_device_idx", nothing),
            (acc, "current_stream", lambda device=None: current[0]), (acc, "set_stream", set_stream),
            (acc, "synchronize", nothing), (acc, "device_index", _Device),
            (acc, "get_device_capability", constant({"major": PROPERTIES.major, "minor": PROPERTIES.minor})),
            (acc, "get_memory_info", constant((FAKE_TOTAL_BYTES, FAKE_TOTAL_BYTES))),
            (acc, "empty_cache", nothing), (acc, "reset_peak_memory_stats", nothing),
            (acc, "reset_accumulated_memory_stats", nothing), (acc, "memory_stats", constant({}))]
    out += [(acc, name, constant(0)) for name in memory_reads]
    return out
