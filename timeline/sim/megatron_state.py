"""The ``megatron`` profile's static state in the order Megatron-Core creates it, over the buffers of
:mod:`timeline.graph.dp_buffers` (rules read at Megatron-Core 0.14.0, ``MC``, and Transformer
Engine 2.6, ``TE``):

1. model construction makes each parameter on its own (``MC/training/training.py: get_model``);
2. per model chunk, ``DistributedDataParallel`` makes its dense then expert buffers: under the
   distributed optimizer the param buffer, then the grad buffer (``torch.zeros``), then copies each
   parameter into its view of the param buffer and frees its own storage, in layout order
   (``MC/distributed/param_and_grad_buffer.py: _ParamAndGradBuffer.__init__``);
3. the optimizer's fp32 main parameters: one ``detach().clone().float()`` per parameter
   (``MC/optimizer/optimizer.py: Float16OptimizerWithFloat16Params.__init__``), or one
   ``clone().float()`` per owned shard (``MC/optimizer/distrib_optimizer.py:
   DistributedOptimizer._build_model_and_main_param_groups``), in parameter-group order — each a
   clone in the model's dtype, its fp32 copy, then the clone dropped;
4. Adam's ``exp_avg`` and ``exp_avg_sq`` per main parameter inside the first ``step()``
   (``TE/optimizers/fused_adam.py: FusedAdam.step`` → ``initialize_state``: ``torch.empty_like``
   per state, the optimizer Megatron imports first, ``MC/optimizer/__init__.py``); the dense
   optimizer steps before the expert one (``ChainedOptimizer``), and under
   ``--overlap-param-gather-with-optimizer-step`` the first chunk's dense optimizer before both;
5. every step, ``_copy_model_grads_to_main_grads`` sets ``main_param.grad =
   model_param.main_grad[shard].float()``: a new fp32 tensor per parameter (shard) when the grad
   buffer is not fp32 (an alias when it is), dropped by ``optimizer.zero_grad()`` at the start of
   the next ``train_step`` (``MC/training/training.py: train_step``). It runs in ``prepare_grads``,
   before the loss scaler's overflow check, so a skipped step copies too.

One Megatron parameter can hold several of the layer library's: TE's fused ``linear_qkv`` (q, k and
v projections, weight and bias) and ``linear_fc1`` (a SwiGLU's gate and up projections) are one
``Parameter`` each (``MC/transformer/attention.py: SelfAttention.__init__``, ``MC/transformer/mlp.py:
MLP.__init__``: ``ffn_hidden_size * 2`` rows when gated), so each is one allocation of the weight,
the main parameter and each moment — one large-pool block where the pieces would each be small-pool
ones (:func:`megatron_params`).

Parameter groups (``MC/optimizer/__init__.py: _get_param_groups``) are keyed by weight decay
(none for biases and 1-D parameters) and expert parallelism, in order of first appearance over
the model chunks; each group's parameters in ``named_parameters()`` order, or under the
distributed optimizer in buffer order (``_build_optimizer_group_ranges``: chunk, buffer, bucket,
layout).
"""

from __future__ import annotations

from timeline.graph.dp_buffers import megatron_order
from timeline.graph.static import is_expert_state, optimizer_element_bytes
from timeline.graph.tensors import DTYPE_BYTES, Category, TensorDef
from timeline.placement.devices import StaticDevice
from timeline.profiles.megatron_workspaces import FUSED_INTO
from timeline.sim.compiled import CAT_CODE
from timeline.sim.megatron_load import resumed_moments
from timeline.spec.framework import FrameworkSpec
from timeline.spec.run import TrainingSpec

#: (created at: "start" | "first_backward" | "first_step", name, bytes, category code, +1 alloc / −1 free)
StaticEvent = tuple[str, str, int, int, int]


def _group_key(name: str, shape: tuple[int, ...], optimizer: int) -> tuple[int, bool]:
    """(the optimizer's place in the chain, no weight decay) of one parameter (``_get_param_groups``'
    default condition; the chain: :attr:`timeline.graph.dp_buffers.DdpBuffer.optimizer`)."""
    return optimizer, name.endswith(".bias") or len(shape) == 1


def megatron_params(tensors: list[TensorDef]) -> list[tuple[str, list[TensorDef]]]:
    """``tensors`` (in order) as Megatron's parameters: (name, the layer library's tensors it holds),
    q/k/v and gate/up of one module merged at the first one's place (``FUSED_INTO``)."""
    groups: dict[str, list[TensorDef]] = {}
    for t in tensors:
        parts = t.name.rsplit(".", 2)
        name = t.name
        if len(parts) == 3 and parts[1] in FUSED_INTO:
            name = f"{parts[0]}.{FUSED_INTO[parts[1]]}.{parts[2]}"
        groups.setdefault(name, []).append(t)
    return [(n, ts) if len(ts) > 1 else (ts[0].name, ts) for n, ts in groups.items()]


