"""The vocabulary from-megatron gives the model: the tokenizer Megatron-LM's ``build_tokenizer`` would build,
read from its file where the file is on this machine (SentencePiece protobuf, Hugging Face ``tokenizer.json``),
``NullTokenizer``'s EOD on top of ``--vocab-size`` before Megatron-Core 0.18, TikToken's 2**17 default."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from timeline.errors import UserError
from timeline.io.megatron_args import from_mapping
from timeline.io.megatron_tokenizer import null_adds_eod, read_sentencepiece
from timeline.io.megatron_write import convert

BASE = {"--num-layers": 2, "--hidden-size": 256, "--num-attention-heads": 8, "--seq-length": 512,
        "--micro-batch-size": 1, "--global-batch-size": 8, "--bf16": True}


def vocab(args: dict, **kw) -> int:
    return convert(from_mapping(BASE | args), world_size=1, **kw).sections["model"]["vocab_size"]


# --- a SentencePiece model file written field by field (sentencepiece_model.proto) ----------------------------

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int32 -1 is a ten-byte varint
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def sentencepiece_file(path: Path, pieces: list[str], **ids: int) -> Path:
    data = b""
    for piece in pieces:  # SentencePiece {piece = 1; score = 2 (float); type = 3}
        body = _len_field(1, piece.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", -1.0) + _varint(3 << 3) + b"\x01"
        data += _len_field(1, body)
    spec = b"".join(_varint(n << 3) + _varint(ids[k]) for n, k in ((40, "unk"), (41, "bos"), (42, "eos"), (43, "pad"))
                    if k in ids)
    data += _len_field(2, spec + _varint(3 << 3) + _varint(len(pieces)))  # trainer_spec, vocab_size = 3
    path.write_bytes(data)
    return path


PIECES = ["<unk>", "<s>", "</s>", "▁a", "▁b", "c"]


def test_the_sentencepiece_reader_gives_pieces_and_trainer_ids(tmp_path):
    pieces, ids = read_sentencepiece(sentencepiece_file(tmp_path / "t.model", PIECES, pad=-1, eos=2))
    assert pieces == PIECES
    assert ids == {"unk": 0, "bos": 1, "eos": 2, "pad": -1}


def test_llama2_and_gpt_sentencepiece_vocabularies_are_the_piece_count(tmp_path):
    model = str(sentencepiece_file(tmp_path / "t.model", PIECES, pad=-1))
    for kind in ("Llama2Tokenizer", "GPTSentencePieceTokenizer"):
        assert vocab({"--tokenizer-type": kind, "--tokenizer-model": model}) == 6
    # Megatron reads the file, not --vocab-size, for a tokenizer with one
    assert vocab({"--tokenizer-type": "Llama2Tokenizer", "--tokenizer-model": model, "--vocab-size": 999}) == 6


def test_the_legacy_sentencepiece_tokenizer_appends_its_special_tokens(tmp_path):
    """Legacy ``_SentencePieceTokenizer._initalize`` (to 0.16): <CLS> <SEP> <EOD> <MASK>, <PAD> for pad_id -1
    (BOS and EOS are pieces already), then the extra ids; 0.17's library keeps the piece count."""
    model = str(sentencepiece_file(tmp_path / "t.model", PIECES, pad=-1))
    args = {"--tokenizer-type": "SentencePieceTokenizer", "--tokenizer-model": model}
    assert vocab(args, megatron_core="0.16.0") == 6 + 5
    assert vocab(args | {"--vocab-extra-ids": 3}, megatron_core="0.16.0") == 6 + 5 + 3
    assert vocab(args, megatron_core="0.17.0") == 6
    # a pad piece in range is not added again
    padded = str(sentencepiece_file(tmp_path / "p.model", [*PIECES, "<pad>"], pad=6))
    assert vocab({"--tokenizer-type": "SentencePieceTokenizer", "--tokenizer-model": padded},
                 megatron_core="0.16.0") == 7 + 4


