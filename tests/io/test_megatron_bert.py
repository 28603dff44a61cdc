"""``from-megatron`` on a BERT job (``io/megatron_bert.py``): Megatron-LM's own BERT functional test
``tests/functional_tests/test_cases/bert/bert_mcore_tp4_pp1/model_config.yaml`` at 64bee49c96 (its arguments below,
paths as the file has them), read from its folder as a user would, and what a BERT job is refused with."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from helpers_run import from_megatron_folder

from timeline.errors import UserError
from timeline.io.megatron_args import from_mapping
from timeline.io.megatron_write import convert, run_file_text
from timeline.io.runfile import run_from_data
from timeline.result.build import build_timeline

ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": 1, "NVTE_ALLOW_NONDETERMINISTIC_ALGO": 0, "NCCL_ALGO": "Ring",
       "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
ARGS = {"--num-layers": 24, "--hidden-size": 1024, "--num-attention-heads": 16, "--log-params-norm": True,
        "--log-num-zeros-in-grad": True, "--log-validation-ppl-to-tensorboard": True,
        "--log-timers-to-tensorboard": True, "--log-memory-to-tensorboard": True,
        "--tensorboard-dir": "${TENSORBOARD_PATH}", "--micro-batch-size": 4, "--global-batch-size": 128,
        "--seq-length": 512, "--max-position-embeddings": 512, "--train-iters": 50, "--timing-log-level": 0,
        "--lr-decay-iters": 990000, "--save": "${CHECKPOINT_SAVE_PATH}", "--load": "${CHECKPOINT_LOAD_PATH}",
        "--data-path": "${DATA_PATH}/text/common_pile/v01_filtered_data/my-bert_00_text_sentence",
        "--vocab-file": "${DATA_PATH}/text/common_pile/v01_filtered_data/vocab.txt", "--split": "949,50,1",
        "--distributed-backend": "nccl", "--lr": 0.0001, "--min-lr": 0.00001, "--lr-warmup-fraction": 0.01,
        "--log-interval": 1, "--save-interval": 10000, "--eval-interval": 1000, "--eval-iters": 10,
        "--tensor-model-parallel-size": 4, "--pipeline-model-parallel-size": 1, "--deterministic-mode": True,
        "--no-gradient-accumulation-fusion": True, "--data-cache-path": "${DATA_CACHE_PATH}", "--bf16": True,
        "--ckpt-format": "torch", "--attention-backend": "unfused"}


def _bert(args: dict, world_size: int = 8):
    margs = from_mapping(args, ENV, family="bert", family_source="the path test_cases/bert/")
    return convert(margs, world_size=world_size, te_version="2.12", megatron_core="0.16.0")


def test_the_functional_test_s_folder_makes_a_bert_run_file_that_simulates(tmp_path, capsys):
    data = from_megatron_folder(tmp_path, "bert", "bert_mcore_tp4_pp1", ENV, ARGS)
    # pretrain_bert.py: BertModel with the binary head and two token types, BertWordPieceLowerCase's vocabulary
    # (30,522 WordPieces and the [BOS] and [EOS] tokenizer.py's _BertWordPieceTokenizer adds)
    assert {k: data["model"][k] for k in ("architecture", "binary_head", "type_vocab_size", "vocab_size")} == {
        "architecture": "bert", "binary_head": True, "type_vocab_size": 2, "vocab_size": 30524}
    assert data["framework"]["attention_backend"] == "unfused" and data["framework"]["dataloader_batch"] == "tokens"
    assert (data["parallel"]["tp"], data["parallel"]["dp"], data["training"]["num_microbatches"]) == (4, 2, 16)
    run = run_from_data(data, tmp_path / "bert.toml")
    tl = build_timeline(run, summary_only=True)
    # BertModel on one stage: 24 layers of 12.6 M parameters, the embeddings, the LM head, pooler and binary
    # head; the whole of it is on the device tp 4 shards
    assert 3.0e9 < tl.peak(0).allocated_bytes < 3.4e9


def test_pretrain_gpt_never_reads_the_binary_head_switch():
    gpt = {k: v for k, v in ARGS.items() if k != "--vocab-file"} | {"--bert-no-binary-head": True,
                                                                     "--vocab-size": 50257}
    c = convert(from_mapping(gpt), world_size=8)
    assert "architecture" not in c.sections["model"] and c.mapped["--bert-no-binary-head"]


def test_without_the_binary_head_there_are_no_token_types():
    model = _bert(ARGS | {"--bert-no-binary-head": True}).sections["model"]
    assert (model["binary_head"], model["type_vocab_size"]) == (False, 0)


def test_a_cased_wordpiece_vocabulary():
    assert _bert(ARGS | {"--tokenizer-type": "BertWordPieceCase"}).sections["model"]["vocab_size"] == 28996 + 2


@pytest.mark.parametrize("spec", ["local", ["local"], "[local]"])
def test_the_local_layer_spec_is_the_local_implementation(spec):
    """pretrain_bert.py: ``args.spec[0] == 'local'`` builds ``bert_layer_local_spec`` (Megatron's own modules, whatever
    --transformer-impl says), and BertModel asserts the local or auto attention backend for its DotProductAttention."""
    for backend in ("local", "auto"):
        c = _bert(ARGS | {"--spec": spec, "--attention-backend": backend})
        fw = c.sections["framework"]
        assert (fw["transformer_impl"], fw["attention_backend"]) == ("local", "local")
        assert "--spec" in c.mapped and c.sections["model"]["architecture"] == "bert"
    with pytest.raises(UserError, match=r"^--attention-backend unfused with --spec local: BertModel asserts"):
        _bert(ARGS | {"--spec": spec})


def test_the_legacy_bert_model_is_the_local_layer_under_the_same_head():
    """megatron/legacy/model/bert_model.py: BertModel on the legacy language model — ParallelTransformer's local layer
    (--transformer-impl local; CoreAttention whatever --attention-backend says) with the b1ss mask and Core's head."""
    c = _bert(ARGS | {"--use-legacy-models": True, "--transformer-impl": "local", "--ckpt-format": "torch"})
    fw = c.sections["framework"]
    assert (fw["use_legacy_models"], fw["transformer_impl"], fw["attention_backend"]) == (True, "local", "local")
    assert c.sections["model"]["architecture"] == "bert"


