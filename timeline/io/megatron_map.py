"""Map Megatron-LM arguments onto a run file (DESIGN §14): ``timeline from-megatron``'s core.

Absent arguments take Megatron-LM's command-line defaults (``megatron/training/arguments.py``,
where they disagree with ``TransformerConfig`` the command line wins): LayerNorm, GeLU, learned
absolute positions, biases, tied embeddings, dropout 0.1, Transformer Engine with
``--attention-backend auto``, gradient-accumulation fusion on, no sequence parallelism, the
``allgather`` MoE dispatcher with the ``aux_loss`` router, the vocabulary padded to
``--make-vocab-size-divisible-by`` (128) × tp. Every argument is mapped here, listed memory-neutral
or refused in :mod:`timeline.io.megatron_table`; the result is plain run-file data with a record of
what went where, which :mod:`timeline.io.megatron_write` turns into TOML. Nothing here simulates.
"""

from __future__ import annotations

import builtins
import re
from dataclasses import dataclass, field
from typing import Any, overload

from timeline.errors import UserError
from timeline.io.megatron_args import VAR_RE, MegatronArgs
from timeline.io.megatron_cp import cp_comm
from timeline.io.megatron_hybrid import read_hybrid, stack_spec
from timeline.io.megatron_layout import (
    layout_places_mtp,
    linear_attention_pattern,
    moe_layer_pattern,
    parse_layout_mtp,
    pattern_to_model,
    split_layers,
    window_layer_pattern,
)
from timeline.io.megatron_table import (
    FAMILY_ARGS,
    FAMILY_NAMES,
    MODE_JOBS,
    MODELLED_FAMILIES,
    PROVIDER_FAMILIES,
    REFUSED,
    REFUSED_UNLESS,
    VLM_FAMILIES,
)
from timeline.io.megatron_tokenizer import assumed_gpt2, vocab_size
from timeline.profiles.megatron_workspaces import version_tuple

#: how a conversion's note begins where it took GPT-2's vocabulary for want of a tokenizer
ASSUMED_VOCAB = "the arguments name no tokenizer"


@dataclass
class Conversion:
    """Run-file sections, and per argument the key(s) it set or why it was skipped."""

    sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    mapped: dict[str, str] = field(default_factory=dict)
    neutral: dict[str, str] = field(default_factory=dict)
    env_mapped: dict[str, str] = field(default_factory=dict)
    passed_over: list[str] = field(default_factory=list)  # a fork's arguments the user chose to pass over
    notes: list[str] = field(default_factory=list)  # what the conversion assumed, for the user and the run file

    def put(self, key: str, value: Any, *sources: str) -> None:
        section, name = key.split(".", 1)
        self.sections.setdefault(section, {})[name] = value
        for src in sources:
            self.mapped[src] = f"{self.mapped[src]}, {key}" if src in self.mapped else key


def no_qk_norms(c: Conversion, model: str, spec: str, *, built: bool = False) -> None:
    """``--qk-layernorm`` / ``--qk-l2-norm`` on a model whose layer spec gives its attention ``IdentityOp`` q/k
    norms: ``attention.py: SelfAttention.__init__`` builds the spec's module (``build_module(submodules.q_layernorm)``
    core_v0.12.0 … 0.17, ``submodules.q_layernorm or TENorm`` from core_v0.18.0), so the flag builds nothing —
    read as memory-neutral with a note. ``built``: this spec builds real norms there (``SelfAttention``'s TENorm or
    L2Norm per head, as in a GPT layer): the flag stays mapped."""
    model_s, fw = c.sections["model"], c.sections["framework"]
    if not model_s.get("qk_norm") or built:
        return
    flag = "--qk-l2-norm" if fw.get("qk_l2_norm") else "--qk-layernorm"
    model_s.pop("qk_norm")
    fw.pop("qk_l2_norm", None)
    c.mapped.pop(flag, None)
    c.neutral[flag] = f"{model}'s layer spec ({spec}) builds IdentityOp q/k norms"
    c.notes.append(f"{flag}: {model}'s layer spec ({spec}) gives its attention IdentityOp q/k norms, so the flag "
                   "builds none (attention.py: SelfAttention)")


class ArgReader:
    """Typed access to the raw arguments; each read marks the argument as mapped."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw
        self.read: set[str] = set()

    def has(self, name: str) -> bool:
        self.read.add(name)
        return name in self.raw

    def value(self, name: str, default: Any = None) -> Any:
        self.read.add(name)
        if name not in self.raw:
            return default
        v = self.raw[name]
        if isinstance(v, str) and VAR_RE.search(v):
            var = VAR_RE.search(v).group(0).strip("${}")  # type: ignore[union-attr]
            raise UserError(f"{name}: {v!r} is an unexpanded shell variable and the argument changes memory; "
                            f"give its value (from-megatron --script-env {var}=…)")
        return v

    def flag(self, name: str) -> bool:
        raw = self.raw.get(name)
        if isinstance(raw, str) and VAR_RE.fullmatch(raw):
            self.read.add(name)  # a launch script's unset variable after a flag expands to nothing
            return True
        v = self.value(name, False)
        if isinstance(v, str):
            return v.strip().lower() not in ("false", "0", "no")
        return bool(v)

    @overload
    def int(self, name: str) -> builtins.int | None: ...
    @overload
    def int(self, name: str, default: builtins.int) -> builtins.int: ...

    def int(self, name: str, default: builtins.int | None = None) -> builtins.int | None:
        v = self.value(name, default)
        if v is None or isinstance(v, int) and not isinstance(v, bool):
            return v
        if v is True:
            raise UserError(f"{name} is given without a value (in a launch script, a variable that expands to "
                            "nothing; in a YAML config, an empty value or an unfilled ${VAR}?); give its value")
        try:
            return int(str(v))
        except ValueError:
            raise UserError(f"{name}: expected an integer, got {v!r}") from None

    def float(self, name: str, default: builtins.float) -> builtins.float:
        v = self.value(name, default)
        if v is True:
            raise UserError(f"{name} is given without a value (in a launch script, a variable that expands to "
                            "nothing; in a YAML config, an empty value or an unfilled ${VAR}?); give its value")
        try:
            return float(v)
        except (TypeError, ValueError):
            raise UserError(f"{name}: expected a number, got {v!r}") from None

    @overload
    def str(self, name: builtins.str) -> builtins.str | None: ...
    @overload
    def str(self, name: builtins.str, default: builtins.str) -> builtins.str: ...

    def str(self, name: builtins.str, default: builtins.str | None = None) -> builtins.str | None:
        v = self.value(name, default)
        if v is True:
            raise UserError(f"{name} is given without a value (in a launch script, a variable that expands to "
                            "nothing; in a YAML config, an empty value or an unfilled ${VAR}?); give its value")
        return None if v is None else builtins.str(v)

    def need(self, name: builtins.str) -> builtins.int:
        v = self.int(name)
        if v is None:
            raise UserError(f"{name} is required (Megatron-LM has no default for it)")
        return v


def positive(a: ArgReader, name: str, default: int) -> int:
    """A parallel size: ``megatron/core/parallel_state.py: initialize_model_parallel`` divides the world by it, so
    Megatron-LM fails on 0 or less before any memory is held; so does the conversion, naming the argument."""
    v = a.int(name, default)
    if v < 1:
        raise UserError(f"{name} {v}: a parallel size is 1 or more (1: not split); give a positive size")
    return v


def refuse_job(m: MegatronArgs) -> None:
    """Raise a one-line UserError when the input itself names a job timeline does not simulate: a model
    family it lacks (by folder or script) or a functional test's non-training ``MODE``."""
    if m.family and m.family not in MODELLED_FAMILIES:
        what = FAMILY_NAMES.get(m.family, m.family)
        raise UserError(f"{what} model (named by {m.family_source}): timeline models GPT-style decoders "
                        "(dense, MoE, MLA), BERT, T5 and LLaVA (pretrain_vlm.py) only")
    if m.mode in MODE_JOBS:
        raise UserError(f"MODE: {m.mode}: {MODE_JOBS[m.mode]}")


