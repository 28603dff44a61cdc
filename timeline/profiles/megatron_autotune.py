"""The first call of Megatron's compiled cross-entropy steps: Inductor autotunes their Triton kernels there.

Megatron-Core's ``--cross-entropy-loss-fusion`` with ``--cross-entropy-fusion-impl native``
(``fusions/fused_cross_entropy.py``, Megatron-LM 46fdcd5b7e … 93aa335b95 … d98e8a64dd) runs its four steps
(``calculate_logits_max``, ``calculate_predicted_logits``, ``calculate_cross_entropy_loss``,
``calculate_gradients``) under ``jit_fuser``, which is ``torch.compile`` from torch 2.2.0a0 on (``core/jit.py``).
Each compiled step's first call compiles its kernels and, before launching one that has more than one launch
configuration, benchmarks every configuration once on the device:

- which kernels have several configurations (PyTorch v2.2.0 ``torch/_inductor/triton_heuristics.py``, v2.4.1 …
  v2.5.1 ``torch/_inductor/runtime/triton_heuristics.py``: ``pointwise``): a one-dimensional pointwise kernel gets
  two unless ``torch.are_deterministic_algorithms_enabled()`` (``disable_pointwise_autotuning``; Megatron's
  ``--deterministic-mode``); the steps' row reductions are ``ReductionHint.INNER``, one configuration;
- each benchmarked launch runs on fresh copies of the arguments the kernel writes (``CachingAutotuner.bench`` →
  ``clone_args``: one ``clone_preserve_strides`` per name in ``mutated_arg_names``, the same tensor twice when it
  is passed under two names), inside Triton's ``do_bench`` (``triton/testing.py`` at 2.1.0, the lts image's pin,
  … 3.1.0), which holds a 256e6-byte L2-flush buffer (``torch.empty(int(256e6 // 4), dtype=torch.int)``) while it
  repeats them;
- from PyTorch 2.6.0 ``CachingAutotuner.copy_args_to_cpu_if_needed`` (``optimize_mem``) copies a written argument
  to the host instead where its clone would raise the peak: not modelled (:data:`CPU_COPIES_FROM`).

The kernels and their written arguments were read off Inductor's own output for these four steps (the CUDA
wrapper and Triton kernels torch 2.2.0, 2.3.1, 2.4.1 and 2.5.1 generate for a [1024, 4, 25216] fp32 softmax,
``TORCH_LOGS=output_code``): the largest first-call transient of the forward is the division of
``calculate_cross_entropy_loss`` (``exp_logits.div_``), a pointwise kernel over the whole fp32 softmax whose
written arguments ``in_ptr0`` and ``out_ptr1`` are both the softmax — two clones — and which at 2.2.0 writes a
fresh fp32 buffer of the softmax's shape besides (copied back into the input; in place from 2.3); the backward's
is ``calculate_gradients``' multiply, whose written argument is the saved softmax — one clone beside the fp32
scatter copy and the bf16 gradient the loss's rule already holds. Both happen once per process, on the first
micro-batch's loss, and are freed when the benchmark returns.
"""

from __future__ import annotations

from timeline.profiles.base import FirstCall
from timeline.profiles.megatron_workspaces import version_tuple
from timeline.spec.framework import FrameworkSpec

#: Megatron-LM core/jit.py: ``jit_fuser = torch.compile`` where ``is_torch_min_version("2.2.0a0")``
COMPILED_FROM = (2, 2)
#: PyTorch v2.6.0 torch/_inductor/runtime/triton_heuristics.py: ``CachingAutotuner.copy_args_to_cpu_if_needed``
CPU_COPIES_FROM = (2, 6)
#: PyTorch v2.3.0 on: the loss step's division writes its result into the softmax itself (no fresh buffer)
DIVISION_IN_PLACE_FROM = (2, 3)
#: triton/testing.py do_bench (triton 2.1.0 … 3.1.0): ``cache = torch.empty(int(256e6 // 4), dtype=torch.int)``
FLUSH_BYTES = 256_000_000

