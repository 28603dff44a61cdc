"""A BERT job (``pretrain_bert.py``, a ``test_cases/bert/`` folder) → ``[model] architecture = "bert"``, and a
one-line refusal for what its model is not modelled with.

Read at ``NVIDIA/Megatron-LM@92f052b8`` (``pretrain_bert.py``; ``examples/bert/pretrain_bert.py`` from
547fb1713e, unchanged): ``model_provider`` builds ``megatron.core.models.bert.bert_model.BertModel`` with
``num_tokentypes = 2 if args.bert_binary_head else 0`` and ``add_binary_head = args.bert_binary_head``
(``--bert-no-binary-head`` clears it), the layer spec ``bert_layer_with_transformer_engine_spec`` unless
``--spec`` — ``local`` gives ``bert_layer_local_spec`` (mapped to the local implementation), any other module is
refused —, so ``--transformer-impl`` does not choose it, or the legacy ``BertModel`` under
``--use-legacy-models`` (``megatron/legacy/model/bert_model.py``: the same head on the legacy language model, which
:mod:`timeline.io.megatron_legacy` maps as the local layer, or as TE's TransformerLayer before TE 1.10); ``pretrain(..., args_defaults={'tokenizer_type': 'BertWordPieceLowerCase'})`` (the vocabulary:
:data:`timeline.io.megatron_map.BERT_VOCABS`).
"""

from __future__ import annotations

from timeline.errors import UserError
from timeline.io.megatron_map import ArgReader, Conversion, bert_local_spec, no_qk_norms
from timeline.profiles.megatron_workspaces import version_tuple
from timeline.spec.arch_rules import PADDED_BACKENDS, legacy_bert_te_modelled

#: bert_layer_specs.py leaves the TE spec's q/k norms unset from this release (2c579b45b9, core_v0.19.0), so
#: SelfAttention builds TENorm (--qk-layernorm) or L2Norm (--qk-l2-norm) for them; before, IdentityOp
BERT_TE_QK_NORMS = (0, 19)

#: arguments a BERT job is refused with, and why
REFUSED = {
    "--num-experts": "pretrain_bert.py's layer spec (bert_layer_specs.py) has a dense MLP: the experts would not be "
                     "built; drop it",
    "--multi-latent-attention": "pretrain_bert.py's layer spec has no MLA; drop it",
    "--mtp-num-layers": "BertModel has no multi-token prediction; drop it",
    "--fp8-format": "FP8 training of BERT (its LM head and pooler are torch.nn.Linear) is not modelled",
}


def map_bert(a: ArgReader, c: Conversion, family: str | None) -> None:
    """``[model]`` of a BERT job, and what its batch is; nothing for another family."""
    if family != "bert":
        a.flag("--bert-no-binary-head")  # pretrain_gpt.py never reads it
        return
    for name, why in REFUSED.items():
        if a.raw.get(name) not in (None, False, 0, "None"):
            raise UserError(f"{name} with a BERT model: {why}")
    impl = a.str("--transformer-impl", "transformer_engine")
    backend = c.sections["framework"]["attention_backend"]
    legacy = a.flag("--use-legacy-models")
    if legacy and impl != "local":
        # megatron/legacy/model/bert_model.py: BertModel hands its [b, 1, s, s] extended mask to TE's
        # TransformerLayer with the padding mask type, whose attention TE chooses itself (--attention-backend acts
        # through Core's LanguageModule only: io/megatron_framework.py). TE's unfused attention before 1.10 applies
        # that mask as given (attention.py@v1.2 … v1.9), as it does Core BERT's b1ss mask; from 1.10 it asserts a
        # [b, 1, 1, s] mask, and the flash and fused backends unpad the sequences by it
        te = c.sections["framework"]["transformer_engine"]
        if not legacy_bert_te_modelled(backend, te):
            raise UserError(f"--use-legacy-models with --transformer-impl {impl} on a BERT model: the legacy "
                            "BertModel hands its [b, 1, s, s] extended mask to TE's TransformerLayer with the padding "
                            f"mask type; TE {te}'s {backend} attention (the one it chooses) "
                            + ("asserts a [b, 1, 1, s] mask (attention.py from v1.10)" if backend == "unfused" else
                               "unpads the sequences by it") + ", not modelled; give --transformer-impl local")
        a.has("--attention-backend")  # TE chooses, whatever it says
    elif legacy:
        # megatron/legacy/model/bert_model.py: BertModel — the legacy language model (transformer.py:
        # ParallelTransformer, CoreAttention with the padding mask: the local layer) under the same LM head,
        # pooler, binary head and b1ss mask as Core's
        c.put("framework.attention_backend", "local", "--use-legacy-models", "--attention-backend")
        a.has("--attention-backend")  # the legacy attention is CoreAttention whatever it says
    elif bert_local_spec(a.raw):
        a.has("--spec")
        # bert_model.py: BertModel._sanity_check_attention_and_get_attn_mask_dimension asserts the backend is
        # local or auto under Megatron's own DotProductAttention
        given = a.str("--attention-backend", "auto")
        if given not in ("local", "auto"):
            raise UserError(f"--attention-backend {given} with --spec local: BertModel asserts local or auto for "
                            "Megatron's own DotProductAttention; give --attention-backend local")
        # the layer spec is bert_layer_local_spec whatever --transformer-impl says: the local layer's modules
        c.put("framework.transformer_impl", "local", "--spec", "--transformer-impl")
        c.put("framework.attention_backend", "local", "--spec", "--attention-backend")
    elif impl != "transformer_engine":
        raise UserError(f"--transformer-impl {impl} with a BERT model: pretrain_bert.py builds the Transformer "
                        "Engine layer spec whatever it says (--spec local gives the local layer spec), and that mix "
                        "is not modelled; drop it")
    elif backend not in PADDED_BACKENDS:
        raise UserError(f"--attention-backend {a.str('--attention-backend', 'auto')} with a BERT model: the padding "
                        f"mask under TE's {backend} attention (packed unpadded sequences) is not modelled; give "
                        "--attention-backend unfused or fused")
    if c.sections["parallel"]["cp"] > 1:
        raise UserError("--context-parallel-size with a BERT model: pretrain_bert.py's get_batch does not split the "
                        "sequence over context-parallel ranks; use 1")
    te_spec = not legacy and not bert_local_spec(a.raw)
    no_qk_norms(c, "BERT", "bert_layer_specs.py", built=te_spec and version_tuple(
        c.sections["framework"].get("megatron_core") or "0") >= BERT_TE_QK_NORMS)
    binary = not a.flag("--bert-no-binary-head")
    c.put("model.architecture", "bert")
    c.put("model.binary_head", binary, "--bert-no-binary-head")
    c.put("model.type_vocab_size", 2 if binary else 0, "--bert-no-binary-head")
    # pretrain_bert.py: get_batch broadcasts the micro-batch on every stage (no attention mask from the dataset)
    c.put("framework.dataloader_batch", "tokens")

