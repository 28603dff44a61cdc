"""What every optimizer step of the ``megatron`` profile allocates and frees, in order, from its start
(:func:`timeline.sim.expand.device_events`): the states the first step makes (the moments, momentum buffers:
their bytes are :mod:`timeline.graph.optim_state`'s) and the step's own temporaries. ``ChainedOptimizer.step``
runs each optimizer's ``step_with_ready_grads`` in turn (:func:`timeline.graph.optim_state.param_groups`' chain
order); each walks its parameter groups (``torch.optim.Optimizer.step``, TE's ``FusedAdam.step`` /
``FusedSGD.step``), making a group's states in the first step and updating the group before the next one.
Which Adam and SGD run is ``[framework] optimizer_impl`` (``MC/optimizer/__init__.py``: Transformer Engine's
``FusedAdam``/``FusedSGD``, else Apex's, else ``torch.optim.AdamW``/``SGD``; from Megatron-LM 44d581c302,
2024-07-07, Megatron-Core 0.9.0). The fused ones update a group in one multi-tensor kernel and make its states
with ``empty_like``/``zeros_like`` before it: nothing more. Under ``"torch_foreach"``:

- **Adam's denominator.** Each Adam group's foreach temporaries
  (:func:`timeline.profiles.torch_adam.foreach_temporaries`: a ``_foreach_sqrt`` copy of the second moments per
  main parameter or shard — per shard under the distributed optimizer), made after the group's states and
  dropped when its update returns. Muon's Adam fallback is the same ``Adam``.
- **SGD's decayed gradients.** torch's ``_multi_tensor_sgd`` (``torch/optim/sgd.py``, 2.x) makes, where the
  group's ``weight_decay`` is not 0, ``device_grads = torch._foreach_add(device_grads, device_params,
  alpha=weight_decay)`` — a new tensor per parameter of the group, of the main gradient's dtype — before the
  first step's ``momentum_buffer`` clones, and drops them when the group's update is done. Megatron's groups
  (``_get_param_groups``): no decay for biases and 1-D parameters, ``--weight-decay`` for the rest.
- **fp16's main-to-model copy.** ``Float16OptimizerWithFloat16Params._copy_main_params_to_model_params`` passes
  an overflow buffer under fp16 (none under bf16: a plain ``copy_``), so ``_multi_tensor_copy_this_to_that``
  calls Megatron's fallback ``MC/utils.py: local_multi_tensor_scale``: ``dst.copy_(src * scale)``, an fp32 copy
  of each main parameter in turn, after the optimizer's groups (the distributed optimizer uses ``copy_``).

Also, whatever the optimizer: **the layer-wise optimizer's all-gather.** ``MC/optimizer/layer_wise_optimizer.py:
LayerWiseDistributedOptimizer.allgather_params`` (693587db5a … 1ca250c6fb) after the chained step: per
group (dense over ``dp·cp``, then expert over expert-DP when it has more than one rank) this rank's
parameters flattened into one tensor (``_flatten_dense_tensors``: a ``torch.cat``; ``torch.empty(0)`` when
none was dealt to it) and one ``torch.empty`` per rank of that rank's parameters' elements, in the weights'
dtype; ``all_gather``, then copies into the parameters (views); all dropped when it returns.

Not simulated: Muon's Newton-Schulz working tensors (Emerging-Optimizers ``muon_utils.newton_schulz``: per
parameter, one at a time, an fp32 normalised copy, its bf16 iterate and k×k Gram matrices; under
``--muon-tp-mode duplicated``/``distributed`` the TP-gathered matrix), a few times the largest Muon
matrix, after the backward freed the activations; under ``"torch_foreach"``, ``clip_grad_by_total_norm_fp32``'s
``local_multi_tensor_scale`` of the gradients, which runs only when the gradient norm exceeds ``--clip-grad`` (a
property of the data). The precision-aware optimizer's states are :func:`timeline.sim.megatron_state.fused_adam_states`'.
"""

from __future__ import annotations

from timeline.graph.layer_wise_buffers import compact_deal
from timeline.graph.optim_state import cpu_offloaded, dp_groups, main_params, param_groups, ping_pong_deal
from timeline.graph.static import optimizer_element_bytes
from timeline.graph.tensors import DTYPE_BYTES, Category
from timeline.placement.devices import StaticDevice
from timeline.profiles.torch_adam import foreach_temporaries
from timeline.sim.compiled import CAT_CODE
from timeline.spec.framework import FrameworkSpec
from timeline.spec.run import TrainingSpec

#: (name, bytes, +1 alloc / −1 free, category code, made in the first step only), in the order the step makes them
StepAlloc = tuple[str, int, int, int, bool]
_TEMP = CAT_CODE[Category.TEMPORARY]


def _made_and_dropped(made: list[tuple[str, int]]) -> list[StepAlloc]:
    """Temporaries made in turn and dropped together (nothing is allocated between the frees: their order is moot)."""
    return [(n, b, 1, _TEMP, False) for n, b in made] + [(n, b, -1, _TEMP, False) for n, b in made]


#: the name of the 0-byte marker whose allocation event empties the allocator's cache
#: (:func:`timeline.sim.memory.run_allocator_events`)
EMPTY_CACHE = "step.empty_cache"


