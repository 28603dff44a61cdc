"""Persistent workspaces of a Megatron-Core + Transformer Engine job: allocations through PyTorch's
caching allocator that no tensor of the model owns, created by the first GEMM that needs them and
never freed. Measured Megatron jobs allocate them on every rank (the ~96 MiB a dense TE job holds
above its parameters and optimizer states on H100; ~224 MiB with grouped-GEMM experts).

- Transformer Engine's cuBLAS workspace (``TE/module/base.py: get_workspace`` at v2.6): one
  ``torch.empty(get_cublas_workspace_size_bytes())`` per process — 33,554,432 bytes when the
  device's compute capability major is ≥ 9, else 4,194,304 — used by every TE GEMM.
- The same TE workspace in a ``--transformer-impl local`` MoE job: Megatron's router GEMM
  (``moe/moe_utils.py: RouterGatingLinearFunction``, from Megatron-LM 0f058666a8, 2025-06-14) calls
  ``extensions/transformer_engine.py: te_general_gemm`` whenever TE ≥ 2.0 is importable (its
  ``cpp_extensions.general_gemm``) and ``--moe-router-dtype`` is not fp64, whatever the layer spec;
  that passes ``get_workspace()`` (TE < 2.10) or lets ``general_gemm`` take its cached
  ``get_cublas_workspace`` (TE ≥ 2.10, which dropped ``module/base.py: get_workspace``: Megatron
  before d3528a2130, 2026-03-06, imported both in one ``try``, so with TE ≥ 2.10 its
  ``te_general_gemm`` is None and the router falls back to ``torch.mm``). Taken as Megatron-Core
  ≥ 0.13.0 (the release; main's ``0.13.0rc0`` runs 2025-04-10 to 06-17 and its recordings precede
  the change) and, with TE ≥ 2.10, ≥ 0.17 (the first release holding d3528a2130; 0.16.x lacks it).
- TE's multi-stream workspaces for grouped GEMMs (``get_multi_stream_cublas_workspace``): one such
  workspace per compute stream, ``nvte_get_num_compute_streams() = 4``
  (``TE/common/util/multi_stream.cpp``), created by the first ``GroupedLinear``.
- PyTorch's cuBLAS workspace (``aten/src/ATen/cuda/CublasHandlePool.cpp: getCurrentCUDABlasHandle``
  keeps one workspace per (handle, stream); handles are per thread, so the forward (main thread)
  and the autograd engine's backward thread each get one) of the size ``CUBLAS_WORKSPACE_CONFIG``
  gives (``:SIZE_KiB:COUNT`` pairs, Σ SIZE·COUNT KiB). Without it ``parseChosenWorkspaceSize``
  defaults to ``:4096:8`` = 32 MiB on some architectures and ``:4096:2:16:8`` = 8.125 MiB on the
  rest, and which ones changed with the PyTorch version (``[framework] pytorch``): up to 2.11
  only compute capability 9.0 gets 32 MiB (``major == 9 && minor == 0``); pytorch/pytorch#175344
  (merged 2026-02-19, after the 2.11 release branch cut of 2026-02-16…19, so from 2.12) adds
  majors 10 and 12 (Blackwell), and #189312 (merged 2026-07-10, after the 2.13 cut, so from 2.14)
  major 11. Torch GEMMs run where Megatron calls
  ``torch.matmul`` itself: the output layer (``tensor_parallel/layers.py:
  LinearWithGradAccumulationAndAsyncCommunication``) on the stage holding the head, the MoE router
  (``moe/moe_utils.py: RouterGatingLinearFunction``) where it does not go through TE's GEMM (below),
  the shared experts' gate, and every linear of ``--transformer-impl local`` (:func:`torch_gemm_ops`);
  a stage that runs none of them (a TE stage without the head whose router uses TE's GEMM) holds no
  PyTorch workspace, and the backward thread's is created by its first such op.

- Megatron's ``GlobalMemoryBuffer`` (``megatron/core/utils.py: GlobalMemoryBuffer.get_tensor``,
  one buffer per (name, dtype), grown to the largest request and kept): under ``name="mpu"`` the
  local ``DotProductAttention`` takes its ``baddbmm`` input of ``[b·a/tp, s_q, s_k]``
  (``transformer/dot_product_attention.py``), the local linears — and, under every
  ``--transformer-impl``, GPTModel's output layer, a ``tensor_parallel.ColumnParallelLinear``
  (``models/gpt/gpt_model.py``) on the stage holding the head — their sequence-parallel all-gather of
  ``[s·b/cp, h]``, forward and again for the weight gradient (``tensor_parallel/layers.py:
  LinearWithGradAccumulationAndAsyncCommunication.forward`` / ``.backward``, unchanged from Megatron-LM
  c2ea914f7d (2022-09) to d98e8a64dd (2026-08); the frozen-weight path gathers without it) and the
  ``allgather`` MoE dispatcher its gathered tokens ``[T·ep·etp, h]``
  (``moe/token_dispatcher.py: MoEAllGatherTokenDispatcher.token_dispatch``, ``use_global_buffer``).

- TE's cached "dummy" weight gradients (``TE/module/base.py: get_dummy_wgrad``, from TE 2.3): with
  gradient-accumulation fusion the wgrad GEMM accumulates into ``main_grad`` and ``Linear`` /
  ``LayerNormLinear`` return one persistent ``torch.empty`` per (rows, cols, dtype) of
  ``main_grad``'s shape in the weight's dtype, created by the first backward; ``GroupedLinear`` from
  TE 2.10; Megatron's own output layer from Megatron-LM e7c55de (2025-08; taken here as Megatron-Core
  ≥ 0.15). Earlier versions allocate a transient of that shape per weight per backward instead (not
  modelled yet).

This module only sizes them; the simulator places them (``timeline.sim.simulate``) as the
profile's lifecycle names them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from timeline.profiles.base import AT_OP, ParamTensor
from timeline.profiles.megatron_fp8 import amax_histories, weight_caches
from timeline.spec.fields import DTYPE_BYTES
from timeline.spec.framework import FrameworkSpec
from timeline.spec.model import ModelSpec
from timeline.spec.run import ParallelSpec, TrainingSpec
from timeline.spec.te_softmax import te_softmax_kernel

TE = "NVIDIA/TransformerEngine@v2.6:transformer_engine"
TORCH = "pytorch/pytorch@v2.13.0:aten/src/ATen/cuda/CublasHandlePool.cpp"
TE_STREAMS = 4
MC = "NVIDIA/Megatron-LM@core_v0.14.0:megatron/core"
ROUTER_GEMM = ("NVIDIA/Megatron-LM@a53107c006:megatron/core/transformer/moe/moe_utils.py: "
               "RouterGatingLinearFunction (te_general_gemm; from 0f058666a8)")


def global_buffer_bytes(fw: FrameworkSpec, m: ModelSpec, tr: TrainingSpec, par: ParallelSpec, *,
                        has_moe: bool, holds_head: bool = False) -> int:
    """Bytes of the ``("mpu", dtype)`` GlobalMemoryBuffer: the largest request made of it (``holds_head``:
    the device runs the output layer)."""
    sp = par.sp and par.tp > 1  # RunSpec.sp_enabled
    dt = DTYPE_BYTES[tr.dtype]
    local = fw.transformer_impl == "local"
    sizes = [0]
    if local or fw.attention_backend == "local":
        sq = tr.seq_len // par.cp
        sizes.append(tr.micro_batch_size * (m.num_attention_heads // par.tp) * sq * tr.seq_len * dt)
    if (local or holds_head) and sp:
        sizes.append(tr.seq_len // par.cp * tr.micro_batch_size * m.hidden_size * dt)
    if has_moe and fw.moe_token_dispatcher == "allgather" and par.ep * par.etp > 1:
        tokens = tr.seq_len * tr.micro_batch_size // (par.cp * (par.tp if sp else 1))
        sizes.append(tokens * par.ep * par.etp * m.hidden_size * dt)
    return max(sizes)


def drain_buffers(fw: FrameworkSpec, m: ModelSpec, tr: TrainingSpec, par: ParallelSpec, *, holds_head: bool) -> tuple[str, ...]:
    """The GlobalMemoryBuffer names the deferred embedding weight gradient's drain gathers into
    (``megatron/core/utils.py: drain_embedding_wgrad_compute``, core_v0.12.0 … d98e8a64dd): under
    sequence parallelism it all-gathers each held input ``[s·b/cp, h]`` into ``"mpu_0"`` and
    ``"mpu_1"`` in turn (a double buffer, so the next gather overlaps the GEMM), kept from the first
    pipeline flush on (placed at the first step, which follows it)."""
    if not (fw.defer_embedding_wgrad and holds_head and par.sp and par.tp > 1):
        return ()
    return ("mpu_0", "mpu_1") if fw.wgrad_deferral_limit != 1 and tr.num_microbatches > 1 else ("mpu_0",)


def te_causal_mask_bytes(fw: FrameworkSpec, m: ModelSpec, tr: TrainingSpec, par: ParallelSpec) -> int:
    """The bool ``[s, s]`` upper-triangular mask TE's unfused attention caches once per process
    (``_default_causal_mask``, keyed by mask type and shape) when its causal softmax runs the torch path — where the
    fused kernel does not take the decoder's scores (:func:`timeline.spec.te_softmax.te_softmax_kernel`); 0 where it
    never does. BERT's and T5's encoders run padding masks, which build no such cache."""
    if fw.attention_backend != "unfused" or fw.transformer_impl != "transformer_engine" or \
            m.architecture in ("bert", "t5") or tr.dtype == "fp32":
        return 0
    s = tr.seq_len // par.cp
    heads = max(1, m.num_attention_heads // par.tp)
    if te_softmax_kernel(tr.dtype, tr.micro_batch_size, heads, s, tr.seq_len):
        return 0
    return s * tr.seq_len


def version_tuple(text: str) -> tuple[int, ...]:
    """``"2.10.0"`` → ``(2, 10, 0)``; a non-numeric part ends it (``"2.9.0rc1"`` → ``(2, 9)``)."""
    out = []
    for part in text.split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


#: Megatron-LM 2caa681a1d (2026-03-04, "Remove the deprecated GroupedMLP", first in core_v0.17.0)
GROUPED_MLP_REMOVED = (0, 17)


def legacy_grouped_mlp(fw: FrameworkSpec) -> bool:
    """Whether Megatron builds the grouped experts as its legacy ``GroupedMLP`` (grouped_gemm's ``gmm``), not
    ``TEGroupedMLP``: ``--moe-grouped-gemm`` with ``--moe-use-legacy-grouped-gemm``, the local layer spec, or a
    Transformer Engine without ``GroupedLinear`` (< 1.9: ``extensions/transformer_engine.py`` defines
    ``TEColumnParallelGroupedLinear`` under ``is_te_min_version("1.9.0.dev0")``, else None) — Megatron-LM
    ``models/gpt/moe_module_specs.py: get_moe_module_spec`` (60166922d3, 33b0389bde) and
    ``extensions/transformer_engine_spec_provider.py: TESpecProvider.grouped_mlp_modules`` (dabfbc4c6e), up to
    :data:`GROUPED_MLP_REMOVED`."""
    if not fw.moe_grouped_gemm or version_tuple(fw.megatron_core)[:2] >= GROUPED_MLP_REMOVED:
        return False
    return (fw.moe_legacy_grouped_gemm or fw.transformer_impl != "transformer_engine"
            or version_tuple(fw.transformer_engine)[:2] < (1, 9))


def te_workspace_bytes(sm: int, te_version: str = "2.6") -> int:
    """``get_cublas_workspace_size_bytes``: 32 MiB on Hopper and later, 4 MiB before; from TE 2.9 on
    1,024 bytes more on sm ≥ 90 ("32 MiB for NVFP4 GEMM, plus additional 1024 B for alignment")."""
    if sm < 90:
        return 4_194_304
    return 33_554_432 + (1024 if version_tuple(te_version) >= (2, 9) else 0)


def ub_workspace_bytes(sm: int, te_version: str) -> tuple[int, bool]:
    """(bytes, kept beside TE's plain workspace) of the cuBLAS workspace TE's userbuffer GEMMs use under
    ``--tp-comm-overlap``: ``_NUM_MAX_UB_STREAMS = 3`` workspaces in one tensor. Before TE 2.10
    ``module/base.py: initialize_ub`` replaces the global one (``_cublas_workspace =
    get_workspace().repeat(_NUM_MAX_UB_STREAMS)``, v2.2 … v2.9), so the plain one is freed; from 2.10
    ``cpp_extensions/gemm.py: get_cublas_workspace(device, ub, grouped_gemm)`` is an ``lru_cache`` keyed by
    ``ub``: GEMMs without userbuffers keep the plain one beside it (v2.10 … v2.18)."""
    return 3 * te_workspace_bytes(sm, te_version), version_tuple(te_version) >= (2, 10)


def torch_uses_32mib_default(sm: int, pytorch: str) -> bool:
    """Whether PyTorch ``pytorch``'s default cuBLAS workspace is 32 MiB on compute capability ``sm``
    (``parseChosenWorkspaceSize``: 9.0 always; majors 10 and 12 from 2.12; major 11 from 2.14)."""
    major, version = sm // 10, version_tuple(pytorch)
    if sm == 90:
        return True
    if major in (10, 12):
        return version >= (2, 12)
    return major == 11 and version >= (2, 14)


def torch_workspace_bytes(config: str, sm: int, pytorch: str = "2.13") -> int:
    """Bytes of one PyTorch cuBLAS workspace under ``CUBLAS_WORKSPACE_CONFIG`` (``''`` = the default
    of PyTorch ``pytorch`` on compute capability ``sm``)."""
    text = config or (":4096:8" if torch_uses_32mib_default(sm, pytorch) else ":4096:2:16:8")
    pairs = re.findall(r":(\d+):(\d+)", text)
    return sum(int(size) * int(count) for size, count in pairs) * 1024


def router_uses_te_gemm(fw: FrameworkSpec, *, has_moe: bool) -> bool:
    """Whether Megatron's MoE router GEMM runs through TE's ``general_gemm`` (and so holds TE's cuBLAS
    workspace) under ``fw``: Megatron-Core ≥ 0.13.0 (``version_tuple("0.13.0rc0")`` is ``(0, 13)``,
    below ``(0, 13, 0)``), TE ≥ 2.0, and with TE ≥ 2.10 Megatron-Core ≥ 0.17 or a commit from d3528a2130
    whose version lags (``[framework] router_te_gemm_fixed``); not under ``--moe-router-dtype fp64``
    (``RouterGatingLinearFunction`` keeps ``torch.mm`` there)."""
    mc, te = version_tuple(fw.megatron_core), version_tuple(fw.transformer_engine)
    if not has_moe or fw.moe_router_dtype == "fp64" or mc < (0, 13, 0) or te < (2,):
        return False
    return te < (2, 10) or mc >= (0, 17) or fw.router_te_gemm_fixed


#: the MoE router's weight (``mlp.gate.weight`` here; ``moe/router.py: TopKRouter.weight``, whose GEMM is
#: ``moe/moe_utils.py: RouterGatingLinearFunction``: its backward returns ``grad_weight`` itself, core_v0.13.0 …
#: d98e8a64dd) and the shared experts' gate (``moe/shared_experts.py``: ``F.linear``) are plain parameters:
#: no ``get_dummy_wgrad``
ROUTER_WEIGHTS = (".mlp.gate.weight", ".shared_expert_gate.weight")

#: parameter names fused into one Megatron weight (linear_qkv, linear_fc1): one main_grad shape
FUSED_INTO = {"q_proj": "linear_qkv", "k_proj": "linear_qkv", "v_proj": "linear_qkv", "gate_proj": "linear_fc1",
              "up_proj": "linear_fc1"}


def dummy_wgrad_shapes(fw: FrameworkSpec, dtype: str, tensors: Sequence[ParamTensor], *,
                       tied_head: bool = False) -> set[tuple[int, int, str]]:
    """The distinct (rows, cols, dtype) of the TE linears' weights whose wgrad is a cached dummy, for
    weights in ``dtype``. ``tied_head``: the device's output layer runs on the word embedding's weight (tied
    embeddings on the stage holding both), whose ``main_grad`` shape the output layer's dummy takes
    (``MC/tensor_parallel/layers.py: LinearWithGradAccumulationAndAsyncCommunication.backward``:
    ``get_dummy_wgrad(list(weight.main_grad.shape), input.dtype)`` for any weight with
    ``grad_added_to_main_grad``, which DDP sets on every parameter)."""
    te, mc = version_tuple(fw.transformer_engine), version_tuple(fw.megatron_core)
    if fw.transformer_impl != "transformer_engine" or not fw.gradient_accumulation_fusion or te < (2, 3):
        return set()
    fused: dict[tuple[str, str], list[int]] = {}
    word = next((t for t in tensors if t.name == "embedding.word_embeddings.weight"), None)
    if tied_head and mc >= (0, 15) and word is not None:
        fused[("output_layer", "weight")] = [word.shape[0], word.shape[1]]
    for t in tensors:
        if not t.trainable or len(t.shape) != 2 or t.name.startswith(("embedding.", "mtp.embedding")):
            continue
        if ".router" in t.name or ".position_embeddings" in t.name or t.name.endswith(ROUTER_WEIGHTS):
            continue  # Megatron's router, the shared experts' gate and embeddings are not TE linears
        if t.name.startswith("output_layer") and mc < (0, 15):
            continue
        if t.expert and fw.moe_grouped_gemm and (te < (2, 10) or legacy_grouped_mlp(fw)):
            continue
        path, leaf = t.name.rsplit(".", 2)[0], t.name.rsplit(".", 2)[1]
        key = (path, FUSED_INTO.get(leaf, leaf))
        rows_cols = fused.setdefault(key, [0, t.shape[1]])
        rows_cols[0] += t.shape[0]
    return {(r, c, dtype) for r, c in fused.values()}


def torch_gemm_ops(fw: FrameworkSpec, m: ModelSpec, *, holds_head: bool, has_moe: bool) -> str:
    """A pattern of the op names whose backward runs a PyTorch GEMM (``torch.matmul`` on the autograd
    thread, whose first call creates that thread's cuBLAS workspace), ``""`` where none does: the output
    layer (``tensor_parallel/layers.py: LinearWithGradAccumulationAndAsyncCommunication.backward``'s
    ``grad_output.matmul(weight)``), the MoE router's weight gradient where it is not TE's GEMM
    (``moe/moe_utils.py: RouterGatingLinearFunction.backward``: ``torch.mm`` unless
    :func:`router_uses_te_gemm`), the shared experts' gate (``moe/shared_experts.py: SharedExpertMLP``:
    ``torch.nn.functional.linear``) and, under ``--transformer-impl local``, every linear."""
    parts = [r"(^|\.)output_layer$"] if holds_head else []
    if has_moe and not router_uses_te_gemm(fw, has_moe=has_moe):
        parts.append(r"\.router\.wgrad$")
    if has_moe and m.shared_expert_gate:
        parts.append(r"\.shared_expert_gate$")
    if fw.transformer_impl != "transformer_engine":
        parts.append(r"\.linear_\w+$")
    return "|".join(parts)


#: functools.lru_cache(maxsize=32) on RotaryEmbedding.forward and YarnRotaryEmbedding.forward: one cache per
#: function, shared by every instance of the class in the process
ROPE_LRU = 32


def rotary_caches(fw: FrameworkSpec, m: ModelSpec, tr: TrainingSpec, par: ParallelSpec,
                  tensors: Sequence[ParamTensor]) -> list[tuple[str, int, str]]:
    """(name, bytes, source) of the rotary embeddings' persistent tensors on one device.

    - ``RotaryEmbedding.forward`` (``models/common/embeddings/rotary_pos_embedding.py``) and
      ``YarnRotaryEmbedding.forward`` (``yarn_rotary_pos_embedding.py``) are ``lru_cache(maxsize=32)`` methods: the
      fp32 ``[s/cp, 1, 1, d]`` table each instance returns for the training sequence stays referenced by the
      cache (``get_pos_emb_on_this_cp_rank`` slices it to this CP rank first). GPTModel (and HybridModel) builds one
      instance per model chunk for a non-MLA rope model (``d``: the head dim times ``--rotary-percent``); each
      MLA layer builds its own (``multi_latent_attention.py``, ``d = qk_pos_emb_head_dim``).
    - An MLA layer's YarnRotaryEmbedding (``--rope-type yarn``, MLATransformerConfig's default), from Megatron-Core
      0.13 (23e6471569, 2025-06-02): ``__init__`` registers fp32 ``cos_cached`` / ``sin_cached`` buffers of
      ``original_max_position_embeddings / cp`` rows through ``forward`` (whose cached result stays until 0.16:
      5153663876, 2025-11-26, clears the cache in ``__init__``). Under RoPE fusion the layer's
      ``get_cached_cos_sin`` re-registers them in the activations' dtype over the training sequence, with that
      ``forward`` call's result cached (the construction's entry when both sequences are equal, before 0.16);
      without fusion the layer calls ``forward`` with another signature, a second entry.
    The caches hold at most 32 entries per class, the most recent kept: the training calls' ones, then the
    latest constructions'."""
    mc = version_tuple(fw.megatron_core)
    cp, s = par.cp, tr.seq_len
    out: list[tuple[str, int, str]] = []
    emb = f"{MC}/models/common/embeddings"

    def rows(n: int) -> int:
        return n // cp if cp > 1 else n

    if not m.is_mla:  # an MLA layer builds its rotary embedding whatever the model's position embedding
        if m.position_embedding != "rope":
            return out
        d = int(m.attn_head_dim * m.partial_rotary_factor)
        if fw.yarn_positions:  # --position-embedding-type yarn: GPTModel's YarnRotaryEmbedding (2c1b77a998 on)
            return _yarn(fw, tr, par.cp, par.vpp, d, fused=False, where="one per model chunk")
        out.append(("workspace.rotary_pos_emb", min(par.vpp, ROPE_LRU) * rows(s) * d * 4,
                    f"{emb}/rotary_pos_embedding.py: RotaryEmbedding.forward (lru_cache), one per model chunk"))
        return out
    n = sum(1 for t in tensors if t.name.endswith("kv_a_proj.rope.weight"))  # the device's MLA layers, MTP's too
    if not n:
        return out
    d = m.qk_rope_head_dim
    if fw.mla_rope_type == "rope":
        out.append(("workspace.rotary_pos_emb", min(n, ROPE_LRU) * rows(s) * d * 4,
                    f"{emb}/rotary_pos_embedding.py: RotaryEmbedding.forward (lru_cache), one per MLA layer"))
        return out
    # multi_latent_attention.py: get_cached_cos_sin under fusion (from 23e6471569), forward without
    return _yarn(fw, tr, cp, n, d, fused=fw.rope_fusion and mc >= (0, 13), where="one per MLA layer")