def bert_local_spec(raw: dict[str, Any]) -> bool:
    """Whether ``--spec``'s first word is ``local`` (``pretrain_bert.py: model_provider``: ``args.spec[0] ==
    'local'`` builds ``bert_layer_local_spec``)."""
    words = str(raw.get("--spec", "")).replace(",", " ").strip("[]").split()
    return bool(words) and words[0].strip("'\"") == "local"


def refuse_unmodelled(m: MegatronArgs, a: ArgReader) -> None:
    """Raise a one-line UserError for a model family or refused argument not modelled (an optimizer:
    :func:`timeline.io.megatron_optimizer.optimizer`)."""
    refuse_job(m)
    for name, what in FAMILY_ARGS.items():
        if name in a.raw:
            raise UserError(f"{name}: a {what} model; timeline models GPT-style decoders (dense, MoE, MLA), "
                            "BERT, T5 and LLaVA (pretrain_vlm.py) only")
    for name in ("--model-provider", "--spec"):
        text = str(a.raw.get(name, ""))
        for key, what in PROVIDER_FAMILIES.items():
            if key in text:
                raise UserError(f"{name} {text}: a {what} model; timeline models GPT-style decoders, BERT, T5 and "
                                "LLaVA (pretrain_vlm.py) only")
    for name, why in REFUSED.items():
        # the hybrid stack is modelled, and pretrain_bert.py's own `--spec local` (io/megatron_bert.py)
        if name in a.raw and not (name == "--spec" and (stack_spec(a.raw) or (m.family == "bert" and
                                                                             bert_local_spec(a.raw)))):
            raise UserError(f"{name}: {why}")
    tp = str(a.raw.get("--tensor-model-parallel-size", "1"))
    sizes = {"=tp": tp, "=etp": str(a.raw.get("--expert-tensor-parallel-size", tp))}
    for name, (allowed, why) in REFUSED_UNLESS.items():
        if name in a.raw and str(a.raw[name]) not in {sizes.get(v, v) for v in allowed}:
            raise UserError(f"{name} {a.raw[name]}: {why}")


#: ``--fp8-recipe`` values not modelled, and why (Megatron-LM ``core/fp8_utils.py: get_fp8_recipe``)
FP8_REFUSED = {
    "custom": "a custom quantizer factory's tensors are not modelled",
}


def fp8_training(a: ArgReader, c: Conversion) -> None:
    """``--fp8-format`` turns FP8 on with ``--fp8-recipe`` (arguments.py default "delayed"); the format
    (e4m3 | hybrid) only picks E4M3 or E5M2, one byte each. ``--fp8-param-gather`` makes FP8 parameters.
    ``--first-last-layers-bf16`` keeps the first / last layers (``--num-layers-at-start-in-bf16`` /
    ``--num-layers-at-end-in-bf16``, 1 each by default) out of FP8; without FP8 it changes nothing.
    Recipes :data:`FP8_REFUSED` names and Megatron's own rejections are one-line errors."""
    fmt = a.value("--fp8-format")
    bf16 = a.flag("--first-last-layers-bf16")
    start, end = a.int("--num-layers-at-start-in-bf16", 1), a.int("--num-layers-at-end-in-bf16", 1)
    fp8 = not (fmt is None or str(fmt) in ("None", "none", "false", "False"))
    recipe = str(a.value("--fp8-recipe") or "delayed") if fp8 else ""
    reuse = a.flag("--reuse-grad-buf-for-mxfp8-param-ag")
    if reuse and not (a.flag("--fp8-param-gather") and recipe == "mxfp8"):
        # distributed_data_parallel_config.py: __post_init__ asserts fp8_param_gather; the shared buffer exists
        # only for MXFP8 parameters
        raise UserError("--reuse-grad-buf-for-mxfp8-param-ag without MXFP8 parameters: Megatron-LM needs "
                        "--fp8-param-gather under --fp8-recipe mxfp8 for it; add them or drop it")
    if not fp8:
        if a.flag("--fp8-param-gather"):
            raise UserError("--fp8-param-gather without --fp8-format: Megatron keeps FP8 parameters only in FP8 "
                            "training; add --fp8-format or drop it")
        return
    if recipe in FP8_REFUSED:
        raise UserError(f"--fp8-recipe {recipe}: {FP8_REFUSED[recipe]}")
    if recipe not in ("delayed", "tensorwise", "blockwise", "mxfp8"):
        raise UserError(f"--fp8-recipe {recipe}: use one of delayed, tensorwise, blockwise, mxfp8, custom")
    if a.flag("--fp8-param-gather") and not a.flag("--use-distributed-optimizer"):
        raise UserError("--fp8-param-gather: Megatron-LM keeps FP8 parameters only under the distributed "
                        "optimizer (arguments.py: validate_args); add --use-distributed-optimizer")
    if bf16 and recipe == "delayed":
        raise UserError("--first-last-layers-bf16 under the delayed recipe: Megatron-LM refuses it "
                        "(transformer_config.py: 'Delayed scaling does not support first / last layer in BF16.'); "
                        "use --fp8-recipe tensorwise or drop it")
    if a.str("--transformer-impl", "transformer_engine") == "local":
        fp8_on_local_layers(a, c)
        return
    c.put("training.fp8_recipe", recipe, "--fp8-format", "--fp8-recipe")
    if recipe == "delayed":  # arguments.py: --fp8-amax-history-len, default 1 (TE's DelayedScaling: 1024)
        c.put("training.fp8_amax_history_len", a.int("--fp8-amax-history-len", 1), "--fp8-amax-history-len")
    if a.flag("--fp8-param-gather"):
        c.put("training.fp8_param_gather", True, "--fp8-param-gather")
    if reuse:
        c.put("training.mxfp8_reuse_grad_buf", True, "--reuse-grad-buf-for-mxfp8-param-ag")
    if bf16:  # core/fp8_utils.py: is_first_last_bf16_layer (the layer counts default to 1, arguments.py)
        c.put("training.fp8_bf16_first_layers", start, "--first-last-layers-bf16", "--num-layers-at-start-in-bf16")
        c.put("training.fp8_bf16_last_layers", end, "--first-last-layers-bf16", "--num-layers-at-end-in-bf16")


#: the FP8 arguments :func:`fp8_training` maps (the scaling arithmetic's, ``--fp8-margin`` and the like, are
#: memory-neutral in the table already)
FP8_ARGS = ("--fp8-format", "--fp8-recipe", "--fp8-amax-history-len", "--first-last-layers-bf16",
            "--num-layers-at-start-in-bf16", "--num-layers-at-end-in-bf16")


