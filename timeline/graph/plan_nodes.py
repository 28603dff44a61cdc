"""Megatron's schedule-plan nodes of a decoder layer, read off op names and streams, and the weight gradients
``--delay-wgrad-compute`` defers to each node's ``backward_dw``.

Megatron splits each transformer layer into schedule-plan nodes (``models/common/model_chunk_schedule_plan.py:
TransformerLayerSchedulePlan``, ``models/gpt/fine_grained_callables.py: build_transformer_layer_callables``,
core_v0.14.0 … d98e8a64dd): ``attn`` (input norm, attention, residual), ``post_attn`` (pre-MLP norm, router,
dispatch preprocess), ``dispatch`` (the EP all-to-all, on the communication stream), ``mlp`` (dispatch
postprocess, experts, combine preprocess) and ``combine`` (the all-to-all back, unpermute, bias-dropout-add); a
dense layer has ``attn`` and ``mlp`` only. :func:`node_keys` assigns each forward op its node: a layer's
``attn`` ends with its ``attn_residual``; an MoE layer (one whose ``mlp.dispatch.*`` op runs on the EP stream)
then has ``post_attn`` up to the dispatch all-to-all, ``dispatch`` (the EP ops of ``mlp.dispatch``), ``mlp`` up
to the combine all-to-all and ``combine`` after it; a dense layer's rest is ``mlp``.

Under ``--delay-wgrad-compute`` (which needs ``--overlap-moe-expert-parallel-comm``) the TE linears of two nodes
keep their weight gradients for an explicit ``backward_dw`` (``ScheduleNode.backward_dw``, 4e85d74ae9):
the ``mlp`` node's (the routed experts, a latent MoE's ``fc2_latent_proj``; a dense layer's MLP) and the
``attn`` node's, whose ``_BackwardDWWrapper`` also runs the shared experts' and ``fc1_latent_proj``'s
(:func:`dw_group`). The router's gradient GEMM is not a TE linear and stays where autograd runs it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_LAYER = re.compile(r"^layers\.(\d+)\.(.*)$")
#: an MoE layer's weight gradients the attn node's backward_dw runs (fine_grained_callables.py:
#: _BackwardDWWrapper: the shared experts; moe_layer.py: MoELayer.backward_dw, fc1_latent_proj)
_ATTN_DW_PARTS = ("mlp.shared_experts.", "mlp.shared_expert_gate", "mlp.fc1_latent_proj")


def local_name(name: str, layer: int) -> str:
    """``name`` without its ``layers.{layer}.`` prefix (the name itself outside that layer)."""
    m = _LAYER.match(name)
    return m.group(2) if m and int(m.group(1)) == layer else name


def node_keys(names: Sequence[str], streams: Sequence[str], layers: Sequence[int]) -> list[tuple[int, str]]:
    """Each forward op's (decoder layer, node); layer −1 with node ``pre`` or ``post`` outside the decoder layers
    (module docstring)."""
    moe_layers = {layer for name, stream, layer in zip(names, streams, layers, strict=True)
                  if layer >= 0 and stream == "ep" and local_name(name, layer).startswith("mlp.dispatch.")}
    keys: list[tuple[int, str]] = []
    seen_layer = False
    node_of: dict[int, str] = {}
    for name, stream, layer in zip(names, streams, layers, strict=True):
        if layer < 0:
            keys.append((-1, "post" if seen_layer else "pre"))
            continue
        seen_layer = True
        node = node_of.get(layer, "attn")
        local = local_name(name, layer)
        ep = stream == "ep"
        if node == "attn_done":
            node = "post_attn" if layer in moe_layers else "mlp"
        if layer in moe_layers:
            if node == "post_attn" and ep and local.startswith("mlp.dispatch."):
                node = "dispatch"
            elif node == "dispatch" and not ep:
                node = "mlp"
            elif node == "mlp" and ep and local.startswith("mlp.combine."):
                node = "combine"
        keys.append((layer, node))
        node_of[layer] = "attn_done" if node == "attn" and local == "attn_residual" else node
    return keys


def dw_group(name: str, layer: int, node: str) -> str | None:
    """Which node's ``backward_dw`` runs the weight gradient of forward op ``name`` (its node ``node``) under
    ``--delay-wgrad-compute``: ``mlp_dw``, ``attn_dw``, or None where it is not deferred."""
    if layer < 0 or not _LAYER.match(name):
        return None
    local = local_name(name, layer)
    if local.startswith("mlp.router"):
        return None
    if any(local.startswith(p) for p in _ATTN_DW_PARTS):
        return "attn_dw"
    if local.startswith("mlp.fc2_latent_proj"):
        return "mlp_dw"
    return {"mlp": "mlp_dw", "attn": "attn_dw"}.get(node)
