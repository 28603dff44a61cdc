"""vLLM's profile run as the engine's version runs it: the sampler's buffers and the allocations the
run creates once and keeps, all inside the ``torch_peak_increase`` the KV budget subtracts.

Every version (``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``; V0
``worker.py`` ``determine_num_available_blocks``) loads the weights without a GEMM, so the profile
run's first matmul creates PyTorch's cuBLAS workspace (``aten/src/ATen/cuda/CublasHandlePool.cpp``
``getCurrentCUDABlasHandle``, one per handle and stream, through the caching allocator and never
freed): 32 MiB on compute capability 9.0, 8.125 MiB on Ampere and Ada
(:func:`timeline.profiles.megatron_workspaces.torch_workspace_bytes`, the PyTorch 2.x default).

From vLLM 0.17 (:func:`timeline.spec.engine_versions.vllm_triton_profile`; read in the 0.17.0, 0.19.0 and 0.22.0 wheels):

* ``gpu_model_runner.py`` ``_dummy_sampler_run`` computes logits for ``n = min(max_num_seqs,
  max_num_batched_tokens)`` rows of ``torch.rand_like`` hidden states (the dummy run's
  ``last_hidden_states`` and the random copy, ``n × hidden`` each, stay alive beside the model's
  ``tokens × hidden`` output), gives every row ``top_k = vocab − 1`` and ``top_p = 0.9`` and runs the
  sampler twice (once with a generator). ``Sampler.forward`` casts the model-dtype logits to fp32
  (``logits.to(torch.float32)``, the tensor-parallel shard freed once gathered), temperature divides
  in place, ``apply_top_k_top_p_triton`` masks in place with one cached ``[programs, vocab]`` fp32
  buffer (``_TRITON_BUFFER_CACHE``: ``programs = min(next_power_of_2(min(num_sms, n)), num_sms)``,
  kept), ``forward_native`` takes ``softmax(dtype=float32)`` and ``random_sample`` an
  ``empty_like(probs)`` of exponential noise. At the peak: the logits, their fp32 copy, the
  probabilities and the noise — 14 bytes per logit in bf16.
* With ``serving.flashinfer_sampler`` (any V1 version; :func:`flashinfer_sampler`), ``forward_cuda`` →
  ``flashinfer_sample`` instead (the dummy run passes no generator, so FlashInfer is not bypassed; read at
  0.10.1.1 and 0.17.0): FlashInfer's ``top_k_top_p_sampling_from_logits`` in its default ``top_k_first``
  order takes ``top_k_mask_logits`` (``torch.empty_like(logits)``, fp32), a ``softmax`` of it and
  ``top_p_sampling_from_probs`` (one int32 per row). At the peak: the logits, their fp32 copy, the masked
  copy and the probabilities — 14 bytes per logit in bf16, no sort and no kept buffer.
* The fused MoE is a modular kernel (``modular_kernel.py`` ``FusedMoEKernel._allocate_buffers``): one
  ``WorkspaceManager.get_simultaneous`` allocation, grown to the largest request and kept, of
  ``workspace13`` (its size the larger of ``M · top_k · max(I, K)`` and the ``M × K`` output, which
  reuses it) and ``workspace2`` (``M · top_k · max(2I, K)``), each rounded up to 256 bytes, in the
  activation dtype (``TritonExperts.workspace_shapes``, SwiGLU: ``N = 2I``); M = the layer's tokens,
  I = one rank's expert width, K = hidden. The per-call caches of the older kernel are not made.
"""

from __future__ import annotations

from timeline.graph.tensors import DTYPE_BYTES
from timeline.profiles.megatron_workspaces import torch_workspace_bytes
from timeline.spec.serving import ServeRunSpec

#: PyTorch the vLLM releases read here build on (2.x): the cuBLAS default differs only for sm 100+
VLLM_TORCH = "2.11"
#: vLLM ``apply_top_k_top_p``: the Triton kernel from this many rows on (fewer sort)
TRITON_MIN_ROWS = 8


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def cublas_workspace_bytes(run: ServeRunSpec) -> int:
    """PyTorch's cuBLAS workspace the profile run's first GEMM creates (module docstring)."""
    return torch_workspace_bytes("", int(run.hardware.sm), VLLM_TORCH)


def moe_workspace_bytes(run: ServeRunSpec, tokens: int, inter: int) -> int:
    """The modular fused-MoE kernel's kept workspace for a layer of ``tokens`` rows whose experts are
    ``inter`` wide on this rank (module docstring)."""
    m = run.model
    k, topk, act = m.hidden_size, m.num_experts_per_tok, DTYPE_BYTES[run.serving.dtype]
    ws13 = max(tokens * topk * max(inter, k), tokens * k) * act
    ws2 = tokens * topk * max(2 * inter, k) * act
    return _cdiv(ws13, 256) * 256 + _cdiv(ws2, 256) * 256


def fp32_copy_bytes(run: ServeRunSpec, elements: int) -> int:
    """Bytes of ``Sampler.forward``'s ``logits.to(torch.float32)`` over ``elements`` logits: none when the model
    runs in fp32 (``Tensor.to`` returns the tensor itself when the dtype already matches)."""
    return 0 if run.serving.dtype == "fp32" else elements * 4


def triton_sampler(run: ServeRunSpec, num_reqs: int, padded_vocab: int) -> tuple[list[tuple[str, int]], int]:
    """(the sampler's buffers alive at its peak as (name, bytes), the kept Triton buffer's bytes) for
    ``num_reqs`` dummy rows; ``padded_vocab`` is the LM head's padded vocabulary (all ranks' slices:
    the gathered logits; the fp32 copy is of the unpadded view)."""
    m = run.model
    act = DTYPE_BYTES[run.serving.dtype]
    n, vocab = num_reqs, m.vocab_size
    bufs = [("sampler.last_hidden_states", n * m.hidden_size * act), ("sampler.rand_hidden", n * m.hidden_size * act),
            ("sampler.logits", n * padded_vocab * act),
            ("sampler.logits_fp32", fp32_copy_bytes(run, n * vocab)), ("sampler.probs", n * vocab * 4),
            ("sampler.exp_noise", n * vocab * 4)]
    sms = run.hardware.sms
    if n < TRITON_MIN_ROWS or not sms:
        return bufs, 0
    programs = min(sms, n)
    rows = min(1 << (programs - 1).bit_length(), sms)
    return bufs, rows * vocab * 4


def flashinfer_sampler(run: ServeRunSpec, num_reqs: int, padded_vocab: int) -> list[tuple[str, int]]:
    """The FlashInfer sampler's buffers alive at its peak as (name, bytes) for ``num_reqs`` dummy rows
    (module docstring); ``padded_vocab`` as for :func:`triton_sampler`."""
    m = run.model
    act = DTYPE_BYTES[run.serving.dtype]
    n, vocab = num_reqs, m.vocab_size
    return [("sampler.last_hidden_states", n * m.hidden_size * act), ("sampler.rand_hidden", n * m.hidden_size * act),
            ("sampler.logits", n * padded_vocab * act), ("sampler.logits_fp32", fp32_copy_bytes(run, n * vocab)),
            ("sampler.flashinfer_masked_logits", n * vocab * 4), ("sampler.probs", n * vocab * 4)]