def test_a_tokenizer_file_not_on_this_machine_needs_vocab_size():
    args = {"--tokenizer-type": "Llama2Tokenizer", "--tokenizer-model": "/nowhere/tokenizer.model"}
    with pytest.raises(UserError, match=r"/nowhere/tokenizer.model \(not on this machine\).*--vocab-size N"):
        vocab(args)
    assert vocab(args | {"--vocab-size": 32000}) == 32000


def test_a_file_that_is_not_a_sentencepiece_model_is_one_line(tmp_path):
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"\x0a\xff\xff\xff")
    with pytest.raises(UserError, match="not a SentencePiece model file"):
        vocab({"--tokenizer-type": "Llama2Tokenizer", "--tokenizer-model": str(bad)})


def hf_folder(folder: Path, vocab_tokens: list[str], added: list[str], config: dict | None = None) -> Path:
    folder.mkdir(parents=True)
    data = {"model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(vocab_tokens)}},
            "added_tokens": [{"id": 100 + i, "content": t} for i, t in enumerate(added)]}
    (folder / "tokenizer.json").write_text(json.dumps(data))
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_a_hugging_face_tokenizer_is_its_vocabulary_merged_with_the_added_tokens(tmp_path):
    """``len(tokenizer)``: the added token already in the vocabulary (``a``) counts once; a Unigram vocabulary
    (a list of [piece, score]) too; tokenizer_config.json's extra special tokens join."""
    folder = hf_folder(tmp_path / "tok", ["a", "b", "c"], ["<|x|>", "a"],
                       {"additional_special_tokens": ["<|y|>", "<|x|>"]})
    args = {"--tokenizer-type": "HuggingFaceTokenizer", "--tokenizer-model": str(folder)}
    assert vocab(args) == 5
    assert vocab(args | {"--vocab-size": 128256}) == 5  # build_tokenizer reads len(tokenizer), not --vocab-size
    assert vocab({"--tokenizer-type": "HuggingFaceTokenizer",
                  "--tokenizer-model": str(folder / "tokenizer.json")}) == 5
    uni = tmp_path / "uni"
    uni.mkdir()
    (uni / "tokenizer.json").write_text(json.dumps({"model": {"type": "Unigram", "vocab": [["x", 0.0], ["y", -1.0]]},
                                                    "added_tokens": []}))
    assert vocab({"--tokenizer-type": "HuggingFaceTokenizer", "--tokenizer-model": str(uni)}) == 2


