"""The serve tests import tools/perfetto_engine.py (the Perfetto trace processor's Python side)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
