"""A second held-out GPU set, chosen on 2026-12-04 before any GPT-2 GPU rule was written: the workplace's
``record_groundtruth.py`` procedure on two GPT-2 configs unlike both the calibration ones
(``record_gpt2_calibration_h200.py``) and the first held-out ``gpt2_medium`` — a 20-head 1280-wide model, and a
narrow deep one with a non-default MLP width and the exact ``gelu`` activation. Compared once, after a rule is final
(traces/groundtruth-h200/heldout2/). Run on a GPU machine beside ``record_groundtruth.py``:

    python3 record_heldout2_h200.py OUTDIR     # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True for the other half
"""
import sys

import record_groundtruth as rg  # the device script (../shared/device/record_groundtruth.py), copied beside this one

HELD_OUT2_CASES = {
    "gpt2_h1280": dict(model_type="gpt2", n_embd=1280, n_layer=2, n_head=20, vocab_size=50257, n_positions=1024),
    "gpt2_narrow_gelu": dict(model_type="gpt2", n_embd=512, n_layer=4, n_head=8, n_inner=3072, vocab_size=32768,
                             n_positions=1024, activation_function="gelu"),
}
HELD_OUT2_SHAPES = {"gpt2_h1280": (2, 1024), "gpt2_narrow_gelu": (8, 256)}

if __name__ == "__main__":
    from record_heldout_h200 import lend_gpt2_view  # beside this file

    rg.CASES, rg.SHAPES = HELD_OUT2_CASES, HELD_OUT2_SHAPES
    lend_gpt2_view()
    sys.exit(rg.main())
