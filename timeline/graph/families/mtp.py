"""DeepSeek-V3 multi-token prediction module (README_WEIGHTS.md of DeepSeek-V3): enorm,
hnorm, eh_proj [h, 2h], one full decoder layer and the shared head's norm; the embedding and
output head are shared with the main model. Megatron builds an embedding on the MTP stage
when it is not the first (profile rule ``mtp_embedding``). Everything is tagged ``mtp``.

Forward ops (:func:`forward`, Megatron ``multi_token_prediction.py``):
embedding of the shifted tokens, enorm and hnorm, concatenation, eh_proj, one decoder layer,
the shared head's norm, the (shared) output layer and its loss. eh_proj is modelled on the
sequence-parallel rows without its TP collectives (a small approximation).
"""

from __future__ import annotations

from dataclasses import replace

from timeline.graph.context import BuildCtx
from timeline.graph.families import decoder, embedding, head, norm
from timeline.graph.families.common import linear
from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef, param


def params(ctx: BuildCtx, index: int, layer_params: list[TensorDef]) -> list[TensorDef]:
    """Params of MTP module ``index`` around an already-built decoder layer."""
    h = ctx.model.hidden_size
    prefix = f"mtp.{index}"
    out = norm.params(ctx, f"{prefix}.enorm", h, module="mtp") + norm.params(ctx, f"{prefix}.hnorm", h,
                                                                             module="mtp")
    split = ctx.tp if ctx.profile.mtp_eh_proj_tp_split else 1
    out.append(param(f"{prefix}.eh_proj.weight", (h, 2 * h), module="mtp", dtype=ctx.dtype, split=split))
    out += [replace(t, module="mtp") for t in layer_params]
    out += norm.params(ctx, f"{prefix}.shared_head.norm", h, module="mtp")
    return out


def embedding_params(ctx: BuildCtx) -> list[TensorDef]:
    return embedding.params(ctx, prefix="mtp.embedding", module="mtp")


def forward(b: Builder, index: int, hidden: TensorDef) -> None:
    m = b.model
    layer = m.num_hidden_layers + index
    p = f"mtp.{index}"
    e = norm.forward(b, f"{p}.enorm", embedding.forward(b, f"{p}.embedding", layer), layer)
    hn = norm.forward(b, f"{p}.hnorm", hidden, layer)
    cat = b.tensor(f"{p}.concat", (e.shape[0], 2 * m.hidden_size))
    b.op(f"{p}.concat_op", "concat", layer, {"e": e, "h": hn}, {"y": cat})
    x = linear(b, f"{p}.eh_proj", cat, m.hidden_size, layer)
    x = decoder.forward(b, layer, f"{p}.layer", x, moe=m.is_moe_layer(layer))
    head.forward(b, p, f"{p}.shared_head.norm", x, layer)

