"""GPT-2 calibration ground truth for a GPU session (not yet recorded): ``record_groundtruth.py``'s procedure on three
GPT-2 configs unlike the held-out ``gpt2_medium`` (two with HF's default dropout, one without), so the GPU rules
for GPT-2's saved tensors can be written without touching the held-out case (``traces/groundtruth-h200/heldout``:
each block saves 121.8 MB on the H200 against 71.5 MB modelled). Run beside ``record_groundtruth.py`` and
``record_heldout_h200.py``:

    python3 record_gpt2_calibration_h200.py OUTDIR     # and again under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
"""
import sys

import record_groundtruth as rg

rg.CASES = {
    "gpt2_small_cal": dict(model_type="gpt2", n_embd=768, n_layer=3, n_head=12, vocab_size=50257, n_positions=1024),
    "gpt2_wide_cal": dict(model_type="gpt2", n_embd=1536, n_layer=2, n_head=12, vocab_size=32000, n_positions=2048),
    "gpt2_nodrop_cal": dict(model_type="gpt2", n_embd=768, n_layer=2, n_head=12, vocab_size=50257, n_positions=1024,
                            attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0),
}
rg.SHAPES = {"gpt2_small_cal": (4, 512), "gpt2_wide_cal": (1, 2048), "gpt2_nodrop_cal": (4, 512)}

if __name__ == "__main__":
    from record_heldout_h200 import lend_gpt2_view  # beside this file

    lend_gpt2_view()
    sys.exit(rg.main())
