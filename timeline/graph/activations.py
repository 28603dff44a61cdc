"""Activation memory per device: what one micro-batch's forward of each held chunk keeps.

Sums :attr:`ChunkTemplate.layer_activation_bytes` over the chunks a device holds. Pipeline
in-flight multipliers (how many micro-batches are alive at once) are the schedule's business
and are not applied here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from timeline.graph.ops import ChunkTemplate, SavedTensor


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceActivations:
    bytes_per_microbatch: int
    layer_bytes: tuple[tuple[int, int], ...]  # (layer, bytes), -1 = outside decoder layers
    saved: tuple[SavedTensor, ...]


def device_activations(templates: Sequence[ChunkTemplate]) -> DeviceActivations:
    """The activations of a device running ``templates`` (one per chunk it holds)."""
    per_layer: dict[int, int] = {}
    saved: list[SavedTensor] = []
    for t in templates:
        for layer, n in t.layer_activation_bytes.items():
            per_layer[layer] = per_layer.get(layer, 0) + n
        saved += t.saved
    ordered = tuple(sorted(per_layer.items(), key=lambda kv: (kv[0] < 0, kv[0])))
    return DeviceActivations(bytes_per_microbatch=sum(per_layer.values()), layer_bytes=ordered, saved=tuple(saved))
