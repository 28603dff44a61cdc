"""The Mamba-2 mixer of a hybrid model's ``M`` layer, as Megatron-Core builds and trains it.

Sources: NVIDIA/Megatron-LM ``megatron/core/ssm/mamba_mixer.py: MambaMixer`` (``__init__`` and ``forward`` on
the training path, ``use_mamba_mem_eff_path`` True by default), ``mamba_layer.py: MambaLayer.forward`` and
``models/mamba/mamba_layer_specs.py: mamba_stack_spec`` (``in_proj`` a TELayerNormColumnParallelLinear, so the
layer's norm is fused into it; ``out_proj`` a TERowParallelLinear), at 194b2be238 … e4533afdfa (2025-05 …
2026-04, unchanged in what follows); state-spaces/mamba v2.2.4 (``mamba-ssm~=2.2`` in Megatron-LM's
pyproject.toml) ``mamba_ssm/ops/triton/ssd_combined.py: MambaSplitConv1dScanCombinedFn`` and
``layernorm_gated.py: LayerNormFn`` (identical in what they save from v2.2.2 to v2.3.1).

Parameters per device (tp ranks split heads and groups; :func:`params`): ``in_proj.weight``
``[(2·d_inner + 2·ngroups·d_state + nheads)/tp, h]`` (z, x, B, C, dt), ``conv1d.weight`` ``[conv_dim/tp, 1,
d_conv]`` and ``conv1d.bias`` with ``conv_dim = d_inner + 2·ngroups·d_state``, ``dt_bias``, ``A_log``, ``D``
``[nheads/tp]``, the gated norm's ``weight`` ``[d_inner/tp]``, ``out_proj.weight`` ``[h, d_inner/tp]``; no
linear biases (``assert not bias``). Every parameter is in the model's dtype: ``Float16Module`` casts the
whole module (``module.bfloat16()``), the fp32 ``A_log`` and ``D`` included.

Forward ops (:func:`forward`), rows ``t`` the layer's tokens on this device:

1. the fused norm and ``in_proj`` (TE: input, ``ln_out`` and rsigma kept) → ``zxBCdt [t, d_in/tp]``;
2. ``rearrange(zxBCdt, "l b d -> b l d").contiguous()``: a copy, which the scan saves;
3. ``A = -torch.exp(A_log.float())`` and ``dt_bias.float()``: fp32 ``[nheads/tp]`` copies the scan saves;
4. ``mamba_split_conv1d_scan_combined``: saves ``zxbcdt``, ``out_x`` (the ungated scan output, ``[t,
   d_inner/tp]``), ``A``, ``dt_bias`` (conv weight/bias and ``D`` are parameters); while it runs it holds the
   conv output, ``dt`` and ``dA_cumsum`` (fp32 ``[b, nheads, nchunks, chunk]``), the passed states
   (``[b, nchunks, nheads, headdim·d_state]`` in the activations' dtype), the final states (fp32) and ``CB``
   (fp32 ``[b, nchunks, ngroups, chunk, chunk]``) — ``_chunk_scan_fwd``'s moment, the largest of its phases;
5. ``rearrange(y, "b l d -> l b d").contiguous()``: a copy, the gated norm's input;
6. ``RMSNormGated`` (``norm_before_gate=False``, no z): saves its input and fp32 ``rstd`` ``[ngroups/tp · t]``;
7. ``out_proj``: saves its input; TP all-reduce or SP reduce-scatter.

Context parallelism (``mamba_context_parallel.py: MambaContextParallel``): ``pre_conv_ssm`` all-to-alls z, x, B,
C, dt from ``[t/cp rows, cols]`` to ``[t rows, cols/cp]`` (heads and groups over the CP ranks) and
``post_conv_ssm`` back: every tensor between them holds the same bytes as the ``[t/cp, cols]`` this family
builds (the scan's chunks and heads trade places likewise), so the shapes here stand for both; the exchange
buffers themselves are not modelled, and neither is the B/C repeat when ``ngroups/tp < cp``
(``group_repeat_count``), which run validation refuses. Not modelled either: the path without
``use_mamba_mem_eff_path`` (from-megatron refuses it), the scan's backward workspaces.
"""

from __future__ import annotations

import math
from typing import Any

from timeline.graph.context import BuildCtx
from timeline.graph.families import norm
from timeline.graph.families.common import NONE, Tags, column_linear, row_linear
from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef, param

#: ``MambaMixer.__init__`` defaults: chunk_size=128 (the scan's chunk), expand=2
CHUNK = 128


def widths(heads: int, head_dim: int, groups: int, state: int) -> tuple[int, int, int]:
    """(d_inner, in_proj width, conv channels) of the unsharded mixer: ``d_inner = nheads·headdim``;
    ``in_proj`` emits z, x, B, C, dt (``d_inner·2 + 2·ngroups·d_state + nheads``); the conv runs over x, B, C."""
    d_inner = heads * head_dim
    return d_inner, 2 * d_inner + 2 * groups * state + heads, d_inner + 2 * groups * state