def fp8_on_local_layers(a: ArgReader, c: Conversion) -> None:
    """``--fp8-format`` under ``--transformer-impl local``. The local spec's linears are Megatron's own
    ``ColumnParallelLinear`` / ``RowParallelLinear`` (``gpt_layer_specs.py: get_gpt_layer_local_spec``; the legacy
    ``ParallelTransformerLayer`` likewise), which ignore Transformer Engine's ``fp8_autocast``
    (``transformer_block.py: TransformerBlock.forward`` enters ``fp8_utils.get_fp8_context`` around them): the GEMMs
    run in the training dtype and no FP8 copy, scale or amax history is made, and neither ``validate_args`` nor
    ``TransformerConfig.__post_init__`` refuses the pair. So the FP8 arguments are memory-neutral there, with a note.
    Two cases do make FP8 memory and stay refused in one line: the local experts (``experts.py: SequentialMLP``
    pads each expert's tokens under FP8, ``_pad_tensor_for_quantization``) and FP8 parameters (``--fp8-param-gather``:
    ``distrib_optimizer.py`` / Megatron-FSDP keep FP8 parameter state)."""
    if a.value("--num-experts") not in (None, 0, "0"):
        raise UserError("--fp8-format with --transformer-impl local on a MoE model: the local experts "
                        "(experts.py: SequentialMLP) pad each expert's tokens for FP8 (_pad_tensor_for_quantization), "
                        "not modelled; use --transformer-impl transformer_engine or drop --fp8-format")
    if a.flag("--fp8-param-gather"):
        raise UserError("--fp8-param-gather with --transformer-impl local: FP8 parameters of the local layers are not "
                        "modelled; use --transformer-impl transformer_engine or drop --fp8-param-gather")
    given = [name for name in FP8_ARGS if a.raw.get(name) not in (None, False)]
    for name in given:
        a.read.add(name)
        c.neutral[name] = "the local layers' linears ignore TE's fp8_autocast: no FP8 GEMM or state"
    c.notes.append(f"{' '.join(given)}: the local layers (--transformer-impl local) are Megatron's own linears, which "
                   "run in the training dtype under TE's fp8_autocast (transformer_block.py: get_fp8_context), so "
                   "FP8 adds no memory")


def map_gpt_oss(a: ArgReader, c: Conversion, layers: int) -> None:
    """GPT-OSS's knobs as Megatron-Core (core_v0.15.0 on) reads them (``transformer_config.py``): ``--quick-geglu``
    (``activation_func = quick_gelu`` on a gated unit, gate · sigmoid(1.702 · gate): ``hidden_act = "silu"`` with
    ``swiglu_alpha``), ``--glu-linear-offset`` ((up + offset)), ``--activation-func-clamp-value`` (the clamped
    unit), ``--softmax-type learnable`` (one learned sink logit per head: ``attention_sinks``; ``off-by-one``, a fixed
    zero logit: ``sink_fixed``), ``--window-size
    (left, right)`` (TE's window: ``left + 1`` keys a causal query sees) on the layers ``--window-attn-skip-freq``
    leaves sliding (``transformer/utils.py: is_layer_window_attention``)."""
    if a.flag("--quick-geglu"):
        c.put("model.hidden_act", "silu", "--quick-geglu")
        c.put("model.swiglu_alpha", 1.702)  # megatron/core/fusions/fused_bias_geglu.py: quick_gelu
    offset = a.float("--glu-linear-offset", 0.0)
    if offset:
        c.put("model.glu_linear_offset", offset, "--glu-linear-offset")
    clamp = a.float("--activation-func-clamp-value", 0.0)
    if clamp:
        c.put("model.swiglu_limit", clamp, "--activation-func-clamp-value")
    softmax = a.str("--softmax-type", "vanilla")
    if softmax in ("learnable", "off-by-one"):
        c.put("model.attention_sinks", True, "--softmax-type")
        if softmax == "off-by-one":  # TE's fixed zero logit: an fp32 tensor per layer, no parameter
            c.put("model.sink_fixed", True)
    elif softmax != "vanilla":
        raise UserError(f"--softmax-type {softmax}: use vanilla, off-by-one or learnable (Megatron-LM's choices)")
    window = a.value("--window-size")
    skip = a.value("--window-attn-skip-freq")
    if window is None:
        return
    parts = [p for p in re.split(r"[\s,()\[\]]+", " ".join(window) if isinstance(window, tuple) else str(window)) if p]
    if len(parts) != 2 or not all(re.fullmatch(r"-?\d+", p) for p in parts):
        raise UserError(f"--window-size {window!r}: expected two integers, LEFT,RIGHT (Megatron's tuple_type)")
    left, right = (int(p) for p in parts)
    if right != 0 or left < 0:
        raise UserError(f"--window-size {left},{right}: only a causal window (RIGHT = 0, LEFT ≥ 0) is modelled")
    pattern = window_layer_pattern(skip, layers)
    c.put("model.sliding_window", left + 1, "--window-size")
    c.put("model.layer_types", ["sliding_attention" if v else "full_attention" for v in pattern],
          "--window-attn-skip-freq")


def map_mup(a: ArgReader, c: Conversion, family: str | None) -> None:
    """``--use-mup`` → ``model.mup_embedding_mult`` / ``mup_output_mult`` (Megatron-Core core_v0.17.0 …
    d98e8a64dd: ``TransformerConfig.__post_init__`` takes ``mup_width_mult = hidden_size / mup_base_hidden_size``,
    the base defaulting to the hidden size, and an output multiplier left at 1 becomes ``1 / mup_width_mult``;
    ``LanguageModelEmbedding.forward`` multiplies the embeddings by ``mup_embedding_mult`` and GPTModel's and
    HybridModel's ``_scale_logits`` the logits — the MTP heads' too — by ``mup_output_mult``; BertModel and T5Model
    only initialise by μP, so their logits are not scaled). The legacy models have no μP."""
    if not a.flag("--use-mup"):
        for name in ("--mup-embedding-mult", "--mup-output-mult", "--mup-base-hidden-size"):
            a.value(name)  # without --use-mup: read by nothing (TransformerConfig's use_mup gates them)
        return
    if a.flag("--use-legacy-models"):
        raise UserError("--use-mup with --use-legacy-models: μP lives in Megatron-Core's models only "
                        "(transformer_config.py use_mup); drop one of them")
    hidden = a.need("--hidden-size")
    base = a.int("--mup-base-hidden-size") or hidden
    if base <= 0:
        raise UserError(f"--mup-base-hidden-size {base}: Megatron-Core asserts it is positive "
                        "(transformer_config.py: TransformerConfig.__post_init__)")
    width = hidden / base
    output = a.float("--mup-output-mult", 1.0)
    if output == 1.0 and width != 1.0:
        output = 1.0 / width
    embedding = a.float("--mup-embedding-mult", 1.0)
    if output <= 0 or embedding <= 0:
        raise UserError("--mup-output-mult / --mup-embedding-mult: a multiplier must be positive to be modelled")
    c.put("model.mup_embedding_mult", embedding, "--use-mup", "--mup-embedding-mult")
    if family not in ("bert", "t5"):
        c.put("model.mup_output_mult", output, "--use-mup", "--mup-output-mult", "--mup-base-hidden-size")


