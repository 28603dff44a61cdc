"""Megatron-LM's fine-grained activation offloading as groups of a chunk's forward ops.

``--fine-grained-activation-offloading --offload-modules …`` (Megatron-LM b97184db56 … d98e8a64dd,
``megatron/core/pipeline_parallel/fine_grained_activation_offload.py``, read at f5b2ec0130) wraps module
groups of each decoder layer in a saved-tensor hook context (``FineGrainedActivationOffloadingInterface``):
every tensor autograd saves inside the context is pushed into the group (``ChunkOffloadHandler.tensor_push``),
and at the group's *commit* (``group_commit``, an identity autograd function on the group's output) each
pushed tensor of at least ``min_offloaded_tensor_size`` elements is copied to the host and dropped
(``bulk_offload_group``), with the ``forced_released_tensors`` the call names freed besides
(``untyped_storage().resize_(0)``). In the backward each offloaded tensor comes back as a fresh device tensor
(``reload``: ``torch.empty`` + copy), by a bulk reload of the group (:mod:`timeline.sim.offload` decides when)
or, if none came first, when autograd unpacks it (``tensor_pop``).

The groups, their context and their commit, as the modules write them at f5b2ec0130:

- ``attn_norm`` (``transformer_layer.py: TransformerLayer._forward_attention``): the input norm where it is a
  module of its own (not fused into the QKV projection: ``IdentityOp``); committed after the attention's
  bias-dropout-add, releasing the layer input (the residual).
- ``qkv_linear`` (``attention.py: Attention.forward``, ``multi_latent_attention.py:
  MultiLatentAttention.forward``): ``get_query_key_value_tensors`` — the QKV projection (with the input norm
  where TE's LayerNormLinear fuses it), with MLA its down and up projections, latent norms and RoPE; committed
  right after, releasing (MLA) its input.
- ``core_attn``: the core attention (not under ``core_attn`` recompute, whose checkpoint has no context);
  releases query, key and value.
- ``attn_proj``: the output projection; releases its input.
- ``mlp_norm`` (``TransformerLayer._forward_pre_mlp_layernorm`` / ``_forward_post_mlp``): the pre-MLP norm
  where it is a module of its own; committed after the MLP's bias-dropout-add, releasing the residual.
- ``expert_fc1`` and ``moe_act`` (``moe/experts.py: TEGroupedMLP.forward``, grouped GEMM only): the experts'
  fc1, committed right after, releasing its input; their activation, committed after fc2 (so that its input
  is back for the activation's recompute), releasing the activation's input.

Every release a commit forces is of a tensor the group saved itself (the layer input the input norm
saved, the projections' inputs, query/key/value), so the model needs no release of its own: a saved tensor
every one of whose savers is in offloaded groups *moves* — freed once the last of those groups commits (or
after its last forward reader) and allocated again when reloaded. One the GPU keeps anyway — saved outside
every group, or re-created by a recompute region (a ``CheckpointWithoutOutput`` output) — is offloaded as a
*copy*: the reload allocates a second tensor, freed after the group's last backward reader. This module builds
no ops and decides no timing.
"""

from __future__ import annotations

from collections.abc import Sequence

from timeline.graph.analysis import Analysis
from timeline.graph.backward import Unit, rc_storage
from timeline.graph.ir import FOp
from timeline.graph.ops import OffloadGroup, OffloadItem
from timeline.spec.run import OffloadSpec


def _prefix(op: FOp) -> str | None:
    """The name prefix of the decoder layer ``op`` belongs to: ``layers.N.``, or an MTP module's ``mtp.K.layer.``
    (its ``transformer_layer``, a TransformerLayer like the decoder's: multi_token_prediction.py); None outside."""
    if op.layer is None:
        return None
    if f"layers.{op.layer}." in op.name:
        return f"layers.{op.layer}."
    if op.name.startswith("mtp.") and ".layer." in op.name:
        return op.name.split(".layer.", 1)[0] + ".layer."
    return None


