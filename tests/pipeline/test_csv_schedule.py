"""CSV schedules: torch's format in and out, and bad files rejected with rank, position, reason."""

from __future__ import annotations

import pytest

from timeline.errors import UserError
from timeline.io.csv_schedule import CsvScheduleError, parse_csv, read_csv, write_csv
from timeline.pipeline import ScheduleError, build_schedule

KINDS = [
    ("gpipe", 2, 1, 3),
    ("1f1b", 4, 1, 8),
    ("interleaved", 4, 2, 8),
    ("zb-h1", 4, 1, 6),
    ("zbv", 4, 2, 8),
    ("dualpipe", 4, 1, 8),
    ("dualpipev", 4, 2, 10),
]


def load(text: str, *, pp: int, vpp: int = 1, m: int):
    return build_schedule("csv", pp=pp, vpp=vpp, num_microbatches=m, csv_rows=parse_csv(text, source="s.csv"))


@pytest.mark.parametrize(("kind", "pp", "vpp", "m"), KINDS)
def test_round_trip_keeps_actions_placement_and_pairs(kind: str, pp: int, vpp: int, m: int) -> None:
    schedule = build_schedule(kind, pp=pp, vpp=vpp, num_microbatches=m)
    text = write_csv(schedule)
    again = load(text, pp=pp, vpp=vpp, m=m)
    assert again.actions == schedule.actions
    assert again.overlapped == schedule.overlapped
    assert set(map(frozenset, again.stages_of_rank)) == set(map(frozenset, schedule.stages_of_rank))
    assert write_csv(again) == text


def test_dualpipev_pairs_are_written_as_torch_writes_them() -> None:
    first_row = write_csv(build_schedule("dualpipev", pp=2, vpp=2, num_microbatches=4)).splitlines()[0]
    assert "(0F3;3B1)OVERLAP_F_B" in first_row.split(",")


def test_torch_dump_with_idle_cells_header_and_comms_loads(tmp_path) -> None:
    # torch's compute_comms dump carries SEND/RECV, UNSHARD and REDUCE_GRAD cells; all are skipped
    path = tmp_path / "two.csv"
    path.write_text(
        "Rank 0,Step 0,Step 1\r\n"
        "0UNSHARD,0F0,0SEND_F0,0F1,0SEND_F1,,0B0,0B1,0REDUCE_GRAD\r\n"
        ",1RECV_F0,1F0,1B0,1SEND_B0,1F1,1B1\r\n"
        "\r\n"
    )
    schedule = build_schedule("csv", pp=2, vpp=1, num_microbatches=2, csv_rows=read_csv(path))
    assert [[str(a) for a in row] for row in schedule.actions] == [
        ["0F0", "0F1", "0B0", "0B1"],
        ["1F0", "1B0", "1F1", "1B1"],
    ]
    assert schedule.stages_of_rank == ((0,), (1,))


def test_v_shape_placement_is_inferred_from_the_rows() -> None:
    schedule = load("0F0,3F0,3B0,0B0\n1F0,2F0,2B0,1B0\n", pp=2, vpp=2, m=1)
    assert schedule.stages_of_rank == ((0, 3), (1, 2))


def test_unknown_action_names_file_rank_position() -> None:
    with pytest.raises(CsvScheduleError) as error:
        parse_csv("0F0,0B0\n1F0,1X0,1B0\n", source="mine.csv")
    assert (error.value.source, error.value.rank, error.value.position) == ("mine.csv", 1, 1)
    assert "unknown action '1X0'" in str(error.value)
    assert str(error.value).startswith("mine.csv: rank 1, position 1: ")


def test_backward_before_its_forward_is_rejected() -> None:
    with pytest.raises(ScheduleError) as error:
        load("0F0,,0B1,0F1,0B0\n1F0,1B0,1F1,1B1\n", pp=2, m=2)
    assert (error.value.rank, error.value.position) == (0, 2)  # the CSV column, idle cell included
    assert "0B1 runs before its 0F1" in error.value.reason


def test_missing_microbatch_is_rejected() -> None:
    with pytest.raises(ScheduleError) as error:
        load("0F0,0B0\n1F0,1B0\n", pp=2, m=2)
    assert error.value.rank == 0 and error.value.position is None
    assert "micro-batch 1 of stage 0 never runs forward" in error.value.reason


def test_backward_on_another_rank_is_rejected() -> None:
    with pytest.raises(ScheduleError) as error:
        load("0F0,1B0\n1F0,0B0\n", pp=2, m=1)
    assert (error.value.rank, error.value.position) == (0, 1)
    assert "1B0 must run on rank 1, where 1F0 runs" in error.value.reason


def test_deadlock_is_rejected() -> None:
    # rank 0 waits for 1B0 before running 0F1, rank 1 waits for 0F1 before running 1B0
    with pytest.raises(ScheduleError) as error:
        load("0F0,0B0,0F1,0B1\n1F0,1F1,1B0,1B1\n", pp=2, m=2)
    assert (error.value.rank, error.value.position) == (0, 1)
    assert "deadlock" in error.value.reason


def test_row_count_must_match_pp() -> None:
    with pytest.raises(UserError, match="has 1 rows but pp = 2"):
        load("0F0,0B0\n", pp=2, m=1)


def test_empty_file_is_rejected() -> None:
    with pytest.raises(UserError, match="no schedule rows"):
        parse_csv("\n\n", source="empty.csv")


def test_source_can_be_attached_to_schedule_errors() -> None:
    with pytest.raises(ScheduleError) as error:
        load("0F0\n1F0,1B0\n", pp=2, m=1)
    assert str(error.value.with_source("my.csv")).startswith("my.csv: rank 0: ")


@pytest.mark.parametrize(
    ("class_name", "kind", "pp", "vpp", "m"),
    [
        ("ScheduleInterleaved1F1B", "interleaved", 4, 2, 8),
        ("ScheduleZBVZeroBubble", "zbv", 4, 2, 8),
        ("ScheduleDualPipeV", "dualpipev", 4, 2, 10),
    ],
)
@pytest.mark.parametrize("dump_format", ["compute_only", "compute_comms"])
def test_torch_dump_csv_loads_as_our_schedule(
    torch_schedule, tmp_path, class_name: str, kind: str, pp: int, vpp: int, m: int, dump_format: str
) -> None:
    # torch writes idle steps as empty cells (compute_only) or adds SEND/RECV, UNSHARD/RESHARD
    # and REDUCE_GRAD (compute_comms); either way the compute actions are ours
    path = tmp_path / "torch.csv"
    torch_schedule(class_name, pp=pp, chunks_per_rank=vpp, num_microbatches=m)._dump_csv(
        str(path), dump_format
    )
    theirs = build_schedule("csv", pp=pp, vpp=vpp, num_microbatches=m, csv_rows=read_csv(path))
    ours = build_schedule(kind, pp=pp, vpp=vpp, num_microbatches=m)
    assert theirs.actions == ours.actions
    assert theirs.overlapped == ours.overlapped
