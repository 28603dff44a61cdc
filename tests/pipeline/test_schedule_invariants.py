"""What every generated schedule satisfies, through build_schedule, for every kind."""

from __future__ import annotations

import pytest

from timeline.errors import UserError
from timeline.pipeline import GENERATORS, build_schedule, generate, validate
from timeline.pipeline.placement import KINDS, num_chunks, stage_placement
from timeline.spec.run import SCHEDULE_KINDS as SPEC_KINDS
from timeline.spec.run import ScheduleSpec
from timeline.spec.schedule_rules import SCHEDULE_KINDS, SCHEDULES, kinds_help

# (kind, pp, vpp, num_microbatches, microbatch_group_size)
CASES = [
    ("gpipe", 1, 1, 1, 0),
    ("gpipe", 4, 1, 6, 0),
    ("1f1b", 1, 1, 3, 0),
    ("1f1b", 4, 1, 2, 0),
    ("1f1b", 8, 1, 16, 0),
    ("interleaved", 2, 2, 2, 0),
    ("interleaved", 4, 2, 8, 0),
    ("interleaved", 4, 3, 10, 5),
    ("interleaved", 8, 2, 32, 0),
    ("zb-h1", 1, 1, 2, 0),
    ("zb-h1", 4, 1, 3, 0),
    ("zb-h1", 8, 1, 16, 0),
    ("zbv", 1, 2, 1, 0),
    ("zbv", 4, 2, 3, 0),
    ("zbv", 8, 2, 16, 0),
    ("dualpipe", 2, 1, 4, 0),
    ("dualpipe", 8, 1, 20, 0),
    ("dualpipev", 1, 2, 2, 0),
    ("dualpipev", 4, 2, 10, 0),
    ("dualpipev", 8, 2, 17, 0),
]


@pytest.mark.parametrize(("kind", "pp", "vpp", "m", "group"), CASES)
def test_every_microbatch_runs_forward_and_backward_once_on_its_rank(
    kind: str, pp: int, vpp: int, m: int, group: int
) -> None:
    schedule = build_schedule(kind, pp=pp, vpp=vpp, num_microbatches=m, microbatch_group_size=group)
    validate(schedule)  # build_schedule validated already; validation is idempotent
    assert schedule.kind == kind
    assert schedule.num_chunks == num_chunks(kind, pp, vpp)  # the length of [parallel] layout
    assert schedule.stages_of_rank == stage_placement(kind, pp, vpp)
    runs: dict[tuple[int, int], list[tuple[str, int]]] = {}
    for rank, row in enumerate(schedule.actions):
        for action in row:
            assert action.stage in schedule.stages_of_rank[rank]
            runs.setdefault((action.stage, action.microbatch), []).append((action.kind, rank))
    assert set(runs) == {(s, k) for s in range(schedule.num_chunks) for k in range(m)}
    for kinds_and_ranks in runs.values():
        kinds = sorted(kind for kind, _ in kinds_and_ranks)
        assert kinds in (["B", "F"], ["F", "I", "W"])
        assert len({rank for _, rank in kinds_and_ranks}) == 1


@pytest.mark.parametrize(("kind", "pp", "vpp", "m", "group"), CASES)
def test_deterministic(kind: str, pp: int, vpp: int, m: int, group: int) -> None:
    # build_schedule caches its schedules: generate() builds anew each time, unvalidated (the same rows)
    first = build_schedule(kind, pp=pp, vpp=vpp, num_microbatches=m, microbatch_group_size=group)
    again = generate(kind, pp=pp, vpp=vpp, num_microbatches=m, microbatch_group_size=group)
    assert first == again and first is not again
    assert again == generate(kind, pp=pp, vpp=vpp, num_microbatches=m, microbatch_group_size=group)


def test_table_lists_every_kind() -> None:
    """One table of kinds: run validation's choices, the placement, the generators and the help
    all list the same kinds, and each fixed vpp is the number of chunks its placement gives a rank
    (DualPipe's two model copies: twice that)."""
    assert list(GENERATORS) == list(KINDS) == list(SCHEDULE_KINDS) == [k.name for k in SCHEDULES]
    assert ScheduleSpec.__dataclass_fields__["kind"].metadata["choices"] == SPEC_KINDS == tuple(SCHEDULE_KINDS)
    help_lines = kinds_help().splitlines()
    assert [line.split()[0] for line in help_lines] == list(SCHEDULE_KINDS)
    for k in SCHEDULES:
        if k.fixed_vpp is not None:
            copies = 2 if k.placement == "dualpipe" else 1
            assert {len(st) for st in stage_placement(k.name, 4, k.fixed_vpp)} == {copies * k.fixed_vpp}


@pytest.mark.parametrize(
    ("kind", "pp", "vpp", "m", "group", "words"),
    [
        ("ring", 4, 1, 8, 0, "unknown schedule kind"),
        ("zbv", 4, 1, 8, 0, "set parallel.vpp = 2"),
        ("1f1b", 4, 2, 8, 0, "set parallel.vpp = 1"),
        ("1f1b", 4, 1, 8, 4, "applies to interleaved only"),
        ("dualpipe", 5, 1, 20, 0, "even pp"),
        ("dualpipe", 4, 1, 9, 0, "even num_microbatches"),
        ("dualpipev", 4, 2, 6, 0, "at least 2·pp"),
        ("interleaved", 4, 1, 8, 0, "vpp ≥ 2"),
        ("1f1b", 0, 1, 8, 0, "pp must be at least 1"),
        ("gpipe", 2, 1, 0, 0, "num_microbatches must be at least 1"),
    ],
)
def test_impossible_combinations_say_why(
    kind: str, pp: int, vpp: int, m: int, group: int, words: str
) -> None:
    for build in (build_schedule, generate):
        with pytest.raises(UserError) as error:
            build(kind, pp=pp, vpp=vpp, num_microbatches=m, microbatch_group_size=group)
        assert words in str(error.value)


def test_csv_rows_only_with_csv() -> None:
    with pytest.raises(ValueError):
        build_schedule("csv", pp=1, vpp=1, num_microbatches=1)
    with pytest.raises(ValueError):
        build_schedule("1f1b", pp=1, vpp=1, num_microbatches=1, csv_rows=[["0F0", "0B0"]])
    with pytest.raises(ValueError):
        generate("csv", pp=1, vpp=1, num_microbatches=1)
