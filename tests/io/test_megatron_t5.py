"""``from-megatron`` on a T5 job (``io/megatron_t5.py``): Megatron-LM's own T5 functional test
``tests/functional_tests/test_cases/t5/t5_mcore_te_tp4_pp1/model_config.yaml`` at 92f052b8e5 (its memory-relevant
arguments below), read from its folder as a user would, and what a T5 job is refused with."""

from __future__ import annotations

import pytest
from helpers_run import from_megatron_folder

from timeline.cli import main
from timeline.errors import UserError
from timeline.io.megatron_args import from_mapping
from timeline.io.megatron_write import convert

ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": 1, "NVTE_ALLOW_NONDETERMINISTIC_ALGO": 0, "NCCL_ALGO": "^NVLS",
       "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
ARGS = {"--encoder-num-layers": 12, "--decoder-num-layers": 12, "--hidden-size": 768, "--num-attention-heads": 12,
        "--kv-channels": 64, "--ffn-hidden-size": 3072, "--encoder-seq-length": 512, "--decoder-seq-length": 128,
        "--max-position-embeddings": 512, "--tensor-model-parallel-size": 4, "--pipeline-model-parallel-size": 1,
        "--micro-batch-size": 4, "--global-batch-size": 32, "--lr": 0.0001, "--train-iters": 100, "--bf16": True,
        "--vocab-extra-ids": 100, "--init-method-std": 0.015, "--transformer-impl": "transformer_engine",
        "--data-path": "${DATA_PATH}/text/the_pile/t5_shard00/my-t5_00_text_document",
        "--vocab-file": "${DATA_PATH}/text/the_pile/t5_shard00/bert-large-cased-vocab.txt",
        "--tokenizer-type": "BertWordPieceCase", "--calculate-per-token-loss": True, "--split": "99982,9,9",
        "--deterministic-mode": True, "--ckpt-format": "torch_dist", "--dist-ckpt-strictness": "log_all",
        "--attention-backend": "unfused", "--log-memory-to-tensorboard": True}


def _t5(args: dict, world_size: int = 8):
    margs = from_mapping(args, ENV, family="t5", family_source="the path test_cases/t5/")
    return convert(margs, world_size=world_size, te_version="2.12", megatron_core="0.16.0")


def test_the_functional_test_s_folder_makes_a_t5_run_file_that_simulates(tmp_path, capsys):
    """validate_args: --num-layers from --encoder-num-layers, --seq-length from --encoder-seq-length;
    model_provider: an encoder and a decoder of num_layers layers each; the vocabulary: 28,996 cased WordPieces,
    [BOS], [EOS] and 100 sentinels."""
    data = from_megatron_folder(tmp_path, "t5", "t5_mcore_te_tp4_pp1", ENV, ARGS)
    assert {k: data["model"][k] for k in ("architecture", "num_layers", "encoder_layers", "vocab_size",
                                          "tie_word_embeddings")} == {
        "architecture": "t5", "num_layers": 24, "encoder_layers": 12, "vocab_size": 28996 + 2 + 100,
        "tie_word_embeddings": True}
    assert (data["training"]["seq_len"], data["training"]["decoder_seq_len"]) == (512, 128)
    assert data["framework"]["attention_backend"] == "unfused"
    capsys.readouterr()
    assert main(["simulate", str(tmp_path / "t5.toml"), "--format", "summary", "--out", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "summary.json").exists()


def test_the_decoder_has_as_many_layers_as_the_encoder():
    """pretrain_t5.py model_provider builds the decoder block of config.num_layers (= --encoder-num-layers) layers:
    --decoder-num-layers sizes none."""
    m = _t5(ARGS | {"--decoder-num-layers": 6}).sections["model"]
    assert (m["num_layers"], m["encoder_layers"]) == (24, 12)


@pytest.mark.parametrize(("extra", "needle"), [
    ({"--pipeline-model-parallel-size": 2}, "Pipeline parallelism is not supported for T5"),
    ({"--num-layers": 12}, "--encoder-num-layers with --num-layers"),
    ({"--position-embedding-type": "relative"}, "--position-embedding-type relative"),
    ({"--attention-backend": "flash"}, "TE packs the unpadded sequences"),
])
def test_what_a_t5_job_is_refused_with_is_one_line(extra, needle):
    with pytest.raises(UserError) as exc:
        _t5(ARGS | extra)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("name", ["--decoder-seq-length", "--pipeline-model-parallel-split-rank"])
def test_t5_arguments_outside_a_t5_job_are_refused(name):
    """pretrain_t5.py's own arguments name a T5 job; in a T5 job on one stage the encoder/decoder split rank
    (Megatron-LM before 0.14) splits nothing."""
    gpt = {"--num-layers": 2, "--hidden-size": 64, "--num-attention-heads": 4, "--seq-length": 128,
           "--micro-batch-size": 1, "--global-batch-size": 8, name: 64}
    with pytest.raises(UserError, match=f"^{name}: a T5 encoder-decoder model's argument"):
        convert(from_mapping(gpt), world_size=8, megatron_core="0.12.0")
    t5 = from_mapping(ARGS | {name: 128}, ENV, family="t5", family_source="the path test_cases/t5/")
    assert convert(t5, world_size=8, megatron_core="0.12.0").sections["model"]["architecture"] == "t5"


def test_q_k_norm_flags_build_nothing_in_t5_s_identity_norm_spec():
    """t5_spec.py gives every attention IdentityOp q/k norms in every release: the flags are memory-neutral."""
    plain = _t5(ARGS).sections
    c = _t5(ARGS | {"--qk-layernorm": True})
    assert c.sections == plain
    assert any(n.startswith("--qk-layernorm: T5's layer spec (t5_spec.py) gives its attention IdentityOp")
               for n in c.notes)
