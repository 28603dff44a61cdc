"""Read a Megatron-Bridge (NeMo) job's configuration as the Megatron-LM arguments that run the same job.

Megatron-Bridge trains Megatron-Core models from a ``ConfigContainer`` instead of ``pretrain_gpt.py``'s
arguments. Its logs print the whole container as YAML after ``------- Task Configuration -------`` (from
NVIDIA-NeMo/Megatron-Bridge eb4b088f7, 2025-09-03, to b273cd371, 2026-02-04, after which the log prints only the
values off Megatron-Core's defaults), and every checkpoint saves it as ``run_config.yaml``
(``training/checkpointing.py``: ``cfg.to_yaml``). Its sections are Megatron-Core's own configs — ``model`` a
``TransformerConfig`` (a model provider's), ``ddp`` a ``DistributedDataParallelConfig``, ``optimizer`` an
``OptimizerConfig`` — and Bridge's ``train``, ``dataset``, ``tokenizer``, ``checkpoint``, ``dist``,
``mixed_precision``; objects are ``_target_`` maps.

Megatron-LM builds those configs from its arguments by field name, with the exceptions
``core_transformer_config_from_args`` (``megatron/training/argument_utils.py`` at d98e8a64dd; ``arguments.py``
at core_v0.14.0) and ``get_model``'s DDP config (``megatron/training/training.py``) name. Read backwards, a
field becomes the parser's dest of the same name, else the dest those functions fill it from
(:data:`TO_DEST`); SwiGLU, squared ReLU and GQA come from the activation and the query groups, a tied output layer
from ``share_embeddings_and_output_weights``, an unpadded vocabulary from ``should_pad_vocab: false``. Later Bridge
nests the ``TransformerConfig`` under ``model.transformer``: read as one model section. The training sequence is ``dataset.sequence_length`` (a provider's
``model.seq_length`` is its longest context, ``--max-position-embeddings``). The dests then become options as a
job log's arguments block does (:func:`timeline.io.megatron_dump.option_for`: a value at the parser's default is
left out, as a user would leave it out). A field of a group that is off (the MoE fields without experts, the fp8
ones without fp8, the CUDA-graph ones without graphs, …: :data:`GROUPS`) is left out with it; a field no parser
dest takes is named in a note, never guessed at. The world size is the launcher's (``--world-size``).

From b273cd371 on the log prints ``Configuration Summary (Non-Default Values vs Megatron Core)`` instead
(``training/config.py: ConfigContainer.log_non_default_values``): for ``model`` (its ``TransformerConfig``, or
``MLATransformerConfig``), ``optimizer`` and ``ddp`` only the fields whose values differ from the Megatron-Core
dataclass's own defaults, callables never; for ``train``, ``dataset``, ``tokenizer``, … every value but None. The
rest of each Megatron-Core section is that dataclass's defaults at the job's Megatron-Core release
(``megatron_config_defaults.json``, :func:`summary_sections`). The model provider's own fields are not printed at
all: the tied output layer, the position embedding and the vocabulary's padding are then
``GPTModelProvider``'s defaults (Bridge ``models/gpt_provider.py``), and :func:`provider_alternatives` lists the
other choices for ``from-megatron`` to hold against the log's own parameter counts; a gated linear unit is read
as SwiGLU.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import yaml

from timeline.errors import UserError

#: the block a Megatron-Bridge log prints before training (``training/setup.py``, eb4b088f7 … b273cd371)
TASK = re.compile(r"^(?P<prefix>.*?)-{5,} Task Configuration -{5,}[ \t]*\r?$", re.M)
END = re.compile(r"^\s*-{20,}\s*$", re.M)
#: the sections read, in the order their values win (a section read earlier keeps a dest it set)
SECTIONS = ("model", "train", "ddp", "optimizer", "mixed_precision", "dataset", "tokenizer", "checkpoint", "dist",
            "logger", "rng")
#: Megatron-Core config field → the parser dest Megatron-LM fills it from, where the names differ
#: (core_transformer_config_from_args; get_model's DistributedDataParallelConfig; Bridge's own sections)
TO_DEST = {
    "num_moe_experts": "num_experts",
    "num_layers_in_first_pipeline_stage": "decoder_first_pipeline_num_layers",
    "num_layers_in_last_pipeline_stage": "decoder_last_pipeline_num_layers",
    "fp8_param": "fp8_param_gather",
    "fp4_param": "fp4_param_gather",
    "layernorm_epsilon": "norm_epsilon",
    "layernorm_zero_centered_gamma": "apply_layernorm_1p",
    "grad_reduce_in_fp32": "accumulate_allreduce_grads_in_fp32",
    "bucket_size": "ddp_bucket_size",
    "average_in_collective": "ddp_average_in_collective",
    "pad_buckets_for_high_nccl_busbw": "ddp_pad_buckets_for_high_nccl_busbw",
    "check_for_nan_in_grad": "check_for_nan_in_loss_and_grad",
    "mock": "mock_data",
    "create_attention_mask": "create_attention_mask_in_dataloader",
}
#: (section, field) the reader decides itself (the functions above compute them from other arguments)
DERIVED = {("model", f) for f in ("activation_func", "gated_linear_unit", "num_query_groups", "persist_layer_norm",
                                   "batch_p2p_comm", "share_embeddings_and_output_weights", "seq_length",
                                   "bias_activation_fusion", "should_pad_vocab")} | {("dataset", "sequence_length")}
#: field prefixes of a group, and the field that turns the group on (its value falsy: the group is off)
GROUPS = (("moe_", "num_moe_experts"), ("fp8_", "fp8"), ("fp4_", "fp4"), ("cuda_graph_", "enable_cuda_graph"),
          ("tp_comm_", "tp_comm_overlap"), ("mamba_", "is_hybrid_model"), ("mtp_", "mtp_num_layers"),
          ("cpu_offloading_", "cpu_offloading"), ("recompute_", "recompute_granularity"),
          ("optimizer_offload", "optimizer_cpu_offload"))
#: the summary's title line (Bridge b273cd371 on: training/config.py, ConfigContainer.log_non_default_values)
SUMMARY = re.compile(r"^(?P<prefix>.*?)Configuration Summary \(Non-Default Values vs Megatron Core\)[ \t]*\r?$", re.M)
#: a section's line: "[model] Non-default values (vs Mcore TransformerConfig):" or "[train]:"
SUMMARY_SECTION = re.compile(r"^\[(?P<name>\w+)\](?: Non-default values \(vs Mcore (?P<cls>\w+)\))?:$")
SUMMARY_FIELD = re.compile(r"^\s+(?P<field>\w+): (?P<value>.*)$")
MCORE_DEFAULT = "  (Mcore default: "
#: GPTModelProvider's own fields, which the summary never prints (Bridge models/gpt_provider.py, b273cd371 …
#: 067f987df), as the Megatron-LM options that set them: a tied output layer, learned absolute positions; its
#: ``vocab_size`` None, which ``training/setup.py: _validate_and_set_vocab_size`` replaces by the tokenizer's,
#: padded (``should_pad_vocab``) as Megatron-LM pads it
PROVIDER = {"--untie-embeddings-and-output-weights": None, "--position-embedding-type": "learned_absolute"}
#: the options a choice of vocabulary sets
VOCAB_OPTIONS = ("--padded-vocab-size", "--make-vocab-size-divisible-by")
#: torch dtypes as the dtype options take them; AttnBackend's values (megatron/core/transformer/enums.py)
DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.uint8": "fp8"}
ATTN_BACKEND = {1: "flash", 2: "fused", 3: "unfused", 4: "local", 5: "auto"}


def _repr_value(text: str) -> Any:
    """A value as the summary prints it (``repr``): literals as they are, ``torch.bfloat16`` and enum members
    (``<AttnBackend.flash: 1>``) as the ``_target_`` maps a YAML config writes, anything else an unread map."""
    t = text.strip()
    try:
        v = ast.literal_eval(t)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    else:
        return list(v) if isinstance(v, tuple | set | frozenset) else v
    if re.fullmatch(r"torch\.\w+", t):
        return {"_target_": t}
    enum = re.fullmatch(r"<(\w+)\.(\w+): (.+)>", t)
    if enum:
        try:
            arg = ast.literal_eval(enum[3])
        except (ValueError, SyntaxError):
            arg = enum[2]
        return {"_target_": enum[1], "_args_": [arg]}
    return {"_repr_": t}


def summary_config(text: str) -> dict[str, Any] | None:
    """The sections a Megatron-Bridge log's configuration summary prints (module docstring), with ``_summary``
    naming each Megatron-Core section's class, else None."""
    m = SUMMARY.search(text)
    if m is None:
        return None
    prefix = m.group("prefix")
    cfg: dict[str, Any] = {}
    classes: dict[str, str] = {}
    section, other = None, False
    for raw in text[m.end():].splitlines():
        line = raw[len(prefix):] if prefix.strip() and raw.startswith(prefix) else raw
        bare = line.strip()
        if not bare or re.fullmatch(r"-+", bare):
            continue
        if re.fullmatch(r"=+", bare):
            if other:
                break
            continue
        if bare == "Other Configuration Values:":
            other = True
            continue
        if (sec := SUMMARY_SECTION.match(bare)) is not None:
            section = sec["name"]
            cfg.setdefault(section, {})
            if sec["cls"]:
                classes[section] = sec["cls"]
            continue
        fld = SUMMARY_FIELD.match(line.rstrip())
        if fld is None or section is None:
            break  # the next log line: the block ended
        value = fld["value"]
        k = value.rfind(MCORE_DEFAULT)
        if section in classes and k >= 0 and value.endswith(")"):
            value = value[:k]
        cfg[section][fld["field"]] = _repr_value(value)
    # log_non_default_values compares these three sections always: one it prints no line of is at its defaults
    for section, cls in (("optimizer", "OptimizerConfig"), ("ddp", "DistributedDataParallelConfig")):
        classes.setdefault(section, cls)
        cfg.setdefault(section, {})
    if not isinstance(cfg.get("model"), dict) or "model" not in classes:
        raise UserError("the Megatron-Bridge configuration summary holds no '[model] Non-default values (vs Mcore "
                        "…)' section (the log cut short?); give the whole log, or the run_config.yaml a checkpoint "
                        "saves")
    cfg["_summary"] = classes
    return cfg


