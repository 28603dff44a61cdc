"""Read a Hugging Face ``config.json`` into a :class:`~timeline.spec.ModelSpec`.

Understands the key names of DeepSeek-V2/V3, Llama, Mistral/Mixtral, Qwen2/3 and Qwen-MoE, and
GPT-2. Keys the simulator does not need (rope scaling, token ids, …) are ignored; what the
modelling code implies but the config does not say (Qwen2's Q/K/V biases, GPT-2's biases and
tied embeddings) is filled in per ``model_type``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from timeline.errors import UserError
from timeline.spec.model import ALIASES, ModelSpec

SUPPORTED = ("deepseek_v2", "deepseek_v3", "llama", "mistral", "mixtral", "qwen2", "qwen3",
             "qwen2_moe", "qwen3_moe", "gpt2")

#: what the modelling code of a family hard-codes
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt2": {"norm": "layernorm", "position_embedding": "learned", "attention_bias": True,
             "linear_bias": True, "tie_word_embeddings": True, "hidden_act": "gelu_new",
             "num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12,
             "vocab_size": 50257, "max_position_embeddings": 1024, "hidden_dropout": 0.1,
             "attention_dropout": 0.1},  # GPT2Config resid_pdrop / attn_pdrop defaults
    "qwen2": {"attention_bias": True},
    "qwen2_moe": {"attention_bias": True, "shared_expert_gate": True},
    "qwen3": {"qk_norm": True},
    "qwen3_moe": {"qk_norm": True},
}

FIELDS = {f.name for f in dataclasses.fields(ModelSpec)}

#: keys a config.json must give (by their Hugging Face name or an alias such as GPT-2's n_embd)
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size")


def missing_keys(cfg: dict[str, Any]) -> list[str]:
    """The required keys ``cfg`` lacks: ``model_type`` and the core shapes (GPT-2 may leave
    ``intermediate_size`` out: it is 4 × hidden_size)."""
    given = {ALIASES.get(k, k) for k, v in cfg.items() if v is not None}
    missing = [] if cfg.get("model_type") else ["model_type"]
    for key in REQUIRED:
        if key not in given and not (key == "intermediate_size" and cfg.get("model_type") == "gpt2"):
            missing.append(key)
    return missing


def check_hf_config(cfg: dict[str, Any], source: str) -> None:
    """Raise a UserError naming ``source`` and every required key ``cfg`` lacks, or an
    unsupported ``model_type``."""
    missing = missing_keys(cfg)
    if missing:
        raise UserError(f"{source}: missing {', '.join(missing)}; a Hugging Face config.json names the "
                        "model_type and the shapes (hidden_size, num_hidden_layers, …)")
    if cfg["model_type"] not in SUPPORTED:
        raise UserError(f"{source}: model_type {cfg['model_type']!r} is not supported; "
                        f"supported: {', '.join(SUPPORTED)}")


def model_from_hf_dict(cfg: dict[str, Any], name: str = "hf") -> ModelSpec:
    """Map a parsed config dict to a ModelSpec (raises UserError for unsupported families)."""
    model_type = cfg.get("model_type", "llama")
    if model_type not in SUPPORTED:
        raise UserError(f"model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED)}")
    values: dict[str, Any] = {"name": name, "model_type": model_type}
    values.update(FAMILY_DEFAULTS.get(model_type, {}))
    for key, value in cfg.items():
        field = ALIASES.get(key, key)
        if field in FIELDS and field not in ("name", "model_type") and value is not None:
            values[field] = value
    if model_type == "gpt2":
        values["intermediate_size"] = cfg.get("n_inner") or 4 * values["hidden_size"]
        values["hidden_act"] = "gelu"
    if model_type in ("qwen2_moe", "qwen3_moe"):
        # modeling_qwen2_moe.py Qwen2MoeDecoderLayer: MoE where (layer_idx + 1) % decoder_sparse_step == 0,
        # i.e. layers step-1, 2·step-1, … (mlp_only_layers is not modelled)
        values["first_k_dense_replace"] = values.get("moe_layer_freq", 1) - 1
    if model_type == "mixtral" and not values.get("moe_intermediate_size"):
        # modeling_mixtral.py MixtralExperts: each expert is intermediate_size wide
        values["moe_intermediate_size"] = values["intermediate_size"]
    if model_type.startswith("deepseek"):
        values["router_bias"] = cfg.get("topk_method") == "noaux_tc"
        values["first_k_dense_replace"] = cfg.get("first_k_dense_replace") or 0
    if values.get("hidden_act") in ("gelu_new", "gelu_pytorch_tanh"):
        values["hidden_act"] = "gelu"
    if "q_lora_rank" in values and values["q_lora_rank"] is None:
        values["q_lora_rank"] = 0
    try:
        return ModelSpec(**values)
    except TypeError as exc:  # pragma: no cover - guarded by FIELDS filter
        raise UserError(f"config: {exc}") from None


def read_hf_config(path: Path) -> ModelSpec:
    """Read ``path`` (a Hugging Face config.json)."""
    try:
        cfg = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: no such file (model.hf_config)") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder, expected a config.json") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a JSON config ({exc})") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: expected a JSON object")
    check_hf_config(cfg, str(path))
    return model_from_hf_dict(cfg, name=Path(path).parent.name or Path(path).stem)
