"""The vocabulary Megatron-LM builds its embedding and output layer for: the size of the tokenizer the arguments
name, as ``build_tokenizer`` reads it, before ``--make-vocab-size-divisible-by`` × tp padding.

Megatron-LM sets ``args.padded_vocab_size`` from ``tokenizer.vocab_size`` (``megatron/training/tokenizer/
tokenizer.py: build_tokenizer`` to 0.16, ``megatron/core/tokenizers/utils/build_tokenizer.py`` from 0.17, where the
legacy system is gone, 3257093930); ``--vocab-size`` is read only by the tokenizers that have no file
(``NullTokenizer``, ``TikTokenizer``). A tokenizer with a file is read here when the file is on this machine —
a SentencePiece ``.model`` (its protobuf's pieces and trainer ids, no ``sentencepiece`` import), a Hugging Face
``tokenizer.json`` (a folder, or a hub name in the local Hugging Face cache), a BERT WordPiece ``vocab.txt`` or a
GPT-2 ``vocab.json`` (:func:`wordpiece_vocab`, :func:`bpe_vocab`) — and otherwise ``--vocab-size`` stands in for it,
the bundled vocabulary of the tokenizer type is assumed (BERT's, GPT-2's), or the tokenizer is refused with the fix.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from timeline.errors import UserError
from timeline.profiles.megatron_workspaces import version_tuple

if TYPE_CHECKING:
    from timeline.io.megatron_map import ArgReader

#: GPT-2's BPE ``vocab.json`` holds 50,257 tokens (Radford et al. 2019)
GPT2_VOCAB = 50257
#: vocabulary sizes of tokenizers a config names by a file that is not on this machine: Nemotron-4's
#: SentencePiece model 256,000 (Nemotron-4 15B technical report, arXiv 2402.16819 §2)
KNOWN_TOKENIZER_FILES = {"nemotron_2_256k.model": 256000}
#: the BERT WordPiece vocabularies a ``--vocab-file`` of these tokenizer types holds (the file is not read):
#: ``bert-large-uncased`` (30,522 tokens) and ``bert-large-cased`` (28,996), the ``vocab_size`` of Hugging Face's
#: ``google-bert/bert-large-uncased`` and ``google-bert/bert-large-cased`` ``config.json``; pretrain_bert.py's
#: default tokenizer is ``BertWordPieceLowerCase`` (``pretrain(..., args_defaults=…)``)
BERT_VOCABS = {"BertWordPieceLowerCase": 30522, "BertWordPieceCase": 28996}
#: ``CustomTikTokenizer`` (legacy tokenizer.py) and ``TikTokenTokenizer`` (core/tokenizers/text/libraries/
#: tiktoken_tokenizer.py: DEFAULT_TIKTOKEN_MAX_VOCAB) without ``--vocab-size``: 2**17
TIKTOKEN_DEFAULT_VOCAB = 2 ** 17
SENTENCEPIECE_TYPES = ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer")


def null_adds_eod(megatron_core: str | None) -> bool:
    """Whether ``NullTokenizer`` counts its end-of-document token on top of ``--vocab-size``: ``_NullTokenizer``
    (legacy tokenizer.py) and ``NullTokenizer`` (core/tokenizers/text/libraries/null_tokenizer.py) keep
    ``_vocab_size_without_eod = vocab_size`` and report ``+ 1`` until c9dfe34798 "Enable NullTokenizer for
    pretraining" (2026-04-22, first released in core_v0.18.0), which reports ``vocab_size`` with the EOD id
    ``vocab_size - 1`` (Megatron's own tests moved from 131072 to 131073 to keep their padded size)."""
    return version_tuple(megatron_core or "0.14.0") < (0, 18)


def assumed_gpt2(a: ArgReader, family: str | None) -> bool:
    """Whether the vocabulary is GPT-2's by assumption: no tokenizer argument at all, so pretrain_gpt.py's default
    ``GPT2BPETokenizer`` (``pretrain(..., args_defaults={'tokenizer_type': 'GPT2BPETokenizer'})``), whose
    ``--vocab-file`` / ``--merge-file`` the arguments do not name either (Megatron would fail opening them)."""
    return family != "bert" and not any(n in a.raw for n in ("--padded-vocab-size", "--tokenizer-type",
                                                             "--vocab-size", "--vocab-file", "--tokenizer-model"))


def vocab_size(a: ArgReader, family: str | None = None, *, megatron_core: str | None = None,
               null_eod: bool | None = None) -> int:
    """The unpadded vocabulary of the job (``--padded-vocab-size`` as given). ``null_eod``: whether the
    commit's ``NullTokenizer`` adds its EOD (None: :func:`null_adds_eod` of ``megatron_core``)."""
    size = a.int("--padded-vocab-size")
    if size is not None:
        return size
    kind = str(a.raw.get("--tokenizer-type", "BertWordPieceLowerCase" if family == "bert" else "GPT2BPETokenizer"))
    given = a.int("--vocab-size")
    legacy = version_tuple(megatron_core or "0.14.0") < (0, 17)
    if kind == "NullTokenizer":
        if given is None:
            raise UserError("--tokenizer-type NullTokenizer needs --vocab-size (build_tokenizer asserts it)")
        return given + (1 if (null_adds_eod(megatron_core) if null_eod is None else null_eod) else 0)
    if kind == "TikTokenizer":
        return given if given is not None else TIKTOKEN_DEFAULT_VOCAB
    vocab_file = a.raw.get("--vocab-file")
    if kind in BERT_VOCABS and "--vocab-file" in a.raw:
        # tokenizer.py: _BertWordPieceTokenizer adds [BOS] and [EOS], then --vocab-extra-ids sentinels (T5)
        extra = a.int("--vocab-extra-ids", 0) or 0
        read = wordpiece_vocab(vocab_file, extra, legacy=legacy) if isinstance(vocab_file, str) else None
        if read is not None:  # the file the job reads, on this machine: it, not --vocab-size
            return read
        if given is None:
            return BERT_VOCABS[kind] + 2 + extra
    if kind == "GPT2BPETokenizer" and isinstance(vocab_file, str):
        read = bpe_vocab(vocab_file)
        if read is not None:
            return read
    raw = a.raw.get("--tokenizer-model")
    model = raw if isinstance(raw, str) else ""  # a bare --tokenizer-model (its value empty) names no file
    read = _read_file(kind, model, a, legacy=legacy) if model else None
    if read is not None:
        return read
    if given is not None:
        return given
    if kind == "GPT2BPETokenizer" and ("--vocab-file" in a.raw or "--tokenizer-type" not in a.raw):
        return GPT2_VOCAB  # without files: assumed, with a note (:func:`assumed_gpt2`)
    for fname, n in KNOWN_TOKENIZER_FILES.items():
        if model.endswith(fname):
            return n
    where = f"{model} (not on this machine)" if model else "the tokenizer"
    raise UserError(f"--tokenizer-type {kind}: its vocabulary size is unknown without reading {where}; "
                    "run where the tokenizer file is, or give `from-megatron --vocab-size N` (the tokenizer's "
                    "vocabulary)")


def wordpiece_vocab(vocab_file: str, extra_ids: int, *, legacy: bool) -> int | None:
    """The vocabulary of a BERT WordPiece tokenizer built from ``vocab_file`` where it is on this machine (None
    elsewhere): the file's distinct tokens, one per line, then ``[BOS]``, ``[EOS]`` and the ``--vocab-extra-ids``
    sentinels ``<extra_id_i>`` each added unless the file holds it.

    Legacy ``megatron/training/tokenizer/bert_tokenization.py: load_vocab`` (to 0.16) keys an OrderedDict by each
    ``readline().strip()`` and ``tokenizer.py: _BertWordPieceTokenizer.add_token`` adds a token only ``if token not
    in self.vocab``; ``vocab_size`` is ``len(vocab)``. From 0.17 ``MegatronHFTokenizer`` builds Hugging Face's
    ``BertTokenizer`` on the same file (``tokenization_bert.py: load_vocab``, each line ``rstrip("\\n")``) and
    reports ``len(tokenizer)``; the same special tokens are counted on top, as for the bundled vocabularies."""
    path = Path(vocab_file).expanduser()
    if not path.is_file():
        return None
    try:
        with path.open(encoding="utf-8") as reader:
            tokens = {(line.strip() if legacy else line.rstrip("\n")) for line in reader}
    except UnicodeDecodeError as exc:  # load_vocab opens it as UTF-8 text and fails the same way
        raise UserError(f"--vocab-file {path}: not a UTF-8 WordPiece vocab.txt ({exc.reason})") from None
    tokens.update(["[BOS]", "[EOS]", *(f"<extra_id_{i}>" for i in range(extra_ids))])
    return len(tokens)


def bpe_vocab(vocab_file: str) -> int | None:
    """The vocabulary of a GPT-2 BPE tokenizer built from ``vocab_file`` (its ``vocab.json``) where it is on this
    machine (None elsewhere): the JSON object's entries — legacy ``gpt2_tokenization.py: GPT2Tokenizer`` loads it
    as ``self.encoder`` and ``tokenizer.py: _GPT2BPETokenizer.vocab_size`` is ``len(self.tokenizer.encoder)``;
    from 0.17 Hugging Face's ``GPT2Tokenizer`` on the same file, ``len(tokenizer)`` (GPT-2's ``<|endoftext|>`` is
    an entry of the file)."""
    path = Path(vocab_file).expanduser()
    if not path.is_file():
        return None
    try:
        encoder = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"--vocab-file {path}: not a GPT-2 vocab.json ({exc})") from None
    if not isinstance(encoder, dict) or not encoder:
        raise UserError(f"--vocab-file {path}: not a GPT-2 vocab.json (a JSON object of token → id)")
    return len(encoder)


