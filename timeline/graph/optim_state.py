"""Which optimizer state each parameter holds, of which dtype, and — under Muon's layer-wise distributed
optimizer — on which data-parallel rank. Pure rules over parameter names and shapes; the static state's
events (:mod:`timeline.sim.megatron_state`) and the static bytes (:mod:`timeline.placement.devices`) read
them. Megatron-LM sources (``MC`` = ``megatron/core``), at the commits named:

- **Adam** (``training.optimizer = "adam"``): ``exp_avg`` and ``exp_avg_sq`` per main parameter, made by TE's
  ``FusedAdam.initialize_state`` in the first step (``torch.empty_like``); both of ``moment_dtype``, or under the
  precision-aware optimizer (``--use-precision-aware-optimizer``, ``MC/optimizer/__init__.py:
  _get_megatron_optimizer_based_on_param_groups`` passes ``exp_avg_dtype`` / ``exp_avg_sq_dtype`` to
  ``FusedAdam``) each its own (``exp_avg_sq_dtype``).
- **SGD** (``"sgd"``): ``torch.optim.SGD(..., momentum=config.sgd_momentum)`` (``MC/optimizer/__init__.py``,
  core_v0.12.0 … d98e8a64dd); torch's ``_multi_tensor_sgd`` makes ``momentum_buffer = grad.detach().clone()`` in
  the first step (``torch/optim/sgd.py``, 2.x), none when the momentum is 0. The gradient it clones is the main
  parameter's: fp32 under ``Float16OptimizerWithFloat16Params`` (``main_grad.float()``).
- **Muon** (``"muon"``): ``MC/optimizer/muon.py: get_megatron_muon_optimizer`` (693587db5a, 2025-11) and
  ``MC/optimizer/__init__.py: _get_megatron_emerging_optimizer`` (5b512b45d1 on, to d98e8a64dd) give Muon every
  trainable parameter that is not 1-D and not flagged ``is_embedding_or_output_parameter`` — which
  ``MC/models/common/language_module/language_module.py: setup_embeddings_and_output_layer`` sets on the word
  embeddings and the output layer only (learned position embeddings, the router and every expert matrix are
  Muon's); the rest go to Adam. Emerging-Optimizers' ``OrthogonalizedOptimizer.step``
  (``orthogonalized_optimizer.py``, v0.1.0 … v0.4.0) makes ``momentum_buffer = torch.zeros_like(grad)`` in the first
  step: fp32, like the main gradient.
- **Layer-wise distribution** (``--optimizer dist_muon``; from 5b512b45d1 also ``--optimizer muon
  --use-distributed-optimizer``): with ``zero = 0`` (``megatron/training/arguments.py: validate_args`` turning
  the distributed optimizer off; 693587db5a … c1e938b039, and later under ``--no-use-layer-wise-param-layout``)
  ``MC/optimizer/layer_wise_optimizer.py: LayerWiseDistributedOptimizer.shard_params`` sorts all of the chained
  optimizers' parameters by ``numel()`` (a stable sort over optimizer, group and parameter order) and deals the
  dense ones to the ``dp·cp`` ranks and the expert ones to the expert-DP ranks, each in a ping-pong loop
  ``0 … g−1, g−1 … 0`` (:func:`ping_pong_deal`); only then are the optimizers wrapped
  (``Float16OptimizerWithFloat16Params``), so a rank makes main parameters and states for the parameters dealt to
  it alone; the DDP buffers stay unsharded. With ``zero = 1`` (0044db1f20 on: the distributed optimizer's
  buffers, :mod:`timeline.graph.layer_wise_buffers`) a rank owns the Muon matrices its buffer shard holds and the
  distributed optimizer's byte shards of the rest: the buffers' slots say which (:func:`main_params`).
- **CPU offload** (``--optimizer-cpu-offload``, ``training.optimizer_cpu_offload``): ``MC/optimizer/__init__.py:
  _get_megatron_optimizer_based_on_param_groups`` builds a ``HybridDeviceOptimizer``
  (``MC/optimizer/cpu_offloading/hybrid_optimizer.py``, core_v0.15.0 … d98e8a64dd) with ``param_update_in_fp32``,
  and ``DistributedOptimizer.__init__`` rebuilds it over the owned shards (under the precision-aware optimizer Megatron
  requires, the weights' own shards: views of the param buffer). ``_get_sub_optimizer_param_groups`` walks its
  parameters in group order and moves each to the CPU while the elements moved are below
  ``optimizer_offload_fraction`` of the total (:func:`hybrid_split`); each parameter left on the GPU gets an fp32
  clone (``param.detach().clone().float()``) that TE's ``FusedAdam`` — built with the learning-rate arguments
  alone, so fp32 ``exp_avg`` and ``exp_avg_sq`` whatever ``--exp-avg-dtype`` says — steps. A parameter moved to
  the CPU keeps nothing on the GPU: its copy, fp32 master, gradient copy and states are host memory.
"""

from __future__ import annotations

from collections.abc import Sequence

