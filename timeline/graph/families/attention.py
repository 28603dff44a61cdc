"""Multi-head and grouped-query attention (GPT, Llama, Mistral, Qwen).

Q/K/V are column-parallel over TP (heads split), the output projection row-parallel (its
bias, where present, is replicated — Megatron ``RowParallelLinear``). Qwen3's per-head q/k
norms are tagged ``norm``. GPT-OSS's learned sinks are one logit per query head, split with the
heads (HF ``GptOssAttention.sinks``; Megatron-Core's ``softmax_offset`` per local head). :func:`local_heads` reads the local head counts back off the
built parameters, for the op builders.

Forward ops (:func:`forward`): MHA/GQA (QKV projection, RoPE, core attention, output projection) and the
core attention shared with MLA — eager (scores, softmax, dropout, attention over V), flash, or
torch SDPA as CUDA dispatches it (``sdpa``: cuDNN, flash or memory-efficient, :mod:`timeline.graph.families.sdpa`),
as the profile's table says. Context parallelism: each rank holds ``s/cp`` queries and receives the other ranks' K/V
chunks in a ring (a ``comm`` buffer of two chunks in flight). Under a table with ``rope_cache``
the RoPE cos/sin are built once per chunk (:func:`rope_cache`) and every RoPE op reads them.
TE's FlashAttention backend (``flash_bwd`` in the table) gives the op the flash-attn 2 backward's
workspaces as scratch (:mod:`timeline.graph.families.flash_bwd`). Learned sinks (GPT-OSS) under a table with ``sink_attention = "eager"`` run
:func:`~timeline.graph.families.sinks.eager_sink_attention`; otherwise the sinks live inside the
table's attention kernel. BERT's padding mask (``[model] architecture = "bert"``) under TE's unfused attention:
:func:`~timeline.graph.families.bert.padding_mask` widens it before the scores, and ``masked_fill`` zeroes the
padded rows of the probabilities before dropout (keeping the mask).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from timeline.graph.context import BuildCtx
from timeline.graph.families import bert, cp_a2a, flash_bwd, norm, sdpa
from timeline.graph.families.common import NONE, Tags, row_linear, sp_gather
from timeline.graph.families.sinks import eager_attention, eager_sink_attention
from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef, param
from timeline.spec.te_softmax import te_softmax_kernel


def params(ctx: BuildCtx, prefix: str, module: str = "attention") -> list[TensorDef]:
    m, tp, dt = ctx.model, ctx.tp, ctx.dtype
    hd = m.attn_head_dim
    q_out, kv_out = m.num_attention_heads * hd, m.kv_heads * hd
    kv_split = tp
    if ctx.rules.params.kv_head_replicas and 0 < m.kv_heads < tp:
        # vLLM model_executor/layers/linear.py QKVParallelLinear.__init__ (0.6 … 0.19; SGLang's copy alike): with
        # tp >= total_num_kv_heads each rank holds one KV head, num_kv_head_replicas = tp // total_num_kv_heads
        kv_out, kv_split = hd, 1
    out = [
        param(f"{prefix}.q_proj.weight", (q_out, m.hidden_size), module=module, dtype=dt, split=tp),
        param(f"{prefix}.k_proj.weight", (kv_out, m.hidden_size), module=module, dtype=dt, split=kv_split),
        param(f"{prefix}.v_proj.weight", (kv_out, m.hidden_size), module=module, dtype=dt, split=kv_split),
        param(f"{prefix}.o_proj.weight", (m.hidden_size, q_out), module=module, dtype=dt, split=tp, dim=1),
    ]
    # Megatron-Core attention.py: SelfAttention.__init__ widens linear_qkv by kv_channels · heads for the output
    # gate (``attention_output_gate``), its bias with it
    biased = [("q", q_out, tp), ("k", kv_out, kv_split), ("v", kv_out, kv_split)]
    if m.attention_output_gate:
        out.append(param(f"{prefix}.g_proj.weight", (q_out, m.hidden_size), module=module, dtype=dt, split=tp))
        biased.append(("g", q_out, tp))
    if m.attention_bias or m.linear_bias:
        out += [param(f"{prefix}.{n}_proj.bias", (w,), module=module, dtype=dt, split=k) for n, w, k in biased]
    if m.linear_bias or m.attention_out_bias:
        out.append(param(f"{prefix}.o_proj.bias", (m.hidden_size,), module=module, dtype=dt))
    if m.attention_sinks and m.sink_fixed:  # TE dot_product_attention.py: DotProductAttention.__init__ (off-by-one):
        # torch.zeros(num_heads // tp) on the device, fp32, an attribute no optimizer or dtype cast reaches
        out.append(param(f"{prefix}.softmax_offset", (m.num_attention_heads,), module=module, dtype="fp32", split=tp,
                         trainable=False))
    elif m.attention_sinks:
        out.append(param(f"{prefix}.sinks", (m.num_attention_heads,), module=module, dtype=dt, split=tp))
    if m.qk_norm and m.qk_norm_full:  # one weight over every head of the projection, split with it
        out += [param(f"{prefix}.q_norm.weight", (q_out,), module="norm", dtype=dt, split=tp),
                param(f"{prefix}.k_norm.weight", (kv_out,), module="norm", dtype=dt, split=kv_split)]
    elif m.qk_norm and not ctx.structure.qk_l2_norm:  # an L2 norm has no weight
        out += norm.params(ctx, f"{prefix}.q_norm", hd, module="norm", kind="rmsnorm")
        out += norm.params(ctx, f"{prefix}.k_norm", hd, module="norm", kind="rmsnorm")
    return out


def local_heads(params: Mapping[str, TensorDef], prefix: str, head_dim: int) -> tuple[int, int]:
    """Local (query, key/value) heads of the attention built under ``prefix``, off its q/k projections."""
    return (params[f"{prefix}.q_proj.weight"].shape[0] // head_dim,
            params[f"{prefix}.k_proj.weight"].shape[0] // head_dim)


CORE: Tags = frozenset({"core_attn"})


def core_attention(b: Builder, prefix: str, q: TensorDef, k: TensorDef, v: TensorDef, layer: int,
                   heads: int, qk_dim: int, v_dim: int, *, views: TensorDef | None = None,
                   kv_cols: int = 0, kv_len: int = 0, padding: bool | None = None) -> TensorDef:
    """Softmax(q·kᵀ)·v for ``heads`` local heads; returns the context ``(rows, heads·v_dim)``.

    ``views``: the fused QKV output (``Structure.qkv_views``) that any of ``q``, ``k``, ``v`` may still
    be a view of — ``heads·qk_dim`` columns for q, ``kv_cols`` for k and for v; an op keeping a view
    keeps it whole, a contiguous copy has the view's shape. Under an all-to-all context-parallel exchange
    the kernel runs on whole sequences of fewer heads (:mod:`timeline.graph.families.cp_a2a`). ``kv_len``: the
    keys' sequence length where it is not the queries' (a cross-attention); ``padding``: the attention runs
    under a padding mask (default: :func:`padded`)."""
    if padding is None:
        padding = padded(b, layer)
    name = f"{prefix}.core_attn"
    rows = q.shape[0]
    shapes: dict[str, tuple[int, ...]] = {"q": (rows, heads * qk_dim if q is views else q.shape[1]),
                                          "k": (rows, kv_cols if k is views else k.shape[1]),
                                          "v": (rows, kv_cols if v is views else v.shape[1])}
    if b.table.te_qkv_layout and views is not None and any(t is views for t in (q, k, v)) \
            and not (q is k is v):
        # TE attention/dot_product_attention/utils.py: get_qkv_layout (DotProductAttention.forward calls it
        # before choosing a backend) — q/k made new tensors (a norm, RoPE) next to a view v of the fused
        # output match no layout ("not_supported"), so `q, k, v = [x.contiguous() for x in [q, k, v]]`
        # copies each remaining view, and the backend keeps the copies (with q, k and v all views of it, a
        # packed layout such as sbh3d runs on the views, which then keep it whole)
        keep = {n: t for n, t in (("q", q), ("k", k), ("v", v)) if t is views}
        copies = dict(zip(keep, _contiguous(b, f"{name}.qkv_layout", layer, keep, shapes), strict=True))
        q, k, v = copies.get("q", q), copies.get("k", k), copies.get("v", v)
    # TE FlashAttention: bshd copies, `x.transpose(0, 1).contiguous()`; at one sequence per micro-batch
    # the transpose of a contiguous [s, 1, …] tensor is contiguous (PyTorch's is_contiguous skips the
    # strides of size-1 dims) and .contiguous() returns it: only a view of the fused QKV output is copied
    if flash_copies(b):
        xs = {n: t for n, t in (("q", q), ("k", k), ("v", v)) if b.dims.b > 1 or t is views}
        made = dict(zip(xs, _contiguous(b, f"{name}.to_bshd", layer, xs, shapes), strict=True)) if xs else {}
        q, k, v = made.get("q", q), made.get("k", k), made.get("v", v)
        shapes = {"q": q.shape, "k": k.shape, "v": v.shape}
    a2a = cp_a2a.group(b, layer) if b.table.attention == "flash" else 1
    if a2a > 1:  # heads scattered, the sequence gathered; the rest of the CP group (a2a+p2p) rings
        qkv = cp_a2a.scatter_heads(b, name, layer, {"q": q, "k": k, "v": v}, shapes, a2a)
        dims = b.dims
        b.dims = replace(dims, cp=dims.cp // a2a)  # s/cp·a2a queries per rank, a ring over what is left of cp
        try:
            out = _attend(b, name, qkv["q"], qkv["k"], qkv["v"], layer, heads // a2a, qk_dim, v_dim,
                          {k: t.shape for k, t in qkv.items()})
        finally:
            b.dims = dims
        return cp_a2a.gather_heads(b, name, layer, out, a2a)
    return _attend(b, name, q, k, v, layer, heads, qk_dim, v_dim, shapes, kv_len=kv_len, padding=padding)


def unmasked(b: Builder, layer: int) -> bool:
    """Whether layer ``layer``'s self-attention runs without a mask: a LLaVA ViT layer's
    (``vit_layer_specs.py``: ``AttnMaskType.no_mask``)."""
    return b.model.is_vision_layer(layer)


def padded(b: Builder, layer: int) -> bool:
    """Whether layer ``layer``'s self-attention runs under a padding mask: BERT's, T5's encoder's."""
    m = b.model
    return m.architecture == "bert" or (m.architecture == "t5" and layer < m.encoder_layers)


def _attend(b: Builder, name: str, q: TensorDef, k: TensorDef, v: TensorDef, layer: int, heads: int, qk_dim: int,
            v_dim: int, shapes: Mapping[str, tuple[int, ...]], *, kv_len: int = 0,
            padding: bool = False) -> TensorDef:
    """The attention kernel (or eager ops) on prepared q, k, v; under ``b.dims.cp > 1`` the K/V ring."""
    d = b.dims
    sq, sk = d.s_local, kv_len or d.s
    rows = q.shape[0]
    kv = {"k": k, "v": v}
    kc, vc = shapes["k"][1], shapes["v"][1]
    if d.cp > 1:
        ring = b.tensor(f"{name}.kv_ring", (2 * k.shape[0], kc + vc), comm=True)
        b.op(f"{name}.cp_ring", "comm", layer, {"k": k, "v": v}, {"y": ring}, kind="p2p", stream="cp", tags=CORE)
        kv["_ring"] = ring
    if b.model.attention_sinks and b.table.sink_attention == "eager":
        return eager_sink_attention(b, name, q, k, v, layer, heads, qk_dim)
    if b.table.model_code and b.model.eager_attention:
        return eager_attention(b, name, q, k, v, layer, heads, qk_dim)
    ctx = b.tensor(f"{name}.out", (rows, heads * v_dim))
    if b.table.attention == "sdpa":
        return sdpa.forward(b, name, q, k, v, ctx, layer, heads, qk_dim, v_dim, CORE)
    if b.table.attention == "flash":
        # softmax statistics [b, h, s_q, 1] fp32 and the philox rng_state [seed, offset] (uint64)
        extras = {"lse": b.tensor(f"{name}.softmax_lse", (d.b, heads, sq), "fp32"),
                  "rng_state": b.tensor(f"{name}.rng_state", (2,), "int64")}
        if d.cp > 1:  # the K/V chunk the ring ends on (a k+v concatenation), which a CP backward re-reads
            extras["kv_p2p"] = b.tensor(f"{name}.kv_p2p", (k.shape[0], kc + vc))
            # and one rng_state per ring step: step 0's is rng_state, steps 1 … cp − 1 add theirs
            for i in range(1, d.cp):
                extras[f"rng_state_step{i}"] = b.tensor(f"{name}.rng_state_step{i}", (2,), "int64")
        rule = "flash_attn"
        if b.model.attention_sinks:  # learned sinks inside the kernel: their fp32 copy [1, h, 1, 1] is kept; a
            # fixed one is fp32 already, so softmax_offset.to(torch.float32) is the tensor itself (no copy)
            if not b.model.sink_fixed:
                extras["softmax_offset"] = b.tensor(f"{name}.softmax_offset", (1, heads, 1, 1), "fp32")
            rule = "flash_attn_sinks"
        if b.model.is_sliding(layer):  # a sliding window: each query meets at most that many keys
            sk = min(sk, b.model.sliding_window)
        f = 2.0 * d.b * heads * sq * sk * (qk_dim + v_dim)
        copied = flash_copies(b)
        # the bshd output's `.view(b, s, -1).transpose(0, 1).contiguous()`: a copy only for b > 1, as above
        out = b.tensor(f"{name}.out_bshd", ctx.shape) if copied and d.b > 1 else ctx
        inputs = {"q": q, **kv}
        if d.cp > 1 and copied:  # the ring keeps q, its last K/V buffer and out, not the
            inputs = {"q": q, "_k": k, "_v": v, "_ring": kv["_ring"]}  # bshd k/v copies
        scratch = flash_bwd.scratch(b, name, q, k, v, heads, qk_dim) \
            if b.table.flash_bwd and qk_dim == v_dim and rule == "flash_attn" else {}
        b.op(name, rule, layer, inputs, {"y": out}, extras=extras, flops=f, tags=CORE, scratch=scratch)
        if out is not ctx:  # the returned sbhd copy the output projection keeps
            b.op(f"{name}.to_sbhd", "copy", layer, {"x": out}, {"y": ctx}, tags=CORE)
        return ctx
    shape = (d.b, heads, sq, sk)
    # a padding mask (BERT, T5's encoder and cross-attention): TE's unfused attention widens it before the
    # scores (graph/families/bert.py); Megatron's own DotProductAttention (the local spec) passes the extended
    # mask to its softmax as it is
    te_padding = padding and b.table.te_qkv_layout
    masks = bert.padding_mask(b, f"{name}.mask", layer, CORE, kv_len=kv_len) if te_padding else {}
    scores = b.tensor(f"{name}.scores", shape)
    b.op(f"{name}.qk", "attn_scores", layer, {"q": q, "k": k}, {"y": scores},
         flops=2.0 * d.b * heads * sq * sk * qk_dim, tags=CORE)
    kernel = te_softmax_kernel(d.dtype, d.b, heads, sq, sk, causal=not (padding or unmasked(b, layer)))
    # TE's FusedScaleMaskSoftmax.forward_torch_softmax (softmax.py, v1.11 … v2.18), where its kernel does not take
    # the shape: `inp.float()`, the mask applied in place, torch's softmax kept in fp32, cast back; the fp32 copy is
    # the function's local until it returns, the bf16 scores UnfusedDotProductAttention.forward's `matmul_result`
    # until the attention returns
    te_torch = b.table.te_torch_softmax and not kernel and d.dtype != "fp32"
    fp32 = (b.table.softmax_fp32 or te_torch) and d.dtype != "fp32"
    src, held_in, held_scores = scores, {}, {}
    if te_torch:
        src = b.tensor(f"{name}.softmax_in", shape, "fp32")
        b.op(f"{name}.softmax_upcast", "copy", layer, {"x": scores}, {"y": src}, tags=CORE)
        held_in, held_scores = {"_in": src}, {"_scores": scores}
    probs = b.tensor(f"{name}.softmax", shape, "fp32" if fp32 else None)
    rule = "te_fused_softmax" if b.table.te_softmax and kernel else \
        "te_torch_softmax_masked" if te_torch and not unmasked(b, layer) else "softmax"
    b.op(f"{name}.softmax_op", rule, layer, {"x": src, **({"_mask": masks["mask"]} if masks else {})},
         {"y": probs}, flops=5.0 * d.b * heads * sq * sk, tags=CORE)
    if fp32:  # probs.half() / .bfloat16() after the fp32 softmax
        cast = b.tensor(f"{name}.softmax_cast", shape)
        b.op(f"{name}.softmax_cast", "copy", layer, {"x": probs, **held_in}, {"y": cast}, tags=CORE)
        probs = cast
    if masks:  # TE UnfusedDotProductAttention.forward: `attention_probs.masked_fill(attention_mask, 0)`
        filled = b.tensor(f"{name}.masked_fill.out", shape)
        b.op(f"{name}.masked_fill", "masked_fill", layer, {"x": probs, "_mask": masks["mask"]}, {"y": filled},
             tags=CORE)
        probs = filled
    if b.table.dropout or (b.table.model_dropout and b.model.attention_dropout > 0):
        dropped = b.tensor(f"{name}.dropout.out", shape)
        mask = b.tensor(f"{name}.dropout.mask", shape, "uint8")
        b.op(f"{name}.dropout", "attn_dropout", layer, {"x": probs}, {"y": dropped}, extras={"mask": mask},
             flops=float(d.b * heads * sq * sk), tags=CORE)
        probs = dropped
    held = {"_diag": masks["diag"]} if "diag" in masks else {}  # TE < 2.0: the local `mask` lives to forward's end
    b.op(f"{name}.pv", "attn_v", layer, {"p": probs, "v": v, **held, **held_scores}, {"y": ctx},
         flops=2.0 * d.b * heads * sq * sk * v_dim, tags=CORE)
    return ctx


def flash_copies(b: Builder) -> bool:
    """Whether TE's FlashAttention backend runs on Megatron's sbhd tensors and converts them to and from
    bshd (``NVIDIA/TransformerEngine@release_v2.14:transformer_engine/pytorch/attention/dot_product_attention/
    backends.py: FlashAttention.forward``: ``x.transpose(0, 1).contiguous()`` for q, k and v; the output's
    ``.view(batch_size, max_seqlen_q, -1).transpose(0, 1)`` then ``.contiguous()``), unchanged v2.6 … v2.17."""
    return b.table.attention == "flash" and b.table.te_flash_copies


def _contiguous(b: Builder, name: str, layer: int, xs: dict[str, TensorDef],
                shapes: Mapping[str, tuple[int, ...]] | None = None, tags: Tags = CORE) -> tuple[TensorDef, ...]:
    """One op copying each of ``xs`` to a new contiguous tensor of its shape (a layout change), or of
    ``shapes[key]`` where ``xs[key]`` is a view of a wider tensor."""
    outs = {k: b.tensor(f"{name}.{k}", (shapes or {}).get(k, x.shape), x.dtype) for k, x in xs.items()}
    b.op(name, "copy", layer, xs, outs, tags=tags)
    return tuple(outs.values())


def rope_cache(b: Builder) -> None:
    """RoPE cos/sin ``(1, s, rope_dim)`` built once per forward by the model (HF ``rotary_emb``); the op
    is tagged ``shared`` so a checkpoint that keeps them counts them outside the layers."""
    m, d = b.model, b.dims
    dim = m.qk_rope_head_dim if m.is_mla else m.attn_head_dim
    if b.table.model_code and m.rope_half_width:  # GptOssRotaryEmbedding: emb = freqs, not cat((freqs, freqs))
        dim //= 2
    cos, sin = b.tensor("rotary_emb.cos", (1, d.s_local, dim)), b.tensor("rotary_emb.sin", (1, d.s_local, dim))
    b.op("rotary_emb", "rope_cache", None, {}, {"cos": cos, "sin": sin}, tags=frozenset({"shared"}))
    b.shared.update(cos=cos, sin=sin)


def rope_inputs(b: Builder) -> dict[str, TensorDef]:
    """The shared cos/sin as reference inputs of a RoPE op (no gradient), if the chunk built them."""
    return {f"_{k}": b.shared[k] for k in ("cos", "sin") if k in b.shared}


def forward(b: Builder, prefix: str, x: TensorDef, layer: int) -> TensorDef:
    """Input norm + MHA/GQA; ``x`` is the layer input (sequence-parallel rows); returns the
    output projection's result on the same rows (before dropout and the residual)."""
    return attend(b, prefix, input_norm(b, prefix, x, layer), layer)


