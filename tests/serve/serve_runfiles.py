"""Serve run files over the published configs of ``tests/data/hf``, for the family tests (one request, no trace)."""

from __future__ import annotations

from pathlib import Path

HF = Path(__file__).resolve().parents[1] / "data" / "hf"


def hf_run_file(path: Path, folder: str, *, tp: int, gpu: str, engine: str = "vllm", version: str = "0.19.0",
                extra: str = "") -> Path:
    """Write at ``path`` a run serving ``tests/data/hf/<folder>/config.json`` on ``tp`` ``gpu``s; ``extra`` is more
    ``[serving]`` lines."""
    path.write_text(f'[model]\nhf_config = "{HF / folder / "config.json"}"\n[parallel]\ntp = {tp}\n[hardware]\n'
                    f'gpu = "{gpu}"\n[serving]\nengine = "{engine}"\nengine_version = "{version}"\n{extra}'
                    "[serving.load]\nnum_requests = 1\n")
    return path
