"""The micro-batch Megatron-LM's ``get_batch`` puts on the device for the first and last pipeline
stages' forward (the ``megatron`` profile under ``[framework] dataloader_batch``).

``pretrain_gpt.py: get_batch`` returns nothing on middle stages; on the first and last (virtual)
stages ``megatron/training/utils.py: get_batch_on_this_tp_rank`` holds the data iterator's
``tokens``, ``labels`` (int64 ``[b, s]``), ``loss_mask`` (fp32 ``[b, s]``), ``position_ids`` (int64
``[b, s]``) and, when the dataloader creates it (``--no-create-attention-mask-in-dataloader``
unset), the bool ``attention_mask`` ``[b, 1, s, s]`` on the device — TP rank 0 moves all of them
with ``.cuda()``, the representative device here; under context parallelism
``megatron/core/utils.py: get_batch_on_this_cp_rank`` replaces each by its ``index_select`` of the
rank's two sequence chunks (the mask sliced on its query dimension). They live through that
forward step: :func:`release` reads them after the chunk's last forward op.
"""

from __future__ import annotations

from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef

#: (name, dtype) of the per-token fields, all ``[b, s]``
FIELDS = (("tokens", "int64"), ("labels", "int64"), ("loss_mask", "fp32"), ("position_ids", "int64"))


def load(b: Builder, with_mask: bool) -> dict[str, TensorDef]:
    """The batch ops at the start of a forward step; returns the tensors the step keeps."""
    d = b.dims
    full = {name: b.tensor(f"batch.{name}", (d.b, d.s), dtype) for name, dtype in FIELDS}
    if with_mask:
        full["attention_mask"] = b.tensor("batch.attention_mask", (d.b, 1, d.s, d.s), "bool")
    b.op("batch.get_batch", "batch", None, {}, full)
    if d.cp == 1:
        return full
    local = {k: b.tensor(f"batch.{k}.cp_local", (d.b, 1, d.s_local, d.s) if k == "attention_mask"
                         else (d.b, d.s_local), t.dtype) for k, t in full.items()}
    b.op("batch.cp_slice", "batch", None, full, local)
    return local


def release(b: Builder, batch: dict[str, TensorDef]) -> None:
    """The end of the forward step (``forward_step`` returns): the batch's last reader."""
    b.op("batch.release", "batch", None, {f"_{k}": t for k, t in batch.items()}, {})
