"""DeepSeek-V3 multi-token prediction module ops (Megatron ``multi_token_prediction.py``):
embedding of the shifted tokens, enorm and hnorm, concatenation, eh_proj, one decoder layer,
the shared head's norm, the (shared) output layer and its loss. eh_proj is modelled on the
sequence-parallel rows without its TP collectives (a small approximation)."""

from __future__ import annotations

from timeline.graph.ir import Builder
from timeline.graph.ops_layers.common import linear, norm
from timeline.graph.ops_layers.embedding import embedding
from timeline.graph.ops_layers.head import head
from timeline.graph.ops_layers.layer import decoder_layer
from timeline.graph.tensors import TensorDef


def mtp(b: Builder, index: int, hidden: TensorDef) -> None:
    m = b.model
    layer = m.num_hidden_layers + index
    p = f"mtp.{index}"
    e = norm(b, f"{p}.enorm", embedding(b, f"{p}.embedding", layer), layer)
    hn = norm(b, f"{p}.hnorm", hidden, layer)
    cat = b.tensor(f"{p}.concat", (e.shape[0], 2 * m.hidden_size))
    b.op(f"{p}.concat_op", "concat", layer, {"e": e, "h": hn}, {"y": cat})
    x = linear(b, f"{p}.eh_proj", cat, m.hidden_size, layer)
    x = decoder_layer(b, layer, f"{p}.layer", x, moe=m.is_moe_layer(layer))
    head(b, p, f"{p}.shared_head.norm", x, layer)
