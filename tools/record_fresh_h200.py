"""Calibration ground truth from a fresh allocator (chosen 2026-12-04): ``record_groundtruth.py``'s procedure on the
nine calibration configs (its four, ``record_gpt2_calibration_h200.py``'s three, ``record_reserved_calibration_h200.py``'s
two) with its untimed warm-up pass (``saved_bytes_per_layer``: one forward and backward before the recording) left
out, so the recording starts where a training job starts — weights built, nothing else cached — and the reserved
peak can be compared without the cache a pass the simulation does not run leaves behind. ``layer_saved_bytes`` is
empty (the other recordings hold it). Run on a GPU machine beside those scripts:

    python3 record_fresh_h200.py OUTDIR
"""
import sys

import record_groundtruth as rg  # the device script (../shared/device/record_groundtruth.py), copied beside this one
from record_gpt2_calibration_h200 import rg as _gpt2  # noqa: F401  (sets rg.CASES to the GPT-2 ones)

if __name__ == "__main__":
    import importlib

    gpt2_cases, gpt2_shapes = dict(rg.CASES), dict(rg.SHAPES)
    importlib.reload(rg)  # the four original cases back
    from record_reserved_calibration_h200 import RESERVED_CASES, RESERVED_SHAPES

    rg.CASES = {**rg.CASES, **gpt2_cases, **RESERVED_CASES}
    rg.SHAPES = {**rg.SHAPES, **gpt2_shapes, **RESERVED_SHAPES}
    rg.saved_bytes_per_layer = lambda model, ids: []  # no warm-up pass
    sys.exit(rg.main())
