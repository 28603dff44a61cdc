"""The gated delta-net mixer of a ``linear_attention`` layer (Qwen3-Next, Qwen3.5), as vLLM builds and runs it.

Source: vLLM 0.19.0 ``vllm/model_executor/layers/mamba/gdn_linear_attn.py`` ``GatedDeltaNetAttention``
(``__init__``, ``forward``, ``fix_query_key_value_ordering``, ``_forward_core``), built by
``models/qwen3_next.py`` ``Qwen3NextDecoderLayer`` (``gqa_interleaved_layout=True``) and ``models/qwen3_5.py``
``Qwen3_5DecoderLayer`` (``False``). With ``K = linear_num_key_heads · linear_key_head_dim`` and ``V =
linear_num_value_heads · linear_value_head_dim``, one tensor-parallel rank holds (:func:`params`):

* ``in_proj_qkvz`` ``[(2K + 2V)/tp, hidden]`` and ``in_proj_ba`` ``[2·v_heads/tp, hidden]`` (``MergedColumnParallel
  Linear``, no bias), quantized as the checkpoint says;
* ``conv1d.weight`` ``[(2K + V)/tp, 1, conv_kernel]`` (a ``ColumnParallelLinear`` built without ``quant_config``,
  no bias);
* ``dt_bias`` ``[v_heads/tp]`` in the model dtype and ``A_log`` ``[v_heads/tp]`` in fp32;
* ``norm.weight`` ``[linear_value_head_dim]`` (``RMSNormGated`` over one head, whole on every rank);
* ``out_proj`` ``[hidden, V/tp]`` (``RowParallelLinear``).

Forward ops on the layer's ``t`` tokens (:func:`forward`): the projections' outputs; Qwen3.5 splits ``q, k, v | z``
as views and copies ``b`` and ``a`` (``.contiguous()``), Qwen3-Next unpacks its interleaved layout with
reshapes that copy ``v``, ``z``, ``b``, ``a``, ``rearrange`` copies of ``q`` and ``k`` and their ``torch.cat``;
``core_attn_out = torch.zeros(t, v_heads/tp, value_dim)``; the ``gdn_attention_core`` custom op, which in vLLM's
profile run (no attention metadata) only warms the chunked kernels up on at most 64 tokens and returns; the gated
``RMSNormGated`` (a new ``[t, V/tp]``); ``out_proj``. Nothing is saved: an engine runs no backward, and the
training path is :func:`train_params` / :func:`train_forward`.

**Training (Megatron-Core).** NVIDIA/Megatron-LM ``megatron/core/ssm/gated_delta_net.py: GatedDeltaNet``
(``__init__``, ``forward``, ``_prepare_qkv_for_gated_delta_rule``, ``_compute_g_and_beta``, ``_apply_gated_norm``;
read at core_v0.17.0 and 2d1fa8d372, and in the fork elena-lyulina/Megatron-LM-Attention-Benchmark at c86c326518;
the file moved to ``ssm/gated_delta_net/gdn.py`` at 07e958fc74 and is not re-read after it), built by
``models/gpt/experimental_attention_variant_module_specs.py: get_gated_delta_net_module_spec`` (``in_proj`` a
TELayerNormColumnParallelLinear, the layer's input norm fused into it; ``out_norm`` the model's norm over one value
head; ``out_proj`` a TERowParallelLinear; ``bias`` and ``conv_bias`` False). Parameters per device
(:func:`train_params`): ``in_proj.weight`` ``[(2K + 2V + 2·v_heads)/tp, h]`` (q, k, v, gate, beta, alpha),
``conv1d.weight`` ``[(2K + V)/tp, 1, conv_kernel]``, ``dt_bias`` and ``A_log`` ``[v_heads/tp]`` in the params dtype,
``out_norm.weight`` ``[value_head_dim]``, ``out_proj.weight`` ``[h, V/tp]``.

Forward ops (:func:`train_forward`) on the ``t = s·b`` rows of this rank (gathered under sequence parallelism),
widths the rank's; flash-linear-attention 0.4.x (``flash-linear-attention~=0.4.0`` in Megatron-LM's pyproject.toml
from 558fdafab3; 0.5.1's ``ChunkGatedDeltaRuleFunction`` saves the same tensors when its gate and beta stay out of
the kernel) ``fla/modules/convolution.py: CausalConv1dFunction``,
``fla/modules/l2norm.py: L2NormFunction`` and ``fla/ops/gated_delta_rule/chunk.py: ChunkGatedDeltaRuleFunction``:

1. the fused norm and ``in_proj`` → ``qkvzba [t, 2K + 2V + 2·v_heads]``, held by the forward's local to its end;
2. the causal conv's input, a contiguous copy of the ``qkv`` columns (``input_guard``'s ``.contiguous()`` of the
   ``[b, s, C]`` slice; before 2d1fa8d372, ``transpose(1, 2).contiguous()`` to ``[b, C, s]`` for
   ``causal_conv1d_fn``: the same bytes), which the conv saves; its output ``[t, C]`` (SiLU fused), held by the
   forward's local to its end;
3. ``l2norm(query_key.contiguous())``: a contiguous copy of q and k, and the norm's output and fp32 ``rstd`` (one per
   row and head), both saved;
4. q and k at the value heads (``repeat_interleave`` when ``v_heads > k_heads``, else contiguous copies of the
   split), ``value``, ``gate``, ``beta`` and ``alpha`` contiguous copies;
5. ``_compute_g_and_beta`` (``jit_fuser``, torch.compile): fp32 ``g [t, v_heads]`` and ``beta.sigmoid()``; the
   compiled backward recomputes from ``alpha`` and ``beta``, which it saves;
6. ``chunk_gated_delta_rule``: ``chunk_local_cumsum`` (fp32 ``g``), the fp32 ``A [t, v_heads, 64]`` that
   ``solve_tril`` turns into ``A`` in the activations' dtype; then ``w``, ``u``, the chunk states ``h [b,
   ceil(s/64), v_heads, key_dim, value_dim]`` and ``v_new`` while ``chunk_fwd_o`` writes ``o [t, V]``; saved: q, k,
   v, the cumulative ``g``, ``beta``, ``A``;
7. ``_apply_gated_norm``: ``out_norm`` over each head (saves its input ``o`` and fp32 ``rsigma``), then
   ``y · silu(gate.float())`` compiled (saves ``y`` and ``gate``);
8. ``transpose(0, 1).contiguous()`` to ``[s, b, V]``, which ``out_proj`` saves.

fla's kernels are autotuned: Triton's benchmarking flush buffer at the first forward's and backward's GDN op is a
first-call rule (:func:`timeline.profiles.megatron_autotune.first_call`).

**Deterministic mode** (``--deterministic-mode``; ``[framework] deterministic_mode``, or ``deterministic`` where that
is unset: :attr:`timeline.spec.framework.FrameworkSpec.deterministic_algorithms`): Megatron-Core runs the conv as
``act_fn(conv1d(qkv)[..., :seq_len])`` (``nn.Conv1d`` / ``F.conv1d``; the activation keeps the whole
``[b, C, s + kernel − 1]`` convolution output) and the rule as ``torch_chunk_gated_delta_rule``, torch ops under
autograd instead of fla's kernels (``gated_delta_net.py`` from 20d66d5c7b, the first GDN commit on main,
2026-01-17, released in core_v0.16.0; on the dev branch from 5880674a39, 2025-11-19; ``gated_delta_net/gdn.py``
from 07e958fc74, unchanged). :func:`timeline.profiles.megatron_gdn.torch_chunk_elements` gives what that function keeps, its forward's transient
and its backward's peak in closed form, read op by op off the function at core_v0.17.0 and checked to the byte
against its own autograd graph on the CPU (``tools/probe_gdn_torch_chunk.py``, ``tests/data/gdn_torch_chunk.json``).

Not modelled: context parallelism (the all-to-alls of ``tensor_a2a_cp2hp``), packed sequences, and fla's kernels'
backward workspaces. ``--recompute-modules gdn_norm_out``
(ff5264c33d on) checkpoints step 7 and the transpose copy without their output (``CheckpointWithoutOutput``: the
checkpoint keeps ``o`` and ``gate``, out_proj's input is discarded after it runs).
"""

