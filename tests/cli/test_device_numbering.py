"""One device numbering (issue 14, item 2): every view names a device by its global rank — the
table, summary.json, the Parquet files, trace.json and the protobuf, and ``replay`` of the
run's own snapshot.pickle (memory_viz numbers by index; the pickle's ``timeline_devices`` maps it)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

from timeline.cli import main

SHIPPED = Path(__file__).resolve().parents[2] / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"
SMALL = ["--set", "model.profile=megatron", "--set", "model.num_layers=4", "--set", "parallel.pp=2",
         "--set", "parallel.layout=[2,2]", "--set", "training.seq_len=512", "--set", "training.num_microbatches=2",
         "--set", "model.n_routed_experts=16", "--set", "parallel.dp=8", "--set", "model.mtp_layers=0"]


def test_every_view_uses_the_global_rank(tmp_path, capsys):
    import pyarrow.parquet as pq

    from timeline.exporters.perfetto_proto import _protos

    pb = _protos()

    out = tmp_path / "run"
    assert main(["simulate", str(SHIPPED), "-o", str(out), "--no-progress", "--format",
                 "summary,memory,events,ops,trace,perfetto,snapshot", *SMALL]) == 0
    table = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    ranks = [d["device"] for d in summary["devices"]]
    assert ranks == [0, 16]  # pp rank 1 starts after tp·ep·… = 16 ranks (Megatron order)
    assert [line.split()[:2] for line in table.splitlines() if line.split()[:1] == ["1"]] == [["1", "16"]]
    for name in ("memory", "events", "ops"):
        assert sorted(set(pq.read_table(out / f"{name}.parquet").column("device").to_pylist())) == ranks, name
    trace = json.loads((out / "trace.json").read_text())["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in trace if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {1: "rank 0 · pp 0 · ×16", 17: "rank 16 · pp 1 · ×16"}
    proto = pb.Trace.FromString((out / "trace.perfetto-trace").read_bytes())
    groups = {t.track_descriptor.sibling_order_rank + 1: t.track_descriptor.name for t in proto.packet
              if t.HasField("track_descriptor") and t.track_descriptor.parent_uuid == 1}  # device groups by rank
    assert groups == procs
    snap = pickle.loads((out / "snapshot.pickle").read_bytes())
    assert [d["device"] for d in snap["timeline_devices"]] == ranks  # memory_viz shows index 0, 1
    assert main(["replay", str(out / "snapshot.pickle"), "--json"]) == 0
    devices = json.loads(capsys.readouterr().out)["devices"]
    assert [(d["device"], d["snapshot_index"]) for d in devices] == [(0, 0), (16, 1)]
    assert main(["replay", str(out / "snapshot.pickle"), "-o", str(tmp_path / "rep")]) == 0
    assert "    16 " in capsys.readouterr().out
    rep = pq.read_table(tmp_path / "rep" / "memory.parquet")
    assert sorted(set(rep.column("device").to_pylist())) == ranks
