"""Megatron-LM's legacy ``SwitchMLP`` (``--use-legacy-models --transformer-impl local --num-experts E``): a
torch-Linear router, sinkhorn top-1 routing and one legacy ``ParallelMLP`` per local expert, fed by index.

Read at ``NVIDIA/Megatron-LM@60166922d3`` (``megatron/legacy/model/transformer.py: SwitchMLP``, ``sinkhorn``,
``get_router_linear_layer``; the same code to 39ec5ebeb4's parent, which removed it). ``SwitchMLP.forward`` on
the layer's ``[s, b, h]`` norm output (``T`` rows here, the sequence-parallel shard):

- ``route = self.router(hidden_states)``: ``torch.nn.Linear(h, E, bias=False)``, keeping its input;
- under ``torch.no_grad()`` ``sinkhorn(route.detach().to(torch.float32))`` and ``torch.max(…, dim=1)``: the
  int64 ``max_ind`` of each row (its ``[T, E]`` fp32 temporaries are a few bytes per row, not modelled);
- ``route = torch.sigmoid(route)`` (keeps its output) and ``max_prob = route[torch.arange(T), max_ind]``
  (advanced indexing keeps both int64 index vectors);
- with sequence parallelism or EP > 1, ``gather_from_sequence_parallel_region`` all-gathers the rows over the
  expert-tensor-and-model-parallel group (``Tg = T·tp·ep`` rows) and ``gather_indices`` the indices (int64);
- ``output_total = torch.zeros_like(global_hidden_states)`` (and ``output_bias_total`` with linear biases);
- per local expert: ``(global_indices == e).nonzero()`` (int64 ``[n, 1]``), ``global_hidden_states[
  local_indices, :]`` (a copy; ``IndexBackward`` keeps the indices), the expert's ``ParallelMLP`` on it
  (``is_expert``: column/row-parallel linears without their SP collectives, the bias-GeLU fusion or the
  torch-op SwiGLU), and ``output_total[local_indices, :] = output`` in place (``index_put_``, keeping the same
  indices); the bias rows likewise;
- with the gather, ``reduce_scatter_to_sequence_parallel_region`` of both totals back to ``T`` rows, the
  bias total divided by the TP size (a new tensor);
- ``output_total * max_prob`` and ``output_bias_total * max_prob``, each ``MulBackward`` keeping both factors.

Sinkhorn balances the experts' loads by construction, so each expert receives ``Tg / E`` rows (the first
``Tg mod E`` one more). The layer's bias-dropout-add then reads the weighted output and the weighted bias rows.
This module decides no bytes: each op names the profile rule that says what it keeps
(:mod:`timeline.profiles.megatron_legacy`).
"""

from __future__ import annotations

from timeline.graph.families import mlp, norm
from timeline.graph.families.common import all_gather, linear
from timeline.graph.families.moe import local_widths
from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef

MOE = frozenset({"moe"})


def expert_rows(total: int, experts: int, e: int) -> int:
    """Rows expert ``e`` of ``experts`` receives of ``total`` under balanced top-1 routing."""
    return total // experts + (1 if e < total % experts else 0)