def test_another_spec_module_is_still_refused():
    with pytest.raises(UserError, match=r"^--spec: a custom layer spec"):
        _bert(ARGS | {"--spec": "my_specs bert_spec"})
    # pretrain_gpt.py imports any --spec as a module: `local` is not one
    gpt = {k: v for k, v in ARGS.items() if k != "--vocab-file"} | {"--vocab-size": 50257, "--spec": "local"}
    with pytest.raises(UserError, match=r"^--spec: a custom layer spec"):
        convert(from_mapping(gpt), world_size=8)


@pytest.mark.parametrize(("extra", "needle"), [
    ({"--use-legacy-models": True}, "--use-legacy-models with --transformer-impl transformer_engine"),
    ({"--attention-backend": "flash"}, "--attention-backend flash with a BERT model"),
    ({"--context-parallel-size": 2}, "--context-parallel-size with a BERT model"),
    ({"--transformer-impl": "local"}, "--transformer-impl local with a BERT model"),
    ({"--num-experts": 8}, "--num-experts with a BERT model"),
])
def test_what_a_bert_job_is_refused_with_is_one_line(extra, needle):
    """(TE's cuDNN attention runs BERT's padding mask on the padded tensors: auto and fused are mapped.)"""
    with pytest.raises(UserError) as exc:
        _bert(ARGS | extra)
    assert str(exc.value).startswith(needle) and "\n" not in str(exc.value)


def test_te_cudnn_attention_runs_bert_s_padding_mask():
    """dot_product_attention.py: DotProductAttention.forward reads the sequence lengths off the padding mask
    (get_cu_seqlens) for the cuDNN backend, which runs on the padded q, k, v: mapped as the fused backend."""
    assert _bert(ARGS | {"--attention-backend": "fused"}).sections["framework"]["attention_backend"] == "fused"