def _read_file(kind: str, model: str, a: ArgReader, *, legacy: bool) -> int | None:
    """The vocabulary of the tokenizer file ``model`` names, None when it is not on this machine."""
    if kind in SENTENCEPIECE_TYPES:
        path = Path(model)
        if not path.is_file():
            return None
        pieces, ids = read_sentencepiece(path)
        if kind == "SentencePieceTokenizer" and legacy:
            return legacy_sentencepiece_vocab(pieces, ids, a.int("--vocab-extra-ids", 0) or 0)
        return len(pieces)  # SentencePieceProcessor.vocab_size() / get_piece_size()
    if kind == "HuggingFaceTokenizer":
        folder = hf_tokenizer_folder(model)
        return None if folder is None else hf_vocab(folder)
    return None


# --- SentencePiece -------------------------------------------------------------------------------------------

def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data):
            raise ValueError("truncated varint")
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of a protobuf message: ints for varints and fixed, bytes for
    length-delimited fields."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 1:
            value, i = struct.unpack_from("<q", data, i)[0], i + 8
        elif wire == 2:
            size, i = _varint(data, i)
            value, i = data[i:i + size], i + size
        elif wire == 5:
            value, i = struct.unpack_from("<i", data, i)[0], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, value


def _int32(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def read_sentencepiece(path: Path) -> tuple[list[str], dict[str, int]]:
    """The pieces of a SentencePiece model file in id order and its trainer's ``unk_id``/``bos_id``/``eos_id``/
    ``pad_id`` (sentencepiece_model.proto: ModelProto.pieces = 1 {piece = 1}, trainer_spec = 2 {unk_id = 40,
    bos_id = 41, eos_id = 42, pad_id = 43; defaults 0, 1, 2, -1})."""
    ids = {"unk": 0, "bos": 1, "eos": 2, "pad": -1}
    pieces: list[str] = []
    try:
        for number, wire, value in _fields(path.read_bytes()):
            if number == 1 and wire == 2:
                assert isinstance(value, bytes)
                piece = next((v for n, w, v in _fields(value) if n == 1 and w == 2), b"")
                assert isinstance(piece, bytes)
                pieces.append(piece.decode("utf-8", "replace"))
            elif number == 2 and wire == 2:
                assert isinstance(value, bytes)
                for n, w, v in _fields(value):
                    if w == 0 and n in (40, 41, 42, 43):
                        ids[("unk", "bos", "eos", "pad")[n - 40]] = _int32(int(v))
    except (ValueError, struct.error, IndexError) as exc:
        raise UserError(f"--tokenizer-model {path}: not a SentencePiece model file ({exc})") from None
    if not pieces:
        raise UserError(f"--tokenizer-model {path}: a SentencePiece model file with no pieces")
    return pieces, ids


def legacy_sentencepiece_vocab(pieces: list[str], ids: dict[str, int], extra_ids: int) -> int:
    """``_SentencePieceTokenizer._initalize`` (legacy tokenizer.py, to 0.16): the model's pieces, then each of
    ``<CLS>``, ``<SEP>``, ``<EOD>``, ``<MASK>``, the pad, BOS and EOS pieces (``<PAD>``/``<BOS>``/``<EOS>`` where
    the id is out of range) and the ``--vocab-extra-ids`` sentinels appended unless already a piece."""
    vocab = set(pieces)
    extra = []
    for name, fallback in (("pad", "<PAD>"), ("bos", "<BOS>"), ("eos", "<EOS>")):
        i = ids[name]
        extra.append(pieces[i] if 0 <= i < len(pieces) else fallback)
    for token in ["<CLS>", "<SEP>", "<EOD>", "<MASK>", *extra, *(f"<extra_id_{i}>" for i in range(extra_ids))]:
        vocab.add(token)
    return len(vocab)


# --- Hugging Face ----------------------------------------------------------------------------------------------

def hf_tokenizer_folder(model: str) -> Path | None:
    """The local folder ``AutoTokenizer.from_pretrained(model)`` would read: ``model`` itself (a folder, or a
    ``tokenizer.json`` in one), else a snapshot of the hub name in the Hugging Face cache (``$HF_HUB_CACHE``, else
    ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``: ``models--org--name/snapshots/*``); None if neither."""
    path = Path(model).expanduser()
    if path.is_file() and path.name == "tokenizer.json":
        return path.parent
    if path.is_dir():
        return path if (path / "tokenizer.json").is_file() else None
    if model.count("/") != 1 or model.startswith(("/", ".")):
        return None
    hub = os.environ.get("HF_HUB_CACHE") or str(Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
    snapshots = Path(hub).expanduser() / ("models--" + model.replace("/", "--")) / "snapshots"
    found = sorted(p for p in snapshots.glob("*") if (p / "tokenizer.json").is_file()) if snapshots.is_dir() else []
    return found[-1] if found else None


def hf_vocab(folder: Path) -> int:
    """``len(tokenizer)`` of a fast Hugging Face tokenizer (``_HuggingFaceTokenizer.vocab_size``;
    ``PreTrainedTokenizerFast.__len__`` = tokenizers' ``get_vocab_size(with_added_tokens=True)``, the size of the
    model vocabulary merged with the added tokens by content), counting also the added and additional special
    tokens ``tokenizer_config.json`` declares (``from_pretrained`` adds the ones missing)."""
    try:
        data = json.loads((folder / "tokenizer.json").read_text())
        vocab = data["model"]["vocab"]
        tokens = set(vocab) if isinstance(vocab, dict) else {entry[0] for entry in vocab}  # BPE/WordPiece | Unigram
        tokens.update(t["content"] for t in data.get("added_tokens") or [])
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise UserError(f"{folder / 'tokenizer.json'}: not a Hugging Face tokenizer file ({exc})") from None
    config = folder / "tokenizer_config.json"
    if config.is_file():
        try:
            cfg = json.loads(config.read_text())
        except ValueError:
            cfg = {}
        for entry in (cfg.get("added_tokens_decoder") or {}).values():
            if isinstance(entry, dict) and "content" in entry:
                tokens.add(entry["content"])
        for token in cfg.get("additional_special_tokens") or []:
            tokens.add(token["content"] if isinstance(token, dict) else str(token))
    return len(tokens)