def map_model(a: ArgReader, c: Conversion, family: str | None = None, *, megatron_core: str | None = None,
              null_eod: bool | None = None) -> None:
    """``[model]``: the ``megatron-gpt`` preset with every size and switch the arguments give (``family``: the
    model family the input names, for its tokenizer's default; ``megatron_core``, ``null_eod``: the tokenizer's
    vocabulary, :func:`timeline.io.megatron_tokenizer.vocab_size`)."""
    c.put("model.preset", "megatron-gpt")
    layers, h, heads = num_layers(a), a.need("--hidden-size"), a.need("--num-attention-heads")
    c.put("model.num_layers", layers, "--num-layers")
    c.put("model.hidden_size", h, "--hidden-size")
    c.put("model.num_attention_heads", heads, "--num-attention-heads")
    swiglu, relu2 = a.flag("--swiglu"), a.flag("--squared-relu")
    ffn = a.int("--ffn-hidden-size")
    if ffn is None:  # arguments.py: validate_args
        ffn = int((4 * h * 2 / 3) / 64) * 64 if swiglu else 4 * h
    c.put("model.intermediate_size", ffn, "--ffn-hidden-size")
    c.put("model.hidden_act", "silu" if swiglu else "relu2" if relu2 else "gelu", "--swiglu", "--squared-relu")
    map_gpt_oss(a, c, layers)
    gqa = a.flag("--group-query-attention")
    groups = a.int("--num-query-groups", 1)
    c.put("model.num_key_value_heads", groups if gqa else heads, "--group-query-attention", "--num-query-groups")
    kv = a.int("--kv-channels")
    if kv is not None:
        c.put("model.head_dim", kv, "--kv-channels")
    norm = a.str("--normalization", "LayerNorm")
    if norm not in ("LayerNorm", "RMSNorm"):
        raise UserError(f"--normalization {norm}: only LayerNorm and RMSNorm are modelled")
    c.put("model.norm", norm.lower(), "--normalization")
    pos = a.str("--position-embedding-type", "learned_absolute")
    if a.flag("--use-rotary-position-embeddings"):  # arguments.py: validate_args, "Legacy RoPE arguments"
        pos = "rope"
    if pos not in ("learned_absolute", "rope", "yarn", "none"):
        raise UserError(f"--position-embedding-type {pos}: only learned_absolute, rope, yarn and none are modelled")
    # none: no position table and no rotary (gpt_model.py / hybrid_model.py build neither; the hybrid default)
    c.put("model.position_embedding", {"learned_absolute": "learned", "none": "none"}.get(pos, "rope"),
          "--position-embedding-type", "--use-rotary-position-embeddings")
    if a.flag("--no-position-embedding") and pos != "rope":  # arguments.py: validate_args raises
        raise UserError(f"--no-position-embedding with --position-embedding-type {pos}: Megatron-LM rejects it "
                        "(use --position-embedding-type rope)")
    bias = not a.flag("--disable-bias-linear")
    c.put("model.linear_bias", bias, "--disable-bias-linear")
    c.put("model.attention_bias", bias or a.flag("--add-qkv-bias"), "--add-qkv-bias")
    c.put("model.tie_word_embeddings", not a.flag("--untie-embeddings-and-output-weights"),
          "--untie-embeddings-and-output-weights")
    c.put("model.hidden_dropout", a.float("--hidden-dropout", 0.1), "--hidden-dropout")
    c.put("model.attention_dropout", a.float("--attention-dropout", 0.1), "--attention-dropout")
    seq = a.need("--seq-length")
    c.put("model.max_position_embeddings", a.int("--max-position-embeddings", seq), "--max-position-embeddings")
    if assumed_gpt2(a, family):
        c.notes.append(f"{ASSUMED_VOCAB}: the vocabulary is taken as GPT-2's 50,257 tokens "
                       "(the entry script's default GPT2BPETokenizer, whose --vocab-file they do not give either); "
                       "give from-megatron --vocab-size N for the job's own")
    unpadded = [n for n in ("--no-pad-vocab-size", "--disable-pad-vocab-size") if a.flag(n)]
    if unpadded and "--padded-vocab-size" not in a.raw:
        # core/tokenizers/utils/build_tokenizer.py (core_v0.18.0 … d98e8a64dd): _set_padded_vocab_size runs only under
        # pad_vocab_size, so args.padded_vocab_size stays None and GPTModel gets no vocabulary size
        raise UserError(f"{unpadded[0]} without --padded-vocab-size: Megatron-LM then sets no padded vocabulary "
                        "(build_tokenizer.py) and the model has no vocabulary size; give --padded-vocab-size N")
    c.put("model.vocab_size", vocab_size(a, family, megatron_core=megatron_core, null_eod=null_eod), "--vocab-size",
          "--tokenizer-type", "--vocab-file", "--tokenizer-model", "--padded-vocab-size", *unpadded)
    if a.flag("--attention-output-gate"):  # transformer_config.py: MLATransformerConfig raises for it
        if a.flag("--multi-latent-attention"):
            raise UserError("--attention-output-gate with --multi-latent-attention: Megatron-LM rejects it (\"Output "
                            "gate is not supported for MLA yet\"); drop one")
        c.put("model.attention_output_gate", True, "--attention-output-gate")
    if a.flag("--qk-l2-norm"):  # gpt_layer_specs.py: L2Norm for q and k, before any --qk-layernorm norm
        if a.flag("--multi-latent-attention"):
            raise UserError("--qk-l2-norm with --multi-latent-attention: Megatron-LM rejects it (\"qk_l2_norm is not "
                            "supported with MLA\")")
        c.put("model.qk_norm", True, "--qk-l2-norm")
        c.put("framework.qk_l2_norm", True, "--qk-l2-norm")
    elif a.flag("--qk-layernorm") and not a.flag("--multi-latent-attention"):
        c.put("model.qk_norm", True, "--qk-layernorm")
    if a.flag("--multi-latent-attention"):
        c.put("model.kv_lora_rank", a.int("--kv-lora-rank", 32), "--multi-latent-attention", "--kv-lora-rank")
        c.put("model.q_lora_rank", a.int("--q-lora-rank", 0) or 0, "--q-lora-rank")
        c.put("model.qk_nope_head_dim", a.int("--qk-head-dim", 128), "--qk-head-dim")
        c.put("model.qk_rope_head_dim", a.int("--qk-pos-emb-head-dim", 64), "--qk-pos-emb-head-dim")
        c.put("model.v_head_dim", a.int("--v-head-dim", 128), "--v-head-dim")
        a.flag("--qk-layernorm")  # MLA's q/kv latent norms: always built by the MLA layers
    map_rotary(a, c, pos)
    map_linear_attention(a, c, layers)
    experts = a.int("--num-experts")
    if experts:
        c.put("model.n_routed_experts", experts, "--num-experts")
        c.put("model.moe_intermediate_size", a.int("--moe-ffn-hidden-size", ffn), "--moe-ffn-hidden-size")
        c.put("model.num_experts_per_tok", a.int("--moe-router-topk", 2), "--moe-router-topk")
        shared = a.int("--moe-shared-expert-intermediate-size")
        if shared:
            c.put("model.n_shared_experts", 1, "--moe-shared-expert-intermediate-size")
            c.put("model.shared_expert_intermediate_size", shared)
        # moe/moe_layer.py: MoELayer hands config.moe_shared_expert_gate to SharedExpertMLP, which exists only
        # with --moe-shared-expert-intermediate-size: without shared experts the flag changes nothing
        gate = a.flag("--moe-shared-expert-gate")
        if gate and shared:
            c.put("model.shared_expert_gate", True, "--moe-shared-expert-gate")
        pattern = moe_layer_pattern(a.value("--moe-layer-freq", 1), layers)
        rule = pattern_to_model(pattern)
        if rule is not None:
            c.put("model.first_k_dense_replace", rule[0], "--moe-layer-freq")
            c.put("model.moe_layer_freq", rule[1])
        else:  # any other list: one kind per layer (transformer_layer.py builds each layer's MLP from it)
            c.put("model.mlp_layer_types", tuple("moe" if v else "dense" for v in pattern), "--moe-layer-freq")
        c.put("model.router_bias", a.flag("--moe-router-enable-expert-bias"), "--moe-router-enable-expert-bias")
    latent = a.int("--moe-latent-size")
    if latent:  # arguments.py: validate_args (b51db3e07a on) asserts a positive size and --num-experts
        if not experts:
            raise UserError(f"--moe-latent-size {latent} without --num-experts: Megatron-LM refuses it (\"MoE latent "
                            "projections are applicable only for MoE models\"); give --num-experts or drop it")
        c.put("model.moe_latent_size", latent, "--moe-latent-size")
    mtp = a.int("--mtp-num-layers")
    c.put("model.mtp_layers", mtp or 0, "--mtp-num-layers")
    map_hybrid(a, c)
    # transformer_config.py (core_v0.17.0 on): mtp_use_repeated_layer builds one MTP layer and runs it at every
    # depth (multi_token_prediction.py: MultiTokenPredictionBlock, `layer_idx = 0 if self.mtp_use_repeated_layer`)
    repeated = a.flag("--mtp-use-repeated-layer")
    if repeated and c.sections["model"].get("mtp_layers"):
        c.put("model.mtp_repeated_layer", True, "--mtp-use-repeated-layer")