SOURCE = ("Megatron-LM core/jit.py (jit_fuser = torch.compile from torch 2.2.0a0), fusions/fused_cross_entropy.py; "
          "PyTorch v2.2.0…v2.5.1 torch/_inductor/(runtime/)triton_heuristics.py: CachingAutotuner.bench / clone_args "
          "(a clone per mutated_arg_names entry), pointwise (two configs for 1-D kernels unless deterministic); "
          "triton/testing.py do_bench's 256e6-byte flush buffer; the kernels read off Inductor's generated code at "
          "2.2.0, 2.3.1, 2.4.1, 2.5.1")


#: PyTorch 2.6.0 pins Triton 3.2.0, whose ``do_bench`` takes its flush buffer from the driver
#: (``third_party/nvidia/backend/driver.py: CudaDriver.get_empty_cache_for_benchmark``: ``cache_size = 256 * 1024 *
#: 1024``, ``torch.empty(int(cache_size // 4), dtype=torch.int)``), 256 MiB
FLUSH_MIB_FROM = (2, 6)


def flush_bytes(pytorch: str) -> int:
    """The L2-flush buffer ``triton.testing.do_bench`` holds while it benchmarks, under the Triton ``pytorch`` pins."""
    return 256 * 2**20 if version_tuple(pytorch)[:2] >= FLUSH_MIB_FROM else FLUSH_BYTES


#: flash-linear-attention 0.4.x's gated-delta-rule kernels (``fla/ops/common/chunk_delta_h.py``, ``chunk_o.py``,
#: ``gated_delta_rule/wy_fast.py``, ``modules/l2norm.py``, ``modules/conv``) are each ``@triton.autotune``'d:
#: Triton's ``Autotuner.run`` benchmarks every configuration on a key's first call (``_bench`` → ``do_bench``),
#: inside the flush buffer, once per process. Placed at the first ``chunk_gated_delta_rule`` of the first forward
#: (layer by layer, the first GDN layer's) and of the first backward (the last GDN layer's, whose backward kernels
#: ``chunk_bwd_kernel_dv_local`` … are new there and run with the most held)
GDN_SOURCE = ("fla-org/flash-linear-attention@v0.4.1 fla/ops (every chunk kernel @triton.autotune); Triton "
              "runtime/autotuner.py: Autotuner.run benchmarks each config on a key's first call through "
              "testing.py: do_bench and its L2-flush buffer (driver.get_empty_cache_for_benchmark from Triton 3.2)")


def first_call(fw: FrameworkSpec) -> tuple[FirstCall, ...]:
    """The first-call autotuning transients under ``[framework]``'s PyTorch: the native fused cross entropy's
    (none with another loss path, PyTorch outside 2.2 … 2.5, or deterministic algorithms) and the gated delta
    net's Triton kernels' (a flush buffer at the first forward and backward of a model that has them)."""
    torch = version_tuple(fw.pytorch)[:2]
    # under --deterministic-mode the chunk rule and the conv are torch ops: fla's l2norm is the one autotuned kernel
    op = r"\.linear_attn\.l2norm$" if fw.deterministic_algorithms else r"\.linear_attn\.chunk_gated_delta_rule$"
    gdn = FirstCall(op=op, like="", forward_copies=0, backward_copies=0,
                    flush_bytes=flush_bytes(fw.pytorch), source=GDN_SOURCE, tag="gdn",
                    backward_same_op=False)
    if fw.cross_entropy_fusion != "native" or not COMPILED_FROM <= torch < CPU_COPIES_FROM or fw.deterministic_algorithms:
        return (gdn,)
    forward = 2 + (0 if torch >= DIVISION_IN_PLACE_FROM else 1)
    return (FirstCall(op=r"(^|\.)loss$", like="exp_logits", forward_copies=forward, backward_copies=1,
                      flush_bytes=FLUSH_BYTES, source=SOURCE), gdn)