def params(ctx: BuildCtx, prefix: str) -> list[TensorDef]:
    """The mixer's parameter shard (``prefix`` = ``layers.N.mixer``); the fused in_proj norm is the layer's
    ``input_layernorm`` (:mod:`~timeline.graph.families.norm`)."""
    m, dt, h, tp = ctx.model, ctx.dtype, ctx.model.hidden_size, ctx.tp
    d_inner, d_in, conv = widths(m.mamba_heads, m.mamba_head_dim, m.n_groups, m.ssm_state_size)
    kw: dict[str, Any] = {"module": "mamba", "dtype": dt, "split": tp}
    return [
        param(f"{prefix}.in_proj.weight", (d_in, h), **kw),
        param(f"{prefix}.conv1d.weight", (conv, 1, m.conv_kernel), **kw),
        param(f"{prefix}.conv1d.bias", (conv,), **kw),
        param(f"{prefix}.dt_bias", (m.mamba_heads,), **kw),
        param(f"{prefix}.A_log", (m.mamba_heads,), **kw),
        param(f"{prefix}.D", (m.mamba_heads,), **kw),
        param(f"{prefix}.norm.weight", (d_inner,), **kw),
        param(f"{prefix}.out_proj.weight", (h, d_inner), dim=1, **kw),
    ]


def forward(b: Builder, prefix: str, x: TensorDef, layer: int, *, tags: Tags = NONE) -> TensorDef:
    """The layer's fused norm and Mamba mixer on its residual stream ``x``; returns ``out_proj``'s output on
    the same rows (before the layer's bias-dropout-add)."""
    m, p = b.model, f"{prefix}.mixer"
    heads = b.params[f"{p}.A_log"].shape[0]  # local heads, read off the shard
    groups = m.n_groups * heads // m.mamba_heads
    d_inner = heads * m.mamba_head_dim
    d_in = b.params[f"{p}.in_proj.weight"].shape[0]
    conv = b.params[f"{p}.conv1d.bias"].shape[0]
    ln = norm.forward(b, f"{prefix}.input_layernorm", x, layer, tags=tags)
    zx = column_linear(b, f"{p}.in_proj", ln, d_in, layer, tags=tags)
    t = zx.shape[0]
    zxt = b.tensor(f"{p}.zxbcdt", (t, d_in))
    b.op(f"{p}.transpose_in", "mamba_transpose", layer, {"x": zx}, {"y": zxt}, tags=tags)
    a = b.tensor(f"{p}.A", (heads,), "fp32")
    dt_bias = b.tensor(f"{p}.dt_bias_fp32", (heads,), "fp32")
    b.op(f"{p}.fp32_params", "mamba_fp32_params", layer, {}, {"A": a, "dt_bias": dt_bias}, tags=tags)
    bsz = b.dims.b
    seq = t // bsz
    chunks = math.ceil(seq / CHUNK)
    y = b.tensor(f"{p}.scan.out", (t, d_inner))
    work = {  # alive while _chunk_scan_fwd runs, freed when the autograd Function returns
        "xbc_conv": b.tensor(f"{p}.scan.xbc_conv", (t, conv)),
        "dt": b.tensor(f"{p}.scan.dt", (bsz, heads, chunks, CHUNK), "fp32"),
        "dA_cumsum": b.tensor(f"{p}.scan.dA_cumsum", (bsz, heads, chunks, CHUNK), "fp32"),
        "states": b.tensor(f"{p}.scan.states", (bsz, chunks, heads, m.mamba_head_dim * m.ssm_state_size)),
        "final_states": b.tensor(f"{p}.scan.final_states", (bsz, heads, m.mamba_head_dim * m.ssm_state_size),
                                 "fp32"),
        "CB": b.tensor(f"{p}.scan.CB", (bsz, chunks, groups, CHUNK, CHUNK), "fp32"),
    }
    flops = 2.0 * t * d_inner * m.ssm_state_size * 3 + 2.0 * t * conv * m.conv_kernel
    b.op(f"{p}.scan", "mamba_split_conv1d_scan", layer, {"x": zxt, "A": a, "dt_bias": dt_bias},
         {"y": y, **work}, extras={"out_x": b.tensor(f"{p}.scan.out_x", (t, d_inner))}, flops=flops, tags=tags)
    yt = b.tensor(f"{p}.y", (t, d_inner))
    b.op(f"{p}.transpose_out", "mamba_transpose", layer, {"x": y}, {"y": yt}, tags=tags)
    normed = b.tensor(f"{p}.norm.out", (t, d_inner))
    b.op(f"{p}.norm", "mamba_gated_norm", layer, {"x": yt}, {"y": normed},
         extras={"rstd": b.tensor(f"{p}.norm.rstd", (groups * t,), "fp32")}, flops=5.0 * t * d_inner, tags=tags)
    return row_linear(b, f"{p}.out_proj", normed, m.hidden_size, layer, tags=tags)