#: ``--experimental-attention-variant`` values that build Megatron-Core's GatedDeltaNet (``gated_delta_net``;
#: ``gdn`` from 0c1fc4c5c9, which normalises the old name to it in ``TransformerConfig.__post_init__``)
GDN_VARIANTS = ("gated_delta_net", "gdn")


def map_linear_attention(a: ArgReader, c: Conversion, layers: int) -> None:
    """``--experimental-attention-variant gated_delta_net``: which layers are gated delta nets and their sizes
    (``TransformerConfig``'s defaults: conv kernel 4, key and value head dims 128, 16 key and 32 value heads)."""
    variant = a.str("--experimental-attention-variant")
    legacy = a.str("--linear-attention-type")
    if legacy is not None:
        # the dev branch's name for it, from c7590d8c37 (2025-10-13, choices gated_delta_net and mamba) to
        # a9fb6c8ba3 (2026-01-30), where arguments.py: validate_args warns it is deprecated and sets
        # `args.experimental_attention_variant = args.linear_attention_type`; no release carries it
        if legacy != "gated_delta_net":
            raise UserError(f"--linear-attention-type {legacy}: only gated_delta_net is modelled (Mamba layers: "
                            "--hybrid-layer-pattern)")
        if variant is not None and variant != legacy:
            raise UserError(f"--linear-attention-type {legacy} with --experimental-attention-variant {variant}: the "
                            "first is the deprecated name of the second (Megatron-LM overwrites it); give one")
        variant = legacy
        c.notes.append("--linear-attention-type gated_delta_net is the dev branch's name for "
                       "--experimental-attention-variant gated_delta_net (deprecated there from a9fb6c8ba3, in no "
                       "release): its layers are simulated as core_v0.17.0's GatedDeltaNet"
                       + (", whose --deterministic-mode path (torch_chunk_gated_delta_rule) the dev branch has from "
                          "5880674a39 (2025-11-19), not before" if a.flag("--deterministic-mode") else ""))
    if variant is None:
        return
    if variant not in GDN_VARIANTS:
        raise UserError(f"--experimental-attention-variant {variant}: only the gated delta net ({', '.join(GDN_VARIANTS)}) "
                        "is modelled (DSA's indexer and GDN2's gates are not)")
    freq = a.value("--linear-attention-freq")
    if freq is None:  # experimental_attention_variant_module_specs.py: get_linear_attention_pattern raises
        raise UserError(f"--experimental-attention-variant {variant} needs --linear-attention-freq (Megatron-LM raises "
                        "without it): an integer N (every N-th layer attention) or a list expression")
    pattern = linear_attention_pattern(freq, layers)
    c.put("model.layer_types", tuple("linear_attention" if v else "full_attention" for v in pattern),
          "--experimental-attention-variant", "--linear-attention-freq", "--linear-attention-type")
    for arg, default in (("--linear-conv-kernel-dim", 4), ("--linear-key-head-dim", 128),
                         ("--linear-value-head-dim", 128), ("--linear-num-key-heads", 16),
                         ("--linear-num-value-heads", 32)):
        c.put("model." + arg[2:].replace("-", "_"), a.int(arg, default), arg)
    if a.flag("--deterministic-mode"):
        c.notes.append(deterministic_gdn_note(a, c.sections["model"]))


def deterministic_gdn_note(a: ArgReader, model: dict[str, Any]) -> str:
    """What ``--deterministic-mode`` costs a gated delta-net layer: ``torch_chunk_gated_delta_rule``'s saved tensors
    (:func:`timeline.profiles.megatron_gdn.torch_chunk_elements`) against what fla's chunk kernel keeps (q and k at the
    value heads, v, A, the cumulative g, beta), per layer and micro-batch on one tensor-parallel rank."""
    from timeline.profiles.megatron_gdn import FLA_CHUNK, TORCH_CHUNK, torch_chunk_elements

    s, b = a.int("--seq-length", 0), a.int("--micro-batch-size", 1)
    heads = max(model["linear_num_value_heads"], model["linear_num_key_heads"]) \
        // max(1, a.int("--tensor-model-parallel-size", 1))
    kd, vd = model["linear_key_head_dim"], model["linear_value_head_dim"]
    text = ("--deterministic-mode runs each gated delta net as torch ops (Megatron-Core's torch_chunk_gated_delta_rule "
            "and nn.Conv1d; fla is not deterministic)")
    if s <= 0 or heads <= 0:
        return text
    t = s * b
    torch_kept = b * heads * torch_chunk_elements(s, kd, vd)[0] * 4 + 2 * TORCH_CHUNK * TORCH_CHUNK
    fla_kept = t * heads * (2 * kd * 2 + vd * 2 + FLA_CHUNK * 2 + 4 + 2)
    return (f"{text}: {torch_kept / 2**20:,.0f} MiB kept per layer and micro-batch on a rank where fla's kernels keep "
            f"{fla_kept / 2**20:,.0f} MiB")


def num_layers(a: ArgReader) -> int:
    """``--num-layers``, or a hybrid pattern's length (``arguments.py: validate_args`` derives it from
    ``--hybrid-layer-pattern``)."""
    hybrid = read_hybrid(a.raw)
    if hybrid is not None:
        a.value("--num-layers")
        return len(hybrid.pattern)
    return a.need("--num-layers")


def map_hybrid(a: ArgReader, c: Conversion) -> None:
    """A hybrid model's layer kinds and Mamba mixer sizes (:mod:`timeline.io.megatron_hybrid`)."""
    hybrid = read_hybrid(a.raw)
    if hybrid is None:
        return
    c.put("model.hybrid_override_pattern", hybrid.pattern, "--hybrid-layer-pattern", "--hybrid-override-pattern",
          "--hybrid-attention-ratio", "--hybrid-mlp-ratio", "--is-hybrid-model", "--spec")
    if hybrid.mtp_depths:  # the pattern's MTP depths (arguments.py: validate_args infers --mtp-num-layers from them)
        moe = bool(c.sections["model"].get("n_routed_experts"))
        if (hybrid.mtp_pattern == "*E") != moe:
            raise UserError(f"--hybrid-layer-pattern …/{hybrid.mtp_pattern}: an MTP depth with "
                            f"{'an MoE' if hybrid.mtp_pattern == '*E' else 'a dense MLP'} layer in "
                            f"{'a dense' if not moe else 'an MoE'} model is not modelled")
        given = c.sections["model"].get("mtp_layers")
        if given and given != hybrid.mtp_depths:
            c.notes.append(f"--mtp-num-layers {given} conflicts with the pattern's {hybrid.mtp_depths} MTP depths: "
                           "Megatron-LM warns and takes the pattern's (arguments.py: validate_args)")
        c.put("model.mtp_layers", hybrid.mtp_depths, "--hybrid-layer-pattern", "--mtp-hybrid-override-pattern")
    c.put("model.mamba_head_dim", a.int("--mamba-head-dim", 64), "--mamba-head-dim")
    c.put("model.ssm_state_size", a.int("--mamba-state-dim", 128), "--mamba-state-dim")
    c.put("model.n_groups", a.int("--mamba-num-groups", 8), "--mamba-num-groups")
    c.put("model.mamba_num_heads", a.int("--mamba-num-heads", 0) or 0, "--mamba-num-heads")


