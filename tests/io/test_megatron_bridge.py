"""A Megatron-Bridge job's ConfigContainer (its log's Task Configuration block, or the run_config.yaml a checkpoint
saves) read as the Megatron-LM arguments of the same job: fields by the parser's dests, the renames
``core_transformer_config_from_args`` and ``get_model`` make read backwards, groups that are off left out."""

from __future__ import annotations

from pathlib import Path

import pytest

from timeline.cli import main
from timeline.errors import UserError
from timeline.io.megatron_args import read_megatron_config
from timeline.io.megatron_bridge import bridge_config, bridge_dests
from timeline.io.runfile import load_run

LOG = Path(__file__).resolve().parents[1] / "data" / "megatron_bridge" / "llama32_1b_task_configuration.log"


def _yaml_of(log: str) -> str:
    """The ConfigContainer alone, as run_config.yaml holds it."""
    body = log.split("------- Task Configuration -------\n", 1)[1]
    return body.split("\n----------------------------------", 1)[0] + "\n"


def test_a_task_configuration_block_is_the_job():
    m = read_megatron_config(LOG)
    a = m.args
    assert (a["--num-layers"], a["--hidden-size"], a["--num-attention-heads"], a["--ffn-hidden-size"]) == \
        ("16", "2048", "32", "8192")
    # silu with gated_linear_unit is --swiglu; 8 query groups of 32 heads --group-query-attention
    assert a["--swiglu"] is True and a["--group-query-attention"] is True and a["--num-query-groups"] == "8"
    # the training sequence is the dataset's; the provider's seq_length is its longest context
    assert a["--seq-length"] == "1024" and a["--max-position-embeddings"] == "131072"
    assert a["--use-distributed-optimizer"] is True and a["--accumulate-allreduce-grads-in-fp32"] is True
    assert a["--ddp-bucket-size"] == "40000000" and a["--disable-bias-linear"] is True
    assert "--untie-embeddings-and-output-weights" not in a  # share_embeddings_and_output_weights: true
    # should_pad_vocab: false — GPTModelProvider.provide keeps the provider's vocab_size rows, not the tokenizer's
    # (Megatron-LM's NullTokenizer would count its EOD on top, and Megatron-LM pads to the divisor · tp)
    assert (a["--padded-vocab-size"], a["--make-vocab-size-divisible-by"]) == ("128256", "1")
    # groups that are off: no MoE, fp8, CUDA-graph or recompute option from their fields at defaults
    assert not any(k.startswith(("--moe-", "--fp8", "--cuda-graph", "--recompute")) for k in a)
    assert any("Megatron-Bridge ConfigContainer (Llama31ModelProvider)" in n for n in m.notes)
    assert any(n.startswith("10 Megatron-Bridge fields with a value have no Megatron-LM argument") for n in m.notes)


def test_run_config_yaml_and_a_launcher_prefix_read_the_same(tmp_path):
    text = LOG.read_text()
    saved = tmp_path / "run_config.yaml"
    saved.write_text(_yaml_of(text))
    prefixed = tmp_path / "rank0.log"
    prefixed.write_text("".join(f"[default0]:{line}\n" for line in text.splitlines()))
    base = read_megatron_config(LOG).args
    assert read_megatron_config(saved).args == base
    assert read_megatron_config(prefixed).args == base


def test_an_moe_provider_keeps_its_moe_fields():
    cfg = bridge_config(_yaml_of(LOG.read_text()).replace("  num_moe_experts: null", "  num_moe_experts: 8"))
    assert cfg is not None
    dests, _ = bridge_dests(cfg)
    assert (dests["num_experts"], dests["moe_router_topk"], dests["moe_token_dispatcher_type"]) == \
        (8, 2, "allgather")


