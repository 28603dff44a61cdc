"""Read a Hugging Face ``config.json`` into a :class:`~timeline.spec.ModelSpec`.

Understands the key names of DeepSeek-V2/V3, Llama, Mistral/Mixtral, Qwen2/3 and Qwen-MoE, GPT-2,
OPT, GPT-OSS, Phi, Phi-3/4, Granite, Gemma/Gemma-2/Gemma-3, the gated delta-net hybrids, GLM-4.5, MiniMax-M2 and ERNIE-4.5-MoE (:data:`SUPPORTED`); a vision-language checkpoint's
``text_config`` where the caller serves it (:mod:`timeline.io.hf_vision`). Keys the simulator does not need (rope scaling, token ids, …) are ignored; what the
modelling code implies but the config does not say (Qwen2's Q/K/V biases, GPT-2's biases and
tied embeddings, GPT-OSS's sinks and biases) is filled in per ``model_type``. A ``quantization_config``
(GPT-OSS ships MXFP4 experts) is reported in a note and ignored: training holds the weights in
``[training] dtype``.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

from timeline.errors import UserError
from timeline.io.hf_vision import is_vision_language, split_vision
from timeline.io.text import read_user_text
from timeline.spec.fields import check_value
from timeline.spec.model import ALIASES, ModelSpec

SUPPORTED = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "llama", "mistral", "mixtral", "qwen2", "qwen3",
             "qwen2_moe", "qwen3_moe", "gpt2", "gpt_oss", "opt", "phi", "phi3", "granite", "gemma", "gemma2",
             "gemma3_text", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "glm4_moe",
             "minimax_m2", "ernie4_5_moe")

#: the modelling class a config's ``architectures`` names → the family it implements, for
#: configs whose ``model_type`` is a label of their own (Kimi-K2's ``kimi_k2`` runs
#: ``DeepseekV3ForCausalLM``)
ARCHITECTURES: dict[str, str] = {
    "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV32ForCausalLM": "deepseek_v32",
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3", "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe", "GPT2LMHeadModel": "gpt2", "GptOssForCausalLM": "gpt_oss",
    "OPTForCausalLM": "opt", "PhiForCausalLM": "phi", "Phi3ForCausalLM": "phi3", "GraniteForCausalLM": "granite",
    "GemmaForCausalLM": "gemma", "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3_text",
    "Qwen3NextForCausalLM": "qwen3_next", "Qwen3_5ForCausalLM": "qwen3_5_text",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe_text", "Glm4MoeForCausalLM": "glm4_moe",
    "MiniMaxM2ForCausalLM": "minimax_m2", "Ernie4_5_MoeForCausalLM": "ernie4_5_moe",
}

#: fields where the config's 0 would be read as "not given" by the spec, but Hugging Face has
#: ``null`` for that: an explicit 0 is a broken config, not a default
NO_EXPLICIT_ZERO = ("num_key_value_heads", "head_dim")

#: what every gated delta-net family's attention layers have (Qwen3NextAttention; the head and RoPE share)
_GATED_DELTA_NET: dict[str, Any] = {"qk_norm": True, "attention_output_gate": True, "partial_rotary_factor": 0.25,
                                    "head_dim": 256}

#: what the modelling code of a family hard-codes
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt2": {"norm": "layernorm", "position_embedding": "learned", "attention_bias": True,
             "linear_bias": True, "tie_word_embeddings": True, "hidden_act": "gelu_new",
             "num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12,
             "vocab_size": 50257, "max_position_embeddings": 1024, "hidden_dropout": 0.1,
             "attention_dropout": 0.1},  # GPT2Config resid_pdrop / attn_pdrop defaults
    # models/opt/modeling_opt.py (transformers 4.21): OPTDecoderLayer's pre-norm LayerNorms, q/k/v/out_proj and
    # fc1/fc2 with biases (enable_bias, default true), ReLU (activation_function), learned positions, lm_head
    # tied to embed_tokens; OPTLearnedPositionalEmbedding's two offset rows (ModelSpec.position_offset_rows)
    "opt": {"norm": "layernorm", "position_embedding": "learned", "attention_bias": True, "linear_bias": True,
            "tie_word_embeddings": True, "hidden_act": "relu"},
    "qwen2": {"attention_bias": True},
    # models/phi/modeling_phi.py (transformers 4.37+) and vLLM models/phi.py (0.19.0): PhiDecoderLayer's one
    # input_layernorm (nn.LayerNorm) feeds attention and the MLP side by side (the parallel-residual code fact),
    # q/k/v and dense with biases, fc1 → gelu_new → fc2 with biases (no gate), final_layernorm, lm_head with a
    # bias (the head-bias code fact); PhiConfig's defaults for the rest (tie_word_embeddings false)
    "phi": {"norm": "layernorm", "attention_bias": True, "linear_bias": True, "hidden_act": "gelu_new",
            "tie_word_embeddings": False},
    # models/gemma/modeling_gemma.py (transformers 4.47): GemmaMLP gates gelu(gate_proj(x)) * up_proj(x) (the
    # gated-GeLU code fact, spec/model.py), lm_head tied to embed_tokens (GemmaConfig tie_word_embeddings=True);
    # the embedding's sqrt(hidden) normalizer is a scalar. Gemma-2 (models/gemma2/modeling_gemma2.py) adds a
    # post-attention and a post-feedforward RMSNorm per layer (the sandwich-norms code fact), runs eager attention
    # with tanh soft-capping and slides on even layers (Gemma2Attention: ``sliding_window if not bool(layer_idx %
    # 2)``)
    "gemma": {"tie_word_embeddings": True},
    "gemma2": {"tie_word_embeddings": True, "sliding_window": 4096},  # Gemma2Config's default window
    # models/gemma3/configuration_gemma3.py (transformers 5.24) Gemma3TextConfig's defaults — a vision-language
    # checkpoint's text_config gives only the keys that differ from them — and modeling_gemma3.py: Gemma-2's
    # layer (gated GeLU, sandwich norms, Gemma RMSNorm) with q_norm/k_norm (Gemma3RMSNorm over head_dim) before
    # RoPE, no soft-capping by default, SDPA
    "gemma3_text": {"tie_word_embeddings": True, "qk_norm": True, "sliding_window": 4096, "vocab_size": 262_208,
                    "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                    "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 131_072},
    "qwen2_moe": {"attention_bias": True, "shared_expert_gate": True},
    "qwen3": {"qk_norm": True},
    # Gated delta-net hybrids, as vLLM 0.19.0 builds them (models/qwen3_next.py, models/qwen3_5.py) from the
    # config classes it ships (transformers_utils/configs/qwen3_next.py Qwen3NextConfig, qwen3_5.py
    # Qwen3_5TextConfig, qwen3_5_moe.py Qwen3_5MoeTextConfig), whose defaults stand for what a file leaves out:
    # Qwen3NextAttention's q/k norms over head_dim, its sigmoid output gate (``attn_output_gate``, default true:
    # q_proj twice as wide), RoPE on a quarter of each head; Qwen3NextSparseMoeBlock's gated shared expert
    # (``shared_expert_gate``, always built) and renormalised top-k (``norm_topk_prob``, default true). Qwen3.5-MoE
    # builds the sparse block in every layer, so its config has no intermediate_size: the shared expert's width
    # stands in for the unused dense width.
    "qwen3_next": {**_GATED_DELTA_NET, "shared_expert_gate": True, "norm_topk_prob": True, "vocab_size": 151_936,
                   "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 48,
                   "num_attention_heads": 16, "num_key_value_heads": 2, "max_position_embeddings": 32_768,
                   "n_routed_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
                   "shared_expert_intermediate_size": 512},
    "qwen3_5_text": {**_GATED_DELTA_NET, "vocab_size": 248_320, "hidden_size": 4096, "intermediate_size": 12_288,
                     "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4,
                     "max_position_embeddings": 32_768},
    "qwen3_5_moe_text": {**_GATED_DELTA_NET, "shared_expert_gate": True, "norm_topk_prob": True,
                         "vocab_size": 248_320, "hidden_size": 2048, "num_hidden_layers": 40,
                         "num_attention_heads": 16, "num_key_value_heads": 2, "max_position_embeddings": 32_768,
                         "n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
                         "shared_expert_intermediate_size": 512, "intermediate_size": 512},
    "qwen3_moe": {"qk_norm": True},
    # GLM-4.5 / 4.6 / 4.7 (models/glm4_moe/modeling_glm4_moe.py, transformers 4.54+; vLLM 0.19.0 models/glm4_moe.py):
    # DeepSeek-V3's MoE — a sigmoid router with an fp32 e_score_correction_bias (Glm4MoeTopkRouter, vLLM's
    # Glm4MoE.gate), shared experts of n_shared_experts · moe_intermediate_size, dense layers before
    # first_k_dense_replace — under grouped-query attention with biased q/k/v (attention_bias), RoPE on half of
    # each head (``partial_rotary_factor`` 0.5, vLLM's default where the config has none) and q/k RMSNorms where
    # ``use_qk_norm``; the MTP layer (num_nextn_predict_layers) is loaded only as a draft model
    "glm4_moe": {"partial_rotary_factor": 0.5, "router_bias": True, "attention_bias": True},
    # MiniMax-M2 (vLLM 0.19.0 models/minimax_m2.py): every layer a sparse MoE of num_local_experts experts as wide
    # as intermediate_size (MiniMaxM2MoE: FusedMoE(intermediate_size=config.intermediate_size), renormalised
    # top-k), a sigmoid router with an fp32 correction bias (use_routing_bias), no shared expert; q/k RMSNorms over
    # the whole projection (MiniMaxText01RMSNormTP of head_dim · heads), RoPE on rotary_dim of each head; its MTP
    # modules are not part of the causal-LM model
    "minimax_m2": {"norm_topk_prob": True, "router_bias": True},
    # ERNIE-4.5-MoE (vLLM 0.19.0 models/ernie45_moe.py; transformers models/ernie4_5_moe): MoE layers from
    # moe_layer_start_index to moe_layer_end_index every moe_layer_interval (the rest dense), moe_num_experts of
    # moe_intermediate_size, moe_k a token, moe_num_shared_experts shared experts, a softmax router with an fp32
    # correction bias (Ernie4_5_MoeMoE.gate, moe_statics), renormalised top-k; use_bias on q/k/v;
    # its MTP layer (num_nextn_predict_layers) is not part of the causal-LM model
    "ernie4_5_moe": {"norm_topk_prob": True, "router_bias": True},
    # models/gpt_oss/modeling_gpt_oss.py (transformers 5.24): GptOssAttention.sinks (one per head),
    # GptOssTopKRouter.bias, GptOssExperts gate_up_proj_bias / down_proj_bias, _apply_gate's
    # gate * sigmoid(gate * alpha) * (up + 1) with the clamps; GptOssConfig defaults for the rest
    "gpt_oss": {"attention_sinks": True, "router_logit_bias": True, "expert_linear_bias": True,
                "attention_bias": True, "swiglu_limit": 7.0, "swiglu_alpha": 1.702, "glu_linear_offset": 1.0,
                "sliding_window": 128},
}

FIELDS = {f.name for f in dataclasses.fields(ModelSpec)}

#: per-layer attention kinds and the window, read only for the families whose layers the graph builds
#: by them (GPT-OSS); other configs that name a window (Mistral, Qwen ``use_sliding_window``) keep
#: full attention as before, so their ``layer_types`` cannot clash with a ``num_hidden_layers`` override
WINDOW_FIELDS = ("layer_types", "sliding_window")
WINDOWED = ("gpt_oss", "gemma2", "gemma3_text")
#: families whose layers mix tokens by a gated delta-net where ``layer_types`` says ``linear_attention``
LINEAR_ATTENTION = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")

#: families whose config class's defaults stand for keys a published file leaves out (Gemma-3's
#: vision-language checkpoints write their text_config sparse: gemma-3-27b-it gives no vocab_size)
CONFIG_CLASS_DEFAULTS: dict[str, tuple[str, ...]] = {f: tuple(FAMILY_DEFAULTS[f]) for f in ("gemma3_text",
                                                                                          *LINEAR_ATTENTION)}

#: keys a config.json must give (by their Hugging Face name or an alias such as GPT-2's n_embd)
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size")


def missing_keys(cfg: dict[str, Any]) -> list[str]:
    """The required keys ``cfg`` lacks: ``model_type`` and the core shapes (GPT-2 may leave
    ``intermediate_size`` out: it is 4 × hidden_size; a family in :data:`CONFIG_CLASS_DEFAULTS` any shape its
    config class defaults)."""
    given = {ALIASES.get(k, k) for k, v in cfg.items() if v is not None}
    given |= set(CONFIG_CLASS_DEFAULTS.get(str(cfg.get("model_type")), ()))
    missing = [] if cfg.get("model_type") else ["model_type"]
    for key in REQUIRED:
        if key not in given and not (key == "intermediate_size" and cfg.get("model_type") == "gpt2"):
            missing.append(key)
    return missing


def family(cfg: dict[str, Any]) -> tuple[str, str | None]:
    """(the family ``cfg`` is read as, a note or None): its ``model_type`` when supported,
    else the family of the first class in ``architectures`` this reader knows."""
    model_type = cfg.get("model_type", "llama")
    if model_type in SUPPORTED:
        return model_type, None
    archs = cfg.get("architectures")
    for arch in archs if isinstance(archs, list) else []:
        if isinstance(arch, str) and arch in ARCHITECTURES:
            known = ARCHITECTURES[arch]
            return known, f"model_type {model_type!r} is read as {known!r}: its architectures name {arch}"
    named = f"architectures: {', '.join(map(str, archs))}" if isinstance(archs, list) and archs else \
        "no architectures"
    causal = [a for a in archs if isinstance(a, str) and a.endswith(("ForCausalLM", "LMHeadModel"))] \
        if isinstance(archs, list) else []
    if not causal:
        raise UserError(f"model_type {model_type!r} is not supported and no class in architectures ({named}) is "
                        f"known or a causal language model (…ForCausalLM); supported: {', '.join(SUPPORTED)}")
    beyond = _beyond_a_dense_decoder(cfg)
    if beyond:
        raise UserError(f"model_type {model_type!r} ({named}) is not one this reader knows, and its config has "
                        f"{beyond}, which a Llama-style decoder reading would leave out; supported: "
                        f"{', '.join(SUPPORTED)}")
    return "llama", (f"model_type {model_type!r} ({named}) is not one this reader knows: read as a Llama-style "
                     "decoder (LlamaForCausalLM's layers) from its standard keys; whatever its own modelling code "
                     "adds beyond them (other norms, biases, a different MLP) is not read")


#: config keys (their names in part) that say a model is more than a dense decoder of Llama's layers: experts, state
#: space or linear-attention layers, latent attention, another tower, per-layer attention kinds
_BEYOND = (("expert", "experts (a mixture of experts)"), ("moe", "mixture-of-experts keys"),
           ("mamba", "Mamba layers"), ("ssm", "state-space layers"), ("linear_attn", "linear-attention layers"),
           ("linear_attention", "linear-attention layers"), ("linear_num_", "linear-attention heads"),
           ("linear_conv", "linear-attention convolutions"), ("lora_rank", "latent (low-rank) attention"),
           ("vision", "a vision tower"), ("audio", "an audio tower"), ("text_config", "a nested language model"),
           ("encoder", "an encoder"), ("cross_attention", "cross-attention layers"), ("layer_types", "per-layer kinds"),
           ("sliding_window", "a sliding window"), ("block_types", "per-layer kinds"),
           ("hybrid", "hybrid layers"))


def _beyond_a_dense_decoder(cfg: dict[str, Any]) -> str:
    """The first key of ``cfg`` (with a value: not None, False, 0 or empty) naming a structure beyond Llama's dense
    decoder layers, as "'KEY' (WHAT)", else ""."""
    for key, value in cfg.items():
        if value in (None, False, 0, "", [], {}) or not isinstance(key, str):
            continue
        if key == "layer_types" and isinstance(value, list) and set(value) <= {"full_attention"}:
            continue
        if key == "use_sliding_window" or key == "max_window_layers":
            continue
        for part, what in _BEYOND:
            if part in key.lower():
                return f"{key!r} ({what})"
    return ""


def check_hf_config(cfg: dict[str, Any], source: str) -> None:
    """Raise a UserError naming ``source`` and every required key ``cfg`` lacks, or an
    unsupported family."""
    missing = missing_keys(cfg)
    if missing:
        raise UserError(f"{source}: missing {', '.join(missing)}; a Hugging Face config.json names the "
                        "model_type and the shapes (hidden_size, num_hidden_layers, …)")
    try:
        family(cfg)
    except UserError as exc:
        raise UserError(f"{source}: {exc}") from None


_HINTS = typing.get_type_hints(ModelSpec)
_FIELD = {f.name: f for f in dataclasses.fields(ModelSpec)}


def _checked(key: str, field: str, value: Any, problems: list[str]) -> Any:
    """``value`` of config key ``key`` checked against the spec field's type and range."""
    if field in NO_EXPLICIT_ZERO and value == 0 and not isinstance(value, bool):
        problems.append(f"{key}: 0 is not valid; use null (or leave it out) for the default")
        return None
    v, problem = check_value(_FIELD[field], _HINTS[field], value)
    if problem:
        problems.append(f"{key}: {problem}")
        return None
    return v


