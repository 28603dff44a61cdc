"""A T5 job (``pretrain_t5.py``, a ``test_cases/t5/`` folder) → ``[model] architecture = "t5"``, and a one-line
refusal for what its model is not modelled with.

Read at ``NVIDIA/Megatron-LM@92f052b8`` (``pretrain_t5.py: model_provider``, ``megatron/training/arguments.py:
validate_args``; the same from 46fdcd5b7e to 58baa0e6de):

- ``validate_args``: without ``--num-layers``, ``args.num_layers = args.encoder_num_layers``; without
  ``--seq-length``, ``args.seq_length = args.encoder_seq_length`` (:func:`derived_args`);
- ``model_provider``: ``encoder_config.num_layers = args.encoder_num_layers`` and the decoder block of
  ``config.num_layers`` (``args.num_layers``) layers — ``--decoder-num-layers`` sizes no block
  (``get_t5_decoder_with_*_block_spec(decoder_layers_per_pipeline)`` of ``config.num_layers``); "Pipeline
  parallelism is not supported for T5" (``ValueError``); ``share_embeddings_and_output_weights = not
  --untie-embeddings-and-output-weights``; ``position_embedding_type`` learned absolute, rope or relative;
- the decoder's tokens per sample: ``--decoder-seq-length`` (``T5MaskedWordPieceDatasetConfig.
  sequence_length_decoder``);
- the vocabulary: Megatron's ``_BertWordPieceTokenizer`` adds ``[BOS]`` and ``[EOS]`` and ``--vocab-extra-ids``
  sentinels to the WordPiece vocabulary (``megatron/training/tokenizer/tokenizer.py``).
"""

from __future__ import annotations

from typing import Any

from timeline.errors import UserError
from timeline.io.megatron_map import ArgReader, Conversion, no_qk_norms
from timeline.io.megatron_table import VLM_FAMILIES
from timeline.spec.arch_rules import PADDED_BACKENDS

#: ``pretrain_t5.py``'s own arguments (refused as a T5 model in any other job)
T5_ARGS = ("--encoder-num-layers", "--encoder-seq-length", "--decoder-seq-length", "--decoder-num-layers",
           "--relative-attention-num-buckets", "--relative-attention-max-distance",
           "--pipeline-model-parallel-split-rank")


def derived_args(raw: dict[str, Any], family: str | None) -> dict[str, Any]:
    """The arguments as ``validate_args`` completes them for a T5 job: ``--num-layers`` from
    ``--encoder-num-layers``, ``--seq-length`` from ``--encoder-seq-length``; unchanged for other families."""
    if family != "t5" and family not in VLM_FAMILIES:  # pretrain_vlm.py reads the same validate_args
        return raw
    out = dict(raw)
    for given, derived in (("--encoder-num-layers", "--num-layers"), ("--encoder-seq-length", "--seq-length")):
        if out.get(given) is not None and out.get(derived) is not None:
            raise UserError(f"{given} with {derived}: Megatron-LM asserts only one is given (arguments.py: "
                            "validate_args)")
        if out.get(derived) is None and out.get(given) is not None:
            out[derived] = out[given]
    return out


def map_t5(a: ArgReader, c: Conversion, family: str | None) -> None:
    """``[model]`` and ``[training]`` of a T5 job; for another family, a refusal of ``pretrain_t5.py``'s own
    arguments."""
    if family in VLM_FAMILIES:  # pretrain_vlm.py reads its own (io/megatron_vlm.py)
        return
    if family != "t5":
        for name in T5_ARGS:
            if name in a.raw:
                raise UserError(f"{name}: a T5 encoder-decoder model's argument (pretrain_t5.py); name the job's "
                                "family as T5 (a test_cases/t5/ folder or pretrain_t5.py) or drop it")
        return
    layers = c.sections["model"]["num_layers"]
    a.int("--encoder-num-layers")
    a.int("--encoder-seq-length")
    a.int("--decoder-num-layers")  # sizes no block: the decoder has --num-layers layers (model_provider)
    dec = a.int("--decoder-seq-length")
    if dec is None:
        raise UserError("--decoder-seq-length is required for a T5 model (the decoder's tokens per sample)")
    if c.sections["parallel"].get("pp", 1) > 1:
        raise UserError("--pipeline-model-parallel-size with a T5 model: pretrain_t5.py raises \"Pipeline "
                        "parallelism is not supported for T5\"; use 1")
    backend = c.sections["framework"]["attention_backend"]
    if backend not in PADDED_BACKENDS + ("local",):
        raise UserError(f"--attention-backend {a.str('--attention-backend', 'auto')} with a T5 model: its padding "
                        f"masks under TE's {backend} attention (TE packs the unpadded sequences) are not modelled; "
                        "give --attention-backend unfused or fused")
    a.has("--pipeline-model-parallel-split-rank")  # the encoder/decoder split: read only with pp > 1 (refused)
    a.has("--relative-attention-num-buckets")  # read only under the relative type (refused by map_model)
    a.has("--relative-attention-max-distance")
    no_qk_norms(c, "T5", "t5_spec.py")  # IdentityOp q/k norms in every release
    c.put("model.architecture", "t5")
    c.put("model.num_layers", 2 * layers, "--encoder-num-layers", "--num-layers")
    c.put("model.encoder_layers", layers)
    c.put("training.decoder_seq_len", dec, "--decoder-seq-length")
    # pretrain_t5.py: get_batch broadcasts the micro-batch and builds the masks itself
    c.put("framework.dataloader_batch", "tokens")
