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
   per state, the optimizer Megatron imports first, ``MC/optimizer/__init__.py``; torch's AdamW
   ``_init_group``: ``zeros_like``), group by group, each group's update (and its temporaries) before the
   next group's states: :func:`timeline.sim.optimizer_step.step_transients`; the dense
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

from timeline.graph.megatron_param import megatron_params
from timeline.graph.optim_state import MainParam, main_params
from timeline.graph.static import optimizer_element_bytes
from timeline.graph.tensors import DTYPE_BYTES, Category
from timeline.placement.devices import StaticDevice
from timeline.sim.compiled import CAT_CODE
from timeline.sim.megatron_fsdp import fsdp_events
from timeline.sim.megatron_load import resumed_moments
from timeline.spec.framework import FrameworkSpec
from timeline.spec.run import TrainingSpec

#: (created at: "start" | "first_backward" | "first_step", name, bytes, category code, +1 alloc / −1 free)
StaticEvent = tuple[str, str, int, int, int]


def main_param_order(dev: StaticDevice, tr: TrainingSpec, expert_rule: str) -> list[MainParam]:
    """The device's main parameters (shards) with their optimizer states, in creation and step order
    (:func:`timeline.graph.optim_state.main_params`)."""
    return main_params(dev.tensors, dev.dp_buffers, tr, expert_rule)


def megatron_events(tr: TrainingSpec, dev: StaticDevice, expert_rule: str,
                    fw: FrameworkSpec | None = None) -> list[StaticEvent]:
    """Weights, buffers, main parameters and moments of one device, in creation order (``fw``: the
    versions and checkpoint format a resumed run's load follows; default ``[framework]``'s)."""
    w_cat, g_cat, o_cat = CAT_CODE[Category.WEIGHTS], CAT_CODE[Category.GRADS], CAT_CODE[Category.OPTIMIZER]
    w, g = DTYPE_BYTES[tr.dtype], DTYPE_BYTES[tr.grad_dtype]
    dist = tr.zero >= 1
    # under the distributed optimizer each piece's own storage is freed into the param buffer by its slot
    params = [(t.name, [t]) for t in dev.tensors] if dist else megatron_params(list(dev.tensors))
    # FP8 parameters (--fp8-param-gather) are one byte (profiles/megatron_fp8.py)
    out: list[StaticEvent] = [("start", f"static.weights.{n}",
                               sum(t.size_bytes if t.dtype == "fp8" or not t.trainable else t.numel * w for t in ts),
                               w_cat, 1) for n, ts in params]
    for b in dev.dp_buffers:
        pw = DTYPE_BYTES["fp8"] if b.fp8 else w
        moved = dist and b.param_buffer  # a compact layer-wise buffer's parameters keep their own storage
        if moved:
            out.append(("start", f"static.param_buffer.{b.label}", b.numel * pw, w_cat, 1))
        out.append(("start", f"static.grad_buffer.{b.label}", b.numel * g, g_cat, 1))
        if moved:
            out += [("start", f"static.weights.{s.name}", (s.end - s.start) * pw, w_cat, -1) for s in b.slots]
    master, _ = optimizer_element_bytes(tr)
    order = main_param_order(dev, tr, expert_rule)
    fsdp = bool(dev.dp_buffers) and bool(dev.dp_buffers[0].fsdp)
    if fsdp:  # Megatron-FSDP's buffers hold the main weights themselves (timeline.sim.megatron_fsdp)
        out = fsdp_events(tr, dev)
    if tr.optimizer_cpu_offload:  # the hybrid optimizer's fp32 clones, then its GPU FusedAdam's moments
        return [e for e in out + hybrid_device_states(tr, order) if e[2] > 0]
    if tr.precision_aware:  # TE's FusedAdam makes the masters with the moments (fused_adam_states)
        return [e for e in out + (fused_adam_states(tr, order) if tr.optimizer_step else []) if e[2] > 0]
    for n, k, _ in order if not fsdp else ():  # clone() in the model dtype, then .float(); the clone is dropped
        out += [("start", f"static.master_clone.{n}", k * w, o_cat, 1), ("start", f"static.master.{n}", k * master, o_cat, 1),
                ("start", f"static.master_clone.{n}", k * w, o_cat, -1)] if master else []
    if tr.resumed:  # the checkpoint load makes them, before any step (timeline.sim.megatron_load)
        out += resumed_moments(order, o_cat, distributed=dist, fw=fw or FrameworkSpec())
    return [e for e in out if e[2] > 0]  # else the first step makes them (timeline.sim.optimizer_step)


#: bytes per element of TE's int16 master remainders
INT16_BYTES = 2
#: bytes of the [1] fp32 scale TE keeps per non-fp32 state (``FusedAdam._initialize_state``: ``torch.ones([1])``)
STATE_SCALE_BYTES = 4


