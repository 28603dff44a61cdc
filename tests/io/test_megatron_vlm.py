"""``from-megatron`` on a LLaVA job (``io/megatron_vlm.py``): Megatron-LM's own functional test
``tests/functional_tests/test_cases/multimodal-llava/multimodal_llava_mcore_te_tp1_pp1/model_config.yaml`` at
ad2ab2ca12 (its memory-relevant arguments below), read from its folder as a user would, and what a LLaVA job is
refused with."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from helpers_run import from_megatron_folder

from timeline.cli import main
from timeline.errors import UserError
from timeline.io.megatron_args import from_mapping
from timeline.io.megatron_vlm import padding
from timeline.io.megatron_write import convert, run_file_text
from timeline.io.runfile import run_from_data

ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": 1, "NVTE_ALLOW_NONDETERMINISTIC_ALGO": 0, "NCCL_ALGO": "Ring",
       "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
ARGS = {"--num-layers": 12, "--hidden-size": 624, "--attention-dropout": 0.0, "--hidden-dropout": 0.0,
        "--num-attention-heads": 12, "--micro-batch-size": 4, "--global-batch-size": 32, "--seq-length": 1024,
        "--max-position-embeddings": 1024, "--train-iters": 50, "--lr": 0.00015, "--split": "949,50,1",
        "--tokenizer-type": "NullTokenizer", "--vocab-size": 8192, "--distributed-backend": "nccl",
        "--transformer-impl": "transformer_engine", "--tensor-model-parallel-size": 1,
        "--pipeline-model-parallel-size": 1, "--deterministic-mode": True, "--attention-softmax-in-fp32": True,
        "--ckpt-format": "torch", "--no-gradient-accumulation-fusion": True, "--bf16": True, "--img-h": 336,
        "--img-w": 336, "--patch-dim": 14, "--mock-data": True, "--log-memory-to-tensorboard": True}


def _vlm(args: dict, world_size: int = 8, family: str = "vlm", core: str = "0.16.0"):
    margs = from_mapping(args, ENV, family=family, family_source="the script pretrain_vlm.py")
    return convert(margs, world_size=world_size, te_version="2.12", megatron_core=core)


def test_the_functional_test_s_folder_makes_a_llava_run_file_that_simulates(tmp_path, capsys):
    """validate_args: the ViT's layers are --num-layers (--encoder-num-layers), the decoder's too without
    --decoder-num-layers; model_provider: 576 patches and the class token, so the decoder runs 1,024 + 577 = 1,601
    positions, its learned table as many rows, untied from the output layer; 52-wide heads leave TE its unfused
    attention on an H100 (cuDNN's and flash's head dimensions are multiples of 8)."""
    data = from_megatron_folder(tmp_path, "multimodal-llava", "multimodal_llava_mcore_te_tp1_pp1", ENV, ARGS)
    model = data["model"]
    assert {k: model[k] for k in ("architecture", "num_layers", "vision_layers", "image_height", "image_width",
                                  "patch_size", "vision_class_token", "max_position_embeddings",
                                  "tie_word_embeddings")} == {
        "architecture": "llava", "num_layers": 12, "vision_layers": 12, "image_height": 336, "image_width": 336,
        "patch_size": 14, "vision_class_token": "keep", "max_position_embeddings": 1601,
        "tie_word_embeddings": False}
    assert data["training"]["seq_len"] == 1601
    assert data["framework"]["attention_backend"] == "unfused"
    capsys.readouterr()
    assert main(["simulate", str(tmp_path / "multimodal-llava.toml"), "--format", "summary",
                 "--out", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "summary.json").exists()


def test_the_sequence_follows_the_image_the_class_token_and_the_dataloader():
    """--disable-vision-class-token drops one position; --dataloader-seq-length is the text's tokens over
    --seq-length; --decoder-num-layers sizes the decoder alone."""
    tr = _vlm(ARGS | {"--disable-vision-class-token": True}).sections["training"]
    assert tr["seq_len"] == 1024 + 576
    conv = _vlm(ARGS | {"--dataloader-seq-length": 512, "--img-h": 224, "--img-w": 224, "--patch-dim": 16,
                        "--decoder-num-layers": 4})
    assert conv.sections["training"]["seq_len"] == 512 + 14 * 14 + 1
    assert (conv.sections["model"]["num_layers"], conv.sections["model"]["vision_layers"]) == (4, 12)
    # the test folder names the same script
    assert _vlm(ARGS, family="multimodal-llava").sections["model"]["architecture"] == "llava"


def test_freezing_names_the_frozen_modules():
    """--freeze-LM / --freeze-ViT (LLaVAModel.freeze; the projector stays trainable)."""
    assert _vlm(ARGS | {"--freeze-LM": True, "--freeze-ViT": True}).sections["model"]["frozen"] == ["language",
                                                                                                    "vision"]
    assert _vlm(ARGS).sections["model"]["frozen"] == []


def test_padding_is_context_parallel_s_get_padding():
    """context_parallel.get_padding: to a multiple of tp under SP, of 2·cp under CP, of tp·cp·2 under both."""
    assert padding(1601, tp=4, cp=1, sp=True) == 3
    assert padding(1601, tp=1, cp=2, sp=False) == 3
    assert padding(1601, tp=2, cp=2, sp=True) == 7
    assert padding(1601, tp=4, cp=1, sp=False) == 0


@pytest.mark.parametrize(("extra", "needle"), [
    ({"--ckpt-format": "torch_dist"}, "pretrain_vlm.py asserts \"Only ckpt-format torch"),
    ({"--num-experts": 8}, "--num-experts with pretrain_vlm.py"),
    ({"--pipeline-model-parallel-size": 2, "--context-parallel-size": 2}, "PP+CP is not yet supported"),
    ({"--use-packed-sequence": True, "--context-parallel-size": 2}, "--use-packed-sequence with"),
    ({"--img-h": 330}, "--img-h 330 is not a multiple of --patch-dim 14"),
])
def test_what_a_llava_job_is_refused_with_is_one_line(extra, needle):
    """The conversion's refusals, and the run's validation for what it writes but does not model (a frozen
    module)."""
    with pytest.raises(UserError) as exc:
        conv = _vlm(ARGS | extra)
        run_from_data(tomllib.loads(run_file_text(conv, name="x", source="t", world_size=8)), Path("x.toml"))
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_pretrain_vlm_s_own_arguments_elsewhere_are_refused_by_name():
    for name in ("--freeze-LM", "--disable-vision-class-token"):
        margs = from_mapping(ARGS | {name: True}, ENV, family="gpt", family_source="the script pretrain_gpt.py")
        with pytest.raises(UserError, match=f"{name}: pretrain_vlm.py's own argument"):
            convert(margs, world_size=8)
    margs = from_mapping({k: v for k, v in ARGS.items() if k not in ("--img-w", "--patch-dim")}, ENV, family="gpt",
                         family_source="the script pretrain_gpt.py")
    with pytest.raises(UserError, match="--img-h: a multimodal"):
        convert(margs, world_size=8)


def test_the_vit_s_own_pipeline_stage_comes_first_and_holds_no_decoder_layer():
    """--encoder-pipeline-model-parallel-size 1 (Megatron-LM 8af3dae72a … b600e38d7b): the ViT and projector on a
    stage before the decoder's; the world is data-parallel copies of tp·(pp + 1)·cp ranks (validate_args); an
    encoder TP without an encoder stage changes nothing."""
    par = _vlm(ARGS | {"--encoder-pipeline-model-parallel-size": 1}, core="0.12.0").sections["parallel"]
    assert {k: par[k] for k in ("pp", "encoder_pp", "layout", "dp")} == {"pp": 2, "encoder_pp": 1,
                                                                          "layout": [0, 12], "dp": 4}
    plain = _vlm(ARGS | {"--encoder-tensor-model-parallel-size": 1}, core="0.12.0").sections["parallel"]
    assert "encoder_pp" not in plain and plain["pp"] == 1 and plain["dp"] == 8
    # a ViT stage over fewer ranks: the world is dp copies of 1 + 3 (12 heads split 3 ways)
    own = _vlm(ARGS | {"--encoder-pipeline-model-parallel-size": 1, "--encoder-tensor-model-parallel-size": 1,
                       "--tensor-model-parallel-size": 3}, core="0.12.0").sections["parallel"]
    assert {k: own[k] for k in ("tp", "pp", "encoder_pp", "encoder_tp", "dp")} == {
        "tp": 3, "pp": 2, "encoder_pp": 1, "encoder_tp": 1, "dp": 2}


@pytest.mark.parametrize(("extra", "family", "needle"), [
    ({"--encoder-pipeline-model-parallel-size": 2}, "vlm", "ViT can only live on 1 pipeline stage"),
    ({"--encoder-tensor-model-parallel-size": 2}, "vlm", "at most --tensor-model-parallel-size 1"),
    ({"--encoder-pipeline-model-parallel-size": 1}, "gpt", "a separately parallelised encoder"),
])
def test_what_encoder_stages_are_refused_with(extra, family, needle):
    args = ARGS if family == "vlm" else {k: v for k, v in ARGS.items() if k not in ("--img-h", "--img-w",
                                                                                     "--patch-dim")}
    margs = from_mapping(args | extra, ENV, family=family, family_source="the script")
    with pytest.raises(UserError, match=needle):
        convert(margs, world_size=8)


def test_the_decoder_spec_builds_no_qk_norms():
    """pretrain_vlm.py: decoder_model_with_transformer_engine_default_spec(num_experts, moe_grouped_gemm) — its
    qk_layernorm stays False, so --qk-layernorm builds no q/k norms (a note says so)."""
    conv = _vlm(ARGS | {"--qk-layernorm": True})
    assert "qk_norm" not in conv.sections["model"]
    assert conv.neutral["--qk-layernorm"] == "LLaVA's layer spec (llava_spec.py, qk_layernorm=False) builds IdentityOp q/k norms"
    assert any(n.startswith("--qk-layernorm: LLaVA's layer spec") for n in conv.notes)
