"""What Megatron-LM's per-layer CUDA graphs (``--cuda-graph-impl transformer_engine``) hold beyond their
captured ops, at the Megatron-Core and Transformer Engine versions a run names. Decides sizes and switches
only; :mod:`timeline.sim.graph_capture` turns them into the capture's events.

- Sample inputs (``TransformerLayer.get_layer_static_inputs``, ``megatron/core/transformer/
  transformer_layer.py``@6295b45627 … 11debfa7b4): per graph a ``hidden_states`` ``torch.ones`` of
  ``[s/(cp·tp under SP), b, h]`` in **bfloat16** whatever the model's dtype (``module.py:
  GraphableMegatronModule.get_layer_static_inputs``), and for a layer with self-attention in its graph the
  causal ``attention_mask`` ``~tril(ones(s/cp, s)).bool()`` tiled to ``[b, 1, s/cp, s]`` (one byte an
  element). TE's graphed callables keep them as their static inputs for the graphs' life.
- Who shares them: from Megatron-LM 94b47593f9 (2025-12-18, core_v0.16.0; "Optimize TE cudagraph input
  memory") ``TECudaGraphHelper._get_sample_arguments`` walks the capture order and makes a sample only where
  no finished graph's sample of the same signature is free (``megatron_samples``); before, Megatron made one
  per (chunk, micro-batch, layer) up front and TE's ``_reuse_graph_input_output_buffers`` dropped the
  duplicates (``transformer_engine/pytorch/graph.py: _make_graphed_callables``@v2.9, the same queues).
- ``_reuse_graph_input_output_buffers`` (``reuse_buffers``): Megatron passes it from TE 2.6 on
  (``megatron/training/training.py: get_cuda_graph_input_data``@2b6b46b796, core 0.14.0rc5) and, from the
  refactor c173615753 (2025-09-25, core 0.15.0rc6) on, from TE 2.7 (``cuda_graphs.py:
  TECudaGraphHelper._get_cuda_graph_input_data``@11debfa7b4). With it one static grad output per signature
  serves every backward graph, and a backward capture turns its graph's static outputs and the previous
  layer's static grad inputs into weak references (``utils.py: make_weak_ref``: freed into the pool);
  without it every graph keeps all four.
- When the capture runs: before the first step up to core 0.15.0rc5 (``training.py: train_step``,
  ``args.curr_iteration == args.iteration``, whatever ``--cuda-graph-warmup-steps`` says); from c173615753 at
  iteration ``--cuda-graph-warmup-steps`` (``train``: ``iteration == args.cuda_graph_warmup_steps``).
- PyTorch GEMMs inside the graphed part — TE's unfused attention (``backends.py:
  UnfusedDotProductAttention``: ``torch.baddbmm``, ``torch.bmm``) and Megatron's local attention — create one
  cuBLAS workspace per (thread, stream) they run on (``aten/src/ATen/cuda/CublasHandlePool.cpp:
  setWorkspaceForHandle``, a ``CUDACachingAllocator`` block kept in a map for good): TE's warm-up runs the
  callables on a new side stream (``graph.py: _make_graphed_callables``: ``torch.cuda.stream(
  torch.cuda.Stream())``), the captures on ``torch.cuda.graph``'s capture stream; each forward on the main
  thread and each backward on the autograd engine's device thread: four workspaces. Checked on an H200 (PyTorch
  2.11, compute capability 9.0): a ``torch.bmm`` forward and its ``autograd.grad`` on a new stream allocate
  32 MiB each once; captured into a pool, 32 MiB each again, still allocated after the graphs' other tensors are
  dropped and through ``empty_cache``; a replay allocates nothing. The MoE router's GEMM is one too where it is
  ``torch.mm`` (``moe/moe_utils.py: RouterGatingLinearFunction``, forward and both backward GEMMs: TE ≥ 2.10 before
  Megatron-LM d3528a2130, :func:`timeline.profiles.megatron_workspaces.router_uses_te_gemm`) and a ``moe_router``
  graph holds it (``transformer_layer.py: _te_cuda_graph_capture`` runs ``_forward_mlp`` up to the router, or the
  preprocess, @ad2ab2ca12): only a device capturing an MoE layer makes them. The scoped_cudagraph goldens of that
  span (tp4 ep2 etp2 pp2, ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, recorded at 11c9680db0 … f5b2ec0130) hold 127.5 …
  129.7 MiB more after the capture than those recorded after d3528a2130: 4 × 32 MiB.

Main's 0.16.0rc0 snapshots are read as having 94b47593f9 (the version does not tell them apart; before it only
the transient of making every sample up front differs, not what stays).
"""

