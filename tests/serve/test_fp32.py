"""``serving.dtype = "fp32"`` (vLLM ``--dtype float32``): weights, KV cache and activations in fp32, and the
sampler's ``logits.to(torch.float32)`` the logits themselves (``v1/sample/sampler.py`` ``Sampler.forward``, vLLM
0.19.0; ``Tensor.to`` returns its input when the dtype already matches)."""

from __future__ import annotations

from pathlib import Path

from timeline.io.serve_runfile import load_serve_run
from timeline.serve.budget import compute_budget
from timeline.serve.profile_run import triton_sampler

HF = Path(__file__).resolve().parents[1] / "data" / "hf"
LLAMA_8B = 8_030_261_248  # Llama-3.1-8B's parameters (tests/io/test_published_configs.py)


def _run(tmp_path: Path, dtype: str):
    path = tmp_path / f"{dtype}.toml"
    path.write_text(f'[model]\nhf_config = "{HF / "llama-3.1-8b" / "config.json"}"\n[hardware]\ngpu = "h100"\n'
                    f'[serving]\nengine = "vllm"\nengine_version = "0.19.0"\nmax_model_len = 8192\n'
                    f'dtype = "{dtype}"\n[serving.load]\nnum_requests = 1\n')
    return load_serve_run(path)


def test_fp32_doubles_weights_and_cache(tmp_path):
    b16, b32 = compute_budget(_run(tmp_path, "bf16")), compute_budget(_run(tmp_path, "fp32"))
    rope = 131_072 * 128  # the cos/sin cache, max_position × head_dim elements in the model dtype
    assert (b16.weights_bytes, b32.weights_bytes) == ((LLAMA_8B + rope) * 2, (LLAMA_8B + rope) * 4)
    assert (b16.kv_bytes_per_token, b32.kv_bytes_per_token) == (32 * 2 * 8 * 128 * 2, 32 * 2 * 8 * 128 * 4)
    assert b32.num_kv_blocks < b16.num_kv_blocks


def test_fp32_sampler_has_no_fp32_copy(tmp_path):
    r16, r32 = _run(tmp_path, "bf16"), _run(tmp_path, "fp32")
    n, vocab = 1024, 128_256
    (b16, _), (b32, _) = triton_sampler(r16, n, vocab), triton_sampler(r32, n, vocab)
    assert dict(b16)["sampler.logits_fp32"] == n * vocab * 4 and dict(b32)["sampler.logits_fp32"] == 0
    assert dict(b32)["sampler.logits"] == n * vocab * 4 == 2 * dict(b16)["sampler.logits"]
    assert dict(b32)["sampler.probs"] == dict(b16)["sampler.probs"] == n * vocab * 4


def test_fp32_activations_are_fp32(tmp_path):
    from timeline.serve.graph_view import step_ops

    ops = {op.name: op for op in step_ops(_run(tmp_path, "fp32"), 8192)}
    up = ops["layers.0.mlp.linear_fc1"].outputs
    assert [t.size_bytes for t in up.values()] == [8192 * 2 * 14336 * 4]
