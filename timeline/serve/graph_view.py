"""The model graph as an inference engine shards it: one device's parameters and forward ops.

An engine runs the whole model on each tensor-parallel group (``pp = 1``) or, with pipeline
parallelism, stage ``s`` holds the decoder layers vLLM's ``vllm/distributed/utils.py``
``get_pp_indices`` gives it (``num_hidden_layers // pp`` each, the remainder one more each on the
stages before the last: ``partitions[-i] += 1`` for ``i`` in ``2 … remainder + 1``), the embedding on
the first and the final norm and LM head on the last (``PPMissingLayer`` elsewhere); no sequence
parallelism, and pads the vocabulary as vLLM's ``VocabParallelEmbedding`` does
(``vllm/model_executor/layers/vocab_parallel_embedding.py``: ``pad_vocab_size(vocab, 64)``, then
split by tp). Routed experts split over ``ep`` ranks whole (``etp = 1``) or, without EP, by tp
(vLLM ``FusedMoE``: ``tp_size`` shards the intermediate dimension). The training graph's
Megatron-style forward ops give every activation shape; nothing is saved for a backward.
"""

from __future__ import annotations

from dataclasses import replace

from timeline.graph.analytic import forward_ops
from timeline.graph.build import chunk_layers, chunk_nodes, decoder_layer
from timeline.graph.context import BuildCtx
from timeline.graph.ir import FOp
from timeline.graph.tensors import TensorDef, param
from timeline.profiles import profile
from timeline.serve.dp import attention_tp, dp_attention, moe_tp
from timeline.spec.engine_versions import vllm_all_reduce_out_of_place
from timeline.spec.model import ModelSpec
from timeline.spec.run import ParallelSpec, RecomputeSpec, RunSpec, ScheduleSpec, TrainingSpec
from timeline.spec.serving import ServeRunSpec

#: vLLM ``DEFAULT_VOCAB_PADDING_SIZE``
VOCAB_PADDING = 64