def fused_adam_states(tr: TrainingSpec, order: list[MainParam]) -> list[StaticEvent]:
    """Megatron's precision-aware optimizer (``training.precision_aware``): the optimizer's parameters are the
    bf16 weights (their shards, views of the param buffer: ``distrib_optimizer.py:
    _build_model_and_main_param_groups`` keeps ``shard_float16_params_this_group``, Megatron-Core from 972553db35,
    0.15) and TE's ``FusedAdam.step`` runs ``initialize_state`` per parameter in its first step (TE v2.1 … v2.18,
    ``pytorch/optimizers/fused_adam.py``): ``exp_avg`` and ``exp_avg_sq`` (``torch.empty_like`` of their dtypes,
    zeroed), a ``torch.ones([1])`` fp32 scale for each state that is not fp32, then ``master_param``: int16
    remainders (``store_param_remainders``: ``torch.zeros_like(param, dtype=torch.int16)``), or an
    ``empty_like`` of ``master_dtype`` filled by ``set_scaled_state(param.clone().detach().float())`` — a clone
    in the weights' dtype, its fp32 copy (the clone dropped), then the copy dropped."""
    o_cat = CAT_CODE[Category.OPTIMIZER]
    w, master = DTYPE_BYTES[tr.dtype], DTYPE_BYTES[tr.master_dtype]
    out: list[StaticEvent] = []
    for n, k, states in order:
        for state, b in states:
            out.append(("first_step", f"static.moments.{n}.{state}", k * b, o_cat, 1))
            if b != DTYPE_BYTES["fp32"]:
                out.append(("first_step", f"static.state_scale.{n}.{state}", STATE_SCALE_BYTES, o_cat, 1))
        if tr.master_remainders:
            out.append(("first_step", f"static.master.{n}", k * INT16_BYTES, o_cat, 1))
            continue
        out += [("first_step", f"static.master.{n}", k * master, o_cat, 1),
                ("first_step", f"static.master_clone.{n}", k * w, o_cat, 1),
                ("first_step", f"static.master_fp32.{n}", k * DTYPE_BYTES["fp32"], o_cat, 1),
                ("first_step", f"static.master_clone.{n}", k * w, o_cat, -1)]
        if master != DTYPE_BYTES["fp32"]:
            out.append(("first_step", f"static.state_scale.{n}.master_param", STATE_SCALE_BYTES, o_cat, 1))
        out.append(("first_step", f"static.master_fp32.{n}", k * DTYPE_BYTES["fp32"], o_cat, -1))
    return out


def hybrid_device_states(tr: TrainingSpec, order: list[MainParam]) -> list[StaticEvent]:
    """``--optimizer-cpu-offload`` (``training.optimizer_cpu_offload``): the ``HybridDeviceOptimizer``
    ``DistributedOptimizer.__init__`` rebuilds over the owned shards makes, for each one it keeps on the GPU
    (``order``: :func:`timeline.graph.optim_state.main_params`), ``param.detach().clone().float()`` — a clone in the
    weights' dtype, its fp32 copy, the clone dropped (``_get_sub_optimizer_param_groups``); none for an fp32
    weight. Its GPU ``FusedAdam`` makes ``exp_avg`` and ``exp_avg_sq`` per parameter in its first step
    (``initialize_state``, TE's fp32 default: the hybrid optimizer passes no state dtypes). The shards it moves to
    the CPU clone there (a transient GPU clone in the weights' dtype each, before training: left out)."""
    o_cat = CAT_CODE[Category.OPTIMIZER]
    w, fp32 = DTYPE_BYTES[tr.dtype], DTYPE_BYTES["fp32"]
    out: list[StaticEvent] = []
    for n, k, _ in order:
        if w != fp32:
            out += [("start", f"static.master_clone.{n}", k * w, o_cat, 1), ("start", f"static.master.{n}", k * fp32, o_cat, 1),
                    ("start", f"static.master_clone.{n}", k * w, o_cat, -1)]
    if tr.optimizer_step:
        out += [("first_step", f"static.moments.{n}.{state}", k * b, o_cat, 1) for n, k, states in order
                for state, b in states]
    return out


def main_grad_copies(tr: TrainingSpec, dev: StaticDevice, expert_rule: str) -> tuple[tuple[str, int], ...]:
    """(name, bytes) of the fp32 copies of the main grads each step makes (none when the grad
    buffer is fp32, or without fp32 main parameters: ``FP32Optimizer`` aliases ``main_grad``)."""
    master, _ = optimizer_element_bytes(tr)
    if tr.grad_dtype == "fp32" or not master or tr.precision_aware:  # precision-aware: decoupled_grad, a view
        return ()
    return tuple((f"step.main_grad.{n}", k * master) for n, k, _ in main_param_order(dev, tr, expert_rule))
