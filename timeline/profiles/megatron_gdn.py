"""Op rules the ``megatron`` layer library adds for the gated delta-net mixer (:mod:`timeline.graph.families.gdn`).

The mixer is built for serving only (an engine's step keeps nothing for a backward; training with these layers is
refused by :mod:`timeline.spec.arch_rules`), so each rule saves nothing; the sources say what the op allocates,
read at vLLM 0.19.0. The rules extend :data:`timeline.profiles.megatron.RULES` under new names only.
"""

from __future__ import annotations

from timeline.profiles.base import SaveRule, SaveRules

GDN = "vllm-project/vllm@v0.19.0:vllm/model_executor/layers/mamba/gdn_linear_attn.py: GatedDeltaNetAttention"

RULES: dict[str, SaveRule] = {
    "gdn_unpack": SaveRule(source=f"{GDN}.forward / fix_query_key_value_ordering — b.contiguous(), a.contiguous() "
                                  "(Qwen3.5); reshapes of non-contiguous splits, rearrange copies and torch.cat "
                                  "(Qwen3-Next): new tensors, serving only"),
    "gdn_zeros": SaveRule(source=f"{GDN}.forward — core_attn_out = torch.zeros(num_tokens, v_heads/tp, head_v_dim)"),
    "gdn_core": SaveRule(source=f"{GDN}._forward_core — the gdn_attention_core custom op writes core_attn_out in "
                                "place; in the profile run (attn_metadata None) it only warms the chunked kernels "
                                "up on ≤ 64 tokens (_warmup_prefill_kernels) and returns"),
    "gdn_gated_norm": SaveRule(source="vllm-project/vllm@v0.19.0:vllm/model_executor/layers/layernorm.py: "
                                      "RMSNormGated.forward_cuda — a new output of its input's shape"),
}


def extend(rules: SaveRules) -> SaveRules:
    """``rules`` (the megatron rules) with the gated delta-net rules added; no rule of it is replaced."""
    return rules.extended(RULES)