from __future__ import annotations

import math

from timeline.graph.context import BuildCtx
from timeline.graph.families import attention, norm
from timeline.graph.families.common import NONE, Tags, column_linear, row_linear
from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef, param
from timeline.profiles.megatron_gdn import FLA_CHUNK, TORCH_CHUNK, torch_chunk_elements
from timeline.spec.model import ModelSpec


def widths(m: ModelSpec) -> tuple[int, int]:
    """(K, V): the key and value widths of the unsharded mixer."""
    return m.linear_num_key_heads * m.linear_key_head_dim, m.linear_num_value_heads * m.linear_value_head_dim


def params(ctx: BuildCtx, prefix: str) -> list[TensorDef]:
    """The mixer's parameter shard (``prefix`` = ``layers.N.linear_attn``); the layer's norms are its own."""
    m, dt, h, tp = ctx.model, ctx.dtype, ctx.model.hidden_size, ctx.tp
    k, v = widths(m)
    nv = m.linear_num_value_heads
    def shard(name: str, shape: tuple[int, ...], dtype: str = dt, dim: int = 0) -> TensorDef:
        return param(f"{prefix}.{name}", shape, module=prefix, dtype=dtype, split=tp, dim=dim)

    return [
        shard("in_proj_qkvz.weight", (2 * k + 2 * v, h)),
        shard("in_proj_ba.weight", (2 * nv, h)),
        shard("conv1d.weight", (2 * k + v, 1, m.linear_conv_kernel_dim)),
        shard("dt_bias", (nv,)),
        shard("A_log", (nv,), "fp32"),
        param(f"{prefix}.norm.weight", (m.linear_value_head_dim,), module=prefix, dtype=dt),
        shard("out_proj.weight", (h, v), dim=1),
    ]