def _yarn(fw: FrameworkSpec, tr: TrainingSpec, cp: int, n: int, d: int, *, fused: bool,
          where: str) -> list[tuple[str, int, str]]:
    """:func:`rotary_caches` of ``n`` YarnRotaryEmbedding instances of ``d`` rotated dims (``fused``: the MLA
    layer's ``get_cached_cos_sin`` path)."""
    mc = version_tuple(fw.megatron_core)
    yarn = f"{MC}/models/common/embeddings/yarn_rotary_pos_embedding.py"
    s, orig = tr.seq_len // cp, fw.yarn_original_max_positions // cp
    out: list[tuple[str, int, str]] = []
    init_entries = 0
    if mc >= (0, 13):
        if fused:  # cos/sin re-registered over the training sequence, in the activations' dtype
            out.append(("workspace.yarn_cos_sin", n * 2 * s * d * DTYPE_BYTES[tr.dtype],
                        f"{yarn}: _set_cos_sin_cache via get_cached_cos_sin (multi_latent_attention.py)"))
        else:
            out.append(("workspace.yarn_cos_sin", n * 2 * orig * d * 4,
                        f"{yarn}: YarnRotaryEmbedding.__init__ _set_cos_sin_cache"))
        if mc < (0, 16) and not (fused and s == orig):  # the construction's forward entry, not cleared
            init_entries = min(n, max(0, ROPE_LRU - n))
    out.append(("workspace.yarn_rotary_pos_emb", (min(n, ROPE_LRU) * s + init_entries * orig) * d * 4,
                f"{yarn}: YarnRotaryEmbedding.forward (lru_cache), {where}"))
    return out


