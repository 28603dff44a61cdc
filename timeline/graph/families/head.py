"""Output head (vocabulary-parallel over TP) and the final norm before it.

With tied embeddings the head reuses the embedding when both live on one device; on a
separate last stage Megatron keeps a synchronised copy (``word_embeddings`` on the last
stage), counted under ``head``. :func:`local_vocab` reads the local vocabulary rows back off the
built parameters, for the op builders.

Forward ops (:func:`forward`; :func:`loss` without the norm): final norm, vocabulary-parallel output linear (SP all-gather, local
shard saved) and the vocab-parallel cross-entropy, which keeps fp32 softmax numerators
(``exp_logits``) and, under Megatron, the target mask and masked targets; under HF (``upcast_fp32``)
the logits are copied to fp32 first and the loss keeps the fp32 log-softmax, the shifted labels and
``total_weight``.
"""

from __future__ import annotations

from collections.abc import Mapping

from timeline.graph.context import BuildCtx
from timeline.graph.families import norm
from timeline.graph.families.common import column_linear, upcast
from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef, param


def final_norm_params(ctx: BuildCtx) -> list[TensorDef]:
    if not ctx.profile.final_norm:
        return []
    return norm.params(ctx, "final_norm", ctx.model.hidden_size)


def params(ctx: BuildCtx, *, shares_embedding: bool) -> list[TensorDef]:
    if ctx.model.tie_word_embeddings and shares_embedding:
        return []
    out = [param("output_layer.weight", (ctx.padded_vocab, ctx.model.hidden_size), module="head",
                 dtype=ctx.dtype, split=ctx.tp)]
    if ctx.model.head_bias:  # Phi's lm_head (added inside the GEMM: no tensor of its own)
        out.append(param("output_layer.bias", (ctx.padded_vocab,), module="head", dtype=ctx.dtype, split=ctx.tp))
    return out


def local_vocab(params: Mapping[str, TensorDef]) -> int:
    """Vocabulary rows of the output layer one device holds (the embedding's, when the head reuses it)."""
    w = params.get("output_layer.weight") or params.get("embedding.word_embeddings.weight")
    if w is None:
        raise KeyError("no output layer or word embedding in this chunk")
    return w.shape[0]


def forward(b: Builder, prefix: str, norm_name: str, x: TensorDef, layer: int | None) -> TensorDef:
    """Final norm → logits → loss; returns the scalar loss."""
    return loss(b, prefix, norm.forward(b, norm_name, x, layer, final=True), layer)


def loss(b: Builder, prefix: str, ln: TensorDef, layer: int | None) -> TensorDef:
    """Logits → loss of already normalised hidden states ``ln``; returns the scalar loss."""
    return cross_entropy(b, prefix, logits(b, prefix, ln, layer), layer)


def logits(b: Builder, prefix: str, ln: TensorDef, layer: int | None,
           refs: dict[str, TensorDef] | None = None) -> TensorDef:
    """The vocabulary-parallel output layer on ``ln`` (``refs``: as :func:`~timeline.graph.families.common.linear`'s);
    returns the local logits (an fp32 copy under ``upcast_fp32``)."""
    vocab = local_vocab(b.params)
    out = column_linear(b, f"{prefix}.output_layer", ln, vocab, layer, buffered=b.table.head_gather_buffer, refs=refs)
    cap = b.model.final_logit_softcapping if b.table.model_code else 0.0
    if cap > 0:  # Gemma2ForCausalLM: logits / cap, tanh, * cap — TanhBackward0 keeps its 16-bit result
        for step, rule in (("capped", "scale"), ("tanh", "tanh"), ("uncapped", "scale")):
            y = b.tensor(f"{prefix}.output_layer.{step}", out.shape)
            b.op(f"{prefix}.output_layer.{step}_op", rule, layer, {"x": out}, {"y": y},
                 flops=float(out.shape[0] * out.shape[1]))
            out = y
    if b.model.mup_output_mult != 1.0:  # Megatron-Core LanguageModule._scale_logits: logits * mup_output_mult
        y = b.tensor(f"{prefix}.output_layer.mup_scaled", out.shape)
        b.op(f"{prefix}.output_layer.mup_scale", "scale", layer, {"x": out}, {"y": y},
             flops=float(out.shape[0] * out.shape[1]))
        out = y
    if b.table.upcast_fp32:  # ForCausalLMLoss: logits.float()
        out = upcast(b, f"{prefix}.output_layer.upcast", out, layer)
    return out


def cross_entropy(b: Builder, prefix: str, logits: TensorDef, layer: int | None) -> TensorDef:
    """The vocab-parallel cross entropy of ``logits``; returns the scalar loss."""
    vocab = logits.shape[1]
    rows = logits.shape[0]
    loss = b.tensor(f"{prefix}.loss", (1,), "fp32")
    if b.table.ce_inplace:  # the gradient is written into the logits, which the loss keeps
        b.op(f"{prefix}.loss", "ce_loss_inplace", layer, {"x": logits}, {"y": loss}, flops=6.0 * rows * vocab)
        return loss
    # transformers loss/loss_utils.py ForCausalLMLoss: pad(labels, (0, 1))[..., 1:].contiguous() copies the shifted
    # labels unless the micro-batch is 1, where the (1, s) slice is already contiguous and keeps the (s + 1) storage
    targets = rows + 1 if b.table.model_code and b.dims.b == 1 else rows
    extras = {"exp_logits": b.tensor(f"{prefix}.loss.exp_logits", (rows, vocab), "fp32"),
              "target_mask": b.tensor(f"{prefix}.loss.target_mask", (rows,), "bool"),
              "masked_target": b.tensor(f"{prefix}.loss.masked_target", (targets,), "int64"),
              "total_weight": b.tensor(f"{prefix}.loss.total_weight", (1,), "fp32")}
    rule = "ce_loss_compiled" if b.table.ce_compiled else "ce_loss"
    b.op(f"{prefix}.loss", rule, layer, {"x": logits}, {"y": loss}, extras=extras, flops=6.0 * rows * vocab)
    return loss
