"""The restricted snapshot unpickler: plain data loads, anything else is refused unexecuted."""

from __future__ import annotations

import os
import pickle
from collections import OrderedDict

import pytest

from timeline.errors import UserError
from timeline.io.snapshot import load_snapshot, loads_snapshot

SNAPSHOT = {
    "segments": [{"device": 0, "address": 1 << 30, "total_size": 2 << 20, "stream": 0, "segment_type": "small",
                  "blocks": [{"address": 1 << 30, "size": 512, "requested_size": 100, "state": "active_allocated"}]}],
    "device_traces": [[{"action": "alloc", "addr": 1 << 30, "size": 100, "stream": 0}]],
    "allocator_settings": OrderedDict(expandable_segments=False),
}


class _Hostile:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_plain_snapshot_loads(tmp_path):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(SNAPSHOT, protocol=4))
    snap = load_snapshot(path)
    assert snap["segments"][0]["blocks"][0]["size"] == 512
    assert snap["device_traces"][0][0]["action"] == "alloc"
    assert snap["allocator_settings"]["expandable_segments"] is False


def test_hostile_pickle_is_refused_and_not_executed(tmp_path):
    marker = tmp_path / "pwned"
    data = pickle.dumps({"segments": [], "x": _Hostile(str(marker))})
    with pytest.raises(UserError, match="refusing to load"):
        loads_snapshot(data)
    assert not marker.exists()


def test_truncated_file(tmp_path):
    path = tmp_path / "cut.pickle"
    path.write_bytes(pickle.dumps(SNAPSHOT, protocol=4)[:-40])
    with pytest.raises(UserError, match="cut.pickle") as info:
        load_snapshot(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("obj", [{"hello": 1}, 42, "text", [1, 2, 3], {"segments": [{"address": 1}]}])
def test_foreign_pickles_are_user_errors(obj):
    with pytest.raises(UserError, match="snapshot"):
        loads_snapshot(pickle.dumps(obj))


def test_bare_list_of_segments_is_an_old_valid_format():
    snap = loads_snapshot(pickle.dumps(SNAPSHOT["segments"]))
    assert snap["device_traces"] == [] and snap["allocator_settings"] is None and len(snap["segments"]) == 1


def test_not_a_pickle_and_missing_file(tmp_path):
    with pytest.raises(UserError):
        loads_snapshot(b"this is not a pickle at all")
    with pytest.raises(UserError, match="cannot read"):
        load_snapshot(tmp_path / "absent.pickle")