def model_from_hf_dict(cfg: dict[str, Any], name: str = "hf", notes: list[str] | None = None) -> ModelSpec:
    """Map a parsed config dict to a ModelSpec; every value is checked against the spec field's
    type and range (a UserError lists each bad key). A family read by ``architectures`` adds a
    line to ``notes``."""
    model_type, note = family(cfg)
    if note and notes is not None:
        notes.append(note)
    values: dict[str, Any] = {"name": name, "model_type": model_type}
    values.update(FAMILY_DEFAULTS.get(model_type, {}))
    problems: list[str] = []
    for key, value in cfg.items():
        field = ALIASES.get(key, key)
        if field in WINDOW_FIELDS and model_type not in WINDOWED + LINEAR_ATTENTION:
            continue
        if field == "mamba_ssm_dtype":  # a torch dtype name: _gated_delta_net reads it
            continue  # Mistral/Qwen configs carry a window too; their sliding attention is not modelled
        if field in FIELDS and field not in ("name", "model_type") and value is not None:
            v = _checked(key, field, value, problems)
            if v is not None:
                values[field] = v
    if problems:
        raise UserError("; ".join(problems))
    if model_type == "gpt2":
        values["intermediate_size"] = cfg.get("n_inner") or 4 * values["hidden_size"]
    if model_type in LINEAR_ATTENTION:
        _gated_delta_net(cfg, values)
    if model_type in ("qwen2_moe", "qwen3_moe", "qwen3_next"):
        # modeling_qwen2_moe.py Qwen2MoeDecoderLayer: MoE where layer_idx is not in mlp_only_layers and
        # (layer_idx + 1) % decoder_sparse_step == 0, i.e. layers step-1, 2·step-1, …
        step = values.get("moe_layer_freq", 1)
        only = cfg.get("mlp_only_layers") or []
        if only:
            if not isinstance(only, list) or not all(isinstance(i, int) for i in only):
                raise UserError(f"mlp_only_layers: {only!r} is not a list of layer indices")
            values["mlp_layer_types"] = tuple("moe" if i not in only and (i + 1) % step == 0 else "dense"
                                              for i in range(values.get("num_hidden_layers", 0)))
            values["moe_layer_freq"] = 1
        else:
            values["first_k_dense_replace"] = step - 1
    if model_type == "gpt_oss":
        _gpt_oss(cfg, values, notes)
    if model_type == "opt":  # configuration_opt.py: OPTConfig dropout = 0.1 (after attention and fc2)
        values["hidden_dropout"] = float(cfg.get("dropout", 0.1) or 0.0)
    if model_type == "gemma2":  # configuration_gemma2.py: Gemma2Config defaults 50.0 and 30.0; null turns them off
        for key, default in (("attn_logit_softcapping", 50.0), ("final_logit_softcapping", 30.0)):
            values[key] = float(cfg.get(key, default) or 0.0)
    if model_type == "gemma3_text":
        _gemma3(cfg, values)
    if model_type == "gemma2" and not cfg.get("layer_types"):
        values["layer_types"] = tuple("full_attention" if i % 2 else "sliding_attention"
                                      for i in range(values.get("num_hidden_layers", 26)))
    if model_type == "opt" and (not cfg.get("do_layer_norm_before", True) or not cfg.get("enable_bias", True)
                                or cfg.get("word_embed_proj_dim", values["hidden_size"]) != values["hidden_size"]):
        raise UserError("OPT with post-norm layers, no biases or a word_embed_proj_dim other than hidden_size "
                        "(project_in/project_out, e.g. opt-350m) is not modelled")
    if model_type == "mixtral" and not values.get("moe_intermediate_size"):
        # modeling_mixtral.py MixtralExperts: each expert is intermediate_size wide
        values["moe_intermediate_size"] = values["intermediate_size"]
    if model_type == "minimax_m2":
        values["moe_intermediate_size"] = values.get("intermediate_size", 0)
        values["router_bias"] = bool(cfg.get("use_routing_bias", True))
        values["qk_norm"] = bool(cfg.get("use_qk_norm", False))
        values["qk_norm_full"] = values["qk_norm"] and cfg.get("qk_norm_type", "per_layer") == "per_layer"
        head_dim = values.get("head_dim") or values["hidden_size"] // values["num_attention_heads"]
        if isinstance(cfg.get("rotary_dim"), int) and head_dim:
            values["partial_rotary_factor"] = cfg["rotary_dim"] / head_dim
        values["mtp_layers"] = 0
    if model_type == "ernie4_5_moe":
        n = values.get("num_hidden_layers", 0)
        values["n_routed_experts"] = int(cfg.get("moe_num_experts") or 0)
        values["num_experts_per_tok"] = int(cfg.get("moe_k") or 0)
        values["n_shared_experts"] = int(cfg.get("moe_num_shared_experts") or 0)
        start, step = int(cfg.get("moe_layer_start_index") or 0), int(cfg.get("moe_layer_interval") or 1)
        end = cfg.get("moe_layer_end_index")
        end = n - 1 if end is None or end < 0 else int(end)
        values["mlp_layer_types"] = tuple("moe" if values["n_routed_experts"] and start <= i <= end
                                          and (i + 1) % step == 0 else "dense" for i in range(n))
        # use_bias: q/k/v biases (o_proj has none); its MLP biases are not counted (the published configs have none)
        values["attention_bias"] = bool(cfg.get("use_bias", False))
        values["mtp_layers"] = 0
    if model_type == "glm4_moe":
        values["qk_norm"] = bool(cfg.get("use_qk_norm", False))
        values["first_k_dense_replace"] = values.get("first_k_dense_replace") or 0
    if model_type.startswith("deepseek"):
        values["router_bias"] = cfg.get("topk_method") == "noaux_tc"
        values["first_k_dense_replace"] = values.get("first_k_dense_replace") or 0
    positions = rope_scaled_positions(cfg, values.get("max_position_embeddings", 0))
    if positions and positions != values.get("max_position_embeddings"):  # DeepSeek's and GPT-OSS's YaRN: the same
        values["rope_scaled_positions"] = positions
    if "q_lora_rank" in values and values["q_lora_rank"] is None:
        values["q_lora_rank"] = 0
    try:
        return ModelSpec(**values)
    except TypeError as exc:  # pragma: no cover - guarded by FIELDS filter
        raise UserError(f"config: {exc}") from None