from timeline.graph.dp_buffers import DdpBuffer, megatron_order
from timeline.graph.megatron_param import megatron_params, muon_managed
from timeline.graph.static import is_expert_state, optimizer_element_bytes
from timeline.graph.tensors import DTYPE_BYTES, TensorDef
from timeline.spec.run import TrainingSpec

#: (name, elements, (state name, bytes per element) …) of one main parameter (shard)
MainParam = tuple[str, int, tuple[tuple[str, int], ...]]

def uses_muon(tr: TrainingSpec, name: str, shape: tuple[int, ...]) -> bool:
    """Whether the parameter belongs to a Muon optimizer (its Adam fallback's otherwise)."""
    return tr.optimizer == "muon" and muon_managed(name, shape)


def param_states(tr: TrainingSpec, name: str, shape: tuple[int, ...]) -> tuple[tuple[str, int], ...]:
    """(state name, bytes per element) of one main parameter's optimizer state, in the order the step makes
    them (empty: the optimizer keeps none)."""
    fp32 = DTYPE_BYTES["fp32"]  # the main gradient these states are made like (Float16Optimizer: .float())
    if tr.optimizer_cpu_offload:  # the hybrid optimizer's GPU FusedAdam: TE's default fp32 states
        return (("exp_avg", fp32), ("exp_avg_sq", fp32))
    if tr.optimizer == "sgd":
        return (("momentum_buffer", fp32),) if tr.sgd_momentum else ()
    if uses_muon(tr, name, shape):
        return (("momentum_buffer", fp32),)
    return (("exp_avg", DTYPE_BYTES[tr.moment_dtype]),
            ("exp_avg_sq", DTYPE_BYTES[tr.exp_avg_sq_dtype or tr.moment_dtype]))


def state_bytes_lower_bound(tr: TrainingSpec) -> tuple[int, int]:
    """(master, state) bytes per element every parameter of a device holds at least: what a static bound may
    count without knowing which parameters are Muon's (the fewer of Muon's and Adam's) or, under the layer-wise
    optimizer, which are dealt to the rank (none)."""
    if tr.muon_layer_wise or tr.optimizer_cpu_offload:  # dealt none of a kind, or all of it kept on the CPU
        return 0, 0
    master = optimizer_element_bytes(tr)[0]
    adam = DTYPE_BYTES[tr.moment_dtype] + DTYPE_BYTES[tr.exp_avg_sq_dtype or tr.moment_dtype]
    if tr.optimizer == "sgd":
        return master, DTYPE_BYTES["fp32"] if tr.sgd_momentum else 0
    if tr.optimizer == "muon":
        return master, min(adam, DTYPE_BYTES["fp32"])
    return master, adam


def state_bytes_per_element(tr: TrainingSpec, name: str, shape: tuple[int, ...]) -> int:
    """Bytes of optimizer state (master copy left out) per element of this parameter."""
    return sum(b for _, b in param_states(tr, name, shape))


def ping_pong_deal(params: Sequence[tuple[str, int, bool]], dense_group: int,
                   expert_group: int) -> dict[bool, list[list[str]]]:
    """Per rank, the names of the parameters the layer-wise distributed optimizer deals to it, dense (False)
    over the ``dp·cp`` ranks and expert (True) over the expert-DP ranks; ``params`` are (name, elements,
    expert) in the chained optimizers' parameter order (``shard_params``)."""
    groups = {False: dense_group, True: expert_group}
    loops = {e: [*range(g), *reversed(range(g))] for e, g in groups.items()}
    dealt: dict[bool, list[list[str]]] = {e: [[] for _ in range(g)] for e, g in groups.items()}
    at = {False: 0, True: 0}
    for name, _, expert in sorted(params, key=lambda p: p[1]):  # list.sort is stable, as Python's in Megatron
        loop = loops[expert]
        dealt[expert][loop[at[expert]]].append(name)
        at[expert] = (at[expert] + 1) % len(loop)
    return dealt


def ping_pong_owned(params: Sequence[tuple[str, int, bool]], dense_group: int, expert_group: int,
                    dense_rank: int, expert_rank: int) -> frozenset[str]:
    """Names of the parameters the layer-wise distributed optimizer deals to this rank (:func:`ping_pong_deal`).
    A ``dp·cp`` group of one rank keeps everything (``shard_params`` returns before dealing)."""
    if dense_group == 1:
        return frozenset(n for n, _, _ in params)
    dealt = ping_pong_deal(params, dense_group, expert_group)
    return frozenset(dealt[False][dense_rank] + dealt[True][expert_rank])


def _group_key(name: str, shape: tuple[int, ...], optimizer: int) -> tuple[int, bool]:
    """(the optimizer's place in the chain, no weight decay) of one parameter (``_get_param_groups``'
    default condition; the chain: :attr:`timeline.graph.dp_buffers.DdpBuffer.optimizer`)."""
    return optimizer, name.endswith(".bias") or len(shape) == 1


def dp_groups(buffers: Sequence[DdpBuffer]) -> tuple[int, int]:
    """(dense, expert) data-parallel group sizes of a device's buffers (1 where it has none)."""
    size = {b.expert: b.group for b in buffers}
    return size.get(False, 1), size.get(True, 1)


