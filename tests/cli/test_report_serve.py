"""``timeline report`` on a ``timeline serve`` folder: the page embeds the folder's own numbers
(summary.json's settings and budget, memory.parquet's rows, requests.parquet's latencies, exactly),
stays small, runs its script, and folders report does not read still get a one-line error."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from browser_check import no_browser, open_page

from timeline.cli import main
from timeline.exporters.report_html import embedded_data
from timeline.exporters.report_serve import COLUMNS, DEVICE_FIELDS, serve_data
from timeline.io.rundir import read_columns

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "schedules" / "llama3.1-8b-h100-serve.toml"
GPT_OSS = ROOT / "schedules" / "gpt-oss-20b-h100-serve.toml"
STUB = Path(__file__).with_name("report_dom_stub.js")


def serve_folder(out: Path, run: Path, *extra: str) -> Path:
    assert main(["serve", str(run), "-o", str(out), "--format", "summary,memory,requests", *extra]) == 0
    return out


def report(folder: Path) -> dict:
    assert main(["report", str(folder)]) == 0
    page = (folder / "report.html").read_text(encoding="utf-8")
    bare = page.replace("'http://www.w3.org/2000/svg'", "")  # the SVG namespace names, it fetches nothing
    assert "https://" not in bare and "http://" not in bare and "<script src" not in bare and "<link" not in bare
    assert (folder / "report.html").stat().st_size < 10 * 2**20
    return embedded_data(page)


def files(folder: Path) -> tuple[dict, dict, dict]:
    summary = json.loads((folder / "summary.json").read_text())
    mem = read_columns(folder / "memory.parquet", "timeline.serve.memory/")
    req = read_columns(folder / "requests.parquet", "timeline.serve.requests/")
    assert mem is not None and req is not None
    return summary, mem, req


def run_stub(page: Path) -> dict:
    proc = subprocess.run(["node", str(STUB), str(page)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def pct(values: np.ndarray, q: float) -> float:
    return round(float(np.percentile(values / 1e3, q)), 3)


@pytest.mark.parametrize("run", [LLAMA, GPT_OSS], ids=["llama3.1-8b", "gpt-oss-20b"])
def test_serve_page_embeds_the_folders_numbers(tmp_path, capsys, run):
    folder = serve_folder(tmp_path / "srv", run)
    doc = report(folder)
    summary, mem, req = files(folder)
    assert doc["schema"] == "timeline.report/1" and doc["kind"] == "serve"
    assert doc["title"] == f"timeline report: srv (serve, {summary['run']['name']})"
    for key in ("run", "engine", "steps", "cuda_graph_capture_sizes", "activation_graph"):
        assert doc[key] == summary[key]
    assert doc["requests_summary"] == summary["requests"]
    (dev,), (page_dev,) = summary["devices"], doc["devices"]
    assert {k: page_dev[k] for k in page_dev if k != "series"} == {k: dev[k] for k in DEVICE_FIELDS if k in dev}
    assert page_dev["budget"] == dev["budget"] and page_dev["num_kv_blocks"] == dev["num_kv_blocks"]
    assert ("kv_cache_groups" in page_dev) == (run == GPT_OSS)  # gpt-oss: sliding and full attention groups
    # every engine step, every column, as the file holds it
    s = page_dev["series"]
    assert s["row"] == list(range(len(mem["t_us"])))
    for col in COLUMNS:
        assert s[col] == mem[col].tolist(), col
    assert max(s["allocated_bytes"]) <= dev["peak_allocated_bytes"]
    assert max(s["kv_blocks_used"]) == dev["max_kv_blocks_used"]
    assert all(u + f == dev["num_kv_blocks"] for u, f in zip(s["kv_blocks_used"], s["kv_blocks_free"], strict=True))
    # the request table: counts and latencies from requests.parquet, agreeing with summary.json
    r = doc["requests"]
    done = req["finish_us"] >= 0
    ttft = (req["first_token_us"] - req["arrival_us"])[done]
    multi = done & (req["output_tokens"] > 1)
    tpot = (req["finish_us"] - req["first_token_us"])[multi] / (req["output_tokens"][multi] - 1)
    assert r["total"] == len(req["request"]) == summary["requests"]["total"]
    assert r["finished"] == int(done.sum()) == summary["requests"]["finished"]
    assert r["rejected"] == summary["requests"]["rejected"] == 0 and r["rejections"] == {}
    assert r["preemptions"] == int(req["preemptions"].sum()) == summary["requests"]["preemptions"]
    for q in (50, 90, 99):
        assert r["ttft_ms"][f"p{q}"] == pct(ttft, q) and r["tpot_ms"][f"p{q}"] == pct(tpot, q)
    for q in (50, 99):
        assert r["ttft_ms"][f"p{q}"] == summary["requests"]["ttft_ms"][f"p{q}"]
        assert r["tpot_ms"][f"p{q}"] == summary["requests"]["tpot_ms"][f"p{q}"]
    assert r["makespan_us"] == summary["requests"]["makespan_us"]
    if shutil.which("node"):
        drawn = run_stub(folder / "report.html")
        assert drawn["svg"] == 3 and drawn["polygon"] >= 3 and drawn["title"] == doc["title"]
    assert "wrote" in capsys.readouterr().out


def test_pipeline_stages_and_rejections(tmp_path, capsys):
    folder = serve_folder(tmp_path / "pp", LLAMA, "--set", "parallel.pp=2", "--set", "serving.load.num_requests=24",
                          "--set", 'serving.load.prompt_tokens={dist="uniform", min=256, max=2048}',
                          "--set", "serving.max_model_len=1200")  # the longer prompts do not fit
    doc = report(folder)
    summary, mem, req = files(folder)
    assert [d["pp_stage"] for d in doc["devices"]] == [d["pp_stage"] for d in summary["devices"]] == [0, 1]
    for page_dev, dev in zip(doc["devices"], summary["devices"], strict=True):
        assert page_dev["layers"] == dev["layers"] and page_dev["budget"] == dev["budget"]
        assert page_dev["worker_num_kv_blocks"] == dev["worker_num_kv_blocks"]
    stage0, stage1 = doc["devices"]  # memory.parquet is stage 0's timeline
    assert stage0["series"]["t_us"] == mem["t_us"].tolist() and stage1["series"] is None
    reasons: dict[str, int] = {}
    for why in req["rejected"].tolist():
        if why:
            reasons[why] = reasons.get(why, 0) + 1
    assert doc["requests"]["rejections"] == reasons and doc["requests"]["rejected"] == summary["requests"]["rejected"]
    assert 0 < sum(reasons.values()) == summary["requests"]["rejected"] < summary["requests"]["total"]
    if shutil.which("node"):
        assert run_stub(folder / "report.html")["svg"] == 3


def test_a_run_that_rejects_every_request_still_draws(tmp_path, capsys):
    folder = serve_folder(tmp_path / "none", LLAMA, "--set", "serving.load.num_requests=3",
                          "--set", "serving.max_model_len=1100")  # 1,024 + 128 tokens never fit
    doc = report(folder)
    assert doc["requests"]["rejected"] == doc["requests"]["total"] == 3 and doc["requests"]["finished"] == 0
    assert doc["requests"]["ttft_ms"]["p50"] is None and doc["requests"]["makespan_us"] == 0.0
    if shutil.which("node"):
        assert run_stub(folder / "report.html")["tr"] > 20  # the tables, no step to chart


def test_thinned_steps_keep_the_files_rows_and_the_peak(tmp_path, capsys):
    folder = serve_folder(tmp_path / "srv", LLAMA)
    summary, mem, req = files(folder)
    doc = serve_data(summary, mem, req, max_steps=100)
    s = doc["devices"][0]["series"]
    assert 50 <= len(s["row"]) <= 100 and s["row"] == sorted(s["row"])
    for col in COLUMNS:
        assert s[col] == mem[col][s["row"]].tolist(), col
    assert max(s["allocated_bytes"]) == int(mem["allocated_bytes"].max())


def test_folders_report_does_not_read(tmp_path, capsys):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "summary.json").write_text(json.dumps({"schema": "timeline.serve/1"}))
    assert main(["report", str(foreign)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "timeline-output.json" in err and len(err.splitlines()) == 1
    other = tmp_path / "other"
    other.mkdir()
    (other / "timeline-output.json").write_text(json.dumps({"schema": "timeline.output/1", "command": "plot"}))
    assert main(["report", str(other)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "written by 'plot'" in err and len(err.splitlines()) == 1
    bare = serve_folder(tmp_path / "bare", LLAMA, "--set", "serving.load.num_requests=2")
    (bare / "summary.json").unlink()
    capsys.readouterr()
    assert main(["report", str(bare)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no summary.json" in err and len(err.splitlines()) == 1




@pytest.mark.browser
@pytest.mark.skipif(no_browser() is not None, reason=str(no_browser()))
def test_serve_report_opens_in_headless_chromium_without_errors(tmp_path, capsys):
    folder = serve_folder(tmp_path / "srv", GPT_OSS)
    report(folder)
    result = open_page(folder / "report.html", tmp_path / "shot.png")
    assert result["errors"] == [] and result["load_ms"] < 5000 and result["svgs"] == 3 and result["rows"] >= 20
    assert (tmp_path / "shot.png").stat().st_size > 10_000


def test_a_summary_only_folder_has_the_budget_and_no_charts(tmp_path, capsys):
    folder = tmp_path / "sum"
    assert main(["serve", str(LLAMA), "-o", str(folder), "--format", "summary",
                 "--set", "serving.load.num_requests=3"]) == 0
    doc = report(folder)
    summary = json.loads((folder / "summary.json").read_text())
    assert doc["devices"][0]["series"] is None and doc["requests"] is None
    assert doc["devices"][0]["budget"] == summary["devices"][0]["budget"]
    if shutil.which("node"):
        assert run_stub(folder / "report.html")["svg"] == 0


def test_dp_ranks_each_get_a_column_and_their_own_rows(tmp_path, capsys):
    folder = serve_folder(tmp_path / "dp", LLAMA, "--set", "parallel.dp=2", "--set", "serving.load.num_requests=30")
    doc = report(folder)
    summary, mem, req = files(folder)
    assert [d["dp_rank"] for d in doc["devices"]] == [0, 1] and [d["device"] for d in doc["devices"]] == [0, 1]
    assert sum(d["requests"] for d in doc["devices"]) == 30 == len(req["request"])
    for rank, page_dev in enumerate(doc["devices"]):  # each rank's series: its own rows of memory.parquet
        rows = np.flatnonzero(mem["device"] == rank)
        assert page_dev["series"]["row"] == rows.tolist()
        assert page_dev["series"]["t_us"] == mem["t_us"][rows].tolist()
        assert [req["dp_rank"].tolist().count(rank)] == [page_dev["requests"]]
    if shutil.which("node"):
        drawn = run_stub(folder / "report.html")
        assert drawn["svg"] == 3 and drawn["title"] == doc["title"]
