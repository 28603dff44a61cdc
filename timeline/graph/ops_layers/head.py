"""Output head and loss: final norm, vocabulary-parallel output linear (SP all-gather, local
shard saved) and the vocab-parallel cross-entropy, which keeps fp32 softmax numerators
(``exp_logits``) and, under Megatron, the target mask and masked targets; under HF (``upcast_fp32``)
the logits are copied to fp32 first and the loss keeps the fp32 log-softmax, the shifted labels and
``total_weight``."""

from __future__ import annotations

from timeline.graph.ir import Builder
from timeline.graph.layers.head import head_vocab
from timeline.graph.ops_layers.common import column_linear, norm, upcast
from timeline.graph.tensors import TensorDef


def head(b: Builder, prefix: str, norm_name: str, x: TensorDef, layer: int | None) -> TensorDef:
    """Final norm → logits → loss; returns the scalar loss."""
    vocab = head_vocab(b.params)
    ln = norm(b, norm_name, x, layer)
    logits = column_linear(b, f"{prefix}.output_layer", ln, vocab, layer)
    if b.table.upcast_fp32:  # ForCausalLMLoss: logits.float()
        logits = upcast(b, f"{prefix}.output_layer.upcast", logits, layer)
    rows = logits.shape[0]
    loss = b.tensor(f"{prefix}.loss", (1,), "fp32")
    if b.table.ce_inplace:  # the gradient is written into the logits, which the loss keeps
        b.op(f"{prefix}.loss", "ce_loss_inplace", layer, {"x": logits}, {"y": loss}, flops=6.0 * rows * vocab)
        return loss
    extras = {"exp_logits": b.tensor(f"{prefix}.loss.exp_logits", (rows, vocab), "fp32"),
              "target_mask": b.tensor(f"{prefix}.loss.target_mask", (rows,), "bool"),
              "masked_target": b.tensor(f"{prefix}.loss.masked_target", (rows,), "int64"),
              "total_weight": b.tensor(f"{prefix}.loss.total_weight", (1,), "fp32")}
    b.op(f"{prefix}.loss", "ce_loss", layer, {"x": logits}, {"y": loss}, extras=extras, flops=6.0 * rows * vocab)
    return loss