def test_from_megatron_writes_a_run_that_simulates(tmp_path, capsys):
    out = tmp_path / "run.toml"
    assert main(["from-megatron", str(LOG), "--world-size", "8", "-o", str(out)]) == 0
    run = load_run(out)
    assert (run.model.num_hidden_layers, run.model.hidden_size, run.model.num_key_value_heads) == (16, 2048, 8)
    assert (run.training.seq_len, run.training.micro_batch_size, run.parallel.dp, run.training.zero) == (1024, 1, 8, 1)
    assert (run.model.vocab_size, run.framework.make_vocab_size_divisible_by) == (128256, 1)
    # the log's own count: 1,235,814,400 on rank (0, 0), Llama-3.2-1B's (its 128,256 rows tied)
    assert "the log's parameter count equals the run's on pipeline rank(s) 0 (1,235,814,400)" in capsys.readouterr().err
    assert main(["simulate", str(out), "-o", str(tmp_path / "sim"), "--format", "summary"]) == 0


def test_bad_bridge_inputs_are_one_line(tmp_path, capsys):
    assert main(["from-megatron", str(LOG), "--world-size", "8", "--job", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "is a Megatron-Bridge configuration" in err and "--job" in err
    empty = tmp_path / "run_config.yaml"
    empty.write_text("_target_: megatron.bridge.training.config.ConfigContainer\nmodel:\n  hidden_size: 64\n"
                     "train:\n  micro_batch_size: 1\n")
    with pytest.raises(UserError, match="no model.num_layers"):
        read_megatron_config(empty)
    assert bridge_config("model:\n  num_layers: 2\n") is None  # a YAML with a model section alone is not Bridge's


def test_a_nested_transformer_config_reads_the_same(tmp_path):
    """Later Bridge keeps the TransformerConfig under model.transformer (GPTModelConfig): read as one model section."""
    lines = _yaml_of(LOG.read_text()).splitlines()
    start = lines.index("model:")
    end = next(i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith(" "))
    own = ("  _target_:", "  vocab_size:", "  share_embeddings_and_output_weights:", "  seq_length:")
    model = [ln for ln in lines[start + 1:end]]
    kept = [ln for ln in model if ln.startswith(own)]
    nested = ["model:", *kept, "  transformer:"] + ["  " + ln for ln in model if not ln.startswith(own)]
    saved = tmp_path / "run_config.yaml"
    saved.write_text("\n".join(lines[:start] + nested + lines[end:]) + "\n")
    assert read_megatron_config(saved).args == read_megatron_config(LOG).args


# --- the configuration summary Megatron-Bridge logs from b273cd371 on ---------------------------------------------

def _python_value(v):
    """A YAML ConfigContainer value as the Python object Bridge's summary reprs: dtypes and enums by their target,
    functions as callables (which the summary skips)."""
    if isinstance(v, dict) and "_target_" in v:
        t = str(v["_target_"])
        if t.startswith("torch.") and t.count(".") == 1:
            return _Repr(t)
        if t.endswith("AttnBackend"):
            member = {1: "flash", 2: "fused", 3: "unfused", 4: "local", 5: "auto"}[v["_args_"][0]]
            return _Repr(f"<AttnBackend.{member}: {v['_args_'][0]}>")
        return len  # a function: callable
    return v


class _Repr:
    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text

    def __eq__(self, other):
        return str(self) == str(other) or repr(self) == repr(other)

    def __str__(self):
        return self.text.split(":")[0].lstrip("<") if self.text.startswith("<") else self.text


def _summary_of(cfg: dict, version: str) -> str:
    """What ConfigContainer.log_non_default_values (Bridge training/config.py, b273cd371) prints for ``cfg``, its
    Megatron-Core sections compared with the dataclass defaults at parser version ``version``
    (timeline/io/megatron_config_defaults.json)."""
    import json

    import timeline.io.megatron_bridge as mb

    table = json.loads((Path(mb.__file__).parent / "megatron_config_defaults.json").read_text())
    k = next(i for i, v in enumerate(table["versions"]) if v["label"] == version)

    def defaults(cls):
        out = {}
        for name, runs in table["classes"][cls].items():
            at = [r for r in runs if r[0] <= k]
            if at and len(at[-1]) == 2:
                v = at[-1][1]
                out[name] = _Repr(v) if isinstance(v, str) and (v.startswith("torch.") or v.startswith("AttnBackend"))\
                    else v
        return out

    lines = ["", "=" * 70, "Configuration Summary (Non-Default Values vs Megatron Core)", "=" * 70]
    for name, cls in (("optimizer", "OptimizerConfig"), ("ddp", "DistributedDataParallelConfig"),
                      ("model", "TransformerConfig")):
        base = defaults(cls)
        section = {f: _python_value(v) for f, v in cfg[name].items() if not str(f).startswith("_")}
        diff = {f: (v, base[f]) for f, v in section.items()
                if f in base and not callable(v) and not callable(base[f]) and repr(v) != repr(base[f])}
        if diff:
            lines.append(f"\n[{name}] Non-default values (vs Mcore {cls}):")
            lines += [f"  {f}: {v!r}  (Mcore default: {d!r})" for f, (v, d) in sorted(diff.items())]
    lines += ["\n" + "-" * 70, "Other Configuration Values:", "-" * 70]
    for name in ("train", "validation", "scheduler", "dataset", "checkpoint", "logger", "tokenizer", "rng"):
        section = cfg.get(name)
        if not isinstance(section, dict):
            continue
        values = {f: _python_value(v) for f, v in section.items() if not str(f).startswith("_")}
        values = {f: v for f, v in values.items() if v is not None and not callable(v) and not isinstance(v, dict)}
        if values:
            lines.append(f"\n[{name}]:")
            lines += [f"  {f}: {v!r}" for f, v in sorted(values.items())]
    lines.append("\n" + "=" * 70)
    return "\n".join(lines) + "\n"


def _summary_log(tmp_path, version="core_v0.16.0", prefix=""):
    text = LOG.read_text()
    cfg = bridge_config(text)
    counts = text.splitlines()[0]  # get_model's parameter count, as the job printed it
    body = f"{counts}\n{_summary_of(cfg, version)}[NeMo I] iteration        1/      10 |\n"
    path = tmp_path / "summary.log"
    path.write_text("".join(f"{prefix}{line}\n" for line in body.splitlines()))
    return path


def test_a_configuration_summary_reads_as_the_full_configuration(tmp_path):
    """Every field the summary leaves out is its Megatron-Core dataclass's default: read with those defaults, the
    summary gives the Task Configuration block's own arguments, but for the model provider's fields it never
    prints (the tied output layer, the position embedding, the vocabulary's padding: GPTModelProvider's defaults
    until the parameter counts decide, below) and the fields the abridged fixture leaves out."""
    full = read_megatron_config(LOG, megatron_core="0.16.0").args
    m = read_megatron_config(_summary_log(tmp_path), megatron_core="0.16.0")
    got = m.args
    assert {k: got.get(k) for k in ("--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size",
                                    "--swiglu", "--group-query-attention", "--num-query-groups", "--seq-length",
                                    "--use-distributed-optimizer", "--accumulate-allreduce-grads-in-fp32",
                                    "--ddp-bucket-size", "--disable-bias-linear", "--micro-batch-size",
                                    "--global-batch-size", "--bf16", "--normalization", "--tokenizer-type",
                                    "--tokenizer-model", "--vocab-size")} == \
        {k: full.get(k) for k in ("--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size",
                                  "--swiglu", "--group-query-attention", "--num-query-groups", "--seq-length",
                                  "--use-distributed-optimizer", "--accumulate-allreduce-grads-in-fp32",
                                  "--ddp-bucket-size", "--disable-bias-linear", "--micro-batch-size",
                                  "--global-batch-size", "--bf16", "--normalization", "--tokenizer-type",
                                  "--tokenizer-model", "--vocab-size")}
    # the provider's fields: GPTModelProvider's defaults, the choices left to the parameter counts
    assert got["--position-embedding-type"] == "learned_absolute" and "--untie-embeddings-and-output-weights" not in got
    assert "--padded-vocab-size" not in got and "--make-vocab-size-divisible-by" not in got  # the tokenizer's, padded
    assert len(m.alternatives) == 8 and m.param_counts == ((0, 0, 1235814400),)
    assert {"--padded-vocab-size": "128256", "--make-vocab-size-divisible-by": "1",
            "--untie-embeddings-and-output-weights": None, "--position-embedding-type": "rope"} in m.alternatives
    assert any("summary (Non-Default Values vs Megatron Core)" in n and "core_v0.16.0" in n for n in m.notes)
    # a launcher's prefix on every line reads the same
    assert read_megatron_config(_summary_log(tmp_path, prefix="[default0]:"), megatron_core="0.16.0").args == got


def test_the_logged_parameter_count_decides_the_provider_fields(tmp_path, capsys):
    """The log's 1,235,814,400 parameters on rank (0, 0) are the Llama-3.2-1B provider's (rope, tied, unpadded
    128,256 rows): the first choice whose run counts as many, in the order GPTModelProvider's defaults first."""
    out = tmp_path / "run.toml"
    assert main(["from-megatron", str(_summary_log(tmp_path)), "--world-size", "8", "--megatron-core", "0.16.0",
                 "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "the model-provider fields the summary leaves out are what the log's parameter counts" in err
    assert "--position-embedding-type rope, --padded-vocab-size 128256, --make-vocab-size-divisible-by 1" in err
    run = load_run(out)
    assert (run.model.position_embedding, run.model.tie_word_embeddings) == ("rope", True)
    # the same model as the Task Configuration block's
    ref = tmp_path / "ref.toml"
    assert main(["from-megatron", str(LOG), "--world-size", "8", "--megatron-core", "0.16.0", "-o", str(ref)]) == 0
    full = load_run(ref)
    assert (run.model.vocab_size, run.framework.make_vocab_size_divisible_by) == \
        (full.model.vocab_size, full.framework.make_vocab_size_divisible_by)
    # the provider's seq_length (its longest context) is not printed either; rotary positions make no table of it
    import dataclasses

    assert dataclasses.replace(run.model, max_position_embeddings=full.model.max_position_embeddings) == full.model
    assert run.training == full.training and run.parallel == full.parallel
    assert "the log's parameter count equals the run's on pipeline rank(s) 0 (1,235,814,400)" in err


def test_script_args_fix_what_the_summary_leaves_out(tmp_path, capsys):
    path = _summary_log(tmp_path)
    m = read_megatron_config(path, script_args=["--untie-embeddings-and-output-weights"], megatron_core="0.16.0")
    assert m.args["--untie-embeddings-and-output-weights"] is True
    # the tie is the user's now: only the position embedding and the padding are left open
    assert len(m.alternatives) == 4 and all("--untie-embeddings-and-output-weights" not in o for o in m.alternatives)
    # a Task Configuration block is the whole job: --script-args is refused there as before
    with pytest.raises(UserError, match="^--script-args: .* is a Megatron-Bridge configuration"):
        read_megatron_config(LOG, script_args=["--untie-embeddings-and-output-weights"])


def test_the_defaults_table_holds_each_release_as_its_source_reads():
    """Spot checks of megatron_config_defaults.json against Megatron-LM's dataclasses (tools/
    megatron_config_defaults.py): transformer_config.py, model_parallel_config.py, optimizer_config.py,
    distributed_data_parallel_config.py."""
    import json

    import timeline.io.megatron_bridge as mb
    from timeline.io.megatron_dump import table

    t = json.loads((Path(mb.__file__).parent / "megatron_config_defaults.json").read_text())
    assert [v["label"] for v in t["versions"]] == [v[0] for v in table()["versions"]]
    labels = [v["label"] for v in t["versions"]]

    def at(cls, name, label):
        runs = [r for r in t["classes"][cls][name] if r[0] <= labels.index(label)]
        return runs[-1][1] if runs and len(runs[-1]) == 2 else "<absent>"

    tc = "TransformerConfig"
    # off in the dataclass, on in Megatron-LM's argparse (the reason the summary needs the table)
    assert at(tc, "gradient_accumulation_fusion", "core_v0.16.0") is False  # ModelParallelConfig
    assert at(tc, "masked_softmax_fusion", "core_v0.19.0") is False
    assert at(tc, "attention_softmax_in_fp32", "core_v0.19.0") is True
    assert at(tc, "params_dtype", "core_v0.12.0") == "torch.float32"
    assert at(tc, "attention_backend", "core_v0.16.0") == "AttnBackend.auto"
    # "full" until core_v0.18.0 made it a list of CudaGraphScope members, None by default
    assert at(tc, "cuda_graph_scope", "core_v0.17.1") == "full" and at(tc, "cuda_graph_scope", "core_v0.18.0") is None
    assert at("MLATransformerConfig", "normalization", "core_v0.16.0") == "RMSNorm"
    assert at("OptimizerConfig", "adam_beta2", "core_v0.16.0") == 0.999
    assert at("DistributedDataParallelConfig", "grad_reduce_in_fp32", "core_v0.16.0") is False
    # a function is never kept: Bridge's summary skips callables
    assert "activation_func" not in t["classes"][tc] and 0 in t["unread"][tc]["activation_func"]


def test_the_ddp_configs_own_reduction_dtype_holds(tmp_path):
    """A Bridge job's DistributedDataParallelConfig is the job's (Bridge sets grad_reduce_in_fp32 from its
    mixed-precision recipe); Megatron-LM's validate_args would reduce bf16 gradients in fp32 unless
    --grad-reduce-in-bf16. A summary with no [ddp] line at all is at DistributedDataParallelConfig's defaults:
    grad_reduce_in_fp32 False."""
    yaml_text = _yaml_of(LOG.read_text())
    assert "  grad_reduce_in_fp32: true" in yaml_text
    bf16_grads = tmp_path / "run_config.yaml"
    bf16_grads.write_text(yaml_text.replace("  grad_reduce_in_fp32: true", "  grad_reduce_in_fp32: false"))
    assert read_megatron_config(bf16_grads).args.get("--grad-reduce-in-bf16") is True
    assert "--grad-reduce-in-bf16" not in read_megatron_config(LOG).args
    text = _summary_log(tmp_path).read_text()
    start = text.index("[ddp] Non-default values")
    end = text.index("[model] Non-default values")
    no_ddp = tmp_path / "no_ddp.log"
    no_ddp.write_text(text[:start] + text[end:])
    m = read_megatron_config(no_ddp, megatron_core="0.16.0")
    assert m.args.get("--grad-reduce-in-bf16") is True and "--use-distributed-optimizer" in m.args  # the optimizer's


def test_a_hybrid_summary_needs_its_layer_pattern(tmp_path):
    """A hybrid (Mamba) provider's layer pattern is its own field, which the summary never prints: refused with the
    way to give it, rather than read as all-Mamba."""
    text = _summary_log(tmp_path).read_text().replace(
        "  num_query_groups: 8  (Mcore default: None)",
        "  num_query_groups: 8  (Mcore default: None)\n  is_hybrid_model: True  (Mcore default: False)")
    path = tmp_path / "hybrid.log"
    path.write_text(text)
    with pytest.raises(UserError, match="^a hybrid \\(Mamba\\) model's layer pattern is a model-provider field"):
        read_megatron_config(path, megatron_core="0.16.0")
    m = read_megatron_config(path, script_args=["--hybrid-override-pattern", "M*M*M*M*M*M*M*M*"], megatron_core="0.16.0")
    assert m.family == "mamba" and m.args["--hybrid-override-pattern"] == "M*M*M*M*M*M*M*M*"