def _layer_ops(ops: Sequence[FOp]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, op in enumerate(ops):
        if op.layer is not None and _prefix(op) is not None:
            out.setdefault(op.layer, []).append(i)
    return out


def _local(op: FOp) -> str:
    """The op's name below its decoder layer (``self_attn.linear_proj``)."""
    prefix = _prefix(op)
    return op.name.split(prefix, 1)[-1] if prefix else op.name


def _spans(ops: Sequence[FOp], idx: list[int], modules: frozenset[str], *,
           core_attn_recomputed: bool) -> list[tuple[str, list[int], int]]:
    """(name, the ops inside the group's context, its commit op) of one layer's groups, in the order their
    contexts start."""
    local = {i: _local(ops[i]) for i in idx}
    found: list[tuple[str, list[int], int]] = []

    def first(name: str) -> int | None:
        return next((i for i in idx if local[i] == name), None)

    norm = first("input_layernorm")
    attn_residual = first("attn_residual")
    core = [i for i in idx if "core_attn" in ops[i].tags]
    attn_ops = [i for i in idx if local[i].startswith("self_attn.")]
    proj = [i for i in attn_ops if local[i] == "self_attn.linear_proj" or local[i].startswith("self_attn.linear_proj.")]
    mla = any(local[i].startswith("self_attn.linear_q_down_proj") or local[i].startswith("self_attn.linear_q_proj")
              for i in attn_ops) and any(local[i].startswith("self_attn.linear_kv_down_proj") for i in attn_ops)
    if "attn_norm" in modules and norm is not None and "layernorm" in ops[norm].tags and attn_residual is not None:
        found.append(("attn_norm", [norm], attn_residual))
    if "qkv_linear" in modules and core:
        qkv = [i for i in attn_ops if i < core[0] and i not in core and (mla or not local[i].startswith("self_attn.rope"))]
        if qkv and norm is not None and "layernorm" not in ops[norm].tags:
            qkv.insert(0, norm)  # a norm fused into the QKV projection (TE's LayerNormLinear) saves inside its context
        if qkv:
            found.append(("qkv_linear", qkv, qkv[-1]))
    if "core_attn" in modules and core and not core_attn_recomputed:
        found.append(("core_attn", core, core[-1]))
    if "attn_proj" in modules and proj:
        found.append(("attn_proj", proj, proj[-1]))
    pre_mlp = next((i for i in idx if local[i] == "pre_mlp_layernorm" or
                    (local[i] in ("post_attention_layernorm", "pre_feedforward_layernorm")
                     and "layernorm" in ops[i].tags)), None)
    mlp_residual = first("mlp_residual")
    if "mlp_norm" in modules and pre_mlp is not None and mlp_residual is not None:
        found.append(("mlp_norm", [pre_mlp], mlp_residual))
    fc1 = [i for i in idx if local[i] == "mlp.experts.linear_fc1" and ops[i].rule.endswith("grouped_linear")]
    if "expert_fc1" in modules and fc1:
        found.append(("expert_fc1", fc1, fc1[-1]))
    act, fc2 = first("mlp.experts.act"), first("mlp.experts.linear_fc2")
    if "moe_act" in modules and fc1 and act is not None and fc2 is not None:
        found.append(("moe_act", [act], fc2))
    return found


def offload_groups(a: Analysis, units: Sequence[Unit], spec: OffloadSpec, *,
                   core_attn_recomputed: bool) -> tuple[OffloadGroup, ...]:
    """The offload groups of one chunk whose forward ops and saved tensors ``a`` analysed, and whose fused
    backward is ``units`` (:func:`timeline.graph.backward.unit_list`), in the order their contexts start.

    A saved tensor of at least ``spec.min_elements`` elements whose savers are all inside groups moves with
    the group holding its last backward reader (the others reload copies, and it moves only where they offload
    too: their commits drop or release the last references); one saved outside every group, or re-created by a
    recompute region, is offloaded as a copy by each group that saved it."""
    if not spec.modules:
        return ()
    ops = a.ops
    modules = frozenset(spec.modules)
    unit_of: dict[tuple[str, int], int] = {}  # (phase, forward op) -> index of its unit in the fused backward
    readers: dict[str, list[int]] = {}  # storage (or its recomputed one) -> backward units reading it
    for k, u in enumerate(units):
        unit_of.setdefault((u.phase, u.index), k)
        for s in u.needs:
            readers.setdefault(s, []).append(k)
    spans = []  # (name, layer, members, commit, start_bwd)
    for layer, idx in sorted(_layer_ops(ops).items()):
        for name, members, commit in _spans(ops, idx, modules, core_attn_recomputed=core_attn_recomputed):
            # the start's backward runs once the first op's node is done (its input gradient, and the weight
            # gradient TE computes in the same node)
            first = next((i for i in members if ("I", i) in unit_of), None)
            start_bwd = None if first is None else max(unit_of[(ph, first)] for ph in ("I", "W") if (ph, first) in unit_of)
            if start_bwd is not None:
                spans.append((name, layer, members, commit, start_bwd))
    group_of = {i: g for g, sp in enumerate(spans) for i in sp[2]}
    items: list[list[OffloadItem]] = [[] for _ in spans]
    for s, savers in a.savers.items():
        if a.tensors[s].numel < spec.min_elements:
            continue
        # the autograd nodes that save s in the forward, each with its group (None: outside every group): an op
        # outside every recompute region, or a region's checkpoint (its kept input); an op inside a region runs
        # without grad in the forward and saves nothing then
        nodes: dict[tuple[str, int], int | None] = {}
        for sv in savers:
            if sv.region is not None:
                nodes.setdefault(("region", sv.region), group_of.get(sv.op))
            elif sv.op not in a.region_of:
                nodes.setdefault(("op", sv.op), group_of.get(sv.op))
        if all(g is None for g in nodes.values()):
            continue
        target = rc_storage(s) if s in a.dropped else s
        reads: dict[tuple[str, int], list[int]] = {n: [] for n in nodes}
        for k in readers.get(target, ()):
            u = units[k]
            region = a.region_of.get(u.index)
            key = ("region", region) if region is not None and ("region", region) in reads else ("op", u.index)
            if key in reads:
                reads[key].append(k)
        saving = [(n, g) for n, g in nodes.items() if g is not None and reads[n]]
        if not saving:
            continue
        whole = s not in a.dropped and all(g is not None for g in nodes.values())
        mover = max((n for n, _ in saving), key=lambda n: reads[n][-1]) if whole else None
        last_read = max(a.consumers.get(s, ()), default=-1)
        groups = sorted({g for _, g in saving})
        free_after = max([last_read, *(spans[g][3] for g in groups)])
        for tag, (n, g) in enumerate(saving):
            items[g].append(OffloadItem(storage=s, copy=n != mover, tag=tag, free_after=free_after,
                                        partners=tuple(x for x in groups if x != g), needs=tuple(reads[n])))
    return tuple(OffloadGroup(name=n, layer=layer, start=members[0], commit=commit, start_bwd=sb,
                              items=tuple(sorted(items[g], key=lambda it: (it.storage, it.tag))))
                 for g, (n, layer, members, commit, sb) in enumerate(spans))
