"""Saved-tensor rules the ``megatron`` profile adds for the Mamba-2 mixer of hybrid models.

What each op of :mod:`timeline.graph.families.mamba` keeps for its backward, read from NVIDIA/Megatron-LM
``megatron/core/ssm/mamba_mixer.py: MambaMixer.forward`` (194b2be238 … e4533afdfa) and state-spaces/mamba
v2.2.4 (``mamba-ssm~=2.2``, the same in v2.2.2 … v2.3.1). The rules extend
:data:`timeline.profiles.megatron.RULES` under new names only.
"""

from __future__ import annotations

from timeline.profiles.base import SaveRule, SaveRules

MIXER = "NVIDIA/Megatron-LM@46a90b0b6c:megatron/core/ssm/mamba_mixer.py: MambaMixer.forward"
SSD = "state-spaces/mamba@v2.2.4:mamba_ssm/ops/triton"

RULES: dict[str, SaveRule] = {
    "mamba_transpose": SaveRule(source=f"{MIXER} — rearrange(...).contiguous() copies; the copy keeps nothing "
                                       "(its consumer saves it)"),
    "mamba_fp32_params": SaveRule(source=f"{MIXER} — A = -torch.exp(A_log.float()) and dt_bias.float() are new "
                                         "fp32 tensors, kept by the scan that reads them"),
    "mamba_split_conv1d_scan": SaveRule(
        saves=("in:x", "extra:out_x", "in:A", "in:dt_bias"),
        source=f"{SSD}/ssd_combined.py: MambaSplitConv1dScanCombinedFn.forward — ctx.save_for_backward(zxbcdt, "
               "conv1d_weight, conv1d_bias, out_x, A, D, dt_bias, initial_states, seq_idx, rmsnorm_weight=None, "
               "rstd=None, outproj_weight=None, outproj_bias=None); out_x is _chunk_scan_fwd's ungated output "
               "(ssd_chunk_scan.py: torch.empty(batch, seqlen, nheads, headdim)) since Megatron passes z"),
    "mamba_gated_norm": SaveRule(
        saves=("in:x", "extra:rstd"),
        source=f"{SSD}/layernorm_gated.py: LayerNormFn.forward saves x, weight, bias, mean=None, rstd (fp32, "
               "ngroups·M), z=None (Megatron's ExtendedRMSNorm is RMSNormGated called without z)"),
}


def extend(rules: SaveRules) -> SaveRules:
    """``rules`` (the megatron rules) with the Mamba rules added; no rule of it is replaced."""
    return rules.extended(RULES)
