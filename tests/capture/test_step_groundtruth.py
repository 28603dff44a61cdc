"""Ground truth for whole-step captures: the same small Llama and Qwen3-MoE steps run on real CPU
tensors (under the same CUDA stand-in, CUDA-autocast emulation and ``AdamW(foreach=True)``) and on
fake tensors give the same live bytes, phase by phase, to the byte: the fake kernels, the
device tracking and the phase labels change nothing. (Both runs share the GPU rules the snapshot
tests check: in-place gradient accumulation and in-place zero-fill formulas.)"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

LLAMA = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 704, "vocab_size": 1000}
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 704, "moe_intermediate_size": 128,
             "num_experts": 16, "num_experts_per_tok": 4, "vocab_size": 1000, "decoder_sparse_step": 1}


def phase_bytes(trace) -> list[tuple[int, str, int, int]]:
    """(step, phase, peak live bytes, live bytes at its end) of every phase run, in order."""
    out: list[tuple[int, str, int, int]] = []
    live, key, peak = 0, None, 0
    for o in trace.ops:
        if (o.step, o.phase) != key:
            if key is not None:
                out.append((*key, peak, live))
            key, peak = (o.step, o.phase), live
        live += sum(trace.storages[s].nbytes for s in o.allocs)
        peak = max(peak, live)
        live -= sum(trace.storages[s].nbytes for s in o.frees)
    out.append((*key, peak, live))
    return out


# grouped_mm experts take 16-bit inputs, so the MoE model trains in bf16 without autocast
@pytest.mark.parametrize(("config", "dtype", "autocast"), [(LLAMA, "fp32", "bf16"), (QWEN3_MOE, "bf16", "off")],
                         ids=["llama-fp32-autocast-bf16", "qwen3-moe-bf16"])
def test_fake_capture_equals_real_cpu_run(config, dtype, autocast):
    from timeline.capture.hf import hf_step_builder
    from timeline.capture.step import capture_step

    def run(fake: bool):
        func = hf_step_builder(config, micro_batch_size=2, seq_len=64, dtype=dtype, optimizer="adamw",
                               autocast=autocast)
        return capture_step(func, steps=2, gpu=False, fake=fake)

    trace = run(True)
    fake, real = phase_bytes(trace), phase_bytes(run(False))
    assert fake == real
    phases = [(s, p) for s, p, _, _ in fake]
    assert phases == [(0, "init"), (1, "F"), (1, "B"), (1, "O"), (2, "F"), (2, "B"), (2, "O")]
    # AdamW's moments (2 × parameters) appear in step 1's optimizer phase and stay
    params = sum(p.nbytes for p in trace.params if p.trainable)
    assert fake[3][3] - fake[0][3] == 2 * params
