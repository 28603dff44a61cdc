"""What an optimizer step allocates and frees within itself, beyond the states it keeps (those are
:mod:`timeline.sim.megatron_state`'s): a sequence of (name, bytes, +1 alloc / −1 free) that every step of the
``megatron`` profile runs from its start, in order (:func:`timeline.sim.expand.device_events`).

- **SGD's decayed gradients.** torch's ``_multi_tensor_sgd`` (``torch/optim/sgd.py``, 2.x: the foreach path
  ``torch.optim.SGD`` takes for CUDA tensors) runs per parameter group; where the group's ``weight_decay`` is
  not 0 it makes ``device_grads = torch._foreach_add(device_grads, device_params, alpha=weight_decay)`` — a
  new tensor per parameter of the group, of the main gradient's dtype — and drops them when the group's
  update is done (``device_grads = bufs`` with momentum). Megatron's groups (``_get_param_groups``): no decay
  for biases and 1-D parameters, ``--weight-decay`` for the rest.
- **The layer-wise optimizer's all-gather.** ``MC/optimizer/layer_wise_optimizer.py:
  LayerWiseDistributedOptimizer.allgather_params`` (693587db5a … 1ca250c6fb) after the chained step: per
  group (dense over ``dp·cp``, then expert over expert-DP when it has more than one rank) this rank's
  parameters flattened into one tensor (``_flatten_dense_tensors``: a ``torch.cat``; ``torch.empty(0)`` when
  none was dealt to it) and one ``torch.empty`` per rank of that rank's parameters' elements, in the weights'
  dtype; ``all_gather``, then copies into the parameters (views); all dropped when it returns.

Not simulated: Muon's Newton-Schulz working tensors (Emerging-Optimizers ``muon_utils.newton_schulz``: per
parameter, one at a time, an fp32 normalised copy, its bf16 iterate and k×k Gram matrices; under
``--muon-tp-mode duplicated``/``distributed`` the TP-gathered matrix), a few times the largest Muon
matrix, after the backward freed the activations.
"""

from __future__ import annotations

from timeline.graph.layer_wise_buffers import compact_deal
from timeline.graph.optim_state import dp_groups, param_groups, ping_pong_deal
from timeline.graph.tensors import DTYPE_BYTES
from timeline.placement.devices import StaticDevice
from timeline.spec.run import TrainingSpec

#: (name, bytes, +1 alloc / −1 free), in the order the step makes them
StepAlloc = tuple[str, int, int]


def step_transients(tr: TrainingSpec, dev: StaticDevice, expert_rule: str) -> tuple[StepAlloc, ...]:
    """The transient allocations of one optimizer step of the device, in order."""
    if not tr.optimizer_step:
        return ()
    groups = param_groups(dev.tensors, dev.dp_buffers, tr, expert_rule)
    out: list[StepAlloc] = []
    if tr.optimizer == "sgd" and tr.weight_decay:
        grad = DTYPE_BYTES["fp32"]  # the main gradient: fp32 under Float16OptimizerWithFloat16Params (.float())
        for (_, no_decay), params in groups:
            if no_decay:
                continue
            names = [f"step.sgd_decayed_grad.{n}" for n, _, _, _ in params]
            out += [(name, k * grad, 1) for name, (_, k, _, _) in zip(names, params, strict=True)]
            out += [(name, k * grad, -1) for name, (_, k, _, _) in zip(names, params, strict=True)]
    if tr.muon_layer_wise and tr.zero == 0:
        out += _layer_wise_gather(tr, dev, [p for _, ps in groups for p in ps])
    elif tr.muon_layer_wise and any(b.muon and not b.param_buffer for b in dev.dp_buffers):
        out += _compact_gather(tr, dev)
    return tuple(out)  # the padded layout's parameters are gathered in place, in the param buffer


def _compact_gather(tr: TrainingSpec, dev: StaticDevice) -> list[StepAlloc]:
    """The compact layout's ``allgather_params`` (``layer_wise_optimizer.py``, 3b9c248a1b … 86ba3a66d5): per group
    of more than one rank, this rank's Muon matrices flattened (its own slot of the gather) and one
    ``torch.empty`` per other rank of that rank's elements, in the weights' dtype."""
    w = DTYPE_BYTES[tr.dtype]
    out: list[StepAlloc] = []
    for expert, lists in compact_deal(dev.dp_buffers).items():
        if len(lists) == 1 or not any(lists):
            continue
        label = "expert" if expert else "dense"
        sizes = [sum(k for _, k in names) * w for names in lists]
        made = [(f"step.layer_wise_flat.{label}", sizes[-1])] + [
            (f"step.layer_wise_gathered.{label}.{r}", b) for r, b in enumerate(sizes[:-1])]
        out += [(n, b, 1) for n, b in made] + [(n, b, -1) for n, b in made]
    return out


def _layer_wise_gather(tr: TrainingSpec, dev: StaticDevice,
                       order: list[tuple[str, int, tuple[int, ...], bool]]) -> list[StepAlloc]:
    """``allgather_params``' buffers for the last rank of each group (``dp·cp`` of one rank: none)."""
    dense_g, expert_g = dp_groups(dev.dp_buffers)
    if dense_g == 1:
        return []
    w = DTYPE_BYTES[tr.dtype]
    numel = {n: k for n, k, _, _ in order}
    dealt = ping_pong_deal([(n, k, e) for n, k, _, e in order], dense_g, expert_g)
    out: list[StepAlloc] = []
    for expert, group in ((False, dense_g), (True, expert_g)):
        lists = dealt[expert]
        if expert and (group == 1 or not lists[0]):  # shard_params: expt_dp_params_list = None
            continue
        sizes = [sum(numel[n] for n in names) * w for names in lists]
        label = "expert" if expert else "dense"
        made = [(f"step.layer_wise_flat.{label}", sizes[-1])] + [
            (f"step.layer_wise_gathered.{label}.{r}", b) for r, b in enumerate(sizes)]
        out += [(n, b, 1) for n, b in made] + [(n, b, -1) for n, b in made]
    return out
