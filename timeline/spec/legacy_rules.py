"""What Megatron-LM's legacy GPT model (``framework.use_legacy_models``) can build: run validation's
rules, one line each. This module decides no bytes (:mod:`timeline.profiles.megatron_legacy` does).

Read at ``NVIDIA/Megatron-LM@60166922d3``: ``megatron/legacy/model/transformer.py: ParallelTransformer``
builds ``ParallelTransformerLayer`` under ``--transformer-impl local`` and TE's ``TransformerLayer`` under
``transformer_engine`` (:mod:`timeline.profiles.megatron_legacy`); its layers have MHA/GQA attention without q/k norms, a dense
``ParallelMLP`` or, with ``--num-experts`` under the local layer, ``SwitchMLP`` in every layer (sinkhorn top-1 over
experts of ``--ffn-hidden-size``, no shared experts: :mod:`timeline.graph.families.switch_mlp`), and no MTP;
``megatron/training/arguments.py: validate_args``
refuses context parallelism with it ("Context parallelism is not supported in legacy models").
"""

from __future__ import annotations

from timeline.spec.framework import FrameworkSpec
from timeline.spec.model import ModelSpec
from timeline.spec.run import ParallelSpec


def legacy_problems(fw: FrameworkSpec, m: ModelSpec, par: ParallelSpec) -> list[tuple[str, str]]:
    """The problems of ``framework.use_legacy_models`` (none when it is off)."""
    if not fw.use_legacy_models:
        return [("framework.legacy_flash_attn", "the legacy model's FlashSelfAttention: set use_legacy_models = true "
                 "or legacy_flash_attn = false")] if fw.legacy_flash_attn else []
    key = "framework.use_legacy_models"
    problems = []
    if fw.legacy_flash_attn and fw.transformer_impl != "local":
        problems.append(("framework.legacy_flash_attn", "--use-flash-attn is read by the legacy local layer only (TE's "
                         "TransformerLayer chooses its own backend): set transformer_impl = \"local\" or "
                         "legacy_flash_attn = false"))
    if m.is_moe:
        if fw.transformer_impl != "local":
            problems.append((key, "TE's TransformerLayer, which the legacy model builds under transformer_engine, has "
                                  "a dense MLP (the experts are not built); set n_routed_experts = 0"))
        switch = {"num_experts_per_tok": (m.num_experts_per_tok, 1), "n_shared_experts": (m.shared_ffn, 0),
                  "first_k_dense_replace": (m.first_k_dense_replace, 0), "moe_layer_freq": (m.moe_layer_freq, 1),
                  "mlp_layer_types": (m.mlp_layer_types, ()),
                  "moe_intermediate_size": (m.moe_intermediate_size, m.intermediate_size)}
        for name, (given, legacy) in switch.items():
            if given != legacy:
                problems.append((f"model.{name}", f"the legacy SwitchMLP (transformer.py) routes every layer's tokens "
                                                  f"to one expert of the dense FFN width, without shared experts: "
                                                  f"set {name} = {legacy}"))
    for has, what in ((m.is_mla, "MLA"), (m.qk_norm, "q/k norms"),
                      (m.mtp_layers > 0, "MTP"), (par.cp > 1, "context parallelism")):
        if has:
            problems.append((key, f"the legacy model has no modelled {what}; set use_legacy_models = false"))
    return problems