def pp_layers(run: ServeRunSpec) -> list[range]:
    """The decoder layers of each pipeline stage (vLLM ``get_pp_indices``, no
    ``VLLM_PP_LAYER_PARTITION``)."""
    n, pp = run.model.num_hidden_layers, run.parallel.pp
    parts = [n // pp] * pp
    for i in range(2, n % pp + 2):
        parts[-i] += 1
    out, start = [], 0
    for k in parts:
        out.append(range(start, start + k))
        start += k
    return out


def padded_vocab(vocab: int) -> int:
    """vLLM ``pad_vocab_size(vocab, DEFAULT_VOCAB_PADDING_SIZE)``: the LM head's rows over all ranks."""
    return -(-vocab // VOCAB_PADDING) * VOCAB_PADDING


def stage_has_moe(run: ServeRunSpec, stage: int) -> list[bool]:
    """Which decoder layers of pipeline stage ``stage`` are MoE layers."""
    return [run.model.is_moe_layer(i) for i in pp_layers(run)[stage]]


def graph_run(run: ServeRunSpec, num_tokens: int, tp: int = 0) -> RunSpec:
    """A run whose forward pass (per pipeline stage) is one engine step of ``num_tokens`` tokens on
    one device of a DP rank: attention split by :func:`~timeline.serve.dp.attention_tp` (or ``tp``),
    routed experts over the MoE layer's GPUs (:func:`~timeline.serve.dp.moe_tp`): ``ep`` ranks' shares of the
    experts, each expert split over the rest (:func:`expert_tp`)."""
    par = run.parallel
    etp = expert_tp(run)
    layout = tuple(len(r) for r in pp_layers(run)) if par.pp > 1 else None
    parallel = replace(par, pp=par.pp, vpp=1, sp=False, cp=1, tp=tp or attention_tp(run), etp=etp, layout=layout)
    # an engine's model code has no dropout (vLLM's model classes build no nn.Dropout; the config's rates are
    # training's): the megatron layer builders would otherwise add a dropout op where a rate is > 0 (Phi, OPT)
    model = replace(run.model, hidden_dropout=0.0, attention_dropout=0.0)
    return RunSpec(name=run.name, source=run.source, model=model, profile="megatron",
                   model_source=run.model_source, parallel=parallel,
                   training=TrainingSpec(micro_batch_size=1, seq_len=max(1, num_tokens), dtype=run.serving.dtype),
                   recompute=RecomputeSpec(), schedule=ScheduleSpec(), allocator=run.allocator,
                   hardware=run.hardware)


def build_ctx(model: ModelSpec, p: ParallelSpec, dtype: str, vocab_padding: int = VOCAB_PADDING) -> BuildCtx:
    """The graph context of an engine's device: the megatron layer builders with vLLM's padding."""
    rules = profile("megatron")
    pad = max(1, vocab_padding // p.tp) if vocab_padding % p.tp == 0 else 1
    rules = replace(rules, params=replace(rules.params, vocab_pad=pad, shared_experts_tp_split=True, mtp_modules=False,
                                          kv_head_replicas=True),
                    structure=replace(rules.structure, qkv_gather_above_kv=False, gdn="vllm"))
    return BuildCtx(model=model, rules=rules, tp=p.tp, ep=p.ep, etp=p.etp, dtype=dtype)


#: families whose router vLLM builds in fp32 whatever the model dtype: GLM-4.5's ``Glm4MoE.gate``
#: (``nn.Linear(..., dtype=torch.float32)``, vLLM 0.19.0 ``models/glm4_moe.py``), MiniMax-M2's
#: (``ReplicatedLinear(..., params_dtype=torch.float32)``, ``models/minimax_m2.py``), ERNIE-4.5-MoE's
#: (the same, ``models/ernie45_moe.py`` ``Ernie4_5_MoeMoE.gate``)
VLLM_FP32_ROUTER = ("glm4_moe", "minimax_m2", "ernie4_5_moe")


def _params(run: ServeRunSpec, stage: int, tp: int = 0) -> list[TensorDef]:
    g = graph_run(run, 1, tp)
    # Hugging Face keeps the vocabulary as the config gives it
    ctx = build_ctx(g.model, g.parallel, g.training.dtype, 1 if run.serving.engine == "hf" else VOCAB_PADDING)
    nodes = chunk_nodes(ctx, chunk_layers(g.parallel, g.model.num_hidden_layers), stage)
    # vLLM loads no MTP module for plain decoding (it is a separate draft model: draft_params)
    params = [t for n in nodes if not n.name.startswith("mtp") for t in n.params]
    if run.serving.engine == "vllm" and run.model.model_type in VLLM_FP32_ROUTER:
        params = [replace(t, dtype="fp32") if t.name.endswith(".mlp.gate.weight") else t for t in params]
    return params + indexer_params(run, stage) + draft_params(run, ctx)


def draft_layers(run: ServeRunSpec) -> int:
    """Decoder layers of the MTP drafter (``speculative_method = "mtp"``): the config's MTP layers, one where it
    names none (vLLM 0.19.0 ``models/qwen3_next_mtp.py``: ``getattr(config, "num_nextn_predict_layers", 1)``)."""
    return (run.model.mtp_layers or 1) if run.serving.speculative_method == "mtp" else 0


def draft_params(run: ServeRunSpec, ctx: BuildCtx) -> list[TensorDef]:
    """The MTP drafter's own weights (vLLM 0.19.0 ``models/qwen3_next_mtp.py`` ``Qwen3NextMultiTokenPredictor``,
    which ``qwen3_5_mtp.py`` follows): ``fc`` (a ``ColumnParallelLinear`` of 2·hidden → hidden, its output split by
    tp), ``pre_fc_norm_hidden``, ``pre_fc_norm_embedding`` and ``norm`` of ``hidden`` each, and full-attention decoder
    layers numbered after the target's. Its embedding and LM head are the target's (``v1/spec_decode/eagle.py``
    ``_maybe_share_embeddings`` / ``_maybe_share_lm_head``: an MTP model shares both at pp = 1, its own copies
    deleted)."""
    n = draft_layers(run)
    if not n:
        return []
    m, dt = run.model, run.serving.dtype
    h = m.hidden_size
    out = [param("mtp.fc.weight", (h, 2 * h), module="mtp.fc", dtype=dt, split=ctx.tp)]
    out += [param(f"mtp.{name}.weight", (h,), module=f"mtp.{name}", dtype=dt)
            for name in ("pre_fc_norm_hidden", "pre_fc_norm_embedding", "norm")]
    for k in range(n):
        layer = m.num_hidden_layers + k
        out += [t for node in decoder_layer(ctx, layer, f"mtp.layers.{k}", moe=m.is_moe_layer(layer))
                for t in node.params]
    return out


def indexer_params(run: ServeRunSpec, stage: int) -> list[TensorDef]:
    """DeepSeek-V3.2's lightning indexer in each decoder layer of ``stage`` (vLLM 0.19.0 ``models/deepseek_v2.py``
    ``Indexer``): ``wq_b`` (``q_lora_rank`` → heads · head_dim) and ``wk`` (hidden → head_dim), the ``k_norm``
    LayerNorm (weight and bias) and ``weights_proj`` (hidden → heads, built unquantized), all ``ReplicatedLinear``:
    whole on every tensor-parallel rank."""
    m = run.model
    if not m.index_n_heads:
        return []
    dt = run.serving.dtype
    n, d = m.index_n_heads, m.index_head_dim
    out: list[TensorDef] = []
    for layer in pp_layers(run)[stage]:
        p = f"layers.{layer}.self_attn.indexer"
        out += [param(f"{p}.wq_b.weight", (n * d, m.q_lora_rank), module=p, dtype=dt),
                param(f"{p}.wk.weight", (d, m.hidden_size), module=p, dtype=dt),
                param(f"{p}.k_norm.weight", (d,), module=p, dtype=dt), param(f"{p}.k_norm.bias", (d,), module=p, dtype=dt),
                param(f"{p}.weights_proj.weight", (n, m.hidden_size), module=p, dtype=dt)]
    return out


def device_params(run: ServeRunSpec, stage: int = 0) -> list[TensorDef]:
    """Every parameter TensorDef one device of pipeline stage ``stage`` holds (model dtype, before
    quantization). Under SGLang's DP attention only the attention is split by ``tp / dp``: the
    dense MLPs, shared experts and LM head keep the whole tp group's split, the embedding is whole
    (:mod:`timeline.serve.dp`)."""
    if not dp_attention(run):
        return _params(run, stage)
    group = {t.name: t for t in _params(run, stage, run.parallel.tp)}
    whole = {t.name: t for t in _params(run, stage, 1) if t.name.startswith("embedding.")}
    return [t if ".self_attn." in t.name else whole.get(t.name, group.get(t.name, t)) for t in _params(run, stage)]


def step_ops(run: ServeRunSpec, num_tokens: int, stage: int = 0, moe_tokens: int = 0,
             kept_moe_workspace: bool = False, profile: bool = False) -> list[FOp]:
    """The forward ops of one step over ``num_tokens`` tokens on pipeline stage ``stage`` (a later
    stage starts from the received hidden states), up to the final norm (the engine
    computes logits only for each request's last token: :func:`~timeline.serve.transients.sampler_tensors`),
    with each MoE block's dispatch / experts / combine replaced by vLLM's fused MoE kernel
    (``moe_tokens`` > 0: on the tokens gathered from every DP rank, :func:`fuse_moe`; its caches in a
    workspace kept outside the step when ``kept_moe_workspace``). DeepSeek-V3.2's indexer runs in every layer
    (:func:`indexer_ops`; its dummy logits reservation only in the engine's ``profile`` run)."""
    g = graph_run(run, num_tokens)
    ops = [op for op in forward_ops(build_ctx(g.model, g.parallel, g.training.dtype), g.parallel, g.training, stage) if not op.name.startswith(("output", "mtp"))]
    if run.model.index_n_heads:
        ops = indexer_ops(run, ops, num_tokens, profile)
    if run.serving.engine == "vllm" and vllm_all_reduce_out_of_place(run.serving.engine_version):
        ops = out_of_place_all_reduce(ops)
    return fuse_moe(run, ops, num_tokens, moe_tokens, kept_moe_workspace) if run.model.is_moe else ops


#: vLLM 0.19.0 ``envs.VLLM_SPARSE_INDEXER_MAX_LOGITS_MB`` (default 512): the indexer's logits bound, which the
#: profile run reserves with one ``torch.empty`` per layer (``sparse_attn_indexer``, no attention metadata)
SPARSE_INDEXER_MAX_LOGITS = 512 * 2**20


def _act(like: TensorDef, module: str, name: str, shape: tuple[int, ...], dtype: str) -> TensorDef:
    """A tensor ``module`` makes, of ``like``'s category."""
    return TensorDef(name=f"{module}.{name}", shape=shape, dtype=dtype, category=like.category, module=module,
                     storage=f"{module}.{name}")


def indexer_ops(run: ServeRunSpec, ops: list[FOp], num_tokens: int, profile: bool) -> list[FOp]:
    """DeepSeek-V3.2's ``Indexer.forward`` (vLLM 0.19.0 ``models/deepseek_v2.py``) after each layer's query
    LayerNorm (its ``qr``), on the layer's normed input: ``wq_b(qr)`` ``[T, heads · head_dim]`` and ``wk(x)``
    ``[T, head_dim]``; ``k_norm``, the RoPE of both (``rope_dim`` of each head) and their ``torch.cat`` (one
    compiled kernel: the two concatenations); ``per_token_group_quant_fp8`` of the query (fp8 and an fp32 scale per
    head); ``weights_proj(x)`` and its fp32 product with the scale; then the ``sparse_attn_indexer`` custom op, which
    writes the top-k indices into the model's ``topk_indices_buffer`` and the keys into its cache — in the profile
    run (no attention metadata) it asks the workspace for its keys (:func:`timeline.serve.dsa.indexer_workspace`, a
    kept buffer of the profile) and allocates
    ``VLLM_SPARSE_INDEXER_MAX_LOGITS_MB`` once, freed as it returns."""
    m, dt = run.model, run.serving.dtype
    n, d, t = m.index_n_heads, m.index_head_dim, num_tokens
    out: list[FOp] = []
    normed: dict[int, TensorDef] = {}
    for op in ops:
        out.append(op)
        if op.layer is None:
            continue
        if op.name == f"layers.{op.layer}.self_attn.linear_q_down_proj":
            normed[op.layer] = op.inputs["x"]
        if op.name != f"layers.{op.layer}.self_attn.q_layernorm":
            continue
        x, qr = normed[op.layer], op.outputs["y"]
        p = f"layers.{op.layer}.self_attn.indexer"
        q, k = _act(qr, p, "q", (t, n * d), dt), _act(qr, p, "k", (t, d), dt)
        qc, kc = _act(qr, p, "q_cat", (t, n * d), dt), _act(qr, p, "k_cat", (t, d), dt)
        q8, qs = _act(qr, p, "q_fp8", (t, n * d), "fp8"), _act(qr, p, "q_scale", (t, n), "fp32")
        w, wf = _act(qr, p, "w", (t, n), dt), _act(qr, p, "weights", (t, n), "fp32")
        extras = {"logits": _act(qr, p, "logits_reserve", (SPARSE_INDEXER_MAX_LOGITS,), "uint8")} if profile else {}
        out += [FOp(name=f"{p}.wq_b", module=p, layer=op.layer, rule="linear", inputs={"x": qr}, outputs={"y": q},
                    flops=2.0 * t * m.q_lora_rank * n * d),
                FOp(name=f"{p}.wk", module=p, layer=op.layer, rule="linear", inputs={"x": x}, outputs={"y": k},
                    flops=2.0 * t * m.hidden_size * d),
                FOp(name=f"{p}.rope_cat", module=p, layer=op.layer, rule="rope", inputs={"q": q, "k": k},
                    outputs={"q": qc, "k": kc}),
                FOp(name=f"{p}.quant", module=p, layer=op.layer, rule="quant", inputs={"x": qc},
                    outputs={"y": q8, "scale": qs}),
                FOp(name=f"{p}.weights_proj", module=p, layer=op.layer, rule="linear", inputs={"x": x},
                    outputs={"y": w}, flops=2.0 * t * m.hidden_size * n),
                FOp(name=f"{p}.weights", module=p, layer=op.layer, rule="mul", inputs={"w": w, "scale": qs},
                    outputs={"y": wf}),
                FOp(name=f"{p}.sparse_attn_indexer", module=p, layer=op.layer, rule="indexer",
                    inputs={"q": q8, "k": kc, "weights": wf}, outputs={}, extras=extras,
                    tags=frozenset({"workspace"}))]
    return out


def out_of_place_all_reduce(ops: list[FOp]) -> list[FOp]:
    """Each tensor-parallel all-reduce returns a new tensor of its input's size
    (:func:`~timeline.spec.engine_versions.vllm_all_reduce_out_of_place`); later ops read it, so the
    input dies at the all-reduce and both are alive while it runs."""
    renamed: dict[str, TensorDef] = {}
    out: list[FOp] = []
    for op in ops:
        ins = {k: renamed.get(t.storage, t) for k, t in op.inputs.items()}
        outs = {k: renamed.get(t.storage, t) for k, t in op.outputs.items()}
        if op.kind == "collective" and op.name.endswith(".all_reduce") and "x" in ins:
            x = ins["x"]
            result = replace(x, name=f"{op.name}.out", storage=f"{op.name}.out")
            renamed[x.storage] = result
            outs = {**outs, "out": result}
        out.append(replace(op, inputs=ins, outputs=outs))
    return out


#: vLLM ``envs.VLLM_FUSED_MOE_CHUNK_SIZE`` default: fused_experts works on at most this many tokens at once
FUSED_MOE_CHUNK = 32768
_MOE_PARTS = (".mlp.dispatch.", ".mlp.experts.", ".mlp.combine.")


def expert_tp(run: ServeRunSpec) -> int:
    """How many ranks split each routed expert: the MoE layer's GPUs over the expert-parallel ones — vLLM's
    ``ep`` is 1 or all of them; SGLang's ``moe_tp_size = tp_size // moe_ep_size``
    (``srt/distributed/parallel_state.py: initialize_model_parallel``)."""
    return max(1, moe_tp(run) // run.parallel.ep)


def moe_rank_width(run: ServeRunSpec) -> int:
    """One rank's routed-expert width: whole experts under EP, else split over the MoE layer's GPUs."""
    return run.model.moe_intermediate_size // expert_tp(run)


def fuse_moe(run: ServeRunSpec, ops: list[FOp], num_tokens: int, moe_tokens: int = 0,
             kept_workspace: bool = False) -> list[FOp]:
    """Replace each MoE block's routed path by one ``fused_moe`` op whose workspaces are vLLM's
    (``vllm/model_executor/layers/fused_moe/fused_moe.py`` ``fused_experts_impl``): ``cache13`` of
    ``M · top_k · max(2·I, K)`` and ``cache2`` of ``M · top_k · I`` elements in the activation dtype,
    M = min(tokens, chunk), I = the expert width one rank holds (split by tp without EP), K = hidden;
    FP8 weights add the per-token-group FP8 copies of the two GEMM inputs and their fp32 scales
    (``per_token_group_quant_fp8``, groups of ``quant_group_size``). The op's output is the block's
    combined output (``torch.empty_like(hidden_states)``).

    With DP ranks (``moe_tokens`` > 0, :func:`timeline.serve.dp.moe_gather`) the layer first gathers
    every rank's tokens (vLLM ``FusedMoE.forward_impl`` → ``get_ep_group().dispatch``: the hidden
    states ``[moe_tokens, hidden]`` and router logits ``[moe_tokens, n_routed]`` all-gathered over the
    DP group, ``naive_multicast`` / ``all_gatherv``), runs the kernel on them (its workspaces and its
    ``empty_like`` output over ``moe_tokens`` rows) and ``combine`` reduce-scatters back to the rank's
    own rows, the op's output.

    ``kept_workspace``: the caches live in the worker's kept workspace (vLLM ≥ 0.19's modular kernel,
    :func:`timeline.serve.profile_run.moe_workspace_bytes`), so the op allocates neither."""
    m, sv = run.model, run.serving
    inter = moe_rank_width(run)
    k, topk = m.hidden_size, m.num_experts_per_tok
    gathered = moe_tokens or num_tokens
    rows = min(gathered, FUSED_MOE_CHUNK) * topk
    out: list[FOp] = []
    i = 0
    while i < len(ops):
        op = ops[i]
        if not any(p in op.name + "." for p in _MOE_PARTS) or op.layer is None:
            out.append(op)
            i += 1
            continue
        j = i
        while j < len(ops) and any(p in ops[j].name + "." for p in _MOE_PARTS):
            j += 1
        first, last = ops[i], ops[j - 1]
        prefix = f"layers.{op.layer}.mlp.fused_moe"
        specs: list[tuple[str, tuple[int, ...], str]] = []
        if moe_tokens:  # the gathered inputs first (dispatch), the kernel's output on them last (before combine)
            specs += [("dispatch.hidden_states", (moe_tokens, k), sv.dtype),
                      ("dispatch.router_logits", (moe_tokens, m.n_routed_experts), sv.dtype)]
        if not kept_workspace:
            specs += [("cache13", (rows * max(2 * inter, k),), sv.dtype), ("cache2", (rows, inter), sv.dtype)]
        if moe_tokens:
            specs.append(("experts_output", (moe_tokens, k), sv.dtype))
        if sv.weight_dtype == "fp8":
            g = sv.quant_group_size
            tokens = min(gathered, FUSED_MOE_CHUNK)
            specs += [(name, shape, "fp32" if name.endswith("scale") else "fp8")
                      for name, shape in (("a1q", (tokens, k)), ("a1_scale", (tokens, -(-k // g))),
                                          ("a2q", (rows, inter)), ("a2_scale", (rows, -(-inter // g))))]
        cat = first.inputs["x"].category
        ws = {name: TensorDef(name=f"{prefix}.{name}", shape=shape, dtype=dtype, category=cat, module=prefix,
                              storage=f"{prefix}.{name}") for name, shape, dtype in specs}
        out.append(FOp(name=prefix, module=prefix, layer=op.layer, rule="fused_moe",
                       inputs={"x": first.inputs["x"], **{f"_{n}": t for n, t in first.inputs.items() if n != "x"}},
                       outputs={"y": last.outputs["y"]}, extras=ws, flops=sum(o.flops for o in ops[i:j]),
                       tags=frozenset({"workspace"})))
        i = j
    return out
