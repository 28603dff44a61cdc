"""Megatron-LM's legacy GPT model (``--use-legacy-models``, ``[framework] use_legacy_models``) as its
differences from the local Megatron-Core model (``--transformer-impl local``) the ``megatron`` profile
already models.

Read at ``NVIDIA/Megatron-LM@60166922d3`` (2025-02-03, the commit of the collected legacy records; the
memory-relevant code is the same at core_v0.12.0 … core_v0.17.x, the last release with
``megatron/legacy/model/gpt_model.py``, removed by 39ec5ebeb4 for 0.18.0). ``pretrain_gpt.py:
model_provider`` builds ``megatron.legacy.model.GPTModel`` with ``parallel_output=True``; per layer
(``megatron/legacy/model/transformer.py: ParallelTransformerLayer.forward``) that is, *as the local Core
layer* (``core/models/gpt/gpt_layer_specs.py: get_gpt_layer_local_spec``):

- the norms before attention and the MLP are apart from the linears (``utils.py: get_norm`` →
  ``fused_layer_norm.py: MixedFusedLayerNorm``, apex's ``fused_layer_norm_affine`` / ``FastLayerNormFN``,
  as Core's ``FusedLayerNorm``);
- ``ParallelAttention.forward``: one ``query_key_value`` ColumnParallelLinear output, viewed
  ``[s, b, ng, (np/ng + 2)·hn]`` and ``torch.split`` into q, k, v views (Core's ``mixed_qkv``), held until
  ``self.dense`` returns; ``CoreAttention.forward`` is Core's ``DotProductAttention.forward`` op for op
  (baddbmm into the ``"mpu"`` GlobalMemoryBuffer, ``FusedScaleMaskSoftmax``, attention dropout, bmm), and
  ``--recompute-granularity selective`` checkpoints exactly it (``_checkpointed_attention_forward``);
- ``ParallelMLP.forward``: ``bias_gelu_impl`` (``fused_bias_gelu.py``: GeLUFunction keeps input and bias)
  or, without the fusion, ``x + bias`` then ``F.gelu`` (keeps the sum); ``bias_dropout_add_fused_train``
  (jit_fuser) as Core's ``bias_dropout_add``;
- ``language_model.py: Embedding.forward`` (word + learned position embeddings, transposed, scattered
  under SP, dropout) and ``parallel_lm_logits`` (``linear_with_grad_accumulation_and_async_allreduce``);
  ``gpt_model.py: post_language_model_processing`` passes ``output.float()`` to
  ``vocab_parallel_cross_entropy``, whose ``calculate_logits_max`` ``.float()`` is then the identity and
  whose in-place steps turn that copy into ``exp_logits`` — the one fp32 [s, b, v/tp] tensor Core's loss
  makes inside the function;
- ``ParallelTransformer._checkpointed_forward`` (uniform / block) as Core's ``TransformerBlock``.

What differs, and is modelled here:

- ``rms_norm.py: RMSNorm.forward`` is torch ops: ``self._norm(x.float()).type_as(x) * self.weight`` —
  ``x.float()`` (an fp32 copy ``pow`` and the product keep), ``rsqrt`` (keeps its fp32 [rows, 1] result),
  ``.type_as(x)`` (a 16-bit copy the weight's product keeps): ``Structure.rmsnorm_ops``;
- ``ParallelMLP`` with ``--swiglu`` runs ``torch.chunk`` then ``F.silu(x[0]) * x[1]``: silu keeps its input
  (a view of the fc1 output, kept whole) and the product keeps silu's output and the up half:
  ``Structure.swiglu_ops`` (Core's ``bias_swiglu_impl`` keeps the fc1 output only).

Under ``--transformer-impl transformer_engine`` (the default) ``ParallelTransformer.build_layer`` builds TE's
``TransformerLayer`` instead (``fuse_qkv_params=True``, ``set_parallel_mode=True``, ``layer_type="encoder"``):
``MultiheadAttention`` (``LayerNormLinear`` q/k/v split into views, RoPE by TE's ``FusedRoPEFunc``,
``DotProductAttention``, the row-parallel ``Linear`` projection), ``_bias_dropout_add``
(``bias_dropout_add_fused_train``), ``LayerNormMLP`` and again ``_bias_dropout_add`` — read at
``NVIDIA/TransformerEngine@v1.13`` (``transformer.py``, ``attention.py: MultiheadAttention.forward``,
``module/layernorm_mlp.py: _LayerNormMLP.forward``). ``LayerNormMLP`` keeps what Core's TE spec keeps over
``TELayerNormColumnParallelLinear`` + activation + ``TERowParallelLinear``: the input, ``mu`` / ``rsigma``,
``ln_out``, ``fc1_out`` (before the bias under ``bias_gelu_fused``) and the activation's output. So the layers
are Core's TE layers; only the final norm is the legacy model's (``utils.py: get_norm``: apex
``MixedFusedLayerNorm``, the same bytes as TE's norm, or the torch-op RMSNorm above:
``Structure.final_rmsnorm_ops``).

With ``--use-flash-attn`` (``[framework] legacy_flash_attn``) the local layer's ``ParallelAttention.forward``
skips ``CoreAttention`` (and its checkpoint under selective recompute) for ``FlashSelfAttention``: ``q, k, v =
[rearrange(x, 's b ... -> b s ...').contiguous() …]`` (copies, as TE's FlashAttention backend makes them:
``Structure.te_flash_copies``), flash-attn 2's ``flash_attn_varlen_func`` on their ``(b s)`` rows (it keeps them,
its output, ``softmax_lse`` and the rng state; its backward's workspaces: :mod:`timeline.graph.families.flash_bwd`
with ``Structure.flash_varlen``), then ``rearrange(context, 'b s h d -> s b (h d)').contiguous()``.

What the legacy model cannot run, or runs through code not modelled, ``timeline from-megatron`` refuses
(:mod:`timeline.io.megatron_legacy`).
"""