def rope_scaled_positions(cfg: dict[str, Any], max_position: int) -> int:
    """The positions the config's ``rope_scaling`` (``rope_parameters`` in transformers 5) extends the model to, 0
    where it is ``max_position_embeddings``: vLLM 0.19.0's cos/sin cache (``rotary_embedding/__init__.py``
    ``get_rope`` and each class's ``_compute_cos_sin_cache``) and its derived ``max_model_len``
    (``config/model.py`` ``_get_and_verify_max_len``) alike — ``linear`` and ``dynamic`` (without ``alpha``)
    ``max_position · factor``; ``yarn`` and ``deepseek_yarn`` ``original_max_position_embeddings · factor``; the
    rest (``default``, ``llama3``, ``longrope``, …) ``max_position``."""
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if isinstance(rs, dict) and isinstance(rs.get("full_attention"), dict):  # transformers 5's per-layer-type
        rs = rs["full_attention"]  # parameters (Gemma-3): the global layers' table is the scaled one
    if not isinstance(rs, dict):
        return 0
    kind, factor = rs.get("rope_type") or rs.get("type"), rs.get("factor")
    if not isinstance(factor, (int, float)) or factor <= 0:
        return 0
    if kind == "linear" or (kind == "dynamic" and "alpha" not in rs):
        return int(max_position * factor) if max_position else 0
    original = rs.get("original_max_position_embeddings")
    if kind in ("yarn", "deepseek_yarn") and isinstance(original, int) and original > 0:
        return int(original * factor)
    return 0


