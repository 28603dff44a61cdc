"""Exporters: each writes one output format from a Timeline to a binary handle it is given.

One file per format behind a two-function interface (``FILENAME`` and ``write(timeline,
handle, options)``); :data:`EXPORTERS` maps format names to modules. Exporters never open files
(the CLI does) and only format what the Timeline's queries return.
"""

EXPORTERS: dict[str, str] = {
    "summary": "timeline.exporters.summary",
    "memory": "timeline.exporters.memory_parquet",
    "events": "timeline.exporters.events_parquet",
    "ops": "timeline.exporters.ops_parquet",
}
DEFAULT_FORMATS = ("summary", "memory", "events", "ops")