from __future__ import annotations

from dataclasses import replace

from timeline.profiles.base import SaveRule, SaveRules, Structure

LEGACY = "NVIDIA/Megatron-LM@60166922d3:megatron/legacy/model"

RULES: dict[str, SaveRule] = {
    "upcast": SaveRule(source=f"{LEGACY}/rms_norm.py: RMSNorm.forward — x.float() (ToCopyBackward keeps nothing; "
                              "the copy is kept by the norm's ops)"),
    "rmsnorm_ops": SaveRule(saves=("in:x", "extra:rsigma", "extra:normed"),
                            source=f"{LEGACY}/rms_norm.py: RMSNorm._norm — x.pow(2) and x * rsqrt(…) keep the fp32 "
                                   "copy x, rsqrt keeps its fp32 [rows, 1] result; forward's .type_as(x) * "
                                   "self.weight keeps the 16-bit normalised tensor"),
    # transformer.py: SwitchMLP.forward (graph/families/switch_mlp.py)
    "switch_sinkhorn": SaveRule(source=f"{LEGACY}/transformer.py: SwitchMLP.forward — sinkhorn and torch.max under "
                                       "torch.no_grad(): the int64 max_ind, nothing kept for a backward"),
    "switch_sigmoid": SaveRule(saves=("out:y",), source=f"{LEGACY}/transformer.py: SwitchMLP.forward — "
                                                        "torch.sigmoid(route) keeps its result"),
    "switch_select": SaveRule(saves=("extra:arange", "in:_idx"),
                              source=f"{LEGACY}/transformer.py: SwitchMLP.forward — route[torch.arange(T), max_ind] "
                                     "(IndexBackward keeps both int64 index vectors)"),
    "switch_alloc": SaveRule(source=f"{LEGACY}/transformer.py: SwitchMLP.forward — torch.zeros_like of the gathered "
                                    "rows, (global_indices == e).nonzero(): new tensors, no autograd node"),
    "switch_index": SaveRule(saves=("in:_idx",),
                             source=f"{LEGACY}/transformer.py: SwitchMLP.forward — global_hidden_states[local_indices, "
                                    ":] (IndexBackward keeps the indices, not its source)"),
    "switch_index_put": SaveRule(source=f"{LEGACY}/transformer.py: SwitchMLP.forward — output_total[local_indices, :] = "
                                        "output in place (IndexPutBackward keeps the same indices, kept by the index)"),
    "switch_weight": SaveRule(saves=("in:x", "in:p"),
                              source=f"{LEGACY}/transformer.py: SwitchMLP.forward — output_total * max_prob "
                                     "(MulBackward keeps both factors)"),
}


def extend(rules: SaveRules) -> SaveRules:
    """``rules`` (the megatron rules) with the legacy model's rules added; no rule is replaced."""
    return rules.extended(RULES)


def configure(table: Structure, *, local: bool, flash: bool = False) -> Structure:
    """The Core structure (``table``, configured for the run's ``transformer_impl``) as the legacy model
    runs it: under the local layer, torch-op RMSNorm and SwiGLU; under TE's ``TransformerLayer`` (whose
    norms are inside ``LayerNormLinear`` / ``LayerNormMLP`` and whose SwiGLU is TE's, as Core's TE layer
    spec), the final norm alone (``utils.py: get_norm`` on the last stage) as the legacy RMSNorm."""
    if local and flash:  # transformer.py: ParallelAttention.forward with use_flash_attn (module docstring)
        table = replace(table, attention="flash", te_flash_copies=True, flash_bwd="fa2", flash_varlen=True)
    if local:  # its MoE layers are transformer.py: SwitchMLP (graph/families/switch_mlp.py)
        return replace(table, rmsnorm_ops=True, swiglu_ops=True, switch_mlp=True)
    return replace(table, final_rmsnorm_ops=True)