def _gemma3(cfg: dict[str, Any], values: dict[str, Any]) -> None:
    """Gemma-3 facts the config leaves to its class (transformers 5.24 ``Gemma3TextConfig.__post_init__``):
    without ``layer_types`` a layer slides unless ``(i + 1)`` is a multiple of ``sliding_window_pattern``
    (default 6: five local layers, then a global one). ``use_bidirectional_attention`` (EmbeddingGemma) is an
    encoder, not the causal decoder this reader builds."""
    if cfg.get("use_bidirectional_attention"):
        raise UserError("use_bidirectional_attention: a bidirectional Gemma-3 encoder (EmbeddingGemma) is not "
                        "modelled; the causal decoder is")
    if "sliding_window" in cfg and cfg["sliding_window"] is None:  # null: every layer sees every key
        values["sliding_window"] = 0
    if not cfg.get("layer_types"):
        pattern = cfg.get("sliding_window_pattern", 6)
        if not isinstance(pattern, int) or isinstance(pattern, bool) or pattern < 1:
            raise UserError(f"sliding_window_pattern: {pattern!r} is not a positive integer")
        values["layer_types"] = tuple("sliding_attention" if (i + 1) % pattern else "full_attention"
                                      for i in range(values["num_hidden_layers"]))


#: config.json's ``mamba_ssm_dtype`` (torch dtype names) → the spec's dtype names
_STATE_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _gated_delta_net(cfg: dict[str, Any], values: dict[str, Any]) -> None:
    """Qwen3-Next / Qwen3.5 facts from their config classes (vLLM 0.19.0 ``transformers_utils/configs``): without
    ``layer_types`` a layer is ``linear_attention`` unless ``(i + 1)`` is a multiple of ``full_attention_interval``
    (default 4); ``partial_rotary_factor`` may sit in ``rope_parameters``; ``mamba_ssm_dtype`` (Qwen3.5) is the
    recurrent state's dtype (``Qwen3_5ForConditionalGenerationConfig.verify_and_update_config`` makes it the
    engine's ``mamba_ssm_cache_dtype``). ``mlp_only_layers`` (dense layers among the MoE ones) is not modelled."""
    if cfg.get("mlp_only_layers"):
        raise UserError("mlp_only_layers: dense layers among a Qwen3-Next model's MoE layers are not modelled")
    if "rope_parameters" in cfg and isinstance(cfg["rope_parameters"], dict) \
            and "partial_rotary_factor" not in cfg and "partial_rotary_factor" in cfg["rope_parameters"]:
        factor = cfg["rope_parameters"]["partial_rotary_factor"]
        if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor <= 1:
            raise UserError(f"rope_parameters.partial_rotary_factor: {factor!r} is not a number in (0, 1]")
        values["partial_rotary_factor"] = float(factor)
    state = cfg.get("mamba_ssm_dtype")
    if state is not None:
        if state not in _STATE_DTYPES:
            raise UserError(f"mamba_ssm_dtype: {state!r} is not one of {', '.join(_STATE_DTYPES)}")
        values["mamba_ssm_dtype"] = _STATE_DTYPES[state]
    if not cfg.get("layer_types"):
        interval = cfg.get("full_attention_interval", 4)
        if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
            raise UserError(f"full_attention_interval: {interval!r} is not a positive integer")
        values["layer_types"] = tuple("linear_attention" if (i + 1) % interval else "full_attention"
                                      for i in range(values["num_hidden_layers"]))
    if len(values["layer_types"]) != values["num_hidden_layers"]:
        raise UserError(f"layer_types: {len(values['layer_types'])} entries for {values['num_hidden_layers']} "
                        "layers")


