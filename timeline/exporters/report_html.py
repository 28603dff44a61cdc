"""``report.html``: one self-contained page (style, script and data inline; it opens offline and
fetches nothing) from a :func:`timeline.exporters.report_data.report_document`.

The data sits in a ``<script type="application/json" id="timeline-data">`` element, so tests and
other tools can read it back without a browser (:func:`embedded_data`). Formatting only.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from typing import Any

from timeline.exporters.report_js import SCRIPT, STYLE
from timeline.exporters.report_serve_js import SERVE_SCRIPT

FILENAME = "report.html"
_DATA_OPEN = '<script type="application/json" id="timeline-data">'


def _json_for_script(doc: Mapping[str, Any]) -> str:
    """Compact, key-sorted JSON that cannot end the script element early."""
    text = json.dumps(doc, separators=(",", ":"), sort_keys=True, allow_nan=False)
    return text.replace("</", "<\\/").replace("<!--", "<\\u0021--")  # both still valid JSON escapes


def render(doc: Mapping[str, Any]) -> str:
    """The page for ``doc``."""
    title = html.escape(str(doc.get("title", "timeline report")))
    script = SERVE_SCRIPT if doc.get("kind") == "serve" else SCRIPT  # a serving run's page draws its own views
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{title}</title><style>{STYLE}</style></head>\n<body><div id=\"report\"></div>\n"
            f"{_DATA_OPEN}{_json_for_script(doc)}</script>\n<script>{script}</script>\n</body></html>\n")


def embedded_data(page: str) -> dict[str, Any]:
    """The document a page embeds (the inverse of :func:`render`'s data element)."""
    start = page.index(_DATA_OPEN) + len(_DATA_OPEN)
    end = page.index("</script>", start)
    return json.loads(page[start:end])
