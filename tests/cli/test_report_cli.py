"""``timeline report``: one self-contained page for simulate, replay and compare folders; the
data it embeds, its size on the shipped run, output safety, and its script run under a DOM stub."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from browser_check import no_browser, open_page

from timeline.cli import main
from timeline.exporters.report_html import embedded_data

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"
STUB = Path(__file__).with_name("report_dom_stub.js")
SMALL = ["--set", "model.profile=megatron", "--set", "model.num_layers=4", "--set", "parallel.pp=2",
         "--set", "parallel.layout=[2,2]", "--set", "training.seq_len=512", "--set", "training.num_microbatches=4",
         "--set", "model.n_routed_experts=16", "--set", "parallel.dp=8", "--set", "model.mtp_layers=0"]
GIB = 2**30


def simulate(out: Path, *extra: str) -> None:
    assert main(["simulate", str(SHIPPED), "-o", str(out), "--no-progress", "--format", "summary,memory,ops,snapshot",
                 *SMALL, *extra]) == 0


def report(folder: Path, *extra: str) -> dict:
    assert main(["report", str(folder), *extra]) == 0
    page = (folder / "report.html").read_text(encoding="utf-8") if not extra else Path(extra[1]).read_text()
    bare = page.replace("'http://www.w3.org/2000/svg'", "")  # the SVG namespace names, it fetches nothing
    assert "https://" not in bare and "http://" not in bare and "<script src" not in bare and "<link" not in bare
    return embedded_data(page)


def run_stub(page: Path) -> dict:
    proc = subprocess.run(["node", str(STUB), str(page)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_simulate_folder_report_embeds_the_run(tmp_path, capsys):
    out = tmp_path / "run"
    simulate(out)
    doc = report(out)
    summary = json.loads((out / "summary.json").read_text())
    assert doc["schema"] == "timeline.report/1" and doc["kind"] == "simulate"
    assert doc["run"]["parallel"]["pp"] == 2 and doc["run"]["schedule"]["kind"] == "1f1b"
    assert [d["device"] for d in doc["devices"]] == [d["device"] for d in summary["devices"]] == [0, 16]
    for page_dev, dev in zip(doc["devices"], summary["devices"], strict=True):
        assert page_dev["peak_reserved_bytes"] == dev["peak_reserved_bytes"]
        assert page_dev["fragmentation_bytes_at_peak"] == dev["fragmentation_bytes_at_peak"]
        s = page_dev["series"]
        assert max(s["reserved"]) == round(dev["peak_reserved_bytes"] / GIB, 4)  # the envelope keeps the peak
        assert len(s["t_ms"]) == len(s["reserved"]) == len(s["allocated"]) and s["t_ms"] == sorted(s["t_ms"])
        assert set(s["categories"]) <= {"weights", "grads", "optimizer", "activations", "recompute", "comm",
                                         "temporary"} and "weights" in s["categories"]
        assert page_dev["iteration_starts_ms"] == [round(t / 1e3, 3) for t in dev["iteration_starts_us"]]
        assert page_dev["top_tensors"] == dev["top_tensors_at_peak"][:10]
        labels = [b[0] for b in page_dev["schedule"]]
        stage = dev["stages"][0]
        # 1F1B, 4 micro-batches, 2 iterations: every F and B of every micro-batch, twice
        assert sorted(set(labels) - {"step"}) == sorted({f"{stage}{k}{m}" for k in "FB" for m in range(4)})
        assert labels.count(f"{stage}F0") == 2 and labels.count("step") == 2
    assert "wrote" in capsys.readouterr().out


def test_replay_and_compare_folders(tmp_path, write_run, capsys, monkeypatch):
    out = tmp_path / "run"
    simulate(out)
    assert main(["replay", str(out / "snapshot.pickle"), "-o", str(tmp_path / "rep")]) == 0
    doc = report(tmp_path / "rep")
    assert doc["kind"] == "replay" and [d["device"] for d in doc["devices"]] == [0, 16]
    assert all(max(d["series"]["reserved"]) * GIB == pytest.approx(d["peak_reserved_bytes"], rel=1e-4)
               for d in doc["devices"])
    sys.path.insert(0, str(ROOT / "tests" / "compare"))
    from recompute_template import recompute_template
    from test_compare_cli import TINY

    monkeypatch.setattr("timeline.cli.compare.templates", lambda: recompute_template)
    cmp = tmp_path / "cmp"
    assert main(["compare", str(write_run(TINY)), "--recompute", "none,selective:core_attn,full:uniform:1",
                 "-o", str(cmp), "--no-progress", "--workers", "1"]) == 0
    listing = json.loads((cmp / "variants.json").read_text())["variants"]
    assert [v["dir"] for v in listing] == ["none", "selective_core_attn", "full_uniform_1"]
    for v in listing:
        assert sorted(p.name for p in (cmp / v["dir"]).iterdir()) == ["memory.parquet", "summary.json"]
    doc = report(cmp)
    assert doc["kind"] == "compare" and [v["name"] for v in doc["variants"]] == [v["name"] for v in listing]
    by_variant = {v["name"]: {d["device"]: d["peak_reserved_bytes"] for d in v["devices"]} for v in doc["variants"]}
    for row in doc["rows"]:
        assert by_variant[row["variant"]][row["device"]] == row["peak_reserved_bytes"]


def test_output_safety(tmp_path, capsys):
    out = tmp_path / "run"
    simulate(out)
    report(out)
    capsys.readouterr()
    assert main(["report", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--force" in err and len(err.splitlines()) == 1
    assert main(["report", str(out), "--force"]) == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    assert main(["report", str(mine)]) == 2
    assert "timeline-output.json" in capsys.readouterr().err
    assert main(["report", str(out), "-o", str(tmp_path / "page.html")]) == 0
    assert (tmp_path / "page.html").read_bytes() == (out / "report.html").read_bytes()  # deterministic
    # --force replaces only a page this command wrote: never a file of the user's, never through a link
    foreign = tmp_path / "thesis.html"
    foreign.write_text("<!DOCTYPE html><title>my thesis</title>")
    assert main(["report", str(out), "-o", str(foreign), "--force"]) == 2
    assert "is not a timeline report" in capsys.readouterr().err
    assert foreign.read_text() == "<!DOCTYPE html><title>my thesis</title>"
    link = tmp_path / "link.html"
    link.symlink_to(tmp_path / "page.html")
    assert main(["report", str(out), "-o", str(link), "--force"]) == 2
    assert "symbolic link" in capsys.readouterr().err and link.is_symlink()


def test_shipped_run_report_is_small(tmp_path, capsys):
    out = tmp_path / "ship"
    assert main(["simulate", str(SHIPPED), "-o", str(out), "--no-progress", "--format", "summary,memory,ops"]) == 0
    doc = report(out)
    size = (out / "report.html").stat().st_size
    assert size < 10 * 2**20 and len(doc["devices"]) == 16
    assert [d["device"] for d in doc["devices"]] == [64 * r for r in range(16)]
    if shutil.which("node"):
        drawn = run_stub(out / "report.html")
        assert drawn["svg"] == 2 and drawn["tr"] >= 17 and drawn["title"].startswith("timeline report: ship")


@pytest.mark.skipif(not shutil.which("node"), reason="needs node to run the page's script")
def test_page_script_runs_without_errors(tmp_path, capsys):
    out = tmp_path / "run"
    simulate(out)
    report(out)
    drawn = run_stub(out / "report.html")
    assert drawn["svg"] == 2 and drawn["polygon"] >= 3 and drawn["rect"] > 10  # chart + schedule bars






@pytest.mark.browser
@pytest.mark.skipif(no_browser() is not None, reason=str(no_browser()))
def test_report_opens_in_headless_chromium_without_errors(tmp_path, write_run, capsys, monkeypatch):
    out = tmp_path / "ship"
    assert main(["simulate", str(SHIPPED), "-o", str(out), "--no-progress", "--format", "summary,memory,ops"]) == 0
    report(out)
    result = open_page(out / "report.html", tmp_path / "shot.png")
    assert result["errors"] == [] and result["load_ms"] < 5000 and result["svgs"] == 2 and result["rows"] >= 16
    assert (tmp_path / "shot.png").stat().st_size > 10_000
