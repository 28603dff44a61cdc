"""A serving run's trace.json in Perfetto's own trace processor (tools/perfetto_engine.py): no
import error or data loss, one slice per engine step on the step track, one async slice per
finished request, and the memory counter equal to memory.parquet at every step."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import perfetto_engine
import pytest

from timeline.exporters import serve_trace
from timeline.io.serve_runfile import load_serve_run
from timeline.serve.run import serve

if perfetto_engine.missing():
    if os.environ.get("CI"):
        raise RuntimeError(f"the Perfetto engine test must run in CI: {perfetto_engine.missing()}")
    pytest.skip(perfetto_engine.missing(), allow_module_level=True)

RUN = Path(__file__).resolve().parents[2] / "schedules" / "llama3.1-8b-h100-serve.toml"


def test_serve_trace_loads_in_perfetto(tmp_path):
    res = serve(load_serve_run(RUN, ["serving.load.num_requests=30"]))
    buf = io.BytesIO()
    serve_trace.write(res, buf)
    path = tmp_path / "trace.json"
    path.write_bytes(buf.getvalue())
    sqls = ["select count(*) from stats where value > 0 and severity in ('error', 'data_loss')",
            "select count(*) from slice s join thread_track tt on s.track_id = tt.id",
            "select count(*) from slice where name like 'request %'",
            "select c.value from counter c join process_counter_track t on c.track_id = t.id "
            "where t.name = 'memory (bytes) allocated' order by c.ts"]
    out = perfetto_engine.query(path, sqls)
    assert out[0]["rows"] == [[0]]
    assert out[1]["rows"] == [[len(res.sched.steps)]]
    assert out[2]["rows"] == [[30]]
    assert [int(r[0]) for r in out[3]["rows"]] == [int(v) for v in res.memory["allocated_bytes"]]
    assert json.loads(buf.getvalue())["metadata"]["schema"] == "timeline.serve.trace/1"


def test_dp_trace_has_a_process_per_rank(tmp_path):
    res = serve(load_serve_run(RUN, ["parallel.dp=2", "serving.load.num_requests=30"]))
    buf = io.BytesIO()
    serve_trace.write(res, buf)
    path = tmp_path / "trace.json"
    path.write_bytes(buf.getvalue())
    sqls = ["select count(*) from stats where value > 0 and severity in ('error', 'data_loss')",
            "select p.pid, count(*) from slice s join thread_track tt on s.track_id = tt.id "
            "join thread t using (utid) join process p using (upid) group by p.pid order by p.pid",
            "select count(*) from slice where name like 'request %'"]
    out = perfetto_engine.query(path, sqls)
    assert out[0]["rows"] == [[0]]
    assert out[1]["rows"] == [[rk.rank, len(rk.sched.steps)] for rk in res.ranks]
    assert out[2]["rows"] == [[30]]
