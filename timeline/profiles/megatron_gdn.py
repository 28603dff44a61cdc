"""Op rules the ``megatron`` layer library adds for the gated delta-net mixer (:mod:`timeline.graph.families.gdn`).

The serving mixer (an engine's step keeps nothing for a backward): each rule saves nothing; the sources say what
the op allocates, read at vLLM 0.19.0. The training mixer (Megatron-Core's ``GatedDeltaNet``, rules ``gdn_copy`` …
``gdn_gate_mul``): what each op keeps for its backward, read from Megatron-LM and flash-linear-attention 0.4.x at the
files :mod:`timeline.graph.families.gdn` names. The rules extend :data:`timeline.profiles.megatron.RULES` under new
names only. Under ``--deterministic-mode`` the conv and the chunk rule are torch ops (``gdn_conv_torch``,
``gdn_torch_chunk``).
"""

from __future__ import annotations

import math

from timeline.profiles.base import SaveRule, SaveRules

MCORE = "NVIDIA/Megatron-LM@core_v0.17.0:megatron/core/ssm/gated_delta_net.py: GatedDeltaNet"
MCORE_DET = "NVIDIA/Megatron-LM@core_v0.17.0:megatron/core/ssm/gated_delta_net.py"
FLA = "fla-org/flash-linear-attention@v0.4.1:fla"
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
    # training: Megatron-Core's GatedDeltaNet.forward on flash-linear-attention's kernels
    "gdn_copy": SaveRule(source=f"{MCORE}.forward / _prepare_qkv_for_gated_delta_rule — .contiguous() copies and "
                                "transposes; the copy keeps nothing (its consumer saves it)"),
    "gdn_conv": SaveRule(saves=("in:x",), source=f"{FLA}/modules/convolution.py: CausalConv1dFunction.forward — "
                                                 "ctx.save_for_backward(x, weight, bias, residual, initial_state)"),
    "gdn_l2norm": SaveRule(saves=("out:y", "extra:rstd"),
                           source=f"{FLA}/modules/l2norm.py: L2NormFunction.forward — ctx.save_for_backward(y, rstd)"),
    "gdn_gate": SaveRule(saves=("in:alpha", "in:beta"),
                         source=f"{MCORE}._compute_g_and_beta (jit_fuser: torch.compile) — g = -A_log.exp() · "
                                "softplus(alpha.float() + dt_bias), beta.sigmoid(); the compiled backward recomputes "
                                "both from the 16-bit alpha and beta it keeps"),
    "gdn_kkt": SaveRule(source=f"{FLA}/ops/gated_delta_rule/chunk.py: chunk_gated_delta_rule_fwd — chunk_local_cumsum "
                               "(fp32 g), chunk_scaled_dot_kkt_fwd (fp32 A) and solve_tril (A in k's dtype); "
                               "ChunkGatedDeltaRuleFunction saves g and A (rule gdn_chunk)"),
    "gdn_chunk": SaveRule(saves=("in:q", "in:k", "in:v", "in:g", "in:beta", "in:A"),
                          source=f"{FLA}/ops/gated_delta_rule/chunk.py: ChunkGatedDeltaRuleFunction.forward — "
                                 "ctx.save_for_backward(q, q_rstd=None, k, k_rstd=None, v, g, beta, A, "
                                 "initial_state=None, cu_seqlens, chunk_indices); w, u (recompute_w_u_fwd), h and "
                                 "v_new (chunk_gated_delta_rule_fwd_h) live until chunk_fwd_o returns"),
    # training under --deterministic-mode: torch ops instead of the conv and chunk kernels
    "gdn_conv_torch": SaveRule(saves=("in:x", "extra:preact"),
                               source=f"{MCORE}.forward — act_fn(self.conv1d(qkv)[..., :seq_len]) when "
                                      "config.deterministic_mode: the convolution (cuDNN) saves its input, the "
                                      "activation its input, a view of the whole [b, C, s + kernel − 1] output"),
    "gdn_torch_chunk": SaveRule(saves=("extra:kept", "extra:masks"), backward_scratch=("scratch:backward",),
                                source=f"{MCORE_DET}: torch_chunk_gated_delta_rule — every fp32 tensor its "
                                       "autograd graph saves (torch_chunk_elements below); "
                                       "the forward's last copies as a transient output; the backward's zero-filled "
                                       "per-chunk gradients as scratch"),
    "gdn_out_norm": SaveRule(saves=("in:x", "extra:rsigma"),
                             source=f"{MCORE}._apply_gated_norm — out_norm (TE's RMSNorm over one value head) keeps "
                                    "its input and fp32 rsigma"),
    "gdn_gate_mul": SaveRule(saves=("in:y", "in:gate"),
                             source=f"{MCORE}._apply_gated_norm (jit_fuser: torch.compile) — (y · silu(gate.float()))"
                                    ".to(dtype); the compiled backward keeps the 16-bit y and gate"),
}


