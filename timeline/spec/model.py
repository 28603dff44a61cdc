"""The model architecture, by Hugging Face field names.

One :class:`ModelSpec` covers the layer families the graph builds: GPT-style (LayerNorm,
GeLU MLP, learned positions), Llama-style (RMSNorm, SwiGLU, RoPE, MHA/GQA), Mixtral/Qwen MoE,
DeepSeek (MLA, shared + routed experts, MTP), GPT-OSS (sliding-window and full attention layers,
a learned softmax sink per head, biased router and experts, a clamped SwiGLU), and hybrid Mamba models
(Nemotron-H, Megatron-Core's ``MambaModel``: one Mamba-2 mixer, attention, MLP or MoE block per layer). Field names follow Hugging Face
``config.json`` so a user can override any of them in ``[model]`` by the name they know;
:data:`ALIASES` maps other spellings (GPT-2's ``n_embd``, Mixtral's ``num_local_experts``, …).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from timeline.spec.fields import spec_field
from timeline.spec.hf_activations import HF_ACTIVATIONS

#: the most decoder layers a model may have: ten times the deepest published LLM (GPT-3-style
#: 1T: 128), so templates stay buildable in seconds; shapes are capped likewise (hidden_size
#: 2**20, vocab_size 2**24, …) so that every tensor's byte count fits the allocator model.
MAX_LAYERS = 1280

#: the model classes the layer library builds (``ModelSpec.architecture``)
ARCHITECTURES = ("gpt", "bert", "t5", "llava")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    name: str = spec_field("custom", doc="label used in outputs")
    model_type: str = spec_field("llama", doc="architecture family (Hugging Face model_type)")
    architecture: str = spec_field("gpt", choices=ARCHITECTURES, doc=(
        "the model class around the layers: gpt (a causal decoder: Megatron-Core's GPTModel, every Hugging Face "
        "causal LM), bert (Megatron-Core's BertModel: bidirectional self-attention under the padding mask, the LM "
        "head's transform, the binary head), t5 (Megatron-Core's T5Model: encoder_layers bidirectional layers under "
        "the padding mask, then decoder layers with cross-attention over the encoder's output, decoder_seq_len "
        "tokens), llava (Megatron-Core's LLaVAModel as pretrain_vlm.py builds it: a CLIP ViT of vision_layers layers "
        "on each image, an MLP projector, and the GPT decoder over the text with the image's embeddings in place of "
        "its image token); megatron profile only for bert, t5 and llava"))
    encoder_layers: int = spec_field(0, nonneg=True, maximum=MAX_LAYERS, doc=(
        "T5: the first this many of num_hidden_layers are the encoder (Megatron --encoder-num-layers), the rest "
        "the decoder"))
    type_vocab_size: int = spec_field(0, nonneg=True, maximum=2**16, doc=(
        "token-type (segment) embedding rows (BERT; Megatron num_tokentypes = 2 with the binary head)"))
    binary_head: bool = spec_field(False, doc="BERT's pooler and 2-way sentence-order head (Megatron "
                                   "--bert-binary-head, the default; --bert-no-binary-head: false)")
    # LLaVA (Megatron-Core models/multimodal/llava_model.py, pretrain_vlm.py): the ViT copies the language model's
    # transformer config (hidden size, heads, FFN, norm, activation, biases), so only its depth and image are given
    vision_layers: int = spec_field(0, nonneg=True, maximum=MAX_LAYERS, doc=(
        "llava: the CLIP ViT's transformer layers (Megatron --encoder-num-layers)"))
    image_height: int = spec_field(336, positive=True, maximum=2**16, doc="llava: input image height (--img-h)")
    image_width: int = spec_field(336, positive=True, maximum=2**16, doc="llava: input image width (--img-w)")
    patch_size: int = spec_field(14, positive=True, maximum=2**12, doc="llava: ViT patch side (--patch-dim)")
    vision_class_token: str = spec_field("keep", choices=("keep", "drop"), doc=(
        "llava: whether the ViT's class token reaches the language model (drop: --disable-vision-class-token)"))
    frozen: tuple[str, ...] = spec_field((), choices=("language", "vision"), doc=(
        "llava: modules without gradients or optimizer states (--freeze-LM: language, --freeze-ViT: vision)"))
    hidden_size: int = spec_field(4096, positive=True, maximum=2**20)
    num_hidden_layers: int = spec_field(32, positive=True, maximum=MAX_LAYERS)
    num_attention_heads: int = spec_field(32, positive=True, maximum=2**16)
    num_key_value_heads: int = spec_field(0, nonneg=True, maximum=2**16, doc="0 = num_attention_heads")
    head_dim: int = spec_field(0, nonneg=True, maximum=2**16, doc="0 = hidden_size / num_attention_heads")
    intermediate_size: int = spec_field(11008, positive=True, maximum=2**22, doc="dense FFN width")
    vocab_size: int = spec_field(32000, positive=True, maximum=2**24)
    max_position_embeddings: int = spec_field(4096, positive=True, maximum=2**30)
    norm: str = spec_field("rmsnorm", choices=("rmsnorm", "layernorm"))
    hidden_act: str = spec_field("silu", choices=tuple(HF_ACTIVATIONS),
                                 doc="a Hugging Face ACT2FN name; the hf profile keeps what its expression keeps "
                                     "(spec/hf_activations.py), the others read every GeLU as the fused one; "
                                     "relu2 = squared ReLU (Megatron --squared-relu)")
    position_embedding: str = spec_field("rope", choices=("rope", "learned", "none"))
    attention_bias: bool = spec_field(False, doc="biases on Q/K/V projections")
    linear_bias: bool = spec_field(False, doc="biases on every linear layer (GPT)")
    qk_norm: bool = spec_field(False, doc="per-head RMSNorm on q and k (Qwen3)")
    qk_norm_full: bool = spec_field(False, doc=(
        "qk_norm over each projection's whole width (all of a rank's heads at once, its weight split by tp): "
        "MiniMax-M2's qk_norm_type per_layer (vLLM MiniMaxText01RMSNormTP)"))
    attention_dropout: float = spec_field(0.0, minimum=0.0, maximum=1.0)
    hidden_dropout: float = spec_field(0.0, minimum=0.0, maximum=1.0)
    tie_word_embeddings: bool = spec_field(False)
    # GPT-OSS: per-layer attention kinds, learned sinks, biases on o_proj, router and experts, clamped SwiGLU
    layer_types: tuple[str, ...] = spec_field((), choices=("full_attention", "sliding_attention", "linear_attention"),
                                              doc="attention kind per decoder layer (linear_attention: a gated "
                                                  "delta-net mixer, Qwen3-Next / Qwen3.5); empty = all full")
    sliding_window: int = spec_field(0, nonneg=True, maximum=2**26, doc="keys a sliding_attention layer sees")
    attention_sinks: bool = spec_field(False, doc="a learned softmax sink logit per attention head (GPT-OSS)")
    sink_fixed: bool = spec_field(False, doc="with attention_sinks: the sink logit is a fixed zero (TE's softmax_type "
                                             "off-by-one), a plain fp32 tensor per layer, no parameter")
    attention_out_bias: bool = spec_field(False, doc="bias on the attention output projection (GPT-OSS)")
    rope_scaled_positions: int = spec_field(0, nonneg=True, maximum=2**31,
                                           doc="positions the config's rope_scaling extends the model to (vLLM: "
                                               "its cos/sin cache and its derived max_model_len); 0 = "
                                               "max_position_embeddings")
    partial_rotary_factor: float = spec_field(1.0, minimum=0.0, maximum=1.0, doc=(
        "the share of each head's dimensions RoPE rotates (vLLM get_rope's rotary_dim = head_dim · factor; its "
        "cos/sin cache is that wide)"))
    attention_output_gate: bool = spec_field(False, doc="a sigmoid gate on the attention output, its q-wide "
                                                        "projection fused into linear_qkv (Megatron "
                                                        "--attention-output-gate)")
    router_logit_bias: bool = spec_field(False, doc="trainable bias on the router's linear (GPT-OSS)")
    expert_linear_bias: bool = spec_field(False, doc="biases on the routed experts' linears (GPT-OSS)")
    swiglu_limit: float = spec_field(0.0, minimum=0.0, maximum=1e6,
                                     doc="SwiGLU clamp: gate ≤ limit, |up| ≤ limit; 0 = unclamped")
    swiglu_alpha: float = spec_field(1.0, minimum=0.0, maximum=1e3, doc="gate · sigmoid(alpha · gate)")
    glu_linear_offset: float = spec_field(0.0, minimum=-1e3, maximum=1e3, doc="(up + offset) · act(gate)")
    # Gemma-2: tanh soft-capping of the attention logits and of the output logits; 0 = none
    attn_logit_softcapping: float = spec_field(0.0, minimum=0.0, maximum=1e6,
                                               doc="logits = cap · tanh(logits / cap) in attention; 0 = none")
    final_logit_softcapping: float = spec_field(0.0, minimum=0.0, maximum=1e6,
                                                doc="the same on the output layer's logits; 0 = none")
    # μP (Megatron-Core use_mup): the embeddings and the logits multiplied by a scalar, each a copy of its tensor
    mup_embedding_mult: float = spec_field(1.0, minimum=1e-12, maximum=1e12, doc=(
        "μP: the embedding output times this (LanguageModelEmbedding.forward under use_mup, a copy); 1 = none"))
    mup_output_mult: float = spec_field(1.0, minimum=1e-12, maximum=1e12, doc=(
        "μP: the logits times this (LanguageModule._scale_logits under use_mup, a copy, MTP heads too); 1 = none"))
    # Multi-head latent attention (DeepSeek); kv_lora_rank = 0 means ordinary MHA/GQA.
    q_lora_rank: int = spec_field(0, nonneg=True, maximum=2**20, doc="0 = no query compression")
    kv_lora_rank: int = spec_field(0, nonneg=True, maximum=2**20, doc="0 = not MLA")
    qk_nope_head_dim: int = spec_field(0, nonneg=True, maximum=2**16)
    qk_rope_head_dim: int = spec_field(0, nonneg=True, maximum=2**16)
    v_head_dim: int = spec_field(0, nonneg=True, maximum=2**16)
    # Mixture of experts; n_routed_experts = 0 means a dense model.
    n_routed_experts: int = spec_field(0, nonneg=True, maximum=2**16)
    n_shared_experts: int = spec_field(0, nonneg=True, maximum=2**10)
    moe_intermediate_size: int = spec_field(0, nonneg=True, maximum=2**22)
    shared_expert_intermediate_size: int = spec_field(0, nonneg=True, maximum=2**22, doc="0 = n_shared_experts × moe_intermediate_size")
    shared_expert_gate: bool = spec_field(False, doc="sigmoid gate on the shared expert (Qwen-MoE)")
    moe_latent_size: int = spec_field(0, nonneg=True, maximum=2**22, doc=(
        "Megatron --moe-latent-size (latent MoE, Nemotron-3): the routed experts, their dispatch and combine run "
        "in this width between two replicated projections (fc1/fc2_latent_proj, moe_layer.py); 0 = hidden_size"))
    num_experts_per_tok: int = spec_field(0, nonneg=True, maximum=2**16)
    first_k_dense_replace: int = spec_field(0, nonneg=True, maximum=MAX_LAYERS)
    moe_layer_freq: int = spec_field(1, positive=True, maximum=MAX_LAYERS)
    mlp_layer_types: tuple[str, ...] = spec_field((), choices=("dense", "moe"),
                                                  doc="per decoder layer, an MoE block or a dense MLP (Megatron's "
                                                      "--moe-layer-freq list when no first-k / every-n rule gives "
                                                      "it); empty = first_k_dense_replace and moe_layer_freq")
    router_bias: bool = spec_field(False, doc="per-expert fp32 score-correction bias (DeepSeek-V3 noaux_tc)")
    norm_topk_prob: bool = spec_field(False, doc="renormalise the top-k routing weights (Qwen-MoE, Mixtral always)")
    mtp_layers: int = spec_field(0, nonneg=True, maximum=64, doc="multi-token-prediction modules (num_nextn_predict_layers)")
    mtp_repeated_layer: bool = spec_field(False, doc="the MTP depths run one module, its parameters once (Megatron's "
                                          "--mtp-use-repeated-layer, core_v0.17.0 on)")
    index_n_heads: int = spec_field(0, nonneg=True, maximum=2**12, doc="heads of DeepSeek-V3.2's lightning indexer "
                                    "(sparse attention, DSA); 0 = dense attention")
    index_head_dim: int = spec_field(128, positive=True, maximum=2**12, doc="the indexer's head dimension")
    index_topk: int = spec_field(2048, positive=True, maximum=2**20, doc="keys each query's sparse attention keeps")
    # Hybrid Mamba models (Nemotron-H config.json names): one character per decoder layer, as Megatron-Core's
    # megatron/core/ssm/mamba_hybrid_layer_allocation.py Symbols spells it: M Mamba-2 mixer, * self-attention,
    # - MLP, E MoE; each layer holds that one block (its norm fused into the first linear) and a residual add
    hybrid_override_pattern: str = spec_field("", doc="hybrid layer kinds, one of M * - E per layer; empty = "
                                                      "every layer attention + MLP/MoE")
    mamba_num_heads: int = spec_field(0, nonneg=True, maximum=2**16, doc="0 = 2·hidden_size / mamba_head_dim")
    mamba_head_dim: int = spec_field(64, positive=True, maximum=2**16)
    ssm_state_size: int = spec_field(128, positive=True, maximum=2**16, doc="Mamba-2 state size (d_state)")
    n_groups: int = spec_field(8, positive=True, maximum=2**16, doc="Mamba-2 B/C groups")
    conv_kernel: int = spec_field(4, positive=True, maximum=64, doc="Mamba-2 causal conv1d width (d_conv)")
    # Gated delta-net layers (Qwen3-Next / Qwen3.5 config.json names), the ``linear_attention`` entries of layer_types
    linear_num_key_heads: int = spec_field(16, positive=True, maximum=2**12, doc="gated delta-net q/k heads")
    linear_num_value_heads: int = spec_field(32, positive=True, maximum=2**12, doc="gated delta-net v heads")
    linear_key_head_dim: int = spec_field(128, positive=True, maximum=2**12)
    linear_value_head_dim: int = spec_field(128, positive=True, maximum=2**12)
    linear_conv_kernel_dim: int = spec_field(4, positive=True, maximum=64, doc="gated delta-net causal conv1d width")
    mamba_ssm_dtype: str = spec_field("", choices=("", "fp32", "bf16", "fp16"), doc=(
        "dtype of a recurrent layer's state in an engine's cache (Qwen3.5's config.json mamba_ssm_dtype); empty = "
        "the cache's dtype"))

    # -- derived -------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts > 0

    @property
    def gated_mlp(self) -> bool:
        """SwiGLU-style gate+up projections (silu, or GeGLU where the family's code gates a GeLU: Gemma);
        GPT's GeLU MLP has one input matrix."""
        if self.model_type in CODE_FACTS["plain_mlp"]:
            return False
        return self.hidden_act == "silu" or self.model_type in CODE_FACTS["gated_gelu"]

    # -- what a family's own modelling code does that its config does not say (read where the profile runs
    # that code: ``Structure.model_code``); derived from ``model_type`` so that every written output and
    # every field stays as it was (:data:`CODE_FACTS`)
    @property
    def fused_qkv(self) -> bool:
        """One QKV projection whose output q, k and v are views of (GPT-2 ``c_attn(x).split``)."""
        return self.model_type in CODE_FACTS["fused_qkv"]

    @property
    def residual_dropout(self) -> bool:
        """Dropout modules after the embeddings, attention and MLP wherever ``hidden_dropout`` > 0 (GPT-2's
        ``resid_pdrop``); Llama/Mistral/Qwen modelling code has none."""
        return self.model_type in CODE_FACTS["residual_dropout"]

    @property
    def router_score(self) -> str:
        """How the router scores experts: ``sigmoid`` then top-k (DeepSeek-V3), ``softmax`` (fp32, of the
        16-bit logits) then top-k (Mixtral, Qwen-MoE), or ``topk_softmax``: top-k of the logits, then a
        softmax over those k in the logits' dtype (GPT-OSS)."""
        for score in ("softmax", "topk_softmax"):
            if self.model_type in CODE_FACTS[f"router_{score}"]:
                return score
        return "sigmoid"

    @property
    def router_weights_cast(self) -> bool:
        """The top-k routing weights are cast back to the logits' dtype, renormalised only with
        ``norm_topk_prob`` (Qwen-MoE); else they stay fp32 and are always renormalised (Mixtral)."""
        return self.model_type in CODE_FACTS["router_weights_cast"]

    @property
    def rope_half_width(self) -> bool:
        """RoPE's cos/sin are head_dim / 2 wide (GPT-OSS ``GptOssRotaryEmbedding``: emb = freqs)."""
        return self.model_type in CODE_FACTS["rope_half_width"]

    @property
    def embedding_dropout(self) -> bool:
        """Dropout on the embeddings' sum too, where ``residual_dropout`` (GPT-2; not OPT)."""
        return self.residual_dropout and self.model_type not in CODE_FACTS["no_embedding_dropout"]

    @property
    def position_offset_rows(self) -> int:
        """Rows a learned position table has beyond ``max_position_embeddings`` (OPT's offset of 2); its ids are
        then computed per row, ``(b, s)`` (else GPT-2's ``arange``, ``(1, s)``)."""
        return 2 if self.model_type in CODE_FACTS["position_offset_rows"] else 0

    @property
    def norm_output_fp32(self) -> bool:
        """RMSNorm keeps its normalised tensor in fp32 (GPT-OSS ``(weight * hidden_states).to(input_dtype)``;
        Gemma ``output * (1.0 + self.weight.float())``, then ``type_as(x)``)."""
        return self.model_type in CODE_FACTS["norm_output_fp32"]

    @property
    def norm_weight_offset(self) -> bool:
        """RMSNorm scales by ``1 + weight`` in fp32 (Gemma ``GemmaRMSNorm``: ``output * (1.0 +
        self.weight.float())``): the product keeps that fp32 [hidden] tensor and the fp32 normalised one."""
        return self.model_type in CODE_FACTS["norm_weight_offset"]

    @property
    def eager_attention(self) -> bool:
        """The family's code runs eager attention (``q·kᵀ``, softmax and ``·V`` as ops; Gemma-2)."""
        return self.model_type in CODE_FACTS["eager_attention"]

    @property
    def sandwich_norms(self) -> bool:
        """A norm after attention and one after the MLP too, each before its residual add (Gemma-2)."""
        return self.model_type in CODE_FACTS["sandwich_norms"]

    @property
    def parallel_residual(self) -> bool:
        """Attention and the MLP both read the one input norm's output; the layer adds both to its input (Phi)."""
        return self.model_type in CODE_FACTS["parallel_residual"]

    @property
    def local_rope(self) -> bool:
        """The sliding layers rotate by a RoPE table of their own, the full layers by the (scaled) global one
        (Gemma-3)."""
        # Gemma3Attention picks the table by the layer's type (``is_sliding``), whatever its window
        return self.model_type in CODE_FACTS["local_rope"] and "sliding_attention" in self.layer_types

    @property
    def head_bias(self) -> bool:
        """The output layer has a bias of ``vocab`` elements (Phi's ``lm_head``)."""
        return self.model_type in CODE_FACTS["head_bias"]

    @property
    def shared_ffn(self) -> int:
        return self.shared_expert_intermediate_size or self.n_shared_experts * self.moe_intermediate_size

    @property
    def routed_width(self) -> int:
        """The width the routed experts read and write: ``moe_latent_size``, else ``hidden_size``."""
        return self.moe_latent_size or self.hidden_size

    def is_linear_attention(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` mixes tokens with a gated delta-net instead of attention
        (``layer_types``' ``linear_attention``, Qwen3-Next / Qwen3.5)."""
        return layer < len(self.layer_types) and self.layer_types[layer] == "linear_attention"

    @property
    def has_linear_attention(self) -> bool:
        return "linear_attention" in self.layer_types

    @property
    def rotary_dim(self) -> int:
        """The dimensions of a head RoPE rotates (vLLM ``get_rope``: ``int(head_size · partial_rotary_factor)``)."""
        dim = self.qk_rope_head_dim if self.is_mla else self.attn_head_dim
        return int(dim * self.partial_rotary_factor)

    def is_sliding(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` attends over a sliding window (``layer_types``; MTP layers past
        the list attend fully)."""
        return layer < len(self.layer_types) and self.layer_types[layer] == "sliding_attention" \
            and self.sliding_window > 0

    @property
    def is_hybrid(self) -> bool:
        return bool(self.hybrid_override_pattern)

    def layer_kind(self, layer: int) -> str:
        """What decoder layer ``layer`` holds: ``M`` a Mamba mixer, ``*`` attention, ``-`` an MLP, ``E`` an MoE
        block (hybrid models), or ``T`` a transformer layer (attention then MLP/MoE). MTP layers (from
        ``num_hidden_layers`` on, also in a model cut shorter than its pattern) are transformer layers."""
        if layer < min(len(self.hybrid_override_pattern), self.num_hidden_layers):
            return self.hybrid_override_pattern[layer]
        return "T"

    @property
    def mamba_heads(self) -> int:
        """Mamba-2 heads: ``mamba_num_heads``, else ``expand · hidden_size / head_dim`` with expand = 2
        (Megatron-LM megatron/core/ssm/mamba_mixer.py: MambaMixer.__init__, ``expand=2``)."""
        return self.mamba_num_heads or 2 * self.hidden_size // self.mamba_head_dim

    @property
    def vision_seq_len(self) -> int:
        """The ViT's tokens per image: its patches and the class token (``clip_vit_model.py: CLIPViTModel``
        ``seq_length``, one class token for ``clip``)."""
        return (self.image_height // self.patch_size) * (self.image_width // self.patch_size) + 1

    @property
    def image_tokens(self) -> int:
        """The language-model positions an image fills (``clip_vit_model.py: get_num_image_embeddings``: the
        patches, and the class token unless dropped)."""
        return self.vision_seq_len - (1 if self.vision_class_token == "drop" else 0)

    def vision_layer(self, k: int) -> int:
        """The layer index of a LLaVA ViT's layer ``k``: past the decoder's layers and MTP modules, so that a layer's
        ops, saved tensors and recompute regions stay apart from the decoder's."""
        return self.num_hidden_layers + self.mtp_layers + k

    def is_vision_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` is a LLaVA ViT's (:meth:`vision_layer`)."""
        return self.architecture == "llava" and layer >= self.vision_layer(0)

    def is_t5_decoder_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) is a T5 decoder layer (after the ``encoder_layers``)."""
        return self.architecture == "t5" and layer >= self.encoder_layers

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` (0-based) has an MoE block (DeepSeek/Qwen rules; a hybrid
        pattern's ``E`` layers)."""
        if self.is_hybrid and layer < min(len(self.hybrid_override_pattern), self.num_hidden_layers):
            return self.is_moe and self.hybrid_override_pattern[layer] == "E"
        if self.mlp_layer_types and layer < len(self.mlp_layer_types):
            return self.is_moe and self.mlp_layer_types[layer] == "moe"
        if not self.is_moe or layer < self.first_k_dense_replace:
            return False
        return (layer - self.first_k_dense_replace) % self.moe_layer_freq == 0 if self.moe_layer_freq > 1 \
            else True

    def with_(self, **changes: Any) -> ModelSpec:
        return replace(self, **changes)


#: code fact → the Hugging Face families whose modelling code has it (transformers ``src/transformers``):
#: models/gpt2/modeling_gpt2.py GPT2Attention (``c_attn``) and GPT2Block (``nn.Dropout``);
#: models/mixtral/modeling_mixtral.py MixtralTopKRouter, models/qwen2_moe/modeling_qwen2_moe.py
#: Qwen2MoeTopKRouter, models/qwen3_moe/modeling_qwen3_moe.py Qwen3MoeTopKRouter (``if self.norm_topk_prob:``,
#: then ``.to(router_logits.dtype)``); models/gpt_oss/modeling_gpt_oss.py GptOssTopKRouter,
#: GptOssRotaryEmbedding, GptOssRMSNorm; models/gemma/modeling_gemma.py GemmaMLP and
#: models/gemma2/modeling_gemma2.py Gemma2MLP (``down_proj(act_fn(gate_proj(x)) * up_proj(x))``, act gelu tanh)
CODE_FACTS: dict[str, tuple[str, ...]] = {
    "fused_qkv": ("gpt2",),
    "residual_dropout": ("gpt2", "opt"),
    #: OPTDecoder: no dropout on the embeddings (GPT2Model: self.drop on them, embd_pdrop)
    "no_embedding_dropout": ("opt",),
    #: OPTLearnedPositionalEmbedding: cumsum of a (b, s) mask, + offset 2 — (b, s) int64 ids, 2 more table rows
    "position_offset_rows": ("opt",),
    "router_softmax": ("mixtral", "qwen2_moe", "qwen3_moe", "ernie4_5_moe"),
    "router_topk_softmax": ("gpt_oss",),
    "router_weights_cast": ("qwen2_moe", "qwen3_moe"),
    "rope_half_width": ("gpt_oss",),
    "norm_output_fp32": ("gpt_oss", "gemma", "gemma2", "gemma3_text"),
    "norm_weight_offset": ("gemma", "gemma2", "gemma3_text"),
    #: Gemma2PreTrainedModel ``_supports_sdpa = False``: eager attention op by op
    "eager_attention": ("gemma2",),
    #: Gemma2DecoderLayer: post_attention_layernorm on the attention output, pre_ and post_feedforward_layernorm
    #: around the MLP
    "sandwich_norms": ("gemma2", "gemma3_text"),
    "gated_gelu": ("gemma", "gemma2", "gemma3_text"),
    #: Gemma3TextModel (models/gemma3/modeling_gemma3.py): its sliding layers rotate by a table of their own
    #: (``rope_local_base_freq``, unscaled) beside the global layers' (``rope_theta`` with ``rope_scaling``); vLLM's
    #: Gemma3Attention (models/gemma3.py, 0.19.0) calls ``get_rope`` with each, two cached cos/sin tables
    "local_rope": ("gemma3_text",),
    #: GPT2MLP / OPTDecoderLayer / PhiMLP: fc1 → ACT2FN[activation] → fc2 whatever the activation (no gate)
    "plain_mlp": ("gpt2", "opt", "phi"),
    #: PhiDecoderLayer (transformers models/phi/modeling_phi.py; vLLM models/phi.py PhiLayer.forward):
    #: ``attn_outputs + feed_forward_hidden_states + residual``, both sub-blocks on the one input_layernorm output
    "parallel_residual": ("phi",),
    #: PhiForCausalLM: ``lm_head = nn.Linear(hidden, vocab, bias=True)`` (vLLM ``ParallelLMHead(..., bias=True)``)
    "head_bias": ("phi",),
}

#: other spellings of ModelSpec fields found in Hugging Face configs and run files
ALIASES: dict[str, str] = {
    "num_layers": "num_hidden_layers",
    "n_layer": "num_hidden_layers",
    "n_embd": "hidden_size",
    "n_head": "num_attention_heads",
    "n_inner": "intermediate_size",
    "ffn_dim": "intermediate_size",
    "n_positions": "max_position_embeddings",
    "num_local_experts": "n_routed_experts",
    "num_experts": "n_routed_experts",
    "num_nextn_predict_layers": "mtp_layers",
    "mtp_num_hidden_layers": "mtp_layers",
    "decoder_sparse_step": "moe_layer_freq",
    "activation_function": "hidden_act",
    "hidden_activation": "hidden_act",
    "attn_output_gate": "attention_output_gate",
    "attn_pdrop": "attention_dropout",
    "resid_pdrop": "hidden_dropout",
}
