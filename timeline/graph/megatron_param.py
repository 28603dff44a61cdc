"""Megatron's parameters over the layer library's tensors: which tensors one ``Parameter`` holds, and which
of them Muon steps. Pure name and shape rules, read by the buffer layout (:mod:`timeline.graph.dp_buffers`) and
the optimizer states (:mod:`timeline.graph.optim_state`)."""

from __future__ import annotations

from collections.abc import Sequence

from timeline.graph.tensors import TensorDef
from timeline.profiles.megatron_workspaces import FUSED_INTO

#: parameter names ``is_embedding_or_output_parameter`` marks (language_module.py)
EMBEDDING_OR_OUTPUT = ("word_embeddings.weight", "output_layer.weight")


def megatron_name(name: str) -> str:
    """The Megatron parameter a layer-library tensor belongs to: q/k/v in ``linear_qkv``, gate/up in
    ``linear_fc1`` (``FUSED_INTO``); any other is its own."""
    parts = name.rsplit(".", 2)
    if len(parts) == 3 and parts[1] in FUSED_INTO:
        return f"{parts[0]}.{FUSED_INTO[parts[1]]}.{parts[2]}"
    return name


def megatron_params(tensors: Sequence[TensorDef]) -> list[tuple[str, list[TensorDef]]]:
    """``tensors`` (in order) as Megatron's parameters: (name, the layer library's tensors it holds),
    q/k/v and gate/up of one module merged at the first one's place (:func:`megatron_name`)."""
    groups: dict[str, list[TensorDef]] = {}
    for t in tensors:
        groups.setdefault(megatron_name(t.name), []).append(t)
    return [(n, ts) if len(ts) > 1 else (ts[0].name, ts) for n, ts in groups.items()]


def muon_managed(name: str, shape: tuple[int, ...]) -> bool:
    """Whether Muon (not its Adam fallback) steps this Megatron parameter: not 1-D, not embedding or output
    (``MC/optimizer/muon.py: get_megatron_muon_optimizer``@693587db5a; ``layer_wise_optimizer.py:
    is_managed_by_layer_wise_optimizer``@86ba3a66d5: 2-D and not ``is_embedding_or_output_parameter``)."""
    return len(shape) > 1 and not name.endswith(EMBEDDING_OR_OUTPUT)