def step_transients(tr: TrainingSpec, dev: StaticDevice, expert_rule: str,
                    fw: FrameworkSpec | None = None) -> tuple[StepAlloc, ...]:
    """What one optimizer step of the device allocates and frees, in order (``fw``: which Adam and SGD run;
    default ``[framework]``'s), with ``--empty-unused-memory-level``'s ``torch.cuda.empty_cache()`` before it (level
    1) and after it (level 2) as 0-byte markers (``training.py: train_step``)."""
    if not tr.optimizer_step:
        return ()
    level = (fw or FrameworkSpec()).empty_unused_memory_level
    body = _step_body(tr, dev, expert_rule, fw)
    marker = [(EMPTY_CACHE, 0, 1, _TEMP, False), (EMPTY_CACHE, 0, -1, _TEMP, False)]
    return tuple((marker if level >= 1 else []) + list(body) + (marker if level >= 2 else []))


def _step_body(tr: TrainingSpec, dev: StaticDevice, expert_rule: str,
               fw: FrameworkSpec | None = None) -> tuple[StepAlloc, ...]:
    foreach = (fw or FrameworkSpec()).optimizer_impl == "torch_foreach"
    pytorch = (fw or FrameworkSpec()).pytorch
    states = {n: st for n, _, st in main_params(dev.tensors, dev.dp_buffers, tr, expert_rule)}
    first = not tr.resumed and not tr.precision_aware  # a resumed run loaded them; precision-aware: fused_adam_states
    o_cat, fp32 = CAT_CODE[Category.OPTIMIZER], DTYPE_BYTES["fp32"]
    master, _ = optimizer_element_bytes(tr)
    groups = param_groups(dev.tensors, dev.dp_buffers, tr, expert_rule)
    out: list[StepAlloc] = []
    for i, ((chain, no_decay), params) in enumerate(groups):
        mine = [(n, k) for n, k, _, _ in params if n in states]  # the layer-wise optimizer's rank holds some
        made = [(f"static.moments.{n}.{state}", k * b, 1, o_cat, True) for n, k in mine for state, b in states[n]]
        made = made if first else []
        if foreach and tr.optimizer == "sgd" and tr.weight_decay and not no_decay:
            # the main gradient: fp32 under Float16OptimizerWithFloat16Params (.float())
            temps = _made_and_dropped([(f"step.sgd_decayed_grad.{n}", k * fp32) for n, k in mine])
            out += temps[:len(mine)] + made + temps[len(mine):]
            continue
        out += made
        if foreach and any(state == "exp_avg_sq" for n, _ in mine for state, _ in states[n]):
            sq = DTYPE_BYTES[tr.exp_avg_sq_dtype or tr.moment_dtype]
            out += _made_and_dropped(list(foreach_temporaries([(f"step.adam.{n}", k) for n, k in mine], sq, pytorch)))
        last_of_optimizer = i + 1 == len(groups) or groups[i + 1][0][0] != chain
        if foreach and last_of_optimizer and tr.dtype == "fp16" and master and tr.zero == 0:
            copies = [(f"step.main_param_copy.{n}", k * master) for (c, _), ps in groups if c == chain
                      for n, k, _, _ in ps if n in states]  # one at a time: each dropped after its copy_
            out += [e for n, b in copies for e in ((n, b, 1, _TEMP, False), (n, b, -1, _TEMP, False))]
    out += _hybrid_copy_back(tr, dev, expert_rule)
    if tr.muon_layer_wise and tr.zero == 0:
        out += _layer_wise_gather(tr, dev, [p for _, ps in groups for p in ps])
    elif tr.muon_layer_wise and any(b.muon and not b.param_buffer for b in dev.dp_buffers):
        out += _compact_gather(tr, dev)
    return tuple(e for e in out if e[1] > 0)  # the padded layout's parameters are gathered in place


def _hybrid_copy_back(tr: TrainingSpec, dev: StaticDevice, expert_rule: str) -> list[StepAlloc]:
    """The hybrid CPU-offload optimizer's copy of each CPU-updated shard back to the GPU
    (``hybrid_optimizer.py: param_copy_back_gpu_hook``: ``gpu_param.data.copy_(param.data, non_blocking=True)``, the
    CPU master fp32, the GPU shard in the weights' dtype). A host-to-device copy that changes the dtype goes through
    a device temporary of the source's dtype (PyTorch ``aten/src/ATen/native/cuda/Copy.cu: copy_kernel_cuda``,
    ``copy_requires_temporaries``: non-blocking, so converted on the GPU — ``at::empty_like(dst, src dtype)``), made
    and dropped per shard, one at a time, after the GPU sub-optimizer's step. The gradients go the other way as
    fp32 views of the fp32 grad buffer (``decoupled_grad``): no device copy."""
    w, fp32 = DTYPE_BYTES[tr.dtype], DTYPE_BYTES["fp32"]
    if w == fp32:
        return []
    return [e for n, k in cpu_offloaded(dev.tensors, dev.dp_buffers, tr, expert_rule)
            for e in ((f"step.hybrid_h2d.{n}", k * fp32, 1, _TEMP, False), (f"step.hybrid_h2d.{n}", k * fp32, -1, _TEMP, False))]


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
        out += _made_and_dropped(made)
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
        out += _made_and_dropped(made)
    return out