#: fla's chunk size (``chunk_gated_delta_rule_fwd``: ``chunk_size=64``; ``A`` is ``[B, T, H, 64]``)
FLA_CHUNK = 64
#: ``torch_chunk_gated_delta_rule(..., chunk_size=64)`` (Megatron-Core's deterministic path)
TORCH_CHUNK = 64


def torch_chunk_elements(s: int, k: int, v: int) -> tuple[int, int, int]:
    """(kept, forward transient, backward peak): fp32 elements per sequence and head of
    ``torch_chunk_gated_delta_rule`` (NVIDIA/Megatron-LM core_v0.17.0 ``megatron/core/ssm/gated_delta_net.py``) on
    ``s`` tokens, key width ``k`` and value width ``v``, with ``n = ceil(s / 64)`` chunks of ``c = 64`` rows after
    ``F.pad``. Every tensor is fp32 (``.to(torch.float32)`` of each input).

    Kept for the backward (what autograd saves), per chunk: ``6c²`` — the decay ``exp`` result and its ``tril``,
    ``k_beta @ key.T`` (the multiply saves it), ``attn + eye`` (both later matmuls save it), and in the chunk loop
    ``q_i @ k_i.T`` and the masked ``attn`` ``@ v_new`` saves; ``7ck`` — the padded key, the scaled query,
    ``k_beta``, ``k_beta · exp(g)``, ``k_cumdecay`` and the loop's ``q_i · exp(g_i)`` and ``k_i · exp(g_last −
    g_i)`` (the last chunk's, which feeds only the dropped final state, is freed: ``− ck`` once); ``3cv`` — the
    padded value, ``v_beta``, each chunk's ``v_new``; ``4c + 1`` — the padded beta, ``exp(g)``, each chunk's
    ``exp(g_i)``, ``exp(g_last − g_i)`` and ``exp(g_last)``; ``kv`` — the recurrent state each chunk's matmuls
    save (the zeros, then each update); and the ``for i in range(1, c)`` loop's clones ``row [i]`` and
    ``sub [i, i]``, which their product saves: ``Σ i + i²``. Besides, two ``[c, c]`` bool masks per call.

    Forward transient at its peak (the function's last copies): ``value = attn @ v_beta`` and ``core_attn_out``
    (``2·n·c·v``), the cumulative ``g`` (``n·c``), the last chunk's two ``[c, v]`` products, and the fp32
    ``transpose(1, 2).contiguous()`` of the output (``s·v``) — a view on one head (``is_contiguous`` skips size-1
    dimensions), which the caller leaves out — beside the output's 16-bit cast (the op's output).

    Backward peak above what the forward kept: in the last chunk's backward, before any input gradient exists, the
    full-size zero-filled gradients ``select_backward`` makes for each chunk index of the fp32 query, key,
    ``k_cumdecay``, value and decay mask and their first accumulations — ``5nck + 2ncv + nc² + nc`` past the
    chunk's own saved tensors where keys are at least as wide as values, ``3nck + 4ncv + nc² + nc`` less a few
    chunk-sized tensors where values are wider (the larger of the two)."""
    c, n = TORCH_CHUNK, math.ceil(s / TORCH_CHUNK)
    clones = (c - 1) * c // 2 + (c - 1) * c * (2 * c - 1) // 6
    kept = n * (6 * c * c + 7 * c * k + 3 * c * v + 4 * c + 1 + k * v + clones) - c * k
    work = 2 * n * c * v + n * c + 2 * c * v + s * v
    keys = 5 * n * c * k + 2 * n * c * v + n * c * c + n * c - c * k - 2 * c * c - 3 * c - 1
    values = 3 * n * c * k + 4 * n * c * v + n * c * c + n * c - 2 * c * v - 3 * c * c - 3 * c - 1
    return kept, work, max(keys, values)


def extend(rules: SaveRules) -> SaveRules:
    """``rules`` (the megatron rules) with the gated delta-net rules added; no rule of it is replaced."""
    return rules.extended(RULES)