def summary_sections(cfg: dict[str, Any], i: int) -> tuple[dict[str, Any], list[str]]:
    """A summary's ``ConfigContainer`` whole at parser version ``i`` (the defaults table's versions are the
    parser's): each Megatron-Core section its class's defaults with the printed values over them; and the notes."""
    from timeline.io.megatron_dump import table

    defaults = json.loads((Path(__file__).parent / "megatron_config_defaults.json").read_text())
    label = table()["versions"][i][0]
    k = next(j for j, v in enumerate(defaults["versions"]) if v["label"] == label)
    out = {name: value for name, value in cfg.items() if name != "_summary"}
    printed = {f: sec for sec, d in out.items() if isinstance(d, dict) for f in d}
    for section, cls in cfg["_summary"].items():
        fields = defaults["classes"].get(cls)
        if fields is None:
            raise UserError(f"the Megatron-Bridge summary's [{section}] compares with Megatron-Core's {cls}, a class "
                            "whose defaults are not read (TransformerConfig, MLATransformerConfig, OptimizerConfig, "
                            "DistributedDataParallelConfig are); give the run_config.yaml a checkpoint saves")
        base: dict[str, Any] = {}
        for name, runs in fields.items():
            at = [r for r in runs if r[0] <= k]
            if at and len(at[-1]) == 2 and printed.get(name, section) == section:
                base[name] = at[-1][1]  # a default, unless another section prints the field (use_distributed_optimizer)
        base = {n: ({"_target_": v} if isinstance(v, str) and v.startswith("torch.") else
                    {"_target_": v.split(".")[0], "_args_": [v]} if isinstance(v, str) and re.fullmatch(
                        r"[A-Z][A-Za-z]+\.\w+", v) else v) for n, v in base.items()}
        out[section] = {**base, **out.get(section, {})}
    model = out["model"]
    notes = [f"a Megatron-Bridge configuration summary (Non-Default Values vs Megatron Core): every field it leaves "
             f"out of model, optimizer and ddp is its Megatron-Core dataclass's default at {defaults['versions'][k]['label']} "
             "(megatron_config_defaults.json)"]
    if model.get("gated_linear_unit") and "activation_func" not in model:
        model["activation_func"] = "silu"  # callables are never printed
        notes.append("the summary never prints the activation (a callable): the gated linear unit is read as SwiGLU")
    return out, notes