def persistent_workspaces(fw: FrameworkSpec, m: ModelSpec, tr: TrainingSpec, par: ParallelSpec, sm: int, *,
                          holds_head: bool, has_moe: bool,
                          tensors: Sequence[ParamTensor] = ()) -> list[tuple[str, int, str, str]]:
    """(name, bytes, source, when) of the workspaces one device holds (the run's ``[framework]``,
    model, training, parallel and GPU generation ``sm``); ``when`` is ``"start"`` (the first
    GEMM), ``"first_backward"``, or ``first_backward_op:PATTERN`` (the start of the first op of the
    first backward that runs a GEMM of that kind: the backward thread's cuBLAS workspace)."""
    out: list[tuple[str, int, str, str]] = []
    if not fw.workspaces:
        return out
    te = fw.transformer_impl == "transformer_engine"
    ub_bytes, ub_beside = ub_workspace_bytes(sm, fw.transformer_engine)
    ub = te and fw.tp_comm_overlap
    if ub:
        out.append(("workspace.te_cublas_userbuffers", ub_bytes, "NVIDIA/TransformerEngine@v2.2..v2.18:transformer_"
                    "engine/pytorch: module/base.py initialize_ub (< 2.10), cpp_extensions/gemm.py "
                    "get_cublas_workspace (≥ 2.10)", "start"))
    if (te or router_uses_te_gemm(fw, has_moe=has_moe)) and (not ub or ub_beside):  # one per process
        out.append(("workspace.te_cublas", te_workspace_bytes(sm, fw.transformer_engine),
                    f"{TE}/pytorch/module/base.py: get_workspace" + ("" if te else f" via {ROUTER_GEMM}"),
                    "start"))
        if has_moe and fw.moe_grouped_gemm and not legacy_grouped_mlp(fw):  # TE's GroupedLinear
            for i in range(TE_STREAMS):
                out.append((f"workspace.te_cublas_stream{i}", te_workspace_bytes(sm, fw.transformer_engine),
                            f"{TE}/pytorch/module/base.py: get_multi_stream_cublas_workspace", "start"))
    buffer = global_buffer_bytes(fw, m, tr, par, has_moe=has_moe, holds_head=holds_head)
    if buffer:
        out.append(("workspace.global_memory_buffer", buffer, f"{MC}/utils.py: GlobalMemoryBuffer.get_tensor",
                    "start"))
    for name in drain_buffers(fw, m, tr, par, holds_head=holds_head):
        out.append((f"workspace.global_memory_buffer_{name}", tr.seq_len // par.cp * tr.micro_batch_size * m.hidden_size
                    * DTYPE_BYTES[tr.dtype], f"{MC}/utils.py: drain_embedding_wgrad_compute", "first_step"))
    gemms = torch_gemm_ops(fw, m, holds_head=holds_head, has_moe=has_moe)
    if gemms:
        size = torch_workspace_bytes(fw.cublas_workspace_config, sm, fw.pytorch)
        out.append(("workspace.torch_cublas_forward", size, f"{TORCH}: getCurrentCUDABlasHandle", "start"))
        out.append(("workspace.torch_cublas_backward", size, f"{TORCH}: getCurrentCUDABlasHandle", AT_OP + gemms))
    if tr.fp8_recipe != "none" and te:  # FP8 weight copies kept between micro-batches (profiles/megatron_fp8.py)
        out += [(name, size, src, "start")
                for name, size, src in weight_caches(tensors, param_gather=tr.fp8_param_gather, sm=sm,
                                                     bf16=(tr.fp8_bf16_first_layers, tr.fp8_bf16_last_layers,
                                                           m.num_hidden_layers), recipe=tr.fp8_recipe)]
    if tr.fp8_recipe == "delayed" and te:  # the recipe's scales and amax histories, made by each module's first
        # FP8 forward, or as it is built under FP8 parameters
        made = "start" if tr.fp8_param_gather else "first_step"
        out += [(name, size, src, made) for name, size, src in
                amax_histories(tensors, history=tr.fp8_amax_history_len, grouped_experts=fw.moe_grouped_gemm)]
    out += [(name, size, src, "start") for name, size, src in rotary_caches(fw, m, tr, par, tensors) if size]
    mask = te_causal_mask_bytes(fw, m, tr, par)
    if mask:
        out.append(("workspace.te_causal_mask", mask, f"{TE}/pytorch/attention/dot_product_attention/softmax.py: "
                    "_get_default_causal_mask (v1.2 … v2.18: softmax.py)", "start"))
    for rows, cols, dt in sorted(dummy_wgrad_shapes(fw, tr.dtype, tensors,
                                                    tied_head=holds_head and m.tie_word_embeddings)):
        out.append((f"workspace.te_dummy_wgrad_{rows}x{cols}", rows * cols * DTYPE_BYTES[dt],
                    f"{TE}/pytorch/module/base.py: get_dummy_wgrad", "first_backward"))
    return out
