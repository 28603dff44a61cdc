"""Frozen, keyword-only, slotted dataclasses describing one simulated training job.

``spec`` is the bottom layer: it imports nothing else from the package except
:mod:`timeline.errors`. Each section checks its own field types and ranges through field
metadata (see :mod:`timeline.spec.fields`); rules that span sections live in
:mod:`timeline.spec.validate`.
"""

from timeline.spec.model import ModelSpec
from timeline.spec.run import (
    AllocatorSpec,
    HardwareSpec,
    OffloadSpec,
    ParallelSpec,
    RecomputeSpec,
    RunSpec,
    ScheduleSpec,
    TrainingSpec,
)

__all__ = [
    "AllocatorSpec",
    "HardwareSpec",
    "ModelSpec",
    "OffloadSpec",
    "ParallelSpec",
    "RecomputeSpec",
    "RunSpec",
    "ScheduleSpec",
    "TrainingSpec",
]