def bridge_config(text: str) -> dict[str, Any] | None:
    """The ``ConfigContainer`` a Megatron-Bridge log prints or a ``run_config.yaml`` holds, else None (a log's
    configuration summary: :func:`summary_config`, filled in by :func:`read_bridge`)."""
    m = TASK.search(text)
    if m is not None:
        body = text[m.end():]
        prefix = m.group("prefix")
        if prefix.strip():  # a launcher's "[default0]:" before every line
            body = "\n".join(line[len(prefix):] if line.startswith(prefix) else line for line in body.splitlines())
        end = END.search(body)
        body = body[:end.start()] if end else body
    elif "_target_: megatron.bridge" in text or re.search(r"^model:\s*$", text, re.M) and re.search(r"^train:\s*$",
                                                                                                      text, re.M):
        body = text
    else:
        return summary_config(text)
    try:
        cfg = yaml.safe_load(body)
    except yaml.YAMLError:
        return None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model"), dict):
        return None
    model = cfg["model"]
    if isinstance(model.get("transformer"), dict):
        # later Bridge (``models/gpt/gpt_builder.py: GPTModelConfig``, Megatron-LM's ``training.models.gpt``) keeps
        # the TransformerConfig under ``model.transformer``, the GPT model's own fields beside it
        cfg = {**cfg, "model": {**{k: v for k, v in model.items() if k != "transformer"}, **model["transformer"]}}
    return cfg


