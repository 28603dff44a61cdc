"""The opt-in headless-Chromium check of a report page (``-m browser``), shared by the report tests."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

BROWSER_SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "browser" / "report_screenshot.js"


def no_browser() -> str | None:
    """Why the browser check cannot run here, or None."""
    if not shutil.which("node") or not shutil.which("chromium"):
        return "needs node and chromium (apt-get install chromium)"
    if not (BROWSER_SCRIPT.parent / "node_modules" / "playwright-core").is_dir():
        return f"needs playwright-core: npm ci in {BROWSER_SCRIPT.parent}"
    return None


def open_page(html: Path, shot: Path) -> dict:
    """Open ``html`` in headless Chromium, screenshot it to ``shot``; the script's JSON result."""
    proc = subprocess.run(["node", str(BROWSER_SCRIPT), str(html), str(shot)], capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)