#: the pipeline-split arguments a layout excludes: ``arguments.py: validate_args`` asserts that at most
#: one of the first two groups' arguments is given; ``TransformerConfig.__post_init__`` raises
#: ValueError for a layout beside the others (core_v0.13.0 … d98e8a64dd)
LAYOUT_EXCLUDES = (("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank"),
                   ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                    "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"))


def layout_conflicts(a: ArgReader) -> None:
    """Refuse ``--pipeline-model-parallel-layout`` beside another way of splitting the layers, as Megatron does."""
    for name in (n for group in LAYOUT_EXCLUDES for n in group):
        if a.value(name) not in (None, False):
            raise UserError(f"--pipeline-model-parallel-layout cannot be given with {name}: the layout already says "
                            "which layers each virtual stage holds; drop one of them")


def encoder_stages(a: ArgReader, tp: int, family: str | None) -> tuple[int, int]:
    """``--encoder-pipeline-model-parallel-size`` / ``--encoder-tensor-model-parallel-size`` (Megatron-LM 8af3dae72a,
    2024-08, to b600e38d7b, 2025-07, which removed them): (the encoder's own pipeline stages, 0 or LLaVA's 1; their
    tensor-parallel ranks, the decoder's unless fewer are given).

    ``arguments.py: validate_args`` asserts an encoder TP divides the heads and is at most the decoder's, and takes
    the decoder's for an encoder stage without one; with no encoder stage it has no effect
    (``parallel_state.py: initialize_model_parallel`` makes no encoder ranks, and ``pretrain_vlm.py:
    model_provider`` reads it only under an encoder stage). ``pretrain_vlm.py`` asserts "ViT can only live on 1
    pipeline stage"; T5's encoder stages are not modelled."""
    enc_pp = a.int("--encoder-pipeline-model-parallel-size", 0)
    enc_tp = a.int("--encoder-tensor-model-parallel-size", 0)
    heads = a.int("--num-attention-heads")
    if enc_tp < 0 or enc_pp < 0:
        raise UserError("--encoder-tensor-model-parallel-size / --encoder-pipeline-model-parallel-size: sizes are 0 "
                        "(the default) or more")
    if enc_tp and ((heads and heads % enc_tp) or enc_tp > tp):
        raise UserError(f"--encoder-tensor-model-parallel-size {enc_tp}: Megatron asserts it divides the attention "
                        f"heads and is at most --tensor-model-parallel-size {tp} (arguments.py: validate_args)")
    if enc_pp == 0:
        return 0, tp
    if family not in VLM_FAMILIES:
        raise UserError(f"--encoder-pipeline-model-parallel-size {enc_pp}: a separately parallelised encoder (T5's) "
                        "is not modelled")
    if enc_pp != 1:
        raise UserError(f"--encoder-pipeline-model-parallel-size {enc_pp}: pretrain_vlm.py asserts \"ViT can only "
                        "live on 1 pipeline stage\"; give 1")
    return 1, enc_tp or tp


