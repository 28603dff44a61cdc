"""What Megatron-LM's legacy GPT model (``framework.use_legacy_models``) can build: run validation's
rules, one line each. This module decides no bytes (:mod:`timeline.profiles.megatron_legacy` does).

Read at ``NVIDIA/Megatron-LM@60166922d3``: ``megatron/legacy/model/transformer.py: ParallelTransformer``
builds ``ParallelTransformerLayer`` under ``--transformer-impl local`` and TE's ``TransformerLayer`` under
``transformer_engine`` (:mod:`timeline.profiles.megatron_legacy`); its layers have MHA/GQA attention without q/k norms, a dense ``ParallelMLP`` (its
``SwitchMLP`` experts are not modelled) and no MTP; ``megatron/training/arguments.py: validate_args``
refuses context parallelism with it ("Context parallelism is not supported in legacy models").
"""

from __future__ import annotations

from timeline.spec.framework import FrameworkSpec
from timeline.spec.model import ModelSpec
from timeline.spec.run import ParallelSpec


def legacy_problems(fw: FrameworkSpec, m: ModelSpec, par: ParallelSpec) -> list[tuple[str, str]]:
    """The problems of ``framework.use_legacy_models`` (none when it is off)."""
    if not fw.use_legacy_models:
        return []
    key = "framework.use_legacy_models"
    problems = []
    for has, what in ((m.is_moe, "MoE (SwitchMLP)"), (m.is_mla, "MLA"), (m.qk_norm, "q/k norms"),
                      (m.mtp_layers > 0, "MTP"), (par.cp > 1, "context parallelism")):
        if has:
            problems.append((key, f"the legacy model has no modelled {what}; set use_legacy_models = false"))
    return problems