def test_a_hub_name_is_read_from_the_local_hugging_face_cache(tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc123"
    hf_folder(snap, ["a", "b"], ["<s>"])
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    args = {"--tokenizer-type": "HuggingFaceTokenizer", "--tokenizer-model": "org/tiny"}
    assert vocab(args) == 3
    with pytest.raises(UserError, match="org/other"):
        vocab(args | {"--tokenizer-model": "org/other"})


def test_null_tokenizer_counts_its_eod_before_megatron_core_0_18():
    """``_NullTokenizer`` / ``NullTokenizer``: ``vocab_size + 1`` until c9dfe34798 (core_v0.18.0); padded by
    128 · tp the embedding grows a whole block of rows where ``--vocab-size`` is a multiple of it."""
    args = {"--tokenizer-type": "NullTokenizer", "--vocab-size": 131072}
    assert null_adds_eod("0.17.0") and not null_adds_eod("0.18.0")
    assert vocab(args, megatron_core="0.16.0") == 131073
    assert vocab(args, megatron_core="0.18.0") == 131072
    assert vocab(args, megatron_core="0.18.0", null_eod=True) == 131073  # main's 0.18.0 before c9dfe34798
    with pytest.raises(UserError, match="NullTokenizer needs --vocab-size"):
        vocab({"--tokenizer-type": "NullTokenizer"})


def test_tiktoken_defaults_to_two_to_the_seventeen():
    assert vocab({"--tokenizer-type": "TikTokenizer", "--tokenizer-model": "/nowhere/t.json"}) == 2 ** 17
    assert vocab({"--tokenizer-type": "TikTokenizer", "--tokenizer-model": "/nowhere/t.json",
                  "--vocab-size": 100000}) == 100000


def test_from_megatron_reads_the_launch_scripts_tokenizer_file(tmp_path):
    """End to end: a launch script naming a local SentencePiece model and no --vocab-size writes a run file
    whose vocabulary is the model's (before: refused)."""
    model = sentencepiece_file(tmp_path / "tokenizer.model", PIECES * 1, pad=-1)
    script = tmp_path / "train.sh"
    script.write_text(f"""#!/bin/bash
TOKENIZER={model}
ARGS=(--num-layers 2 --hidden-size 256 --num-attention-heads 8 --seq-length 512 --max-position-embeddings 512
      --micro-batch-size 1 --global-batch-size 8 --bf16 --tokenizer-type Llama2Tokenizer
      --tokenizer-model $TOKENIZER)
torchrun --nproc_per_node 1 pretrain_gpt.py ${{ARGS[@]}}
""")
    out = tmp_path / "job.toml"
    done = subprocess.run([sys.executable, "-m", "timeline", "from-megatron", str(script), "-o", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert tomllib.loads(out.read_text())["model"]["vocab_size"] == 6


# --- WordPiece vocab.txt and GPT-2 vocab.json on this machine -----------------------------------------------------

def test_a_local_wordpiece_vocab_txt_is_its_distinct_tokens_with_bos_eos_and_sentinels(tmp_path):
    """bert_tokenization.py: load_vocab keys an OrderedDict by each stripped line (a repeated token counts once);
    _BertWordPieceTokenizer.add_token adds [BOS] / [EOS] / <extra_id_i> only when the file lacks them."""
    lines = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "##s", "the", "[EOS]"]  # 'the' twice, [EOS] in
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    bert = {"--vocab-file": str(path), "--tokenizer-type": "BertWordPieceLowerCase"}
    assert vocab(bert) == 8 + 1  # 8 distinct, [BOS] added, [EOS] already there
    assert vocab(bert | {"--vocab-extra-ids": 3}) == 9 + 3
    assert vocab(bert | {"--vocab-size": 100}) == 9  # --vocab-size is read only by tokenizers without a file


def test_the_wordpiece_line_rule_follows_the_tokenizer_the_version_builds(tmp_path):
    """To 0.16 Megatron's own load_vocab strips each line; from 0.17 Hugging Face's BertTokenizer keeps all but
    the newline, so 'a' and 'a ' are two tokens there."""
    path = tmp_path / "vocab.txt"
    path.write_text("[PAD]\na\na \n", encoding="utf-8")
    bert = {"--vocab-file": str(path), "--tokenizer-type": "BertWordPieceCase"}
    assert vocab(bert, megatron_core="0.16.0") == 2 + 2
    assert vocab(bert, megatron_core="0.17.0") == 3 + 2


def test_a_wordpiece_vocab_not_on_this_machine_is_the_bundled_one():
    """Without the file the tokenizer type's bundled vocabulary stands in (bert-large-uncased: 30,522) + 2."""
    assert vocab({"--vocab-file": "/nonexistent/vocab.txt", "--tokenizer-type": "BertWordPieceLowerCase"}) == 30524


def test_a_local_gpt2_vocab_json_is_its_entries(tmp_path):
    """_GPT2BPETokenizer.vocab_size is len(encoder), the vocab.json's entries; a file that is not a JSON object
    of tokens is one line naming --vocab-file."""
    path = tmp_path / "vocab.json"
    path.write_text(json.dumps({f"t{i}": i for i in range(1000)} | {"<|endoftext|>": 1000}), encoding="utf-8")
    gpt2 = {"--vocab-file": str(path), "--merge-file": str(tmp_path / "merges.txt"),
            "--tokenizer-type": "GPT2BPETokenizer"}
    assert vocab(gpt2) == 1001
    path.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(UserError, match="--vocab-file .*not a GPT-2 vocab.json"):
        vocab(gpt2)


def test_a_vocab_txt_that_is_not_utf8_is_one_line(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes(b"[PAD]\n\xff\xfe\n")
    with pytest.raises(UserError, match="--vocab-file .*not a UTF-8 WordPiece vocab.txt"):
        vocab({"--vocab-file": str(path), "--tokenizer-type": "BertWordPieceLowerCase"})