def forward(b: Builder, prefix: str, x: TensorDef, layer: int) -> tuple[TensorDef, TensorDef | None]:
    """The pre-MLP norm and ``SwitchMLP.forward`` on the residual stream ``x``; returns the weighted output and
    the weighted bias rows (None without linear biases), both on ``x``'s rows."""
    m, d = b.model, b.dims
    h, n = m.hidden_size, m.n_routed_experts
    ln = norm.forward(b, f"{prefix}.{mlp.pre_norm(m)}", x, layer, tags=frozenset({"layernorm"}))
    p = f"{prefix}.mlp"
    local = local_widths(b.params, p)
    t = ln.shape[0]
    logits = linear(b, f"{p}.router", ln, n, layer, out_name="logits", rule="torch_linear", tags=MOE)
    max_ind = b.tensor(f"{p}.router.max_ind", (t,), "int64")
    b.op(f"{p}.router.sinkhorn", "switch_sinkhorn", layer, {"_logits": logits}, {"y": max_ind}, tags=MOE)
    route = b.tensor(f"{p}.router.sigmoid", (t, n))
    b.op(f"{p}.router.sigmoid", "switch_sigmoid", layer, {"x": logits}, {"y": route}, tags=MOE)
    max_prob = b.tensor(f"{p}.router.max_prob", (t, 1))
    b.op(f"{p}.router.select", "switch_select", layer, {"x": route, "_idx": max_ind}, {"y": max_prob},
         extras={"arange": b.tensor(f"{p}.router.arange", (t,), "int64")}, tags=MOE)
    group = d.tp * d.ep if (d.sp and d.tp > 1) or d.ep > 1 else 1
    tokens = all_gather(b, f"{p}.tokens", ln, layer, group, stream="ep", tags=MOE)
    indices = max_ind
    if group > 1:
        indices = b.tensor(f"{p}.indices.gathered", (t * group,), "int64", comm=True)
        b.op(f"{p}.indices.all_gather", "comm", layer, {"_x": max_ind}, {"y": indices}, kind="collective",
             stream="ep", tags=MOE)
    rows = tokens.shape[0]
    bias = m.linear_bias
    totals = {"out": b.tensor(f"{p}.output_total", (rows, h))}
    if bias:
        totals["bias"] = b.tensor(f"{p}.output_bias_total", (rows, h))
    b.op(f"{p}.zeros", "switch_alloc", layer, {"_like": tokens}, dict(totals), tags=MOE)
    for i in range(local.experts):  # EP rank 0's experts (another rank's get at most one row fewer each)
        e = f"{p}.experts.{i}"
        k = expert_rows(rows, n, i)
        idx = b.tensor(f"{e}.local_indices", (k, 1), "int64")
        b.op(f"{e}.nonzero", "switch_alloc", layer, {"_indices": indices}, {"y": idx}, tags=MOE)
        hidden = b.tensor(f"{e}.hidden", (k, h))
        b.op(f"{e}.index", "switch_index", layer, {"x": tokens, "_idx": idx}, {"y": hidden}, tags=MOE)
        fc1 = linear(b, f"{e}.linear_fc1", hidden, (2 if m.gated_mlp else 1) * local.expert_ffn, layer, tags=MOE)
        act = mlp.activation(b, f"{e}.act", fc1, layer, local.expert_ffn, tags=MOE)
        out = linear(b, f"{e}.linear_fc2", act, h, layer, tags=MOE)
        b.op(f"{e}.index_put", "switch_index_put", layer, {"x": out, "_acc": totals["out"], "_idx": idx}, {},
             tags=MOE)
        if bias:
            b.op(f"{e}.bias_index_put", "switch_index_put", layer, {"_acc": totals["bias"], "_idx": idx}, {},
                 tags=MOE)
    for key in list(totals):
        if group > 1:
            y = b.tensor(f"{p}.{key}_total.reduced", (t, h), comm=True)
            b.op(f"{p}.{key}_total.reduce_scatter", "comm", layer, {"x": totals[key]}, {"y": y}, kind="collective",
                 stream="ep", tags=MOE)
            totals[key] = y
    if bias and group > 1:  # output_bias_total / tp: a new tensor (DivBackward by a scalar keeps nothing)
        div = b.tensor(f"{p}.bias_total.div", (t, h))
        b.op(f"{p}.bias_total.div", "copy", layer, {"x": totals["bias"]}, {"y": div}, tags=MOE)
        totals["bias"] = div
    weighted = {}
    for key, total in totals.items():
        y = b.tensor(f"{p}.{key}_weighted", (t, h))
        b.op(f"{p}.{key}_weighted", "switch_weight", layer, {"x": total, "p": max_prob}, {"y": y},
             flops=float(t * h), tags=MOE)
        weighted[key] = y
    return weighted["out"], weighted.get("bias")
