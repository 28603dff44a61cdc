"""More calibration cases for the ``hf`` reserved peak (chosen 2026-12-04; rules may be written from these): the
workplace's ``record_groundtruth.py`` procedure on a tied-embedding model with a large vocabulary and an untied one,
the two shapes whose reserved peak follows the order of the loss's large blocks. Run on a GPU machine beside
``record_groundtruth.py``:

    python3 record_reserved_calibration_h200.py OUTDIR     # and again under expandable_segments:True
"""
import sys

import record_groundtruth as rg  # the device script (../shared/device/record_groundtruth.py), copied beside this one

RESERVED_CASES = {
    "qwen3_tied_cal": dict(model_type="qwen3", hidden_size=768, intermediate_size=2048, num_hidden_layers=3,
                           num_attention_heads=12, num_key_value_heads=4, head_dim=64, vocab_size=151936,
                           tie_word_embeddings=True),
    "llama_bigvocab_cal": dict(model_type="llama", hidden_size=1024, intermediate_size=2816, num_hidden_layers=2,
                               num_attention_heads=16, num_key_value_heads=16, vocab_size=128256),
}
RESERVED_SHAPES = {"qwen3_tied_cal": (2, 1024), "llama_bigvocab_cal": (4, 512)}

if __name__ == "__main__":
    rg.CASES, rg.SHAPES = RESERVED_CASES, RESERVED_SHAPES
    sys.exit(rg.main())
