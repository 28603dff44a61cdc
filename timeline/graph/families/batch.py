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

From Megatron-LM 5e4fc931ba (2026-05-21, "refactor(data): consolidate get_batch", the
``[framework] rerun_keeps_batch`` switch) ``pretrain_gpt.py: get_batch`` on TP rank 0 writes the
``.cuda()`` copies back into the dict ``next(data_iterator)`` returned, and that dict is the one
``megatron/core/rerun_state_machine.py: RerunDataIterator.__next__`` appended to
``saved_microbatches`` (rerun mode not ``disabled``; the default is ``validate_results``), which
``RerunDataIterator.advance`` drops only when the next ``train_step``'s
``should_run_forward_backward`` begins. ``megatron/core/utils.py: get_batch_on_this_tp_rank`` sets
``tokens`` and ``position_ids`` to None in that dict on the last stage (pp > 1), ``labels`` and
``loss_mask`` on the first: those die as ``get_batch`` returns, and the others are named
``batch.saved.*``, whose frees :func:`timeline.sim.expand.iterator_kept` moves to the next
iteration's start. Only TP rank 0 calls ``next``; the logged rank (the last) is TP rank 0 only at
tp = 1, so the rule applies there (and at cp = 1: the CP slicing of the saved dict is not read).
"""

from __future__ import annotations

from timeline.graph.ir import Builder
from timeline.graph.tensors import TensorDef

#: (name, dtype) of the per-token fields, all ``[b, s]``
FIELDS = (("tokens", "int64"), ("labels", "int64"), ("loss_mask", "fp32"), ("position_ids", "int64"))


#: the fields ``get_batch_on_this_tp_rank`` sets to None on a first / last stage of pp > 1
DROPPED = {"first": ("labels", "loss_mask"), "last": ("tokens", "position_ids")}


def load(b: Builder, with_mask: bool, saved: str = "") -> dict[str, TensorDef]:
    """The batch ops at the start of a forward step; returns the tensors the step keeps.

    ``saved``: "" (the iterator keeps nothing), or the stage's role when the rerun data iterator
    keeps the micro-batch's dict: "both" (pp = 1), "first" or "last"."""
    d = b.dims
    dropped = DROPPED.get(saved, ())

    def name(field: str) -> str:
        return f"batch.saved.{field}" if saved and field not in dropped else f"batch.{field}"

    full = {f: b.tensor(name(f), (d.b, d.s), dtype) for f, dtype in FIELDS}
    if with_mask:
        full["attention_mask"] = b.tensor(name("attention_mask"), (d.b, 1, d.s, d.s), "bool")
    b.op("batch.get_batch", "batch", None, {}, full)
    if dropped:
        b.op("batch.drop_unused", "batch", None, {f"_{k}": full[k] for k in dropped}, {})
        full = {k: t for k, t in full.items() if k not in dropped}
    if d.cp == 1:
        return full
    local = {k: b.tensor(f"batch.{k}.cp_local", (d.b, 1, d.s_local, d.s) if k == "attention_mask"
                         else (d.b, d.s_local), t.dtype) for k, t in full.items()}
    b.op("batch.cp_slice", "batch", None, full, local)
    return local


def release(b: Builder, batch: dict[str, TensorDef]) -> None:
    """The end of the forward step (``forward_step`` returns): the batch's last reader."""
    b.op("batch.release", "batch", None, {f"_{k}": t for k, t in batch.items()}, {})