def test_q_k_norm_flags_build_nothing_where_bert_s_spec_gives_identity_norms():
    """bert_layer_specs.py gives the TE spec IdentityOp q/k norms before core_v0.19.0 and the local spec always: the
    flags are read as memory-neutral, with a note. From 0.19 (2c579b45b9) the TE spec leaves them unset and
    SelfAttention builds TE's per-head norm (or L2Norm), as in a GPT layer: mapped, and each layer keeps them."""
    plain = _bert(ARGS).sections
    for flag in ("--qk-layernorm", "--qk-l2-norm"):
        c = _bert(ARGS | {flag: True})
        assert c.sections == plain
        assert any(n.startswith(f"{flag}: BERT's layer spec (bert_layer_specs.py) gives its attention IdentityOp")
                   for n in c.notes)
        text = run_file_text(c, name="b", source="x", world_size=8, notes=c.notes)
        assert f"#   {flag} (BERT's layer spec (bert_layer_specs.py) builds IdentityOp q/k norms)" in text
        assert f"{flag} -> " not in text  # memory-neutral here, not a mapped argument
    local = ARGS | {"--spec": "local", "--attention-backend": "local", "--qk-layernorm": True}
    margs = from_mapping(local, ENV, family="bert", family_source="the path test_cases/bert/")
    assert "qk_norm" not in convert(margs, world_size=8, te_version="2.12", megatron_core="0.19.0").sections["model"]

    # from 0.19 each layer's TE per-head norm keeps q's and k's contiguous copy and its output, [s·b, heads/tp · hd]
    # bf16 = 512·4 × 4·64 · 2 B, and (LayerNorm) mu and rsigma per row and head, fp32 = 512·4·4 · 4 B; L2Norm no mu
    rows, width = 512 * 4, 16 // 4 * 64
    for flag, stats in (("--qk-layernorm", ("mu", "rsigma")), ("--qk-l2-norm", ("rsigma",))):
        margs = from_mapping(ARGS | {flag: True}, ENV, family="bert", family_source="the path test_cases/bert/")
        c = convert(margs, world_size=8, te_version="2.12", megatron_core="0.19.0")
        assert c.sections["model"]["qk_norm"] is True
        text = run_file_text(c, name="b", source="x", world_size=8)
        tl = build_timeline(run_from_data(tomllib.loads(text), Path("<from-megatron>/b.toml")))
        ev = tl.events(0)
        kept = sorted((tl.names[t], int(size)) for t, sign, size, it, mb in
                      zip(ev.tensor, ev.sign, ev.size, ev.iteration, ev.microbatch, strict=True)
                      if sign > 0 and it == 1 and mb == 0 and tl.names[t].startswith("layers.0.self_attn.")
                      and ("q_norm" in tl.names[t] or "k_norm" in tl.names[t]))
        assert kept == sorted([(f"layers.0.self_attn.{x}_norm.input.{x}", rows * width * 2) for x in "qk"]
                              + [(f"layers.0.self_attn.{x}_norm.out", rows * width * 2) for x in "qk"]
                              + [(f"layers.0.self_attn.{x}_norm.{st}", rows * 4 * 4) for x in "qk" for st in stats])

def test_run_validation_takes_q_k_norms_on_bert_and_refuses_them_on_t5():
    from dataclasses import replace

    from timeline.spec.arch_rules import architecture_problems

    margs = from_mapping(ARGS | {"--qk-layernorm": True}, ENV, family="bert", family_source="the path test_cases/bert/")
    c = convert(margs, world_size=8, te_version="2.12", megatron_core="0.19.0")
    model = run_from_data(tomllib.loads(run_file_text(c, name="b", source="x", world_size=8)),
                          Path("<from-megatron>/b.toml")).model
    assert model.qk_norm and not [f for f, _ in architecture_problems(model) if f == "model.qk_norm"]
    t5 = replace(model, architecture="t5", binary_head=False, type_vocab_size=0, encoder_layers=12)
    assert [why for f, why in architecture_problems(t5) if f == "model.qk_norm"] == [
        "Megatron's T5Model layers (t5_spec.py) have no q/k norms; remove it or set architecture = \"gpt\""]