#: one parameter group of the chain: ((the optimizer's place, no weight decay), [(name, elements, shape, expert)])
ParamGroup = tuple[tuple[int, bool], list[tuple[str, int, tuple[int, ...], bool]]]


def param_groups(tensors: Sequence[TensorDef], buffers: Sequence[DdpBuffer], tr: TrainingSpec,
                 expert_rule: str) -> list[ParamGroup]:
    """The device's main parameters (shards) by optimizer and parameter group, in the order the optimizers
    create and step them: under ``zero = 1`` the shards this rank owns (``buffers``' slots), else whole Megatron
    parameters. Muon's optimizer is first in the chain, then its Adam fallback's dense and expert ones
    (``MC/optimizer/muon.py: get_megatron_muon_optimizer``, 693587db5a: ``optimizers +=
    chained_adam.chained_optimizers``); groups in first-seen order."""
    shapes = {t.name: t for t in tensors}
    groups: dict[tuple[int, bool], list[tuple[str, int, tuple[int, ...], bool]]] = {}
    if tr.zero >= 1:
        for b in buffers:
            for s in b.slots:
                groups.setdefault(_group_key(s.name, shapes[s.name].shape, b.optimizer), [])
        for b in buffers:
            for s in b.slots:
                if s.shard_numel:
                    shape = shapes[s.name].shape
                    groups[_group_key(s.name, shape, b.optimizer)].append((s.name, s.shard_numel, shape, b.expert))
    else:
        for name, ts in megatron_params(megatron_order(tensors)):
            expert = is_expert_state(ts[0], expert_rule)
            numel = sum(t.numel for t in ts)
            shape = ts[0].shape if len(ts) == 1 else (numel // ts[0].shape[-1], ts[0].shape[-1])
            chain = 0 if uses_muon(tr, name, shape) else int(expert) + (tr.optimizer == "muon")
            groups.setdefault(_group_key(name, shape, chain), []).append((name, numel, shape, expert))
    return [(k, groups[k]) for k in sorted(groups, key=lambda k: k[0])]


def hybrid_split(groups: Sequence[ParamGroup], fraction: float) -> frozenset[str]:
    """The main parameters (shards) a ``HybridDeviceOptimizer`` moves to the CPU: per optimizer of the chain (one
    hybrid optimizer each), walking its groups' parameters in order, every parameter met while the elements moved
    so far are below ``fraction`` of the optimizer's total (``_get_sub_optimizer_param_groups``:
    ``offload_params_numel < offload_threshold``, ``offload_threshold = gpu_params_total_numel * offload_fraction``)
    — so the last one moved may cross the threshold."""
    totals: dict[int, int] = {}
    for (chain, _), params in groups:
        totals[chain] = totals.get(chain, 0) + sum(k for _, k, _, _ in params)
    moved: dict[int, int] = {}
    out: set[str] = set()
    for (chain, _), params in groups:
        for name, k, _, _ in params:
            if moved.get(chain, 0) < totals[chain] * fraction:
                out.add(name)
                moved[chain] = moved.get(chain, 0) + k
    return frozenset(out)


def cpu_offloaded(tensors: Sequence[TensorDef], buffers: Sequence[DdpBuffer], tr: TrainingSpec,
                  expert_rule: str) -> list[tuple[str, int]]:
    """(name, elements) of the main parameters (shards) the hybrid optimizer updates on the CPU, in step order
    (none without ``training.optimizer_cpu_offload``)."""
    if not tr.optimizer_cpu_offload:
        return []
    groups = param_groups(tensors, buffers, tr, expert_rule)
    cpu = hybrid_split(groups, tr.optimizer_offload_fraction)
    return [(n, k) for _, ps in groups for n, k, _, _ in ps if n in cpu]


def main_params(tensors: Sequence[TensorDef], buffers: Sequence[DdpBuffer], tr: TrainingSpec,
                expert_rule: str) -> list[MainParam]:
    """Each main parameter (shard) of a device with its optimizer states (:func:`param_states`), in the order
    the optimizers create and step them (:func:`param_groups`); under Muon's layer-wise optimizer only the
    parameters dealt to it, as the last rank of its DP groups (the rank Megatron-LM logs memory on); under the
    hybrid CPU-offload optimizer only those it keeps on the GPU (:func:`hybrid_split`)."""
    groups = param_groups(tensors, buffers, tr, expert_rule)
    order = [p for _, ps in groups for p in ps]
    if tr.optimizer_cpu_offload:
        cpu = hybrid_split(groups, tr.optimizer_offload_fraction)
        order = [p for p in order if p[0] not in cpu]
    if tr.muon_layer_wise and tr.zero == 0:  # under zero = 1 the buffers' slots say what the rank owns
        dense_g, expert_g = dp_groups(buffers)
        owned = ping_pong_owned([(n, k, e) for n, k, _, e in order], dense_g, expert_g, dense_g - 1, expert_g - 1)
        order = [p for p in order if p[0] in owned]
    return [(n, k, param_states(tr, n, shape)) for n, k, shape, _ in order]