from __future__ import annotations

from dataclasses import dataclass

from timeline.profiles.megatron_workspaces import router_uses_te_gemm, torch_workspace_bytes, version_tuple
from timeline.spec.cuda_graph_rules import megatron_release, scope_modules
from timeline.spec.fields import DTYPE_BYTES
from timeline.spec.framework import FrameworkSpec
from timeline.spec.model import ModelSpec
from timeline.spec.run import ParallelSpec, TrainingSpec

MC = "NVIDIA/Megatron-LM@11debfa7b4:megatron/core/transformer"
TE_GRAPH = "NVIDIA/TransformerEngine@v2.9:transformer_engine/pytorch/graph.py: _make_graphed_callables"
TORCH_BLAS = "pytorch/pytorch@26a39059ec:aten/src/ATen/cuda/CublasHandlePool.cpp: setWorkspaceForHandle"
#: (stream, thread) of each PyTorch cuBLAS workspace the graphed GEMMs create, in the order they appear
GRAPH_WORKSPACES = ("warmup_forward", "warmup_backward", "capture_forward", "capture_backward")


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphHolds:
    hidden_bytes: int  # one sample hidden_states (bf16)
    mask_bytes: int  # one sample attention_mask (0: no self-attention inside the graphs)
    reuse_buffers: bool  # TE's _reuse_graph_input_output_buffers
    megatron_samples: bool  # Megatron makes only the samples no finished graph can lend (94b47593f9)
    torch_workspace_bytes: int  # one PyTorch cuBLAS workspace (0: no PyTorch GEMM inside the graphs)
    #: the graphs' PyTorch GEMMs are the MoE router's alone: a device whose graphs hold no MoE layer makes none
    torch_gemms_moe_only: bool = False


def reuse_buffers(fw: FrameworkSpec) -> bool:
    """Whether Megatron passes ``_reuse_graph_input_output_buffers`` (module docstring)."""
    te = version_tuple(fw.transformer_engine)[:2]
    mc = megatron_release(fw.megatron_core)
    if mc >= (0, 15, 0, 6):
        return te >= (2, 7)
    return te >= (2, 6) and mc >= (0, 14, 0, 5)


def graph_holds(fw: FrameworkSpec, m: ModelSpec, tr: TrainingSpec, par: ParallelSpec, sm: int) -> GraphHolds:
    """What the graphs of one device hold under ``fw`` (module docstring)."""
    sp = par.sp and par.tp > 1
    rows = tr.seq_len // par.cp // (par.tp if sp else 1) * tr.micro_batch_size
    mods = scope_modules(fw.cuda_graph_scope)
    attention = not mods or "attn" in mods  # the graphs hold the layers' self-attention
    torch_attention = attention and (fw.attention_backend in ("unfused", "local") or fw.transformer_impl == "local")
    router = "moe_router" in mods and m.is_moe and not router_uses_te_gemm(fw, has_moe=True)
    torch_gemms = torch_attention or router
    return GraphHolds(
        hidden_bytes=rows * m.hidden_size * DTYPE_BYTES["bf16"],
        mask_bytes=tr.micro_batch_size * (tr.seq_len // par.cp) * tr.seq_len if attention else 0,
        reuse_buffers=reuse_buffers(fw),
        megatron_samples=megatron_release(fw.megatron_core) >= (0, 16, 0, 0),
        torch_workspace_bytes=torch_workspace_bytes(fw.cublas_workspace_config, sm, fw.pytorch) if torch_gemms else 0,
        torch_gemms_moe_only=router and not torch_attention)