def _gpt_oss(cfg: dict[str, Any], values: dict[str, Any], notes: list[str] | None) -> None:
    """GPT-OSS facts the config leaves to the modelling code (transformers 5.24 configuration_gpt_oss.py /
    modeling_gpt_oss.py): experts are ``intermediate_size`` wide, o_proj has a bias exactly when q/k/v do,
    ``layer_types`` defaults to sliding on even layers and full on odd ones (``GptOssConfig.__post_init__``)."""
    values["moe_intermediate_size"] = values["intermediate_size"]
    values["attention_out_bias"] = values.get("attention_bias", True)
    if not cfg.get("layer_types"):
        values["layer_types"] = tuple("sliding_attention" if (i + 1) % 2 else "full_attention"
                                      for i in range(values.get("num_hidden_layers", 36)))
    if cfg.get("sliding_window", 128) is None:  # null: the sliding layers see every key
        values["sliding_window"] = 0
    quant = cfg.get("quantization_config")
    if isinstance(quant, dict) and notes is not None:
        notes.append(f"quantization_config ({quant.get('quant_method', 'unnamed')}) is ignored: training "
                     "memory holds the weights in [training] dtype")


def load_config_json(path: Path) -> dict[str, Any]:
    """The JSON object of ``path`` (a Hugging Face config.json), or a UserError naming the file."""
    text = read_user_text(Path(path), "a Hugging Face config.json")
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not a JSON config ({exc})") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: expected a JSON object")
    return cfg


