"""Parameter rules: how a framework lays out parameters and manages their state (DESIGN §5).

A :class:`Profile` is a table of rules, each naming its source, consulted by the parameter
builders (``timeline.graph.families``) and the static-memory pass — never ``if profile == ...``
scattered through the layers. The op builders read the resulting widths off the parameter
TensorDefs, not off these rules. A framework's saved-tensor rules are in
:mod:`timeline.graph.saved`; :mod:`timeline.graph.framework` joins the two, and each fact lives
in exactly one of them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """One framework's parameter-layout rules (which tensors exist, how TP splits them, how their
    states shard)."""

    name: str
    #: MLA's W^QR (RoPE part of the query up-projection) split over TP, as in Megatron-Core's
    #: ``linear_q_up_proj`` (multi_latent_attention.py); the paper replicates it (2502.07846 Table 5)
    mla_q_rope_tp_split: bool
    #: the final RMSNorm/LayerNorm before the head is a parameter (paper: not counted, Table 3)
    final_norm: bool
    #: DeepSeek-V3's per-expert fp32 score-correction bias is held (paper omits it; Megatron keeps
    #: ``expert_bias`` as an fp32 buffer in ``moe/router.py``)
    router_bias: bool
    #: shared experts are TP-split (Megatron ``SharedExpertMLP`` extends ``MLP``); the paper
    #: replicates one shared expert on every EP rank (Table 6)
    shared_experts_tp_split: bool
    #: which MoE parameters shard over EDP: "moe" = the whole MoE block (router, shared and routed
    #: experts; paper Table 8) or "routed" = routed experts only (Megatron's expert DDP buffers)
    expert_state_group: str
    #: vocabulary padded to a multiple of this × tp (Megatron ``--make-vocab-size-divisible-by 128``)
    vocab_pad: int
    #: the MTP stage builds its own embedding when it is not the first stage (Megatron GPTModel
    #: builds ``self.embedding`` for ``pre_process or mtp_process``)
    mtp_embedding: bool
    #: the MTP module's eh_proj is column-parallel (Megatron ``multi_token_prediction.py``)
    mtp_eh_proj_tp_split: bool
    #: the model builds its MTP modules (transformers' DeepseekV3ForCausalLM builds none)
    mtp_modules: bool


# The lifecycle facts validation needs (ZeRO levels, one device per replica) are in
# :data:`timeline.spec.profiles.PROFILES`, keyed by the same names.

PAPER = Profile(name="paper", mla_q_rope_tp_split=False, final_norm=False, router_bias=False,
                shared_experts_tp_split=False, expert_state_group="moe", vocab_pad=1,
                mtp_embedding=False, mtp_eh_proj_tp_split=False, mtp_modules=True)
MEGATRON = Profile(name="megatron", mla_q_rope_tp_split=True, final_norm=True, router_bias=True,
                   shared_experts_tp_split=True, expert_state_group="routed", vocab_pad=128,
                   mtp_embedding=True, mtp_eh_proj_tp_split=True, mtp_modules=True)
HF = Profile(name="hf", mla_q_rope_tp_split=True, final_norm=True, router_bias=True,
             shared_experts_tp_split=True, expert_state_group="routed", vocab_pad=1,
             mtp_embedding=False, mtp_eh_proj_tp_split=False, mtp_modules=False)
