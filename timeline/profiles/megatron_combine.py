"""Saved-tensor rules of Megatron-Core's MoE combine before Megatron-LM 2659630721 (``[framework]
moe_probs_in_experts = false``), where the token dispatcher's combine multiplies the routing probabilities
into the experts' output; the graph side, and why, is :mod:`timeline.graph.families.moe_combine`. Read at
``NVIDIA/Megatron-LM@2659630721^`` (2025-04-09's parent; the same code in core_r0.12.x).
"""

from __future__ import annotations

from timeline.profiles.base import SaveRule, SaveRules

MC = "NVIDIA/Megatron-LM@2659630721^:megatron/core/transformer/moe"
TE = "NVIDIA/TransformerEngine@release_v2.2:transformer_engine/pytorch/permutation.py"

RULES: dict[str, SaveRule] = {
    "combine_probs_select": SaveRule(saves=("extra:probs_t", "extra:routing_map_t"),
                                     source=f"{MC}/moe_utils.py: unpermute (probs given) and token_dispatcher.py: "
                                            "MoEAllGatherTokenDispatcher.token_unpermutation — probs.T.contiguous()"
                                            ".masked_select(routing_map.T.contiguous()) keeps the transposed probs "
                                            "and bool map"),
    "combine_probs_mul": SaveRule(saves=("in:x", "in:probs"),
                                  source=f"{MC}/moe_utils.py: unpermute — permuted_tokens * permuted_probs"
                                         ".unsqueeze(-1) keeps both (the product in the promoted dtype); "
                                         "token_dispatcher.py: MoEAllGatherTokenDispatcher.token_unpermutation — "
                                         "hidden_states (and the experts' bias rows) * permuted_probs.unsqueeze(-1)"),
    "fused_unpermute_probs": SaveRule(saves=("in:x", "in:probs"),
                                      source=f"{MC}/moe_utils.py: unpermute(fused=True, probs) → {TE}: "
                                             "_moe_unpermute_mask_map.forward with merging_probs saves inp, row_id_map "
                                             "(kept by the permute) and merging_probs"),
}


def extend(rules: SaveRules) -> SaveRules:
    """``rules`` (the megatron rules) with the pre-2659630721 combine's rules added; no rule is replaced."""
    return rules.extended(RULES)