def read_hf_config(path: Path, notes: list[str] | None = None, *, vision: bool = False) -> ModelSpec:
    """Read ``path`` (a Hugging Face config.json); ``notes`` as in :func:`model_from_hf_dict`. A
    vision-language checkpoint is read as its language model where ``vision`` (serving, which models the
    tower: :func:`timeline.io.hf_vision.split_vision`); elsewhere it is refused."""
    cfg = load_config_json(path)
    if is_vision_language(cfg):
        if not vision:
            classes = cfg.get("architectures") or [cfg.get("model_type")]
            raise UserError(f"{path}: a vision-language checkpoint ({', '.join(map(str, classes))}); "
                            "training memory of its vision tower is not modelled — `timeline serve` models it, or "
                            "point hf_config at a file holding its text_config for the language model alone")
        try:
            cfg, _ = split_vision(cfg)
        except UserError as exc:
            raise UserError(f"{path}: {exc}") from None
        if notes is not None:
            notes.append("vision-language checkpoint: its text_config is the language model, its vision tower and "
                         "projector are served beside it unless serving.limit_mm_per_prompt = 0")
    check_hf_config(cfg, str(path))
    try:
        return model_from_hf_dict(cfg, name=Path(path).parent.name or Path(path).stem, notes=notes)
    except UserError as exc:
        raise UserError(f"{path}: {exc}") from None
