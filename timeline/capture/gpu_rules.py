"""GPU behaviour a fake CPU run hides, restored op by op while a whole step is recorded.

Fake tensors are tensor *subclasses* on the *CPU*; PyTorch takes other paths for both, each
costing memory a GPU run never spends. Each rule names the source it restores:

- **gradient accumulation** (``torch/csrc/autograd/input_buffer.cpp`` ``accumulate``): when two
  gradients flow into one input, the engine adds in place (``old_var.add_(var)``) if grad mode is
  off and ``can_accumulate_inplace(old_var)`` — a plain dense tensor whose last reference, and its
  storage's, the buffer holds. Subclasses never qualify, so the capture sees ``old_var + var``.
  The use counts of the last-reference case are measured once per capture (two fresh products
  summed into one input) and compared with each accumulation's;
- **zero-filled backward formulas** (``torch/csrc/autograd/FunctionsManual.cpp``:
  ``gather_backward`` ``result.scatter_add_``, ``value_selecting_reduction_backward`` ``scatter_``,
  ``index_backward`` ``index_put_``, ``select_backward`` / ``slice_backward`` ``copy_`` into a view)
  fill the fresh zeros in place unless an argument ``areAnyTensorSubclassLike``: the capture records
  a second full-size tensor;
- **integer histc**: CUDA's kernel (``aten/src/ATen/native/cuda/SummaryOps.cu``) takes integer input
  and returns that dtype; the CPU one, and so the fake one, refuses it.

Nothing here records; :class:`~timeline.capture.step_recorder.StepRecorder` applies the rules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from timeline.spec.trace import TraceOp


def int_histc(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """histc of an integer tensor: count in float, the same bytes come out."""
    return torch.ops.aten.histc.default(x.float(), *args, **kwargs).to(x.dtype)


def _select_into(dest: torch.Tensor, src: torch.Tensor, dim: int, index: int) -> torch.Tensor:
    dest.select(dim, index).copy_(src)
    return dest


def _slice_into(dest: torch.Tensor, src: torch.Tensor, dim: int = 0, start: int | None = None,
                end: int | None = None, step: int = 1) -> torch.Tensor:
    torch.ops.aten.slice.Tensor(dest, dim, start, end, step).copy_(src)  # Tensor has no .slice method
    return dest


_aten = torch.ops.aten
#: out-of-place backward ops → what a GPU formula does instead on the zeros it just made
IN_PLACE: dict[Any, Any] = {
    _aten.scatter_add.default: _aten.scatter_add_.default, _aten.scatter.src: _aten.scatter_.src,
    _aten.scatter.value: _aten.scatter_.value, _aten.index_put.default: _aten.index_put_.default,
    _aten.index_add.default: _aten.index_add_.default, _aten.masked_scatter.default: _aten.masked_scatter_.default,
    _aten.select_scatter.default: _select_into, _aten.slice_scatter.default: _slice_into,
}
ZEROS = {"aten.new_zeros.default", "aten.zeros_like.default", "aten.zeros.default"}


def in_place_variant(func: Any, args: tuple, prev: TraceOp, sid: Callable[[torch.Tensor], int | None]) -> Any:
    """The in-place op a GPU backward formula runs instead of ``func``, when ``func`` writes into the
    zeros the previous recorded op ``prev`` just made; else None."""
    variant = IN_PLACE.get(func)
    if variant is None or not args or not isinstance(args[0], torch.Tensor):
        return None
    dest = sid(args[0])
    if dest is None or dest not in prev.allocs or prev.name not in ZEROS:
        return None
    return variant


def accumulation_counts(args: tuple) -> tuple[int, int] | None:
    """(tensor, storage) use counts of the first of two same-shaped gradients being summed, or None."""
    if len(args) != 2 or not all(isinstance(a, torch.Tensor) for a in args) or args[0].shape != args[1].shape:
        return None
    a = args[0]
    return a._use_count(), torch._C._storage_Use_Count(a.untyped_storage()._cdata)


def accumulates_in_place(args: tuple) -> bool:
    """The layout half of ``can_accumulate_inplace`` (the reference half is the caller's count check)."""
    from torch._prims_common import is_non_overlapping_and_dense_or_false

    a, b = args
    return is_non_overlapping_and_dense_or_false(a) and a.dtype == b.dtype
