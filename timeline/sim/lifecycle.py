"""When static state comes into being, per profile (DESIGN §5 lifecycle rules).

- ``megatron``: weights, the fp32 ``main_grad`` buffer and the fp32 master weights exist from
  the DDP wrap and the optimizer's construction (``distributed/param_and_grad_buffer.py``,
  ``optimizer/distrib_optimizer.py``); Adam's moments are created lazily by the first
  ``step()`` (``torch/optim/adam.py`` ``_init_group``). Gradient reduce-scatter and parameter
  all-gather work in place in those buffers, so the step allocates nothing else.
- ``paper``: all states counted from the start (the paper's static accounting).
- ``hf``: weights from model construction; ``.grad`` tensors at the first backward that
  reaches them; optimizer states at the first ``step()``.

Outside Megatron, ZeRO communication allocates (DeepSpeed ``runtime/zero/config.py``
defaults): with ZeRO-2/3 a contiguous gradient bucket of ``reduce_bucket_size`` = 5e8 elements
(capped at the device's parameters) exists from the first backward; with ZeRO-3 each action
gathers the full parameters of the layer it runs plus a prefetch of up to
``stage3_prefetch_bucket_size`` = 5e7 elements, released when the action ends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from timeline.graph.saved.megatron_workspaces import persistent_workspaces


@dataclass(frozen=True, slots=True)
class Lifecycle:
    grads_at: str  # "start" | "first_backward"
    master_at: str  # "start" | "first_step"
    moments_at: str  # "start" | "first_step"
    source: str
    reduce_bucket_elems: int = 0  # 0: reduce-scatter works in place (Megatron)
    prefetch_bucket_elems: int = 0
    #: without a distributed optimizer (zero = 0), master weights and Adam's moments are tensors per
    #: parameter, created in the optimizer's parameter order (else one block per kind)
    per_param_states: bool = False
    #: (run, holds_head=, has_moe=, tensors=) -> [(name, bytes, source, when)] of persistent workspaces
    workspaces: Callable[..., list[tuple[str, int, str]]] | None = None


LIFECYCLES: dict[str, Lifecycle] = {
    "megatron": Lifecycle("start", "start", "first_step",
                          "Megatron-Core param_and_grad_buffer.py, distrib_optimizer.py; torch Adam lazy state",
                          workspaces=persistent_workspaces, per_param_states=True),
    "paper": Lifecycle("start", "start", "start", "arXiv 2502.07846 §4 static accounting; DeepSpeed ZeRO buckets",
                       reduce_bucket_elems=500_000_000, prefetch_bucket_elems=50_000_000),
    "hf": Lifecycle("first_backward", "first_step", "first_step",
                    "PyTorch autograd .grad on first backward; torch.optim lazy state; DeepSpeed ZeRO buckets",
                    reduce_bucket_elems=500_000_000, prefetch_bucket_elems=50_000_000),
}
