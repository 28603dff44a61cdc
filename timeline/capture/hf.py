"""Hugging Face causal LMs for capture: a config dict → (model, inputs) on fake CPU tensors.

The model is built from its config (random init, no weights downloaded) in the training dtype,
with SDPA attention and, for MoE models, the grouped expert implementation unless the config
says otherwise. Inputs are ``input_ids`` and ``labels`` of shape (micro_batch_size, seq_len), so
the step includes the head and loss. A preset (a :class:`~timeline.spec.model.ModelSpec`) maps to
the config dict its family's ``config.json`` would hold.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import torch

from timeline.capture.run import Built
from timeline.errors import UserError
from timeline.spec.model import ModelSpec

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

#: ModelSpec fields that are not Hugging Face config keys (or are renamed per family)
_NOT_HF = {"name", "norm", "position_embedding", "linear_bias", "qk_norm", "router_bias", "mtp_layers",
           "shared_expert_intermediate_size", "shared_expert_gate", "hidden_dropout", "moe_layer_freq"}


def preset_config(model: ModelSpec) -> dict[str, Any]:
    """The Hugging Face config dict of a preset's architecture."""
    cfg = {f.name: getattr(model, f.name) for f in dataclasses.fields(model) if f.name not in _NOT_HF}
    if model.model_type == "mixtral":
        cfg["num_local_experts"] = cfg.pop("n_routed_experts")
    elif model.model_type in ("qwen2_moe", "qwen3_moe"):
        cfg["num_experts"] = cfg.pop("n_routed_experts")
    if model.model_type.startswith("deepseek"):
        cfg["topk_method"] = "noaux_tc" if model.router_bias else "greedy"
        cfg["num_nextn_predict_layers"] = model.mtp_layers
    if not model.head_dim:
        cfg.pop("head_dim")
    if not model.num_key_value_heads:
        cfg["num_key_value_heads"] = model.num_attention_heads
    return cfg


#: keys the builder reads itself rather than passing to the config class
BUILDER_KEYS = frozenset({"attn_implementation", "experts_implementation"})


def _transformers() -> ModuleType:
    try:
        import transformers
    except ImportError:
        raise UserError("transformers is not installed: pip install -e '.[capture]'") from None
    return transformers


def _config_errors() -> tuple[type[BaseException], ...]:
    """What building a config or a model from bad values raises (huggingface_hub's strict
    dataclasses raise their own error class; torch modules assert on their arguments, e.g. nn.Embedding on a
    ``pad_token_id`` outside a shrunk vocabulary)."""
    errors: tuple[type[BaseException], ...] = (ValueError, KeyError, TypeError, AttributeError, RuntimeError,
                                               AssertionError)
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # pragma: no cover - older huggingface_hub
        return errors
    return (*errors, StrictDataclassError)


def _brief(exc: BaseException) -> str:
    """One line of an exception's message (transformers lists every model type it knows)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = " ".join(lines)
    return text if len(text) <= 300 else text[:297] + "..."


def config_keys(model_type: str) -> frozenset[str]:
    """Every key the Hugging Face config class of ``model_type`` knows (its fields, its
    ``attribute_map`` aliases, its constructor's arguments), plus the builder's own keys."""
    import inspect

    auto = _transformers().AutoConfig
    try:
        default = auto.for_model(model_type)
    except _config_errors() as exc:
        raise UserError(f"config: model_type {model_type!r}: {_brief(exc)}") from None
    cls = type(default)
    params = {n for n, p in inspect.signature(cls.__init__).parameters.items()
              if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and n != "self"}
    return frozenset(default.to_dict()) | frozenset(getattr(cls, "attribute_map", {})) | params | BUILDER_KEYS


def _default_attention(tf: Any, hf_cfg: Any) -> str:
    """SDPA where the causal-LM class supports it, else eager (GPT-OSS: ``_supports_sdpa = False``, its
    sinks need the logits), as ``from_pretrained`` would pick."""
    cls = tf.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING.get(type(hf_cfg), None)
    return "sdpa" if cls is None or getattr(cls, "_supports_sdpa", True) else "eager"


def transformers_knows(model_type: Any) -> bool:
    """Whether the installed transformers has a causal-LM class for ``model_type`` (one the run-file reader may
    not build, captured through that class)."""
    try:
        tf = _transformers()
    except UserError:
        return False
    return isinstance(model_type, str) and model_type in tf.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def hf_builder(config: dict[str, Any], *, micro_batch_size: int, seq_len: int,
               dtype: str = "bf16") -> Callable[[], Built]:
    """A build function for :func:`timeline.capture.run.capture` (call it inside fake mode).
    A config the Hugging Face classes reject raises a UserError ``config: …``, here or in the build."""
    tf = _transformers()
    cfg = dict(config)
    model_type = cfg.pop("model_type", None)
    if not model_type:
        raise UserError("config: missing model_type (e.g. \"llama\")")
    cfg.setdefault("use_cache", False)
    try:
        hf_cfg = tf.AutoConfig.for_model(model_type, **cfg)
    except _config_errors() as exc:
        raise UserError(f"config: {_brief(exc)}") from None
    hf_cfg._attn_implementation = cfg.get("attn_implementation") or _default_attention(tf, hf_cfg)
    if cfg.get("experts_implementation"):
        hf_cfg._experts_implementation = cfg["experts_implementation"]

    def build() -> Built:
        torch.manual_seed(0)
        try:
            model = tf.AutoModelForCausalLM.from_config(hf_cfg, dtype=DTYPES[dtype])
            ids = torch.randint(0, hf_cfg.vocab_size, (micro_batch_size, seq_len))
        except _config_errors() as exc:
            raise UserError(f"config: cannot build the {model_type} model: {_brief(exc)}") from None
        return model, (), {"input_ids": ids, "labels": ids, "use_cache": False}

    return build


#: torch.optim classes ``--optimizer`` names (torch defaults; foreach, CUDA's default, is chosen by the capture)
OPTIMIZERS = ("adamw", "adam", "sgd", "none")
AUTOCAST = ("bf16", "fp16", "off")


def hf_step_builder(config: dict[str, Any], *, micro_batch_size: int, seq_len: int, dtype: str = "bf16",
                    optimizer: str = "none", autocast: str = "off") -> Callable[[], Callable[[], None]]:
    """A ``--step`` function for :func:`timeline.capture.step.capture_step`: the Hugging Face model on
    the (stand-in) GPU, its optimizer with torch.optim defaults, and a step running the forward to the
    loss under ``torch.autocast("cuda", …)`` when asked, ``loss.backward()``, ``opt.step()``,
    ``opt.zero_grad()`` (set_to_none, PyTorch's default)."""
    build = hf_builder(config, micro_batch_size=micro_batch_size, seq_len=seq_len, dtype=dtype)
    factories: dict[str, Callable[[Iterator[torch.nn.Parameter]], torch.optim.Optimizer]] = {
        "adamw": torch.optim.AdamW, "adam": torch.optim.Adam,
        "sgd": lambda params: torch.optim.SGD(params, lr=1e-3)}
    make_opt = factories.get(optimizer)
    cast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(autocast)

    def func() -> Callable[[], None]:
        model, _, kwargs = build()
        model.to("cuda")
        model.train()
        kwargs = {k: v.to("cuda") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        opt = make_opt(model.parameters()) if make_opt is not None else None

        def step() -> None:
            with torch.autocast("cuda", dtype=cast) if cast is not None else _nothing():
                loss = model(**kwargs).loss
            loss.backward()
            if opt is not None:
                opt.step()
                opt.zero_grad()
            else:
                model.zero_grad()

        return step

    return func


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None
