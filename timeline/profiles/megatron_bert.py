"""The ``megatron`` profile's rules for Megatron-Core's BERT and T5 (``[model] architecture = "bert"`` / ``"t5"``):
what the ops :mod:`timeline.graph.families.bert` and :mod:`timeline.graph.families.t5` add keep for backward, and
the Transformer Engine switches their padding masks read (the extended mask's dimensions: T5's
``config_attention_mask`` takes the same TE-version cut at 1.10 as BertModel's).

Read at ``NVIDIA/Megatron-LM@92f052b8`` (``MC``; unchanged 46fdcd5b7e … 64bee49c96), PyTorch's
``tools/autograd/derivatives.yaml`` (the formulas each autograd node saves, unchanged 2.2 … 2.13) and
Transformer Engine's unfused attention (``UnfusedDotProductAttention.forward``, v1.11 … v2.18).
"""

from __future__ import annotations

from dataclasses import replace

from timeline.profiles.base import SaveRule, SaveRules, Structure
from timeline.profiles.megatron_workspaces import version_tuple
from timeline.spec.framework import FrameworkSpec

MC = "NVIDIA/Megatron-LM@92f052b8:megatron/core"
TE_UNFUSED = ("NVIDIA/TransformerEngine@v2.6:transformer_engine/pytorch/attention/dot_product_attention/backends.py: "
              "UnfusedDotProductAttention.forward")
DERIVATIVES = "pytorch/pytorch tools/autograd/derivatives.yaml"

RULES: dict[str, SaveRule] = {
    "attn_mask": SaveRule(source=f"{TE_UNFUSED} → dot_product_attention/utils.py: get_full_mask (v1.11: the same "
                                 "steps inline in attention.py) — bool and int32 tensors, outside autograd"),
    "masked_fill": SaveRule(saves=("in:_mask",),
                            source=f"{TE_UNFUSED}: `attention_probs.masked_fill(attention_mask, 0)` for a padding "
                                   f"mask; {DERIVATIVES} masked_fill.Scalar: `grad.masked_fill(mask, 0)` keeps the "
                                   "[b, 1, s, s] bool mask"),
    "torch_gelu": SaveRule(saves=("in:x",),
                           source=f"{MC}/models/bert/bert_lm_head.py: BertLMHead.forward `torch.nn.functional.gelu`; "
                                  f"{DERIVATIVES} gelu: `gelu_backward(grad, self, approximate)` keeps its input"),
    "fused_layernorm": SaveRule(saves=("in:x", "extra:mu", "extra:rsigma"),
                                source=f"{MC}/fusions/fused_layer_norm.py: FusedLayerNorm.forward (BertLMHead's "
                                       "layer_norm) — apex FastLayerNormFN / FusedLayerNormAffineFunction with "
                                       "memory_efficient_layer_norm False save the input and the fp32 mean and "
                                       "rsigma per row (without apex, WrappedTorchNorm's native_layer_norm the "
                                       "same)"),
    "torch_linear": SaveRule(saves=("in:_save",), wgrad=("in:_save",),
                             source=f"{MC}/transformer/utils.py: get_linear_layer (torch.nn.Linear: BertLMHead.dense, "
                                    f"Pooler.dense, the binary head) — {DERIVATIVES} addmm keeps its input for the "
                                    "weight gradient, a fresh tensor the DDP hook adds into main_grad "
                                    "(gradient-accumulation fusion covers Megatron's own linears only)"),
    "tanh": SaveRule(saves=("out:y",),
                     source=f"{MC}/models/bert/pooler.py: Pooler.forward `torch.tanh`; {DERIVATIVES} tanh: "
                            "`tanh_backward(grad, result)` keeps its output"),
    "matmul_out": SaveRule(source=f"{MC}/tensor_parallel/layers.py: LinearWithGradAccumulationAndAsyncCommunication."
                                  "forward — `output = torch.matmul(total_input, weight.t())`, then `output + bias` "
                                  "(BertModel's output layer has a bias): the GEMM's result lives until the sum "
                                  "is made; the Function keeps only input and weight"),
    "bert_mask": SaveRule(source=f"{MC}/models/bert/bert_model.py: BertModel.bert_extended_attention_mask — for "
                                 "\"b1ss\" `attention_mask_b1s * attention_mask_bs1` (the int64 [b, s, s] product "
                                 "of the .long() padding mask, a local until the function returns) and `< 0.5`, "
                                 "the bool [b, 1, s, s] mask; outside autograd"),
    "t5_mask": SaveRule(source="NVIDIA/Megatron-LM@92f052b8:megatron/core/datasets/t5_dataset.py: "
                               "T5MaskedWordPieceDataset._build_b1ss_attention_mask — per sample a bool [s_q, s_kv] "
                               "comparison product, negated into a list, then torch.stack; outside autograd"),
    "sop_loss": SaveRule(source="NVIDIA/Megatron-LM@92f052b8:pretrain_bert.py: loss_func — F.cross_entropy of the "
                                "[b, 2] sentence-order logits (.float()): its log_softmax output, one 512-byte block, "
                                "not modelled"),
}


def extend(rules: SaveRules) -> SaveRules:
    """``rules`` (the megatron rules) with BERT's added; no rule is replaced."""
    return rules.extended(RULES)


#: NVIDIA/TransformerEngine v2.0 (attention.py: UnfusedDotProductAttention.forward calls get_full_mask, unchanged
#: in dot_product_attention/utils.py to v2.18); v1.11 built the padding mask with a logical_or alone
FULL_MASK_TE = (2, 0)

#: ``{MC}/models/bert/bert_model.py: BertModel._sanity_check_attention_and_get_attn_mask_dimension`` (from
#: Megatron-LM ee9dba2669, 2024-10, unchanged to 64bee49c96): "b1ss" for Megatron's own DotProductAttention (the
#: local layer spec, ``--spec local``), and under TE for versions before 1.10 (below 1.7 always; 1.7 … 1.9 for the
#: unfused backend, the only one a BERT run here takes); "b11s" for TE ≥ 1.10
B11S_TE = (1, 10)


def configure(table: Structure, spec: FrameworkSpec) -> Structure:
    """The structure with the Transformer Engine version's padding-mask construction and the extended mask's
    dimensions ``BertModel`` chooses."""
    local = spec.transformer_impl == "local"
    b1ss = local or version_tuple(spec.transformer_engine)[:2] < B11S_TE
    return replace(table, te_full_mask=version_tuple(spec.transformer_engine) >= FULL_MASK_TE,
                   bert_mask="b1ss" if b1ss else "b11s")
