"""DeepSeek-V3 multi-token prediction module (README_WEIGHTS.md of DeepSeek-V3): enorm,
hnorm, eh_proj [h, 2h], one full decoder layer and the shared head's norm; the embedding and
output head are shared with the main model. Megatron builds an embedding on the MTP stage
when it is not the first (profile rule ``mtp_embedding``). Everything is tagged ``mtp``.

Forward ops (:func:`forward`, Megatron ``multi_token_prediction.py``):
embedding of the shifted tokens, enorm and hnorm, concatenation, eh_proj, one decoder layer,
the shared head's norm, the (shared) output layer and its loss. eh_proj is modelled on the
sequence-parallel rows without its TP collectives (a small approximation).

MTP on a stage of its own, apart from the loss (Megatron-Core ≥ 0.16, ``parallel.mtp_stage``):
:func:`forward_apart` runs the modules in turn, each on the previous one's output
(``MultiTokenPredictionBlock.forward``), then takes the ``torch.cat`` of the received hidden states and every
module's output along the sequence — the tensor the stage sends on; :func:`heads_apart` is the loss
stage's side (``GPTModel._postprocess``): ``torch.chunk`` of the received tensor (views), each MTP
part's output layer and loss, then the main part's.
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


def module(b: Builder, index: int, hidden: TensorDef) -> TensorDef:
    """MTP module ``index`` on ``hidden`` up to its decoder layer's output (before the shared head's norm)."""
    m = b.model
    layer = m.num_hidden_layers + index
    p = f"mtp.{index}"
    e = norm.forward(b, f"{p}.enorm", embedding.forward(b, f"{p}.embedding", layer), layer)
    hn = norm.forward(b, f"{p}.hnorm", hidden, layer)
    cat = b.tensor(f"{p}.concat", (e.shape[0], 2 * m.hidden_size))
    b.op(f"{p}.concat_op", "concat", layer, {"e": e, "h": hn}, {"y": cat})
    x = linear(b, f"{p}.eh_proj", cat, m.hidden_size, layer)
    return decoder.forward(b, layer, f"{p}.layer", x, moe=m.is_moe_layer(layer))


def forward(b: Builder, index: int, hidden: TensorDef) -> None:
    """MTP module ``index`` with the head and loss on its own stage (the default placement)."""
    p = f"mtp.{index}"
    head.forward(b, p, f"{p}.shared_head.norm", module(b, index, hidden), b.model.num_hidden_layers + index)


def forward_apart(b: Builder, indices: list[int], hidden: TensorDef) -> TensorDef:
    """A standalone MTP stage: the modules ``indices`` in turn, each on the previous one's normalised
    output (``MultiTokenPredictionLayer._postprocess``: ``final_layernorm``), then the ``torch.cat`` of
    ``hidden`` and each output along the sequence (``MultiTokenPredictionBlock.forward``, core_v0.16.0 …
    d98e8a64dd), which the stage sends on; the concatenation keeps nothing for backward."""
    parts, h = [hidden], hidden
    for k in indices:
        h = norm.forward(b, f"mtp.{k}.shared_head.norm", module(b, k, h), b.model.num_hidden_layers + k)
        parts.append(h)
    out = b.tensor("mtp.hidden_states", (sum(t.shape[0] for t in parts), hidden.shape[1]))
    b.op("mtp.concat_hidden", "concat", None, {f"h{i}": t for i, t in enumerate(parts)}, {"y": out})
    return out


def heads_apart(b: Builder, received: TensorDef, mtp_layers: int) -> None:
    """The loss stage after a standalone MTP stage (``GPTModel._postprocess``, core_v0.16.0 … d98e8a64dd):
    ``torch.chunk(hidden_states, 1 + mtp_num_layers)`` gives views of the received tensor (which the
    output layers' saved inputs therefore keep whole, and whose one gradient is sent back); each MTP part's
    output layer and loss run first, then the main part's. No norm runs here: the MTP parts are normalised
    on the MTP stage, the main part on the stage of the last decoder layer."""
    rows = received.shape[0] // (1 + mtp_layers)
    parts = [replace(received, name=f"{received.name}.part{i}", shape=(rows, *received.shape[1:]))
             for i in range(1 + mtp_layers)]
    for k in range(mtp_layers):
        head.loss(b, f"mtp.{k}", parts[k + 1], b.model.num_hidden_layers + k)
    head.loss(b, "output", parts[0], None)
