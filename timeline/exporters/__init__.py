"""Exporters: each writes one output format from a Timeline to a binary handle it is given.

One file per format behind a two-function interface (``FILENAME`` and ``write(timeline,
handle, options)``); :data:`EXPORTERS` maps format names to modules. ``options`` is one dict for
all formats (``gzip``, ``max_samples``, ``max_entries``); each exporter reads only its keys. A
module with ``GZIP = True`` compresses itself when ``gzip`` is set, and the CLI then appends
``.gz`` to its FILENAME. Exporters never open files (the CLI does) and only format what the
Timeline's queries return.
"""

EXPORTERS: dict[str, str] = {
    "summary": "timeline.exporters.summary",
    "memory": "timeline.exporters.memory_parquet",
    "events": "timeline.exporters.events_parquet",
    "ops": "timeline.exporters.ops_parquet",
    "trace": "timeline.exporters.chrome_trace",
    "perfetto": "timeline.exporters.perfetto_proto",
    "snapshot": "timeline.exporters.memviz_snapshot",
    "devices": "timeline.exporters.devices_parquet",
}
#: what ``timeline simulate`` writes unless ``--format`` says otherwise (``perfetto`` needs the
#: optional ``perfetto`` package, so it is asked for by name)
DEFAULT_FORMATS = ("summary", "memory", "events", "ops", "trace", "snapshot", "devices")
