"""Held-out GPU ground truth: the workplace's ``record_groundtruth.py`` procedure on six configs no rule was
written from (traces/groundtruth-h200/heldout/). Run on a GPU machine beside ``record_groundtruth.py``:

    python3 record_heldout_h200.py OUTDIR     # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True for the other half
"""
import sys

import record_groundtruth as rg  # the device script (../shared/device/record_groundtruth.py), copied beside this one

HELD_OUT_CASES = {
    "llama3_8b_2l": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0),
    "qwen3_dense": dict(model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=4,
                        num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                        tie_word_embeddings=True),
    "mistral_gqa": dict(model_type="mistral", hidden_size=2048, intermediate_size=5632, num_hidden_layers=3,
                        num_attention_heads=16, num_key_value_heads=8, vocab_size=32768, sliding_window=None),
    "qwen3_moe_small": dict(model_type="qwen3_moe", hidden_size=1024, intermediate_size=3072, moe_intermediate_size=384,
                            num_hidden_layers=3, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                            num_experts=16, num_experts_per_tok=4, decoder_sparse_step=1, norm_topk_prob=True,
                            vocab_size=32000),
    "mixtral_small": dict(model_type="mixtral", hidden_size=1024, intermediate_size=2048, num_hidden_layers=3,
                          num_attention_heads=16, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
                          vocab_size=32000),
    "gpt2_medium": dict(model_type="gpt2", n_embd=1024, n_layer=4, n_head=16, vocab_size=50257, n_positions=2048),
}
HELD_OUT_SHAPES = {"llama3_8b_2l": (1, 4096), "qwen3_dense": (4, 1024), "mistral_gqa": (2, 2048),
             "qwen3_moe_small": (2, 1024), "mixtral_small": (4, 512), "gpt2_medium": (2, 1024)}


def lend_gpt2_view() -> None:
    """GPT-2 keeps its blocks at ``transformer.h``, not ``model.layers``: lend ``saved_bytes_per_layer`` that view."""
    saved = rg.saved_bytes_per_layer

    def saved_bytes_per_layer(model, ids):
        if hasattr(model, "model"):
            return saved(model, ids)
        import types
        object.__setattr__(model, "model", types.SimpleNamespace(layers=model.transformer.h))
        try:
            return saved(model, ids)
        finally:
            object.__delattr__(model, "model")

    rg.saved_bytes_per_layer = saved_bytes_per_layer


if __name__ == "__main__":
    rg.CASES, rg.SHAPES = HELD_OUT_CASES, HELD_OUT_SHAPES
    lend_gpt2_view()
    sys.exit(rg.main())