def main_param_order(dev: StaticDevice, tr: TrainingSpec, expert_rule: str) -> list[tuple[str, int]]:
    """(name, elements) of each main parameter (shard) in the order the optimizer creates and steps
    them; under ``zero = 1`` only the shards this rank owns."""
    shapes = {t.name: t for t in dev.tensors}
    groups: dict[tuple[int, bool], list[tuple[str, int]]] = {}
    if tr.zero >= 1:
        for b in dev.dp_buffers:
            for s in b.slots:
                groups.setdefault(_group_key(s.name, shapes[s.name].shape, b.optimizer), [])
        for b in dev.dp_buffers:
            for s in b.slots:
                if s.shard_numel:
                    groups[_group_key(s.name, shapes[s.name].shape, b.optimizer)].append((s.name, s.shard_numel))
    else:
        for name, ts in megatron_params(megatron_order(dev.tensors)):
            key = _group_key(name, ts[0].shape, int(is_expert_state(ts[0], expert_rule)))
            groups.setdefault(key, []).append((name, sum(t.numel for t in ts)))
    # the optimizers in their ChainedOptimizer order (dense, then expert), each in first-seen group order
    return [p for k in sorted(groups, key=lambda k: k[0]) for p in groups[k]]


def megatron_events(tr: TrainingSpec, dev: StaticDevice, expert_rule: str,
                    fw: FrameworkSpec | None = None) -> list[StaticEvent]:
    """Weights, buffers, main parameters and moments of one device, in creation order (``fw``: the
    versions and checkpoint format a resumed run's load follows; default ``[framework]``'s)."""
    w_cat, g_cat, o_cat = CAT_CODE[Category.WEIGHTS], CAT_CODE[Category.GRADS], CAT_CODE[Category.OPTIMIZER]
    w, g = DTYPE_BYTES[tr.dtype], DTYPE_BYTES[tr.grad_dtype]
    dist = tr.zero >= 1
    # under the distributed optimizer each piece's own storage is freed into the param buffer by its slot
    params = [(t.name, [t]) for t in dev.tensors] if dist else megatron_params(list(dev.tensors))
    out: list[StaticEvent] = [("start", f"static.weights.{n}",
                               sum(t.numel * w if t.trainable else t.size_bytes for t in ts), w_cat, 1)
                              for n, ts in params]
    for b in dev.dp_buffers:
        if dist:
            out.append(("start", f"static.param_buffer.{b.label}", b.numel * w, w_cat, 1))
        out.append(("start", f"static.grad_buffer.{b.label}", b.numel * g, g_cat, 1))
        if dist:
            out += [("start", f"static.weights.{s.name}", (s.end - s.start) * w, w_cat, -1) for s in b.slots]
    master, moment = optimizer_element_bytes(tr)
    order = main_param_order(dev, tr, expert_rule)
    for n, k in order:  # clone() in the model dtype, then .float(); the clone is dropped
        out += [("start", f"static.master_clone.{n}", k * w, o_cat, 1), ("start", f"static.master.{n}", k * master, o_cat, 1),
                ("start", f"static.master_clone.{n}", k * w, o_cat, -1)] if master else []
    if tr.resumed:  # the checkpoint load makes them, before any step (timeline.sim.megatron_load)
        out += resumed_moments(order, moment, o_cat, distributed=dist, fw=fw or FrameworkSpec())
    elif tr.optimizer_step:
        for n, k in order:
            out += [("first_step", f"static.moments.{n}.exp_avg", k * moment, o_cat, 1),
                    ("first_step", f"static.moments.{n}.exp_avg_sq", k * moment, o_cat, 1)]
    return [e for e in out if e[2] > 0]


def main_grad_copies(tr: TrainingSpec, dev: StaticDevice, expert_rule: str) -> tuple[tuple[str, int], ...]:
    """(name, bytes) of the fp32 copies of the main grads each step makes (none when the grad
    buffer is fp32, or without fp32 main parameters: ``FP32Optimizer`` aliases ``main_grad``)."""
    master, _ = optimizer_element_bytes(tr)
    if tr.grad_dtype == "fp32" or not master:
        return ()
    return tuple((f"step.main_grad.{n}", k * master) for n, k in main_param_order(dev, tr, expert_rule))
