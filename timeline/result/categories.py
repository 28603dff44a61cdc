"""The memory categories a Timeline counts bytes under, in code order (``DeviceEvents.cat``
indexes :data:`CATEGORIES`). They are defined with the tensor vocabulary
(:class:`timeline.graph.tensors.Category`); the exporters and the CLI take them from here, next to
the result they format. A light module: importing it pulls in no simulator.
"""

from __future__ import annotations

from timeline.graph.tensors import CATEGORIES, Category

#: the categories of the state a device holds for the whole run (weights, gradients, optimizer states)
STATIC_CATEGORIES: tuple[str, ...] = (Category.WEIGHTS.value, Category.GRADS.value, Category.OPTIMIZER.value)

__all__ = ["CATEGORIES", "STATIC_CATEGORIES", "Category"]
