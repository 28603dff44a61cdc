"""render(): ranks as rows, unit time steps as columns."""

from __future__ import annotations

from timeline.pipeline import build_schedule, render

EXPECTED = """\
1f1b: pp=2 chunks=2 micro-batches=3 steps=12 (F=1 B=2 I=1 W=1; '.' idle, '-' continues)
step   |   0   1   2   3   4   5   6   7   8   9  10  11
rank 0 | 0F0 0F1   .   . 0B0   - 0F2 0B1   -   . 0B2   -
rank 1 |   . 1F0 1B0   - 1F1 1B1   - 1F2 1B2   -   .   .
"""


def test_1f1b_two_ranks() -> None:
    assert render(build_schedule("1f1b", pp=2, vpp=1, num_microbatches=3)) == EXPECTED


def test_split_backward_and_custom_durations() -> None:
    text = render(build_schedule("zb-h1", pp=2, vpp=1, num_microbatches=2), durations={"F": 2})
    lines = text.splitlines()
    assert lines[0].startswith("zb-h1: pp=2 chunks=2 micro-batches=2 steps=")
    assert "F=2 B=2 I=1 W=1" in lines[0]
    assert lines[2].split("|")[1].split()[:3] == ["0F0", "-", "0F1"]
    assert len({len(line) for line in lines[1:]}) == 1  # fixed width