def forward(b: Builder, prefix: str, x: TensorDef, layer: int) -> TensorDef:
    """The layer's input norm and gated delta-net on its residual stream ``x``; returns ``out_proj``'s output."""
    m, p = b.model, f"{prefix}.linear_attn"
    ln = attention.input_norm(b, prefix, x, layer)
    qkvz_cols = b.params[f"{p}.in_proj_qkvz.weight"].shape[0]
    nv = b.params[f"{p}.dt_bias"].shape[0]  # local value heads, read off the shard
    v = nv * m.linear_value_head_dim
    k = (qkvz_cols - 2 * v) // 2
    qkvz = column_linear(b, f"{p}.in_proj_qkvz", ln, qkvz_cols, layer)
    ba = column_linear(b, f"{p}.in_proj_ba", ln, 2 * nv, layer)
    t = qkvz.shape[0]
    copies: dict[str, TensorDef] = {"b": b.tensor(f"{p}.b", (t, nv)), "a": b.tensor(f"{p}.a", (t, nv))}
    if m.model_type == "qwen3_next":  # fix_query_key_value_ordering: reshapes of non-contiguous splits copy
        copies |= {"value": b.tensor(f"{p}.value", (t, v)), "z": b.tensor(f"{p}.z", (t, v))}
    b.op(f"{p}.split", "gdn_unpack", layer, {"qkvz": qkvz, "ba": ba}, copies)
    if m.model_type == "qwen3_next":
        q, kk = b.tensor(f"{p}.query", (t, k)), b.tensor(f"{p}.key", (t, k))
        b.op(f"{p}.rearrange", "gdn_unpack", layer, {"qkvz": qkvz}, {"query": q, "key": kk})
        mixed = b.tensor(f"{p}.mixed_qkv", (t, 2 * k + v))
        b.op(f"{p}.cat", "gdn_unpack", layer, {"query": q, "key": kk, "value": copies["value"]}, {"y": mixed})
        z = copies["z"]
    else:  # Qwen3.5: mixed_qkv and z are views of the projection's output
        mixed, z = qkvz, qkvz
    core = b.tensor(f"{p}.core_attn_out", (t, v))
    b.op(f"{p}.core_attn_out", "gdn_zeros", layer, {}, {"y": core})
    b.op(f"{p}.gdn_attention_core", "gdn_core", layer, {"mixed_qkv": mixed, "b": copies["b"], "a": copies["a"],
                                                        "out": core}, {},
         flops=2.0 * t * (k // max(1, m.linear_key_head_dim)) * m.linear_key_head_dim * m.linear_value_head_dim * 4)
    normed = b.tensor(f"{p}.norm.out", (t, v))
    b.op(f"{p}.norm", "gdn_gated_norm", layer, {"x": core, "z": z}, {"y": normed}, flops=5.0 * t * v)
    return row_linear(b, f"{p}.out_proj", normed, m.hidden_size, layer)


def train_params(ctx: BuildCtx, prefix: str) -> list[TensorDef]:
    """Megatron-Core's mixer shard (``prefix`` = ``layers.N.linear_attn``), counted with the attention modules
    (it is the layer's ``self_attention``); the fused input norm is the layer's ``input_layernorm``."""
    m, dt, h, tp = ctx.model, ctx.dtype, ctx.model.hidden_size, ctx.tp
    k, v = widths(m)
    nv = m.linear_num_value_heads
    def shard(name: str, shape: tuple[int, ...], dim: int = 0) -> TensorDef:
        return param(f"{prefix}.{name}", shape, module="attention", dtype=dt, split=tp, dim=dim)

    return [shard("in_proj.weight", (2 * k + 2 * v + 2 * nv, h)),
            shard("conv1d.weight", (2 * k + v, 1, m.linear_conv_kernel_dim)),
            shard("dt_bias", (nv,)), shard("A_log", (nv,)),
            *norm.params(ctx, f"{prefix}.out_norm", m.linear_value_head_dim, module="attention"),
            shard("out_proj.weight", (h, v), dim=1)]


def train_forward(b: Builder, prefix: str, x: TensorDef, layer: int, *, tags: Tags = NONE) -> TensorDef:
    """The layer's fused input norm and Megatron-Core's gated delta net on its residual stream ``x``; returns
    ``out_proj``'s output (before the layer's bias-dropout-add)."""
    m, p = b.model, f"{prefix}.linear_attn"
    nv = b.params[f"{p}.dt_bias"].shape[0]  # local value heads, read off the shard
    nk = nv * m.linear_num_key_heads // m.linear_num_value_heads
    kd, vd = m.linear_key_head_dim, m.linear_value_head_dim
    k, v = nk * kd, nv * vd
    conv = 2 * k + v
    ln = norm.forward(b, f"{prefix}.input_layernorm", x, layer, tags=tags)
    qkvzba = column_linear(b, f"{p}.in_proj", ln, 2 * k + 2 * v + 2 * nv, layer, tags=tags)
    t = qkvzba.shape[0]
    conv_in = b.tensor(f"{p}.conv.x", (t, conv))
    b.op(f"{p}.conv_in", "gdn_copy", layer, {"x": qkvzba}, {"y": conv_in}, tags=tags)
    conv_out = b.tensor(f"{p}.conv.out", (t, conv))
    torch_path = b.table.gdn_torch
    bsz = b.dims.b
    if torch_path:  # act_fn(conv1d(qkv)[..., :seq_len]): the activation keeps the padded convolution output
        pre = b.tensor(f"{p}.conv.preact", (t + bsz * (m.linear_conv_kernel_dim - 1), conv))
        b.op(f"{p}.conv1d", "gdn_conv_torch", layer, {"x": conv_in}, {"y": conv_out}, extras={"preact": pre},
             flops=2.0 * t * conv * m.linear_conv_kernel_dim, tags=tags)
    else:
        b.op(f"{p}.conv1d", "gdn_conv", layer, {"x": conv_in}, {"y": conv_out},
             flops=2.0 * t * conv * m.linear_conv_kernel_dim, tags=tags)
    qk = b.tensor(f"{p}.query_key", (t, 2 * k))
    b.op(f"{p}.query_key", "gdn_copy", layer, {"x": conv_out}, {"y": qk}, tags=tags)
    qk_n = b.tensor(f"{p}.l2norm.out", (t, 2 * k))
    b.op(f"{p}.l2norm", "gdn_l2norm", layer, {"x": qk}, {"y": qk_n},
         extras={"rstd": b.tensor(f"{p}.l2norm.rstd", (t * 2 * nk,), "fp32")}, flops=4.0 * t * 2 * k, tags=tags)
    heads = max(nv, nk)  # q and k at the value heads (repeat_interleave), else copies of the split
    q, kk = b.tensor(f"{p}.query", (t, heads * kd)), b.tensor(f"{p}.key", (t, heads * kd))
    b.op(f"{p}.qk_heads", "gdn_copy", layer, {"x": qk_n}, {"q": q, "k": kk}, tags=tags)
    value = b.tensor(f"{p}.value", (t, v))
    b.op(f"{p}.value_copy", "gdn_copy", layer, {"x": conv_out}, {"y": value}, tags=tags)
    gate, beta, alpha = (b.tensor(f"{p}.gate", (t, v)), b.tensor(f"{p}.beta_in", (t, nv)),
                         b.tensor(f"{p}.alpha", (t, nv)))
    b.op(f"{p}.gba_copy", "gdn_copy", layer, {"x": qkvzba}, {"gate": gate, "beta": beta, "alpha": alpha}, tags=tags)
    g, beta_s = b.tensor(f"{p}.g", (t, nv), "fp32"), b.tensor(f"{p}.beta", (t, nv))
    b.op(f"{p}.g_and_beta", "gdn_gate", layer, {"alpha": alpha, "beta": beta}, {"g": g, "beta": beta_s},
         flops=8.0 * t * nv, tags=tags)
    o = b.tensor(f"{p}.core_attn_out", (t, v))
    # the forward's locals (qkvzba, the conv output, alpha, g) hold their tensors until it returns
    held = {"_qkvzba": qkvzba, "_conv_out": conv_out, "_alpha": alpha, "_g": g}
    if torch_path:
        torch_chunk(b, p, layer, {"q": q, "k": kk, "v": value, "g": g, "beta": beta_s}, o, heads, tags)
        held |= {"_q": q, "_k": kk, "_v": value, "_beta": beta_s}  # locals too; the torch path saves none of them
    else:
        g_cum, a = b.tensor(f"{p}.chunk.g", (t, nv), "fp32"), b.tensor(f"{p}.chunk.A", (t, nv, FLA_CHUNK))
        b.op(f"{p}.chunk_kkt", "gdn_kkt", layer, {"k": kk, "g": g, "beta": beta_s},
             {"g": g_cum, "A": a, "A_fp32": b.tensor(f"{p}.chunk.A_fp32", (t, nv, FLA_CHUNK), "fp32")},
             flops=2.0 * t * FLA_CHUNK * nv * kd, tags=tags)
        chunks = math.ceil(t // bsz / FLA_CHUNK)
        work = {"w": b.tensor(f"{p}.chunk.w", (t, nv * kd)), "u": b.tensor(f"{p}.chunk.u", (t, v)),
                "h": b.tensor(f"{p}.chunk.h", (bsz, chunks, nv, kd, vd)),
                "v_new": b.tensor(f"{p}.chunk.v_new", (t, v))}
        b.op(f"{p}.chunk_gated_delta_rule", "gdn_chunk", layer,
             {"q": q, "k": kk, "v": value, "g": g_cum, "beta": beta_s, "A": a}, {"y": o, **work},
             flops=2.0 * t * nv * kd * vd * 4 + 2.0 * t * FLA_CHUNK * nv * (kd + vd), tags=tags)
    # _gated_norm_and_a2a: the region --recompute-modules gdn_norm_out checkpoints (from ff5264c33d)
    norm_tags = tags | {"gdn_norm_out"}
    y = b.tensor(f"{p}.out_norm.out", (t, v))
    b.op(f"{p}.out_norm", "gdn_out_norm", layer, {"x": o}, {"y": y},
         extras={"rsigma": b.tensor(f"{p}.out_norm.rsigma", (t * nv,), "fp32")}, flops=4.0 * t * v, tags=norm_tags)
    gated = b.tensor(f"{p}.gated", (t, v))
    b.op(f"{p}.gate_mul", "gdn_gate_mul", layer, {"y": y, "gate": gate}, {"y": gated}, flops=5.0 * t * v,
         tags=norm_tags)
    sbv = b.tensor(f"{p}.norm_out", (t, v))
    b.op(f"{p}.norm_out", "gdn_copy", layer, {"x": gated}, {"y": sbv}, tags=norm_tags)
    return row_linear(b, f"{p}.out_proj", sbv, m.hidden_size, layer, tags=tags, refs=held)


def torch_chunk(b: Builder, p: str, layer: int, inputs: dict[str, TensorDef], out: TensorDef, heads: int,
                tags: Tags) -> None:
    """Megatron-Core's deterministic ``torch_chunk_gated_delta_rule`` as one op (rule ``gdn_torch_chunk``): what it
    keeps, its forward transient and its backward's scratch, from :func:`torch_chunk_elements` over the micro-batch's
    sequences and this rank's ``heads`` (q and k at the value heads)."""
    m, bsz = b.model, b.dims.b
    t = out.shape[0]
    s = t // bsz
    kd, vd = m.linear_key_head_dim, m.linear_value_head_dim
    kept, work, back = torch_chunk_elements(s, kd, vd)
    units = bsz * heads
    fresh = units * (work - (s * vd if heads == 1 else 0))  # one head: the output's transposed copy is a view
    grads_in = sum(x.size_bytes for x in inputs.values())
    # the backward's peak comes before any input gradient exists; the unit allocates those gradients beside the
    # scratch, so the scratch is the peak less their bytes
    scratch = max(0, units * back * 4 - grads_in)
    c = TORCH_CHUNK
    # the transient is an output no op reads (freed when the op ends), as fla's w, u, h and v_new are
    b.op(f"{p}.torch_chunk_gated_delta_rule", "gdn_torch_chunk", layer, inputs,
         {"y": out, "work": b.tensor(f"{p}.torch_chunk.work", (fresh,), "fp32")},
         extras={"kept": b.tensor(f"{p}.torch_chunk.kept", (units * kept,), "fp32"),
                 "masks": b.tensor(f"{p}.torch_chunk.masks", (2, c, c), "bool")},
         scratch={"backward": b.tensor(f"{p}.torch_chunk.backward", (scratch,), "uint8")} if scratch else {},
         flops=2.0 * t * heads * kd * vd * 4 + 2.0 * t * c * heads * (kd + vd), tags=tags)