def map_parallel(a: ArgReader, c: Conversion, world_size: int, *, megatron_core: str | None = None,
                 family: str | None = None) -> tuple[int, int]:
    """``[parallel]`` and ``[schedule]``; returns (dp, pp). ``megatron_core``: the version whose
    layout rules apply (:func:`timeline.io.megatron_layout.check_layout`); ``family``: the job's model family (a
    LLaVA ViT's own pipeline stage, :func:`encoder_stages`)."""
    tp = positive(a, "--tensor-model-parallel-size", 1)
    pp = positive(a, "--pipeline-model-parallel-size", 1)
    cp = positive(a, "--context-parallel-size", 1)
    ep = positive(a, "--expert-model-parallel-size", 1)
    etp = positive(a, "--expert-tensor-parallel-size", tp)
    encoder, enc_tp = encoder_stages(a, tp, family)
    # arguments.py: validate_args — the world is data-parallel copies of the encoder's and the decoder's ranks,
    # enc_tp·enc_pp·cp + tp·pp·cp
    model_ranks = (enc_tp * encoder + tp * pp) * cp
    if world_size % model_ranks:
        raise UserError(f"--world-size {world_size} is not divisible by tp·pp·cp = {tp}·{pp}·{cp}"
                        + (f" + the ViT stage's {enc_tp}·{cp} ranks" if encoder else ""))
    dp = world_size // model_ranks
    c.put("parallel.tp", tp, "--tensor-model-parallel-size")
    c.put("parallel.pp", pp + encoder, "--pipeline-model-parallel-size",
          *(("--encoder-pipeline-model-parallel-size",) if encoder else ()))
    if encoder:
        c.put("parallel.encoder_pp", encoder, "--encoder-pipeline-model-parallel-size")
    if encoder and enc_tp != tp:
        c.put("parallel.encoder_tp", enc_tp, "--encoder-tensor-model-parallel-size")
    c.put("parallel.cp", cp, "--context-parallel-size")
    cp_comm(a, c, cp)
    c.put("parallel.ep", ep, "--expert-model-parallel-size")
    c.put("parallel.etp", etp, "--expert-tensor-parallel-size")
    c.put("parallel.dp", dp)
    # arguments.py: sequence parallelism is switched off when tp == 1
    c.put("parallel.sp", a.flag("--sequence-parallel") and tp > 1, "--sequence-parallel")
    layers = num_layers(a)
    vpp = 1
    layout = None
    hybrid = read_hybrid(a.raw)
    per = a.int("--num-layers-per-virtual-pipeline-stage")
    stages = a.int("--num-virtual-stages-per-pipeline-rank")
    if a.has("--pipeline-model-parallel-layout"):
        layout_conflicts(a)
        layout, vpp, mtp_at = parse_layout_mtp(a.str("--pipeline-model-parallel-layout") or "", pp,
                                               num_layers=layers, mtp_layers=a.int("--mtp-num-layers"),
                                               megatron_core=version_tuple(megatron_core) if megatron_core else None,
                                               places_mtp=layout_places_mtp(megatron_core) if megatron_core else None)
        if mtp_at is not None:
            c.put("parallel.mtp_stage", mtp_at, "--pipeline-model-parallel-layout")
    elif per:
        # arguments.py: validate_args (core_v0.16.0) counts the embedding and the loss as a layer each under
        # --account-for-embedding/loss-in-pipeline-split before dividing
        counted = layers + int(a.flag("--account-for-embedding-in-pipeline-split")) + \
            int(a.flag("--account-for-loss-in-pipeline-split"))
        if counted % (pp * per):
            raise UserError(f"--num-layers-per-virtual-pipeline-stage {per}: {counted} layers do not divide into "
                            f"pp·{per}")
        vpp = counted // (pp * per)
    elif stages:
        vpp = stages
    if hybrid is not None and hybrid.segments is not None:  # arguments.py: the pattern's '|' segments
        if len(hybrid.segments) % pp:
            raise UserError(f"--hybrid-layer-pattern: {len(hybrid.segments)} pipeline segments do not divide by "
                            f"--pipeline-model-parallel-size {pp}")
        layout, vpp = list(hybrid.segments), len(hybrid.segments) // pp
    # arguments.py: validate_args (core_v0.12.0 … d98e8a64dd) asserts an interleaved schedule has pp > 1,
    # pp > 2 without p2p overlap (--no-overlap-p2p-communication)
    least = 3 if a.flag("--no-overlap-p2p-communication") else 2
    if vpp > 1 and pp < least:
        raise UserError(f"{vpp} virtual pipeline stages per rank with --pipeline-model-parallel-size {pp}: "
                        f"Megatron-LM refuses an interleaved schedule with "
                        f"pp < {least}" + (" without p2p overlap" if least == 3 else "")
                        + " (arguments.py: validate_args); drop the virtual pipeline or raise pp")
    if layout is None:
        layout = split_layers(layers, pp * vpp, first=a.int("--decoder-first-pipeline-num-layers"),
                              last=a.int("--decoder-last-pipeline-num-layers"),
                              embedding=a.flag("--account-for-embedding-in-pipeline-split"),
                              loss=a.flag("--account-for-loss-in-pipeline-split"), pp=pp)
        if layout is None and hybrid is None and layers % (pp * vpp):
            # transformer_block.py: get_num_layers_to_build asserts num_layers % pipeline_model_parallel_size
            # == 0 (and a rank's layers over its virtual stages) when no uneven split is given
            raise UserError(f"--num-layers {layers} does not divide into --pipeline-model-parallel-size {pp}"
                            + (f" × {vpp} virtual stages" if vpp > 1 else "")
                            + ": Megatron-LM refuses this job too (get_num_layers_to_build); give "
                              "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers or "
                              "--pipeline-model-parallel-layout, or another --pipeline-model-parallel-size")
    c.put("parallel.vpp", vpp, "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
          *(("--hybrid-layer-pattern",) if hybrid is not None and hybrid.segments else ()))
    if encoder:  # the ViT's stage comes first and holds no decoder layer
        if vpp > 1:
            raise UserError("--encoder-pipeline-model-parallel-size with virtual pipeline stages: not modelled")
        layout = [0, *(layout or [layers // pp] * pp)]
    if layout is not None:
        c.put("parallel.layout", layout, *(n for n in (
            "--pipeline-model-parallel-layout", "--decoder-first-pipeline-num-layers",
            "--decoder-last-pipeline-num-layers", "--account-for-embedding-in-pipeline-split",
            "--account-for-loss-in-pipeline-split") if n in a.raw))
    c.put("schedule.kind", "interleaved" if vpp > 1 else "1f1b")
    if a.flag("--no-overlap-p2p-communication") and vpp > 1:
        # schedules.py: forward_backward_pipelining_with_interleaving posts the next receive ahead only with
        # config.overlap_p2p_comm; 1F1B's p2p_communication.py sends the same buffers batched or not
        raise UserError("--no-overlap-p2p-communication with an interleaved schedule: the receive buffers' order "
                        "without p2p overlap is not modelled")
    if a.flag("--overlap-moe-expert-parallel-comm"):
        _combined_1f1b(a, c, pp, vpp)
    group = a.int("--microbatch-group-size-per-virtual-pipeline-stage")
    if group and vpp > 1:
        c.put("schedule.microbatch_group_size", group, "--microbatch-group-size-per-virtual-pipeline-stage")
    return dp, pp


def _combined_1f1b(a: ArgReader, c: Conversion, pp: int, vpp: int) -> None:
    """``--overlap-moe-expert-parallel-comm``: Megatron's combined 1F1B (``schedule.combined_1f1b``), which
    ``transformer_config.py: TransformerConfig.__post_init__`` allows with expert parallelism, the alltoall
    or flex dispatcher, bf16/fp16 and no full recompute, and with pp > 1 only under a virtual pipeline
    (core_v0.14.0 … d98e8a64dd)."""
    why = ""
    if pp > 1 and vpp == 1:
        why = "pp > 1 needs a virtual pipeline (--num-layers-per-virtual-pipeline-stage)"
    elif a.int("--expert-model-parallel-size", 1) < 2:
        why = "it needs --expert-model-parallel-size > 1"
    elif a.str("--moe-token-dispatcher-type", "allgather") not in ("alltoall", "flex"):
        why = "it needs --moe-token-dispatcher-type alltoall or flex"
    elif a.str("--recompute-granularity", "") == "full":
        why = "it excludes --recompute-granularity full"
    if why:
        raise UserError(f"--overlap-moe-expert-parallel-comm: Megatron refuses this job: {why}")
    c.put("schedule.combined_1f1b", True, "--overlap-moe-expert-parallel-comm")



def _step_schedule_start(text: str) -> int:
    """The global batch ``--step-batch-size-schedule`` starts with: its entry at threshold 0
    (core/num_microbatches_calculator.py: StepBatchsizeNumMicroBatchesCalculator, "THRESHOLD:BS …",
    updated at sample 0)."""
    sizes = dict(item.partition(":")[::2] for item in text.split())
    start = sizes.get("0", "")
    if not start.strip().isdigit():
        raise UserError(f"--step-batch-size-schedule {text!r}: expected 'THRESHOLD:BATCH …' starting at 0:BATCH")
    return int(start)


def module_names(value: object) -> list[str]:
    """A module-list argument's names (``--recompute-modules``, ``--offload-modules``): argparse's list, or a YAML
    string ``"[layernorm mlp]"``, which the functional tests' launcher word-splits and strips of its brackets so
    that argparse's ``nargs="*"`` receives the names (arguments.py)."""
    if isinstance(value, (list, tuple)):
        return [str(x) for x in value]
    return str(value).strip().strip("[]").replace(",", " ").split()


def map_training(a: ArgReader, c: Conversion, dp: int) -> None:
    """``[training]`` (batch, dtypes, optimizer) and ``[recompute]``."""
    mbs = a.need("--micro-batch-size")
    if mbs < 1:
        raise UserError(f"--micro-batch-size {mbs}: a micro-batch holds at least one sequence; give 1 or more")
    gbs = a.int("--global-batch-size", mbs * dp)
    ramp = a.value("--rampup-batch-size")
    if ramp is not None:  # the measured first iterations run the ramp's start batch
        # several words (a launch script's `--rampup-batch-size 32 32 1000`) or one string (a YAML list's text)
        words = [str(w) for w in ramp] if isinstance(ramp, tuple) else str(ramp).strip("[]() ").replace(",", " ").split()
        words = [w.strip("'\"") for w in words]
        if len(words) != 3 or not all(w.isdigit() for w in words):
            raise UserError(f"--rampup-batch-size {' '.join(words)}: expected three integers: <start batch size> "
                            "<batch size increment> <ramp-up samples> (arguments.py)")
        gbs = int(words[0])
    schedule = a.value("--step-batch-size-schedule")
    if schedule is not None and a.raw.get("--global-batch-size") not in (None, False):
        # Megatron-LM 532ad926b4 (2026-04-21, core_v0.18.0, with the schedule itself): arguments.py validate_args
        raise UserError("--step-batch-size-schedule with --global-batch-size: Megatron-LM raises 'Cannot specify "
                        "both --step-batch-size-schedule and --global-batch-size' (arguments.py: validate_args); "
                        "drop --global-batch-size")
    if schedule is not None:  # one string; a launch script's unquoted expansion splits it into words
        gbs = _step_schedule_start(" ".join(schedule) if isinstance(schedule, tuple) else str(schedule))
    if a.flag("--decrease-batch-size-if-needed"):
        # core/num_microbatches_calculator.py: ConstantNumMicroBatchesCalculator (and the ramp-up one) round the
        # running global batch down to a multiple of micro-batch·dp
        gbs = max(gbs // (mbs * dp), 1) * mbs * dp
    if gbs % (mbs * dp):
        raise UserError(f"--global-batch-size {gbs} is not divisible by micro-batch-size·dp = {mbs}·{dp}")
    c.put("training.micro_batch_size", mbs, "--micro-batch-size")
    c.put("training.seq_len", a.need("--seq-length"), "--seq-length")
    c.put("training.num_microbatches", gbs // (mbs * dp), "--global-batch-size", "--rampup-batch-size",
          "--step-batch-size-schedule", "--decrease-batch-size-if-needed")
    c.put("training.iterations", 2)
    fp16, bf16 = a.flag("--fp16"), a.flag("--bf16")
    if a.raw.get("--fp16-lm-cross-entropy") not in (None, False) and not fp16:  # read, not mapped: memory-neutral
        raise UserError("--fp16-lm-cross-entropy without --fp16: Megatron-LM refuses it (arguments.py: validate_args, "
                        "'lm cross entropy in fp16 only support in fp16 mode')")
    dtype = "fp16" if fp16 else "bf16" if bf16 else "fp32"
    c.put("training.dtype", dtype, "--fp16", "--bf16")
    if fp16 and a.value("--loss-scale") is None:
        # arguments.py: --initial-loss-scale 2**32 with dynamic scaling (optimizer/grad_scaler.py:
        # DynamicGradScaler, hysteresis 2): the first iterations' fp16 gradients overflow, and
        # MixedPrecisionOptimizer.step skips torch's Adam step, so its moments are not created yet
        c.put("training.optimizer_step", False, "--initial-loss-scale", "--loss-scale")
    # arguments.py: bf16 accumulates and all-reduces grads in fp32 unless --grad-reduce-in-bf16;
    # fp16 only with --accumulate-allreduce-grads-in-fp32 (DDP grad_reduce_in_fp32)
    fp32_grads = a.flag("--accumulate-allreduce-grads-in-fp32") or (bf16 and not a.flag("--grad-reduce-in-bf16"))
    c.put("training.grad_dtype", "fp32" if fp32_grads or dtype == "fp32" else dtype,
          "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32")
    c.put("training.zero", 1 if a.flag("--use-distributed-optimizer") else 0, "--use-distributed-optimizer")
    fp8_training(a, c)
    instances = a.int("--num-distributed-optimizer-instances", 1)
    if instances > 1:
        c.put("training.optimizer_instances", instances, "--num-distributed-optimizer-instances")
    cf = a.value("--moe-expert-capacity-factor")
    if cf is not None:
        c.put("training.capacity_factor", float(cf), "--moe-expert-capacity-factor")
        c.put("training.pad_to_capacity", a.flag("--moe-pad-expert-input-to-capacity"),
              "--moe-pad-expert-input-to-capacity")
    if a.flag("--moe-router-padding-for-quantization") or a.flag("--moe-router-padding-for-fp8"):
        c.put("training.moe_router_padding", True, "--moe-router-padding-for-quantization",
              "--moe-router-padding-for-fp8")
    gran = a.str("--recompute-granularity")
    if a.flag("--recompute-activations"):  # arguments.py: validate_args
        gran = "selective"
    moe_layer = a.flag("--moe-layer-recompute")
    if moe_layer:
        # transformer_config.py: TransformerConfig.__post_init__ (deprecated flag): selective, "moe" appended
        # to the modules (default ["core_attn"]); Megatron raises with full granularity
        if gran == "full":
            raise UserError("--moe-layer-recompute with --recompute-granularity full: Megatron-LM rejects it")
        gran = "selective"
    if gran == "full":
        c.put("recompute.policy", "full", "--recompute-granularity")
        c.put("recompute.method", a.str("--recompute-method", "uniform"), "--recompute-method")
        c.put("recompute.num_layers", a.int("--recompute-num-layers", 1), "--recompute-num-layers")
    elif gran == "selective":
        mods = module_names(a.value("--recompute-modules", ("core_attn",)))
        if moe_layer and "moe" not in mods:
            mods.append("moe")
        c.put("recompute.policy", "selective", "--recompute-granularity", "--recompute-activations",
              "--moe-layer-recompute")
        c.put("recompute.modules", [str(x) for x in mods], "--recompute-modules")
    elif gran is not None:
        raise UserError(f"--recompute-granularity {gran}: use full or selective")
    if a.flag("--distribute-saved-activations"):
        distribute_saved(a, c, gran)


def distribute_saved(a: ArgReader, c: Conversion, granularity: str | None) -> None:
    """``--distribute-saved-activations``: ``[recompute] distribute_saved``, after the checks Megatron-LM makes
    (``arguments.py: validate_args``, core_v0.12.0 … d98e8a64dd: tp > 1, full granularity, a recompute method;
    ``transformer_config.py: __post_init__``: no sequence parallelism)."""
    why = None
    if a.int("--tensor-model-parallel-size", 1) < 2:
        why = "it distributes over the tensor-parallel ranks; give --tensor-model-parallel-size 2 or more"
    elif granularity != "full":
        why = "it applies to --recompute-granularity full only"
    elif a.value("--recompute-method") in (None, "None"):
        why = "it needs a --recompute-method (uniform or block)"
    elif a.flag("--sequence-parallel"):
        why = "not with --sequence-parallel (the hidden states are already split)"
    if why:
        raise UserError(f"--distribute-saved-activations: Megatron-LM rejects the job: {why}, or drop the flag")
    c.put("recompute.distribute_saved", True, "--distribute-saved-activations")


def map_rotary(a: ArgReader, c: Conversion, pos: str) -> None:
    """What sizes the rotary embeddings' cached tables (``profiles/megatron_workspaces.py: rotary_caches``):
    ``--rotary-percent`` (the rotated share of a head, ``model.partial_rotary_factor``), ``--no-rope-fusion`` (MLA's),
    ``--rope-type`` of MLA layers (argument_utils.py: another type than rope needs MLA), dev's
    ``--original-max-position-embeddings`` (MLATransformerConfig's, 4096 by default) and, for a model-level YaRN
    embedding (``--position-embedding-type yarn``), ``--yarn-original-max-position-embeddings``. ``pos``: the
    position embedding type :func:`map_model` read."""
    percent = a.float("--rotary-percent", 1.0)
    if not 0.0 < percent <= 1.0:
        raise UserError(f"--rotary-percent {percent}: give a share in (0, 1]")
    if percent != 1.0:
        c.put("model.partial_rotary_factor", percent, "--rotary-percent")
    mla = a.flag("--multi-latent-attention")
    # arguments.py: validate_args sets apply_rope_fusion False unless the position embedding is rope
    # (core_v0.12.0 … d98e8a64dd); it sizes nothing but an MLA layer's YaRN tables
    if mla and (a.flag("--no-rope-fusion") or pos != "rope"):
        c.put("framework.rope_fusion", False, "--no-rope-fusion", "--position-embedding-type")
    rope_type = a.str("--rope-type", "")
    if rope_type not in ("", "None", "rope", "yarn"):
        raise UserError(f"--rope-type {rope_type}: use rope or yarn")
    if rope_type == "yarn" and not mla:
        raise UserError("--rope-type yarn without --multi-latent-attention: Megatron-LM rejects it (\"Common "
                        "attention only support rope_type=\"rope\"\"); use --position-embedding-type yarn")
    if rope_type == "rope" and mla:
        c.put("framework.mla_rope_type", "rope", "--rope-type")
    if pos == "yarn" and not mla:  # gpt_model.py: a YarnRotaryEmbedding for the model (2c1b77a998 on)
        c.put("framework.yarn_positions", True, "--position-embedding-type")
        # argument_utils.py: yarn_original_max_position_embeddings, 4096 unless given
        original = a.int("--yarn-original-max-position-embeddings")
        if original:
            c.put("framework.yarn_original_max_positions", original, "--yarn-original-max-position-embeddings")
    original = a.int("--original-max-position-embeddings")
    if original and mla:
        c.put("framework.yarn_original_max_positions", original, "--original-max-position-embeddings")