def _value(v: Any) -> Any:
    """A YAML value as the option takes it: ``_target_`` maps by their name (dtypes, the attention backend's enum,
    a function's last name), others as they are."""
    if isinstance(v, dict) and "_target_" in v:
        target = str(v["_target_"])
        if target in DTYPES:
            return DTYPES[target]
        if target.endswith("AttnBackend"):
            args = v.get("_args_") or [None]
            if isinstance(args[0], str):  # a default's member name, "AttnBackend.auto"
                return args[0].rsplit(".", 1)[-1]
            return ATTN_BACKEND.get(args[0], target)
        return target.rsplit(".", 1)[-1]
    return v


def _off(section: dict[str, Any], name: str) -> bool:
    """Whether ``name`` belongs to a group whose own switch is off (:data:`GROUPS`)."""
    for prefix, switch in GROUPS:
        if name.startswith(prefix) and name != switch:
            on = section.get(switch)
            if switch == "enable_cuda_graph":
                on = on or section.get("cuda_graph_impl") not in (None, "none")
            return not on
    return False


def bridge_dests(cfg: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(parser dest → value, the fields no dest takes that hold a value) of a ``ConfigContainer``."""
    from timeline.io.megatron_dump import table

    known = table()["dests"]
    dests: dict[str, Any] = {}
    unread: list[str] = []
    model = cfg["model"]
    act = _value(model.get("activation_func"))
    glu = bool(model.get("gated_linear_unit"))
    dests["swiglu"] = act == "silu" and glu
    dests["squared_relu"] = act == "squared_relu"
    dests["quick_geglu"] = act == "quick_gelu" and glu
    fusion = model.get("bias_activation_fusion")
    if isinstance(fusion, bool):
        dests["bias_swiglu_fusion" if dests["swiglu"] else "bias_gelu_fusion"] = fusion
    groups, heads = model.get("num_query_groups"), model.get("num_attention_heads")
    if isinstance(groups, int) and groups != heads:
        dests["group_query_attention"], dests["num_query_groups"] = True, groups
    if isinstance(model.get("persist_layer_norm"), bool):
        dests["no_persist_layer_norm"] = not model["persist_layer_norm"]
    if isinstance(model.get("batch_p2p_comm"), bool):
        dests["overlap_p2p_comm"] = not model["batch_p2p_comm"]
    if model.get("should_pad_vocab") is False:
        # GPTModelProvider.provide (Bridge 067f987df, also its hybrid and T5 providers): without should_pad_vocab the
        # embedding is vocab_size rows, where Megatron-LM pads to make_vocab_size_divisible_by · tp; a divisor of 1
        # pads to tp alone, which a vocabulary that splits over the ranks already is
        dests["make_vocab_size_divisible_by"] = 1
    ddp_raw, mixed_raw = cfg.get("ddp"), cfg.get("mixed_precision")
    ddp: dict[str, Any] = ddp_raw if isinstance(ddp_raw, dict) else {}
    mixed: dict[str, Any] = mixed_raw if isinstance(mixed_raw, dict) else {}
    if ddp.get("grad_reduce_in_fp32") is False and (model.get("bf16") is True or mixed.get("bf16") is True):
        # the DDP config is the job's (Bridge sets it from its mixed-precision config); Megatron-LM's validate_args
        # would turn bf16's fp32 reduction on unless --grad-reduce-in-bf16
        dests["grad_reduce_in_bf16"] = True
    if isinstance(model.get("share_embeddings_and_output_weights"), bool):
        dests["untie_embeddings_and_output_weights"] = not model["share_embeddings_and_output_weights"]
    sequence = (cfg.get("dataset") or {}).get("sequence_length") if isinstance(cfg.get("dataset"), dict) else None
    if model.get("seq_length") is not None:
        dests["max_position_embeddings"] = model["seq_length"]
    dests["seq_length"] = sequence if sequence is not None else model.get("seq_length")
    for name in SECTIONS:
        section = cfg.get(name)
        if not isinstance(section, dict):
            continue
        for field_name, raw in section.items():
            if not isinstance(field_name, str) or field_name.startswith("_") or (name, field_name) in DERIVED \
                    or _off(section, field_name):
                continue
            dest = TO_DEST.get(field_name) or field_name
            value = _value(raw)
            if dest in dests:
                continue  # an earlier section set it (the model's resolved values win)
            if dest in known:
                if not isinstance(raw, dict) or value is not raw:  # a nested map no option takes is unread
                    dests[dest] = value
                    continue
            if value not in (None, False, 0, "", [], {}) and not isinstance(raw, dict):
                unread.append(f"{name}.{field_name}")
    if dests.get("recompute_granularity") is None:
        dests.pop("recompute_modules", None)
        dests.pop("recompute_method", None)
        dests.pop("recompute_num_layers", None)
    return dests, unread


def read_bridge(cfg: dict[str, Any], megatron_core: str | None) -> tuple[dict[str, Any], str, list[str]]:
    """(Megatron-LM arguments, the Megatron-Core version read at, notes) of a Megatron-Bridge ``ConfigContainer``
    (module docstring)."""
    from timeline.io.megatron_dump import _ver, option_for, table

    t = table()
    releases = [i for i, v in enumerate(t["versions"]) if v[0] != "main"]
    if megatron_core is None:
        i = releases[-1]
        how = (f"a Megatron-Bridge config names no Megatron-Core version: read with {t['versions'][i][0]}'s parser "
               "(give --megatron-core)")
    else:
        near = [k for k, v in enumerate(t["versions"]) if _ver(v[1]) <= _ver(megatron_core)] or [0]
        i = near[-1]
        how = f"read with {t['versions'][i][0]}'s parser (--megatron-core {megatron_core})"
    summary = "_summary" in cfg
    notes_before: list[str] = []
    printed = {f"{sec}.{f}" for sec, d in cfg.items() if isinstance(d, dict) for f in d}
    if summary:
        cfg, notes_before = summary_sections(cfg, i)
    dests, unread = bridge_dests(cfg)
    if summary:  # a default left out is no user's value
        unread = [u for u in unread if u in printed]
    args: dict[str, Any] = {}
    for dest, value in dests.items():
        if dest not in t["dests"]:
            continue
        got = option_for(dest, value, i)
        if got is not None:
            args[got[0]] = got[1]
    target = str((cfg.get("model") or {}).get("_target_", "a configuration summary" if summary else "a model provider"))
    notes = [f"read a Megatron-Bridge ConfigContainer ({target.rsplit('.', 1)[-1]}) as Megatron-LM's arguments "
             "(core_transformer_config_from_args read backwards)", how, *notes_before]
    if summary:
        for option, value in PROVIDER.items():
            if value is None:
                args.pop(option, None)
            else:
                args[option] = value
        for option in VOCAB_OPTIONS:
            args.pop(option, None)
        if args.get("--position-embedding-type") == "learned_absolute" and "--max-position-embeddings" not in args:
            args["--max-position-embeddings"] = args.get("--seq-length")
        notes.append("the summary prints no model-provider field: read as GPTModelProvider's defaults (a tied output "
                     "layer, learned absolute position embeddings, the tokenizer's vocabulary padded) unless the "
                     "log's parameter counts say otherwise; --script-args gives them (e.g. '--untie-embeddings-and-"
                     "output-weights --position-embedding-type rope --padded-vocab-size 128256')")
    else:
        rows = provider_rows(cfg["model"])
        if rows is not None:
            args["--padded-vocab-size"], args["--make-vocab-size-divisible-by"] = str(rows), "1"
    if unread:
        notes.append(f"{len(unread)} Megatron-Bridge fields with a value have no Megatron-LM argument and are not read: "
                     + ", ".join(unread[:10]) + (" …" if len(unread) > 10 else ""))
    if not args.get("--num-layers"):
        raise UserError("the Megatron-Bridge config has no model.num_layers: not a model's ConfigContainer")
    return args, (megatron_core or t["versions"][i][1]), notes



def provider_rows(model: dict[str, Any]) -> int | None:
    """The embedding's rows a provider with a ``vocab_size`` builds (``GPTModelProvider.provide``: the vocabulary
    padded to ``make_vocab_size_divisible_by`` × tp when ``should_pad_vocab``, else as it is; the tokenizer's
    ``+ 1`` of Megatron-LM's NullTokenizer does not apply), None without one."""
    vocab = model.get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab <= 0:
        return None
    if not model.get("should_pad_vocab"):
        return vocab
    step = int(model.get("make_vocab_size_divisible_by") or 128) * int(model.get("tensor_model_parallel_size") or 1)
    return -(-vocab // step) * step


def provider_alternatives(cfg: dict[str, Any], given: dict[str, Any]) -> list[dict[str, Any]]:
    """The model-provider choices a configuration summary leaves open, as overlays of options (None: the option
    absent), GPTModelProvider's first: tied or not, learned or rotary positions, and the vocabulary — the
    tokenizer's padded (the provider's ``vocab_size`` None) or, where the summary prints the tokenizer's
    ``vocab_size``, that many rows as a preset provider keeps them. An option in ``given`` (``--script-args``) is
    fixed."""
    import itertools

    dims: list[list[dict[str, Any]]] = []
    if "--untie-embeddings-and-output-weights" not in given:
        dims.append([{"--untie-embeddings-and-output-weights": None}, {"--untie-embeddings-and-output-weights": True}])
    if "--position-embedding-type" not in given:
        dims.append([{"--position-embedding-type": "learned_absolute"}, {"--position-embedding-type": "rope"}])
    tokens = (cfg.get("tokenizer") or {}).get("vocab_size")
    if not any(o in given for o in (*VOCAB_OPTIONS, "--vocab-size")):
        vocab = [dict.fromkeys(VOCAB_OPTIONS)]
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
            vocab.append({"--padded-vocab-size": str(tokens), "--make-vocab-size-divisible-by": "1"})
        dims.append(vocab)
    return [{k: v for part in choice for k, v in part.items()} for choice in itertools.product(*dims)]
