"""TensorDef and the memory categories: the vocabulary every later layer speaks.

A :class:`TensorDef` is one tensor *as one device holds it* (after tensor, expert and
pipeline parallelism), with the category it is accounted under. Shapes are per device;
``split`` says into how many tensor-parallel shards the full tensor was cut, so sums over
devices can be checked against the unsharded model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from timeline.spec.fields import DTYPE_BYTES as DTYPE_BYTES  # bytes per element, defined with the dtypes


class Category(StrEnum):
    """What a byte of device memory is for (DESIGN §4). Fragmentation is not a category."""

    WEIGHTS = "weights"
    GRADS = "grads"
    OPTIMIZER = "optimizer"  # master weights and moments
    ACTIVATIONS = "activations"  # saved for backward
    RECOMPUTE = "recompute"  # re-created by recomputation
    COMM = "comm"  # collective and P2P buffers
    TEMPORARY = "temporary"  # transient intermediates, activation gradients, workspaces


CATEGORIES: tuple[str, ...] = tuple(c.value for c in Category)


#: module tags static memory is reported by
MODULES: tuple[str, ...] = ("embedding", "attention", "norm", "mlp", "moe", "head", "mtp", "mamba")


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorDef:
    name: str
    shape: tuple[int, ...]
    dtype: str
    category: Category
    module: str
    storage: str
    split: int = 1  # tensor-parallel shards of the full tensor (1 = replicated)
    expert: bool = False  # a routed expert's parameter: its states shard over EDP
    trainable: bool = True  # False for buffers (e.g. DeepSeek-V3's router score bias)
    in_moe: bool = False  # part of an MoE block (router, shared or routed experts)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def size_bytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


def param(name: str, full_shape: tuple[int, ...], *, module: str, dtype: str, split: int = 1,
          dim: int = 0, expert: bool = False, trainable: bool = True, in_moe: bool = False) -> TensorDef:
    """A parameter TensorDef, cut into ``split`` shards along ``dim`` (exact division required)."""
    shape = list(full_shape)
    if split > 1:
        if shape[dim] % split:
            raise ValueError(f"{name}: dim {dim} of {full_shape} not divisible by {split}")
        shape[dim] //= split
    return TensorDef(name=name, shape=tuple(shape), dtype=dtype, category=Category.WEIGHTS, module=module,
                     storage=name, split=split, expert=expert, trainable=trainable, in_moe=in_moe)
