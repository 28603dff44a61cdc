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
    # should_pad_vocab: false — GPTModelProvider.provide keeps vocab_size rows (Megatron-LM pads to the divisor · tp)
    assert a["--make-vocab-size-divisible-by"] == "1"
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
