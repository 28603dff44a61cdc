"""FP8 training's op changes (``[training] fp8_recipe``): Transformer Engine's linears of the decoder
layers keep an FP8 copy of their GEMM input for the weight gradient instead of the input itself, and a
sequence-parallel all-gather moves the FP8 shard.

Read at Transformer Engine v2.2 … v2.16 (``transformer_engine/pytorch``), unchanged in what it keeps
for the Float8Tensor recipes (``DelayedScaling`` → ``Float8Quantizer``, ``Float8CurrentScaling`` →
``Float8CurrentScalingQuantizer``):

- ``module/linear.py: _Linear.forward`` (``module/layernorm_linear.py: _LayerNormLinear.forward`` alike
  for ``ln_out``): without an input all-gather the input is quantized with row- and column-wise usage,
  and after the GEMM ``inputmat.update_usage(rowwise_usage=False, columnwise_usage=True)`` keeps one of
  the two: the ``[in, rows]`` transpose where FP8 GEMMs need TN layouts (Hopper), the ``[rows, in]`` data
  where they do not (``utils.py: is_non_tn_fp8_gemm_supported``: compute capability 10.x, 11.x, ≥ 13)
  — one byte per element either way. With the sequence-parallel all-gather the local shard is
  quantized row-wise only ("All-gather is not supported with FP8 column-wise data"), gathered in FP8
  (``distributed.py: gather_along_first_dim`` with the quantizer) and kept as the local row-wise shard.
  Each quantized tensor carries a ``torch.empty(1, dtype=float32)`` ``scale_inv``
  (``tensor/float8_tensor.py``); ``prepare_for_saving`` saves both.
- The block-scaled recipes (``Float8BlockScaling``, ``MXFP8BlockScaling``; their quantizers keep column-wise data
  through an input all-gather, ``supports_only_rowwise_all_gather`` false) save the column-wise copy of the local
  input — the transpose (blockwise) or a same-shape copy (MXFP8), one byte per element — with its block scales
  (:func:`input_scale`). Not modelled: the scales of a gathered sequence-parallel input (a transient).
- The input gradient the dgrad GEMM writes is in the activation dtype (``general_gemm(...,
  out_dtype=ctx.activation_dtype)``), so an FP8 tensor's gradient is allocated in its source's dtype
  (:func:`timeline.graph.backward.grad_of`).

Which linears: Megatron-Core runs every TE module of a transformer layer under ``fp8_autocast``
(``transformer/transformer_block.py``: ``get_fp8_context`` per layer): ``linear_qkv``, ``linear_proj``,
``linear_fc1``, ``linear_fc2``, MLA's projections, the experts' ``GroupedLinear`` and the shared experts.
The output layer (``tensor_parallel.ColumnParallelLinear``), the router (``torch`` GEMM) and the
shared-expert gate are not TE modules and stay in the activation dtype. An MTP module runs its ``eh_proj``
(``TEColumnParallelLinear``) and its layer's TE linears under the global FP8 context
(``multi_token_prediction.py: MultiTokenPredictionLayer.forward``: ``get_fp8_context(self.config)``, no layer
number). Under ``--first-last-layers-bf16`` the first and last decoder layers run outside
``fp8_autocast`` (``training.fp8_bf16_first_layers`` / ``fp8_bf16_last_layers``:
:func:`timeline.profiles.megatron_fp8.bf16_layer`); the MTP layers stay in FP8. Not modelled: the forward's short-lived second copy (row-wise data and the
transpose both exist until the GEMM returns), the quantized output gradient (and its transpose) each
backward GEMM makes, ``GroupedLinear``'s per-expert quantized splits (one tensor here).
"""

from __future__ import annotations

import re
from dataclasses import replace

from timeline.graph.ir import Builder, FOp
from timeline.graph.tensors import TensorDef
from timeline.profiles.megatron_fp8 import bf16_layer, input_scale

TE_RULES = {"linear": "fp8_linear", "grouped_linear": "fp8_grouped_linear"}


#: an MTP module's TE linears: its transformer layer's (``mtp.K.layer.….linear_*``) and its ``eh_proj``
_MTP_TE = re.compile(r"^mtp\.\d+\.(layer\..*\.linear_\w+|eh_proj)$")


def is_te_linear(op: FOp) -> bool:
    """Whether ``op`` is one of a decoder layer's Transformer Engine linears (``…​.linear_*``) or an MTP
    module's (its layer's and its ``eh_proj``)."""
    if op.rule not in TE_RULES:
        return False
    return ((op.name.startswith("layers.") and op.name.rsplit(".", 1)[-1].startswith("linear_"))
            or _MTP_TE.match(op.name) is not None)


def rewrite(b: Builder) -> None:
    """Turn the chunk's TE linears into FP8 ones (in place): rule ``fp8_linear`` / ``fp8_grouped_linear``
    with the FP8 copy of the saved input and its ``scale_inv`` as extras, and their sequence-parallel
    all-gathers' outputs in FP8."""
    fp8_of: dict[str, TensorDef] = {}
    tr, layers = b.training, b.model.num_hidden_layers
    for op in b.ops:
        if not is_te_linear(op) or bf16_layer(op.layer, tr.fp8_bf16_first_layers, tr.fp8_bf16_last_layers, layers):
            continue
        x = op.inputs["x"]
        save = op.inputs.get("_save", x)
        if save.storage != x.storage:  # gathered: the gather moves the FP8 shard
            fp8_of[x.storage] = replace(x, dtype="fp8")
        op.rule = TE_RULES[op.rule]
        op.extras["x_fp8"] = b.tensor(f"{op.name}.x_fp8", save.shape, "fp8")
        shape, dtype = input_scale(tr.fp8_recipe, save.shape)
        op.extras["x_scale_inv"] = b.tensor(f"{op.name}.x_scale_inv", shape, dtype)
    if not fp8_of:
        return
    for op in b.ops:
        for slots in (op.inputs, op.outputs):
            for k, t in slots.items():
                if t.storage in fp8_of:
                    slots[k] = fp8_of[t.storage]
