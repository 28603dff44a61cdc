"""Mixture-of-experts block: router, routed experts, shared experts.

Routed experts: ``n_routed_experts / ep`` per rank, each FFN split over ``etp`` (Megatron
grouped GEMM ``experts``). The router weight is replicated; DeepSeek-V3's score-correction
bias is an fp32 buffer where the profile holds it; GPT-OSS's router linear has a trainable bias
(``router_logit_bias``) and its experts biases (:func:`~timeline.graph.families.mlp.params`). Shared experts are one MLP of width
``n_shared × moe_intermediate`` (or Qwen's ``shared_expert_intermediate_size``), TP-split
or replicated per the profile. Everything is tagged ``moe``. :func:`local_widths` reads the local
expert count and widths back off the built parameters, for the op builders.

Forward ops (:func:`forward`): router, top-k, permute + all-to-all dispatch (Megatron's allgather
dispatcher, or the flex dispatcher's DeepEP / HybridEP ops of :mod:`~timeline.graph.families.moe_flex`),
grouped expert GEMMs and activation, combine + unpermute, shared experts (the ``moe`` recompute module).

Token rows (DESIGN §4): each EP rank dispatches its own ``T = b·s/(tp·cp)`` tokens (``b·s/cp``
without SP), so under balanced routing its local experts receive ``T·top_k`` rows, × ``etp``
after the expert-TP all-gather. ``routing = "skew"`` multiplies the rows by ``routing_skew``
(the busiest EP rank; this template is that rank's). ``capacity_factor > 0`` caps each expert at
``ceil(capacity_factor·T·top_k/E)`` tokens from each source rank — Megatron's ``get_capacity``
in megatron/core/transformer/moe/moe_utils.py — so a rank receives at most ``E·cap`` rows, and
exactly that with ``pad_to_capacity``. The ``paper`` table keeps arXiv 2502.07846's convention:
router and shared expert on the full ``b·s``, experts fed ``b·s·top_k/ep`` rows. Under a table
with ``moe_weight_after_down`` (HF ``grouped_mm`` experts) the routing weights scale the down
projection's output in the combine, not inside the SwiGLU; with ``upcast_fp32`` the router reads
an fp32 copy of its input, unless the model type's router is a softmax on the 16-bit logits
(``ModelSpec.router_score``: Mixtral, Qwen-MoE). Side tensors some implementation keeps (index vectors,
offsets, the top-k normalisation) are extras: a table that does not save them never makes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from timeline.graph.context import BuildCtx
from timeline.graph.families import mlp, moe_combine, moe_flex, norm
from timeline.graph.families.common import add, all_gather, dropout, linear, row_linear, sp_gather, upcast
from timeline.graph.families.mlp import activation, split_gate_up
from timeline.graph.families.router import MOE, expert_rows, padded_rows, router
from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef, param


def params(ctx: BuildCtx, prefix: str, module: str = "moe") -> list[TensorDef]:
    m, h = ctx.model, ctx.model.hidden_size
    out = [param(f"{prefix}.gate.weight", (m.n_routed_experts, h), module=module, dtype=ctx.dtype, in_moe=True)]
    if m.router_logit_bias:
        out.append(param(f"{prefix}.gate.bias", (m.n_routed_experts,), module=module, dtype=ctx.dtype,
                         in_moe=True))
    if m.router_bias and ctx.profile.router_bias:
        out.append(param(f"{prefix}.gate.e_score_correction_bias", (m.n_routed_experts,), module=module,
                         dtype="fp32", trainable=False, in_moe=True))
    if m.moe_latent_size:  # moe_layer.py: two TELinear(parallel_mode="duplicated"), whole on every TP rank
        out += [param(f"{prefix}.fc1_latent_proj.weight", (m.moe_latent_size, h), module=module, dtype=ctx.dtype,
                      in_moe=True),
                param(f"{prefix}.fc2_latent_proj.weight", (h, m.moe_latent_size), module=module, dtype=ctx.dtype,
                      in_moe=True)]
        if m.linear_bias:
            out += [param(f"{prefix}.fc1_latent_proj.bias", (m.moe_latent_size,), module=module, dtype=ctx.dtype,
                          in_moe=True),
                    param(f"{prefix}.fc2_latent_proj.bias", (h,), module=module, dtype=ctx.dtype, in_moe=True)]
    local = m.n_routed_experts // ctx.ep
    for e in range(local):
        out += mlp.params(ctx, f"{prefix}.experts.{e}", m.moe_intermediate_size, split=ctx.etp,
                          module=module, expert=True, in_moe=True, width=m.routed_width)
    if m.shared_ffn:
        split = ctx.tp if ctx.profile.shared_experts_tp_split else 1
        out += mlp.params(ctx, f"{prefix}.shared_experts", m.shared_ffn, split=split, module=module, in_moe=True)
        if m.shared_expert_gate:
            out.append(param(f"{prefix}.shared_expert_gate.weight", (1, h), module=module, dtype=ctx.dtype,
                             in_moe=True))
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class MoELocal:
    """What one device holds of an MoE block."""

    experts: int  # routed experts on this EP rank
    expert_ffn: int  # each routed expert's FFN width after expert-TP
    shared_ffn: int  # the shared experts' FFN width (after TP, where the profile splits them); 0 if none


def local_widths(params: Mapping[str, TensorDef], prefix: str) -> MoELocal:
    """The local expert count and widths of the MoE block built under ``prefix``."""
    n = 0
    while mlp.down(params, f"{prefix}.experts.{n}") is not None:
        n += 1
    shared = mlp.down(params, f"{prefix}.shared_experts")
    return MoELocal(experts=n, expert_ffn=mlp.local_ffn(params, f"{prefix}.experts.0"),
                    shared_ffn=0 if shared is None else shared.shape[1])


SHARED = frozenset({"moe", "shared_experts"})


def forward(b: Builder, prefix: str, x: TensorDef, layer: int) -> TensorDef:
    """Pre-MLP norm and the MoE block on the residual stream ``x``; returns the block's output."""
    m, d = b.model, b.dims
    h, k, n = m.routed_width, m.num_experts_per_tok, m.n_routed_experts  # h: the routed tokens' width
    paper = b.table.moe_tokens == "paper"
    ln = norm.forward(b, f"{prefix}.pre_mlp_layernorm", x, layer,
                      tags=frozenset({"layernorm"}) if b.table.moe_pre_norm_recompute else frozenset())
    p = f"{prefix}.mlp"
    local = local_widths(b.params, p)
    src = sp_gather(b, f"{p}.router", ln, layer, tags=MOE) if paper else ln
    t = src.shape[0]
    # Mixtral/Qwen-MoE: softmax(F.linear(x, W), fp32); GPT-OSS: F.linear(x, W, bias)
    softmax = b.table.model_code and m.router_score != "sigmoid"
    if b.table.upcast_fp32 and not softmax:  # F.linear(hidden_states.type(torch.float32), ...)
        logits = linear(b, f"{p}.router", upcast(b, f"{p}.router.upcast", src, layer, tags=MOE), n, layer,
                        out_name="logits", tags=MOE)
    else:  # Megatron: router_gating_linear returns the logits in --moe-router-dtype, keeping its 16-bit input
        gate_in = src
        if b.table.moe_input_jitter:  # router.py: apply_input_jitter before the gating GEMM
            # Uniform.rsample (torch/distributions/uniform.py): rand, · (high − low), + low — three tensors in turn,
            # none taking a gradient (the bounds are constant tensors)
            noise: TensorDef | None = None
            for step in ("rand", "scaled", "noise"):
                y = b.tensor(f"{p}.router.jitter_{step}", src.shape, src.dtype)
                b.op(f"{p}.router.jitter_{step}", "jitter_sample", layer, {} if noise is None else {"x": noise},
                     {"y": y}, tags=MOE).no_grad = True
                noise = y
            assert noise is not None
            gate_in = b.tensor(f"{p}.router.jittered", src.shape, src.dtype)
            b.op(f"{p}.router.jitter", "jitter_mul", layer, {"x": src, "noise": noise}, {"y": gate_in}, tags=MOE)
        logits = linear(b, f"{p}.router", gate_in, n, layer, save=ln if gate_in is src else gate_in,
                        out_name="logits", out_dtype=b.table.moe_router_dtype or None, tags=MOE)
        if b.table.moe_random_logits:  # --moe-router-force-load-balancing: RandomSTE's random copy routes instead
            rnd = b.tensor(f"{p}.router.random_logits", logits.shape, logits.dtype)
            b.op(f"{p}.router.random_logits", "random_logits", layer, {"x": logits}, {"y": rnd}, tags=MOE)
            logits = rnd
    # a latent MoE projects the tokens down before the permutation (moe_layer.py: MoELayer.preprocess)
    routed_src = linear(b, f"{p}.fc1_latent_proj", src, m.moe_latent_size, layer, tags=MOE) \
        if m.moe_latent_size else src
    # router scores, top-k and the first permutation, as the profile's framework implements them
    probs, idx, pprobs, permuted = router(b.ctx.rules.name)(b, p, routed_src, logits, layer, local.experts)
    rows = expert_rows(b)
    tokens, rprobs = permuted, pprobs
    gather = b.table.megatron_moe and b.table.moe_dispatcher == "allgather"  # tokens already gathered and permuted
    flex = b.table.megatron_moe and b.table.moe_dispatcher == "flex"  # DeepEP / HybridEP: moe_flex
    held: dict[str, TensorDef] = {}
    if flex:
        rprobs, tokens, held = moe_flex.dispatch(b, p, routed_src, probs, layer, local.experts)
    alltoall = not (gather or flex)
    sort = b.table.megatron_moe and local.experts > 1 and alltoall
    combine_probs = moe_combine.at_combine(b)  # before 2659630721: no probs travel with the tokens
    if d.ep > 1 and alltoall:  # with a sort after it, "received" names the sorted copy the experts read
        a2a = f"{p}.dispatch.all_to_all.out" if sort else f"{p}.dispatch.received"
        tokens = b.tensor(a2a, (rows, h), comm=True)
        ins, outs = {"x": permuted}, {"y": tokens}
        if not combine_probs:
            rprobs = b.tensor(f"{a2a}_probs" if sort else f"{p}.dispatch.received_probs", (rows,), pprobs.dtype,
                              comm=True)
            ins["probs"], outs["probs"] = pprobs, rprobs
        b.op(f"{p}.dispatch.all_to_all", "comm", layer, ins, outs, kind="collective", stream="ep", tags=MOE)
    if alltoall:
        tokens = all_gather(b, f"{p}.experts", tokens, layer, d.etp, stream="ep", tags=MOE)
    if sort:  # permutation 2: sort_chunks_by_idxs groups the received rows by local expert (split + cat copies)
        st = b.tensor(f"{p}.dispatch.received", tokens.shape)
        ins, outs = {"x": tokens}, {"y": st}
        if not combine_probs:
            if d.etp > 1:  # the probs are all-gathered over expert-TP like the tokens
                rprobs = all_gather(b, f"{p}.experts.probs", rprobs, layer, d.etp, stream="ep", tags=MOE)
            sp = b.tensor(f"{p}.dispatch.received_probs", rprobs.shape, rprobs.dtype)
            ins["probs"], outs["probs"] = rprobs, sp
            rprobs = sp
        b.op(f"{p}.dispatch.sort_chunks", "sort_chunks", layer, ins, outs,
             extras=_chunk_map(b, f"{p}.dispatch.sort_chunks", tokens.shape[0]), tags=MOE)
        tokens = st
    # probs enter the SwiGLU (Megatron from 2659630721; before it the combine applies them: moe_combine)
    weighted = not paper and not b.table.moe_weight_after_down and not combine_probs
    if weighted and b.table.moe_probs_on_input:
        tokens, rprobs = _probs_on_input(b, p, tokens, rprobs, layer)
    # grouped experts
    e_ffn = local.expert_ffn
    fc1 = linear(b, f"{p}.experts.linear_fc1", tokens, (2 if m.gated_mlp else 1) * e_ffn, layer,
                 rule="grouped_linear", tags=MOE)
    if weighted and b.table.te_activation_func:  # experts.py bias_act_func: TE's activation, then `* permuted_probs`
        act = activation(b, f"{p}.experts.act", fc1, layer, e_ffn, tags=frozenset({"moe", "moe_act"}))
        act = _times_probs(b, f"{p}.experts.act.weighted", act, rprobs, layer)
    else:
        act = activation(b, f"{p}.experts.act", fc1, layer, e_ffn,
                         rule=("weighted_swiglu" if m.gated_mlp else "weighted_act_compiled" if b.table.moe_act_compiled
                               else None) if weighted else None,
                         probs=rprobs if weighted else None, tags=frozenset({"moe", "moe_act"}))
    out = linear(b, f"{p}.experts.linear_fc2", act, h, layer, rule="grouped_linear", tags=MOE)
    if b.table.dropout:  # the paper's convention: a dropout on the experts' output (Megatron: after the block)
        out = dropout(b, f"{p}.experts.dropout", out, layer, tags=MOE)
    if sort:  # unpermutation 2: back to the all-to-all's source-rank order
        unsorted = b.tensor(f"{p}.combine.unsorted", out.shape)
        b.op(f"{p}.combine.sort_chunks", "sort_chunks", layer, {"x": out}, {"y": unsorted},
             extras=_chunk_map(b, f"{p}.combine.sort_chunks", out.shape[0]), tags=MOE)
        out = unsorted
    if flex:
        routed = moe_flex.combine(b, p, out, held, layer, local.experts, unpermute_rule(b))
        return _with_shared(b, p, routed, x, ln, src, layer, local.shared_ffn)
    if gather:
        bias = None
        if combine_probs:  # token_unpermutation@2659630721^: the experts' output times the permuted local probs
            out, pprobs = moe_combine.weighted_rows(b, p, out, rprobs, layer, local.experts, rprobs.shape[0])
            bias = moe_combine.weighted_bias(b, p, pprobs, layer, local.experts)
        return _allgather_combine(b, p, out, idx, x, ln, src, layer, local.shared_ffn, rprobs.dtype, bias)
    if d.etp > 1:
        rs = b.tensor(f"{p}.experts.reduce_scatter.out", (out.shape[0] // d.etp, h))
        b.op(f"{p}.experts.reduce_scatter", "comm", layer, {"x": out}, {"y": rs}, kind="collective", stream="ep",
             tags=MOE)
        out = rs
    # combine: all-to-all back, unpermute (weighted sum over the top-k)
    back = out
    if d.ep > 1:
        back = b.tensor(f"{p}.combine.received", (padded_rows(b, t * k), h), comm=True)
        b.op(f"{p}.combine.all_to_all", "comm", layer, {"x": out}, {"y": back}, kind="collective", stream="ep",
             tags=MOE)
    if combine_probs:
        routed = moe_combine.alltoall_unpermute(b, p, back, probs, idx, layer, unpermute_rule(b))
        return _with_shared(b, p, routed, x, ln, src, layer, local.shared_ffn)
    routed = b.tensor(f"{p}.combine.out", (t, h))
    inputs = {"x": back, "_idx": idx}
    if b.table.moe_weight_after_down:
        inputs["probs"] = rprobs
    b.op(f"{p}.combine.unpermute", unpermute_rule(b), layer, inputs, {"y": routed}, flops=float(t * k * h), tags=MOE,
         extras={"inv_idx": b.tensor(f"{p}.combine.inv_idx", (back.shape[0],), "int64")})
    return _with_shared(b, p, routed, x, ln, src, layer, local.shared_ffn)


def _probs_on_input(b: Builder, p: str, tokens: TensorDef, probs: TensorDef, layer: int) -> tuple[TensorDef, TensorDef]:
    """Megatron's ``--moe-apply-probs-on-input`` (``experts.py``, 4ca43093f8 on, every expert class): the permuted
    input times the probs in the promoted dtype, cast back to the input's (``.to(original_dtype)``: a copy
    keeping nothing, where the dtypes differ), and ``torch.ones_like`` probs for the activation."""
    prod = _times_probs(b, f"{p}.experts.probs_on_input", tokens, probs, layer)
    ones = b.tensor(f"{p}.experts.ones_probs", probs.shape, probs.dtype)
    b.op(f"{p}.experts.ones_probs", "ones_like", layer, {}, {"y": ones}, tags=MOE).no_grad = True
    return prod, ones


def _times_probs(b: Builder, name: str, x: TensorDef, probs: TensorDef, layer: int) -> TensorDef:
    """``x * probs`` as torch ops (``experts.py``): the product in the promoted dtype (MulBackward0 keeps both
    operands, each taking a gradient), then ``.to(original_dtype)`` — a copy keeping nothing — where it differs."""
    prod = b.tensor(name, x.shape, moe_combine.promoted(x.dtype, probs.dtype))
    b.op(name, "times_probs", layer, {"x": x, "probs": probs}, {"y": prod}, tags=MOE)
    if prod.dtype == x.dtype:
        return prod
    cast = b.tensor(f"{name}.cast", x.shape, x.dtype)
    b.op(f"{name}.cast", "copy", layer, {"x": prod}, {"y": cast}, tags=MOE)
    return cast


def unpermute_rule(b: Builder) -> str:
    """The combine's unpermute as the table runs it: TE's fused kernel, the deterministic ``index_add_``
    (keeping its source) or ``scatter_add_``."""
    if b.table.moe_permute_fusion:
        return "fused_unpermute"
    return "unpermute_index_add" if b.table.moe_unpermute == "index_add" else "unpermute"


def _chunk_map(b: Builder, name: str, rows: int) -> dict[str, TensorDef]:
    """TE ``moe_sort_chunks_by_index`` (fused ``sort_chunks_by_idxs``): the int32 ``[rows]`` map from
    ``make_chunk_sort_map`` it saves; the unfused split + cat keeps nothing."""
    return {"row_id_map": b.tensor(f"{name}.row_id_map", (rows,), "int32")} if b.table.moe_permute_fusion else {}


def _allgather_combine(b: Builder, p: str, out: TensorDef, idx: TensorDef, x: TensorDef, ln: TensorDef,
                       src: TensorDef, layer: int, shared_ffn: int, probs_dtype: str,
                       bias: TensorDef | None = None) -> TensorDef:
    """``MoEAllGatherTokenDispatcher`` (MC transformer/moe/token_dispatcher.py): ``combine_preprocess``
    unpermutes the experts' partial outputs into all ``t·etp·ep`` gathered rows (``torch.zeros`` +
    ``scatter_add_``, keeping ``sorted_indices``), ``token_combine`` reduce-scatters them over expert-TP × EP
    back to this rank's ``t`` rows — in the probs' dtype (``hidden_states.to(self.local_probs.dtype)``, then
    back): with ``--moe-router-dtype`` an fp32/fp64 copy of the gathered rows and of the reduced rows. Before
    Megatron-LM 2659630721 ``out`` comes weighted in the probs' dtype already (:mod:`moe_combine`): the
    unpermute and the reduce-scatter run in it, and ``output_total.to(hidden_states.dtype)`` casts back; ``bias``:
    the experts' weighted bias rows of then, added after (:func:`moe_combine.add_bias`)."""
    d, h = b.dims, b.model.routed_width
    t, g = src.shape[0], d.etp * d.ep
    wide_in = out.dtype != d.dtype
    full = b.tensor(f"{p}.combine.unpermuted" if g > 1 or wide_in else f"{p}.combine.out", (t * g, h), out.dtype)
    b.op(f"{p}.combine.unpermute", unpermute_rule(b), layer, {"x": out, "_idx": idx}, {"y": full},
         flops=float(out.shape[0] * h), tags=MOE)
    routed = full
    if g > 1:
        if probs_dtype != full.dtype:
            cast = b.tensor(f"{p}.combine.unpermuted_{probs_dtype}", full.shape, probs_dtype)
            b.op(f"{p}.combine.cast", "copy", layer, {"x": full}, {"y": cast}, tags=MOE)
            full = cast
        wide = full.dtype != d.dtype
        routed = b.tensor(f"{p}.combine.out" + (f"_{full.dtype}" if wide else ""), (t, h), full.dtype, comm=True)
        b.op(f"{p}.combine.reduce_scatter", "comm", layer, {"x": full}, {"y": routed}, kind="collective",
             stream="ep", tags=MOE)
    if routed.dtype != d.dtype:
        back = b.tensor(f"{p}.combine.out", (t, h))
        b.op(f"{p}.combine.cast_back", "copy", layer, {"x": routed}, {"y": back}, tags=MOE)
        routed = back
    if bias is not None:  # the weighted expert bias rows (moe_combine.weighted_bias), added by bias-dropout-add
        routed = moe_combine.add_bias(b, p, routed, bias, idx, layer, unpermute_rule(b), g)
    return _with_shared(b, p, routed, x, ln, src, layer, shared_ffn)


def _with_shared(b: Builder, p: str, routed: TensorDef, x: TensorDef, ln: TensorDef, src: TensorDef, layer: int,
                 shared_ffn: int) -> TensorDef:
    """The routed output plus the shared experts (gated where the model has a gate) on ``ln``."""
    m = b.model
    paper = b.table.moe_tokens == "paper"
    if m.moe_latent_size:  # MoELayer.postprocess: fc2_latent_proj back to the hidden size, then the shared add
        routed = linear(b, f"{p}.fc2_latent_proj", routed, m.hidden_size, layer, tags=MOE)
    if shared_ffn:
        shared = shared_experts(b, f"{p}.shared_experts", ln, src, layer, shared_ffn)
        if m.shared_expert_gate and b.table.shared_expert_gate:  # sigmoid(shared_expert_gate(x)) * shared
            g = linear(b, f"{p}.shared_expert_gate", ln, 1, layer, out_name="logits", tags=SHARED)
            gated = b.tensor(f"{p}.shared_expert_gate.out", shared.shape)
            b.op(f"{p}.shared_expert_gate.mul", "shared_gate", layer, {"x": shared, "g": g}, {"y": gated},
                 extras={"sigmoid": b.tensor(f"{p}.shared_expert_gate.sigmoid", (ln.shape[0], 1))},
                 flops=float(2 * shared.shape[0] * shared.shape[1]), tags=SHARED)
            shared = gated
        routed = add(b, f"{p}.shared_add", shared, routed, layer, tags=MOE)
    if paper and routed.shape[0] != x.shape[0]:  # replicated over TP: keep this rank's SP rows (no comm)
        shard = b.tensor(f"{p}.sp_split.out", x.shape)
        b.op(f"{p}.sp_split", "comm", layer, {"x": routed}, {"y": shard}, tags=MOE)
        routed = shard
    return routed


def shared_experts(b: Builder, p: str, ln: TensorDef, src: TensorDef, layer: int, ffn: int) -> TensorDef:
    """Shared experts of local width ``ffn``: a TP-split MLP on the SP rows ``ln`` (Megatron
    SharedExpertMLP), or, where the profile replicates them (the paper), one MLP with no TP
    collectives on the router's input rows ``src`` (the full ``b·s`` under the paper's token
    convention) with an output dropout mask."""
    m = b.model
    if not b.ctx.profile.shared_experts_tp_split:
        fc1 = linear(b, f"{p}.linear_fc1", src, (2 if m.gated_mlp else 1) * ffn, layer, tags=SHARED)
        act = activation(b, f"{p}.act", fc1, layer, ffn, tags=SHARED)
        out = linear(b, f"{p}.linear_fc2", act, m.hidden_size, layer, tags=SHARED)
        return dropout(b, f"{p}.dropout", out, layer, tags=SHARED)
    if m.gated_mlp and b.table.split_gate_up:  # HF DeepseekV3MLP (one device: no TP collectives)
        gate, up = split_gate_up(b, p, ln, ffn, layer, SHARED)
        act = activation(b, f"{p}.act", gate, layer, ffn, up=up, tags=SHARED)
        return row_linear(b, f"{p}.linear_fc2", act, m.hidden_size, layer, tags=SHARED)
    full = sp_gather(b, f"{p}.linear_fc1", ln, layer, tags=SHARED)
    fc1 = linear(b, f"{p}.linear_fc1", full, (2 if m.gated_mlp else 1) * ffn, layer, save=ln, tags=SHARED)
    act = activation(b, f"{p}.act", fc1, layer, ffn, tags=SHARED)
    return row_linear(b, f"{p}.linear_fc2", act, m.hidden_size, layer, tags=SHARED)

