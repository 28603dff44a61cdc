"""The ``paper`` profile: Korthikanti et al. 2022 and arXiv 2502.07846 — parameter rules, saved-tensor
rules, op structure, lifecycle and limits.

Eager attention that materialises the s² softmax output, its 1-byte dropout mask and the
dropout output; unfused LayerNorm/RMSNorm keeping only their input (no mean/rstd); GeLU input;
1-byte dropout masks after attention and MLP (Korthikanti et al. 2022 §4.1, Table 2). DeepSeek
MLA and MoE follow arXiv 2502.07846 §5–6: compressed q/kv kept at full sequence, router logits
and probabilities, 2-byte top-k routing info, experts fed ``b·s·top_k/ep`` rows, a replicated
shared expert on full ``b·s``; full recompute checkpoints the attention and MoE sub-blocks apart
and keeps the routing info. Every GEMM keeps its input for the weight gradient. Parameters: W^QR
replicated (Table 5), no final norm (Table 3), one shared expert replicated on every EP rank
(Table 6), the whole MoE block's states sharded over EDP (Table 8). All static state counts from
the start (the paper's static accounting); ZeRO 0–3 as DeepSpeed defines them, with its buckets
(``runtime/zero/config.py`` defaults).
"""

from __future__ import annotations

from timeline.profiles.base import Lifecycle, Limits, ParamRules, Profile, SaveRule, SaveRules, Structure

K22 = "Korthikanti et al. 2022 §4.1 (Table 2)"
DS = "arXiv 2502.07846 §6 (Table 9/10)"

RULES: dict[str, SaveRule] = {
    "embedding": SaveRule(source=f"{K22}: the embedding keeps nothing but its dropout mask"),
    "layernorm": SaveRule(saves=("in:x",), source=f"{K22}: LayerNorm input 2sbh"),
    "rmsnorm": SaveRule(saves=("in:x",), source=f"{DS}: RMSNorm input 2bsh"),
    "latent_norm": SaveRule(source=f"{DS}: c_Q/c_KV counted once, as the up-projection inputs"),
    "linear": SaveRule(saves=("in:_save",), wgrad=("in:_save",),
                       source=f"{K22}: a GEMM keeps its input (QKV, output-projection, fc1, fc2 inputs)"),
    "grouped_linear": SaveRule(saves=("in:_save",), wgrad=("in:_save",),
                               source=f"{DS}: expert input 2·E_token·h; SwiGLU terms of 8·E_token·h_E"),
    "attn_scores": SaveRule(saves=("in:q", "in:k"), source=f"{K22}: Q and K 4sbh"),
    "softmax": SaveRule(saves=("out:y",), source=f"{K22}: softmax output 2as²b"),
    "attn_dropout": SaveRule(saves=("extra:mask",), source=f"{K22}: softmax dropout mask as²b"),
    "attn_v": SaveRule(saves=("in:p", "in:v"), source=f"{K22}: attention over V: dropout output 2as²b and V 2sbh"),
    "dropout": SaveRule(saves=("extra:mask",), source=f"{K22}: dropout mask sbh"),
    "gelu": SaveRule(saves=("in:x",), source=f"{K22}: GeLU input 8sbh"),
    "swiglu": SaveRule(saves=("in:x", "extra:silu"),
                       source=f"{DS}: gate and up outputs and silu(gate) (6 of the 8·E_token·h_E bytes)"),
    "clamped_swiglu": SaveRule(saves=("in:x", "extra:glu"),
                               source=f"{DS}: the paper's SwiGLU terms (gate and up outputs, the activated gate); "
                                      "it has no clamp of its own"),
    "rope": SaveRule(source="RoPE's backward needs only cos/sin"),
    "add": SaveRule(source="a residual add keeps nothing"),
    "scale": SaveRule(source="a multiply by a scalar keeps nothing"),
    "router_score": SaveRule(saves=("in:x", "out:y"), source=f"{DS}: router logits and probabilities 4bsN"),
    "topk": SaveRule(saves=("out:idx",), keep_under_recompute=("out:idx",),
                     source=f"{DS}: top-k routing info 2bsN_r, kept under full recompute"),
    "permute": SaveRule(source=f"{DS}: dispatch keeps nothing beyond the routing info"),
    "unpermute": SaveRule(source=f"{DS}: combine keeps nothing"),
    "ce_loss": SaveRule(saves=("extra:exp_logits",),
                        source="Korthikanti et al. 2022 §4.3: output layer and loss 4sbh/t·(1 + V/h) (fp32 softmax)"),
    "concat": SaveRule(source="a concatenation keeps nothing"),
    "comm": SaveRule(source="collectives keep nothing"),
}

PARAMS = ParamRules(mla_q_rope_tp_split=False, final_norm=False, router_bias=False, shared_experts_tp_split=False,
                    expert_state_group="moe", vocab_pad=1, mtp_embedding=False, mtp_eh_proj_tp_split=False,
                    mtp_modules=True)

STRUCTURE = Structure(attention="eager", dropout=True, fused_norm_linear=False, moe_tokens="paper",
                      mla_latent_sp=False, full_recompute_moe_split=True, swiglu_extra=True)

LIFECYCLE = Lifecycle("start", "start", "start", "arXiv 2502.07846 §4 static accounting; DeepSpeed ZeRO buckets",
                      reduce_bucket_elems=500_000_000, prefetch_bucket_elems=50_000_000)

PROFILE = Profile(name="paper", params=PARAMS, saved=SaveRules(name="paper", rules=RULES), structure=STRUCTURE,
                  lifecycle=LIFECYCLE, limits=Limits(max_zero=3, zero_note="ZeRO 0–3 as DeepSpeed defines them"))