def input_norm(b: Builder, prefix: str, x: TensorDef, layer: int) -> TensorDef:
    """The layer's ``input_layernorm`` on ``x``."""
    fused = b.table.fused_norm_linear
    return norm.forward(b, f"{prefix}.input_layernorm", x, layer, tags=NONE if fused else frozenset({"layernorm"}))


def _qkv_above_kv_groups(b: Builder, p: str, full: TensorDef, ln: TensorDef,
                         layer: int) -> tuple[TensorDef, TensorDef | None, int, int]:
    """Megatron-Core's QKV when tp exceeds the KV groups (core_v0.16.0 … d98e8a64dd ``transformer/attention.py``:
    ``get_query_key_value_tensors``; validated by :func:`timeline.spec.validate.tp_above_kv_groups`): the
    column-parallel ``linear_qkv`` gives each rank its 1/tp of the ``(np [+ np gate] + 2·ng)·hn`` columns;
    ``all_gather_last_dim_from_tensor_parallel_region`` (``tensor_parallel/mappings.py: _gather_along_last_dim``:
    an all-gather into a ``[tp·rows, cols/tp]`` buffer, then ``torch.cat`` of its chunks along the last dimension)
    assembles every column; the rank's group is a slice of it and its q (np/tp heads), gate, k and v (one head
    each) are views of that whole tensor, which the attention keeps through them. Its backward reduce-scatters
    the whole gradient back to the rank's columns (``_AllGatherFromTensorParallelRegion.backward`` →
    ``_reduce_scatter_along_last_dim``: the column chunks concatenated along the rows, ``[tp·rows, cols/tp]``,
    then reduce-scattered) — the gradients of the cat and of the all-gather here. Returns (the gathered tensor,
    the gate or None, local query heads, local KV heads = 1)."""
    m, tp, hd = b.model, b.dims.tp, b.model.attn_head_dim
    rows = full.shape[0]
    gated = m.num_attention_heads if m.attention_output_gate else 0
    cols = (m.num_attention_heads + gated + 2 * m.kv_heads) * hd
    local = b.tensor(f"{p}.linear_qkv.out", (rows, cols // tp))
    f = 2.0 * rows * m.hidden_size * cols / tp
    b.op(f"{p}.linear_qkv", "linear", layer, {"x": full, "_save": ln}, {"qkv": local}, flops=f, wflops=f)
    buf = b.tensor(f"{p}.qkv.all_gather", (tp * rows, cols // tp), comm=True)
    b.op(f"{p}.qkv.all_gather", "comm", layer, {"x": local}, {"y": buf}, kind="collective", stream="tp")
    qkv = b.tensor(f"{p}.qkv", (rows, cols))
    b.op(f"{p}.qkv.cat", "copy", layer, {"x": buf}, {"y": qkv})
    nq = m.num_attention_heads // tp
    return qkv, (qkv if gated else None), nq, 1


def attend(b: Builder, prefix: str, ln: TensorDef, layer: int) -> TensorDef:
    """MHA/GQA on the input norm's output ``ln``; returns the output projection's result."""
    m = b.model
    p = f"{prefix}.self_attn"
    hd = m.attn_head_dim
    nq, nkv = local_heads(b.params, p, hd)
    full = sp_gather(b, f"{p}.linear_qkv", ln, layer)
    rows = full.shape[0]
    ng = nq if m.attention_output_gate else 0  # the output gate's columns, q-wide
    f = 2.0 * rows * m.hidden_size * (nq + 2 * nkv + ng) * hd
    # one output whose views q, k and v are: GPT-2's c_attn(x).split(...), Megatron's mixed_qkv
    gate: TensorDef | None = None
    if b.table.qkv_views and b.table.qkv_gather_above_kv and m.kv_heads < b.dims.tp:
        q, gate, nq, nkv = _qkv_above_kv_groups(b, p, full, ln, layer)
        k = v = q
    elif (b.table.model_code and m.fused_qkv) or b.table.qkv_views:
        q = k = v = b.tensor(f"{p}.qkv", (rows, (nq + 2 * nkv + ng) * hd))
        gate = q if ng else None  # get_query_key_value_tensors: query, gate, key, value = split(mixed_qkv)
        b.op(f"{p}.linear_qkv", "linear", layer, {"x": full, "_save": ln}, {"qkv": q}, flops=f, wflops=f)
    else:
        q = b.tensor(f"{p}.q", (rows, nq * hd))
        k = b.tensor(f"{p}.k", (rows, nkv * hd))
        v = b.tensor(f"{p}.v", (rows, nkv * hd))
        outs = {"q": q, "k": k, "v": v}
        if ng:
            gate = outs["g"] = b.tensor(f"{p}.g", (rows, ng * hd))
        b.op(f"{p}.linear_qkv", "linear", layer, {"x": full, "_save": ln}, outs, flops=f, wflops=f)
    views = q if b.table.qkv_views and q is v else None
    if m.qk_norm and b.table.qk_norm:  # Qwen3: q_norm/k_norm over head_dim, per head, before RoPE
        # TE ops/basic/layer_norm.py LayerNorm.op_forward (rmsnorm.py RMSNorm.op_forward alike):
        # `input_.contiguous()` — each norm reads, and keeps for its backward, a copy of its view
        if views is not None:
            (q,) = _contiguous(b, f"{p}.q_norm.input", layer, {"q": q}, {"q": (rows, nq * hd)}, NONE)
        kind, rule = ("rmsnorm", "l2norm") if b.table.qk_l2_norm else (None, None)
        q = norm.forward(b, f"{p}.q_norm", q, layer, groups=1 if m.qk_norm_full else nq, kind=kind, rule=rule)
        if views is not None:
            (k,) = _contiguous(b, f"{p}.k_norm.input", layer, {"k": k}, {"k": (rows, nkv * hd)}, NONE)
        k = norm.forward(b, f"{p}.k_norm", k, layer, groups=1 if m.qk_norm_full else nkv, kind=kind, rule=rule)
    if m.position_embedding == "rope":
        qr, kr = b.tensor(f"{p}.q_rope", (rows, nq * hd)), b.tensor(f"{p}.k_rope", (rows, nkv * hd))
        b.op(f"{p}.rope", "rope", layer, {"q": q, "k": k, **rope_inputs(b)}, {"q": qr, "k": kr},
             flops=3.0 * (nq + nkv) * hd * rows)
        q, k = qr, kr
    ctx = core_attention(b, p, q, k, v, layer, nq, hd, hd, views=views, kv_cols=nkv * hd)
    if gate is not None:  # Attention._apply_output_gate: x · sigmoid(gate.float()), cast back
        gated = b.tensor(f"{p}.output_gate.out", (rows, nq * hd))
        b.op(f"{p}.output_gate", "output_gate", layer, {"x": ctx, "gate": gate}, {"out": gated},
             flops=4.0 * rows * nq * hd)
        ctx = gated
    # SelfAttention.forward holds `value` (a view of mixed_qkv) until it returns, after linear_proj
    return row_linear(b, f"{p}.linear_proj", ctx, m.hidden_size, layer,
                      refs={"_qkv": views} if views is not None else None)

