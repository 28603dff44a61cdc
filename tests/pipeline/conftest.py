"""Shared helpers for the pipeline tests: PyTorch's own schedule generators, where torch exists.

torch is not a test dependency (it is the ``capture`` extra), so the comparison tests skip
without it. Torch's schedule classes want pipeline stages; like torch's own
``test/distributed/pipelining/test_schedule.py`` we hand them a stage stub that only carries
``num_stages``, ``group_size`` and ``group_rank`` — building a schedule's ``pipeline_order``
for every rank needs no process group and no model.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

_COMPUTE = re.compile(r"\d+[FBIW]\d+")

TorchOrder = Callable[..., tuple[list[list[str]], list[list[int]]]]


@pytest.fixture
def torch_schedule() -> Callable[..., object]:
    """``torch_schedule("ScheduleZBVZeroBubble", pp=4, chunks_per_rank=2, num_microbatches=8)``:
    torch's schedule object, built for every rank without a process group."""
    pytest.importorskip(
        "torch", reason="torch is not installed: comparison with torch.distributed.pipelining"
    )
    import torch.distributed

    if not torch.distributed.is_available():
        pytest.skip("this torch build has no torch.distributed")
    schedules = pytest.importorskip(
        "torch.distributed.pipelining.schedules", reason="torch.distributed.pipelining is missing"
    )
    from torch.distributed.pipelining.stage import _PipelineStageBase

    class StageStub(_PipelineStageBase):
        """Only what the schedule constructors read; deliberately skips the base __init__."""

        def __init__(self, *, num_stages: int, group_size: int) -> None:
            self.submod = None  # read by the zero-bubble schedules' torch.compile check
            self.num_stages = num_stages
            self.group_size = group_size
            self.group_rank = 0
            self.group = None
            self.stage_index = 0

        def _create_grad_recv_info(self, *args: object, **kwargs: object) -> None:
            return None

        def _prepare_forward_infra(self, *args: object, **kwargs: object) -> None:
            pass

        def _prepare_backward_infra(self, *args: object, **kwargs: object) -> None:
            pass

    def build(class_name: str, *, pp: int, chunks_per_rank: int, num_microbatches: int) -> object:
        cls = getattr(schedules, class_name, None)
        if cls is None:
            pytest.skip(f"this torch has no {class_name}")
        stages = [StageStub(num_stages=pp * chunks_per_rank, group_size=pp) for _ in range(chunks_per_rank)]
        single = issubclass(cls, schedules.PipelineScheduleSingle)
        return cls(stages[0] if single else stages, num_microbatches)

    return build


@pytest.fixture
def torch_order(torch_schedule: Callable[..., object]) -> TorchOrder:
    """``torch_order("Schedule1F1B", pp=4, chunks_per_rank=1, num_microbatches=8)``.

    Returns, per rank, torch's compute actions as text in order (idle steps, REDUCE_GRAD and
    communication actions dropped, overlapped pairs expanded) and the positions where an
    overlapped F&B pair starts.
    """

    def build(
        class_name: str, *, pp: int, chunks_per_rank: int, num_microbatches: int
    ) -> tuple[list[list[str]], list[list[int]]]:
        schedule: Any = torch_schedule(
            class_name, pp=pp, chunks_per_rank=chunks_per_rank, num_microbatches=num_microbatches
        )
        rows, pairs = [], []
        for rank in range(pp):
            row: list[str] = []
            starts: list[int] = []
            for action in schedule.pipeline_order[rank]:
                if action is None:
                    continue
                subs = getattr(action, "sub_actions", None)
                if subs:
                    starts.append(len(row))
                for part in subs or (action,):
                    if _COMPUTE.fullmatch(str(part)):
                        row.append(str(part))
            rows.append(row)
            pairs.append(starts)
        return rows, pairs

    return build
