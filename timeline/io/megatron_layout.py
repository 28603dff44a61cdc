"""Megatron-LM's layout arguments read without ``eval``: ``--moe-layer-freq`` list expressions and
the pipeline layout family (``--pipeline-model-parallel-layout``, ``--decoder-first/last-pipeline-
num-layers``, ``--account-for-embedding/loss-in-pipeline-split``), turned into the run file's
``first_k_dense_replace`` / ``moe_layer_freq`` and ``parallel.layout`` (layers per virtual stage).

Megatron's rules (``megatron/training/arguments.py: moe_freq_type``,
``megatron/core/transformer/transformer_block.py: get_num_layers_to_build``,
``megatron/core/transformer/pipeline_parallel_layer_layout.py: PipelineParallelLayerLayout``):
an integer k makes every k-th layer MoE from layer 0; a list gives 1 (MoE) or 0 (dense) per layer;
a layout string lists each virtual stage's layers as ``E`` (embedding), ``t`` (decoder layer),
``m`` (MTP), ``L`` (loss), ``|`` between stages, ``X*n`` repeating. This module only parses.
"""

from __future__ import annotations

import ast
import re

from timeline.errors import UserError
from timeline.io.megatron_versions import release_of
from timeline.spec.mtp_rules import STANDALONE_MTP


def _list_value(node: ast.AST, arg: str) -> list[int]:
    """A list expression built from int literals, ``[…]``, ``+`` and ``*`` — nothing else runs."""
    if isinstance(node, ast.List):
        out = []
        for elt in node.elts:
            if not (isinstance(elt, ast.Constant) and type(elt.value) is int):
                raise UserError(f"{arg}: list entries must be integers")
            out.append(elt.value)
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _list_value(node.left, arg) + _list_value(node.right, arg)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        left, right = node.left, node.right
        if isinstance(right, ast.Constant) and type(right.value) is int:
            return _list_value(left, arg) * right.value
        if isinstance(left, ast.Constant) and type(left.value) is int:
            return _list_value(right, arg) * left.value
    raise UserError(f"{arg}: {ast.unparse(node)!r} is not a list of 0/1 built with [..], + and *")


def _freq_or_list(value: object, arg: str) -> int | list[int]:
    """Megatron's ``moe_freq_type`` (``megatron/training/arguments.py``) without ``eval``: an integer ≥ 1, or a
    list expression of 0/1 built with ``[..]``, ``+`` and ``*``."""
    text = str(value).strip()
    if re.fullmatch(r"\d+", text):
        k = int(text)
        if k < 1:
            raise UserError(f"{arg}: must be ≥ 1, got {k}")
        return k
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise UserError(f"{arg}: {text!r} is neither an integer nor a list expression") from None
    pattern = _list_value(tree.body, arg)
    if set(pattern) - {0, 1}:
        raise UserError(f"{arg}: {text!r} must give 0 or 1 per layer")
    return pattern


def moe_layer_pattern(value: object, num_layers: int) -> list[int]:
    """1/0 per decoder layer (MoE/dense) from ``--moe-layer-freq``."""
    arg = "--moe-layer-freq"
    freq = _freq_or_list(value, arg)
    if isinstance(freq, int):
        return [1 if i % freq == 0 else 0 for i in range(num_layers)]
    if len(freq) != num_layers:
        raise UserError(f"{arg}: {str(value).strip()!r} must give 0 or 1 for each of the {num_layers} layers "
                        f"(it gives {len(freq)} values)")
    return freq


def linear_attention_pattern(value: object, num_layers: int) -> list[int]:
    """1 (a gated delta net) / 0 (attention) per decoder layer from ``--linear-attention-freq``
    (``models/gpt/experimental_attention_variant_module_specs.py: get_linear_attention_pattern``, core_v0.16.0 …
    d98e8a64dd): an integer N makes every N-th layer (1-based) attention; a list expression gives each layer."""
    arg = "--linear-attention-freq"
    freq = _freq_or_list(value, arg)
    if isinstance(freq, int):
        return [0 if (i + 1) % freq == 0 else 1 for i in range(num_layers)]
    if len(freq) != num_layers:
        raise UserError(f"{arg}: {str(value).strip()!r} must give 0 or 1 for each of the {num_layers} layers "
                        f"(it gives {len(freq)} values)")
    return freq


def window_layer_pattern(value: object, num_layers: int) -> list[int]:
    """1 (a sliding-window layer) / 0 (full attention) per decoder layer from ``--window-attn-skip-freq``
    (``megatron/core/transformer/utils.py: is_layer_window_attention``, 1-based layer numbers: an integer N makes
    every N-th layer full; a list expression gives each layer, 1 = window; absent: every layer slides)."""
    arg = "--window-attn-skip-freq"
    if value is None:
        return [1] * num_layers
    freq = _freq_or_list(value, arg)
    if isinstance(freq, int):
        return [1 if (i + 1) % freq else 0 for i in range(num_layers)]
    if len(freq) < num_layers:
        raise UserError(f"{arg}: {str(value).strip()!r} must give 0 or 1 for each of the {num_layers} layers "
                        f"(it gives {len(freq)} values)")
    return freq[:num_layers]


def pattern_to_model(pattern: list[int]) -> tuple[int, int] | None:
    """(first_k_dense_replace, moe_layer_freq) reproducing ``pattern``; None when no such rule does (the pattern is
    then written layer by layer, ``model.mlp_layer_types``)."""
    first = next((i for i, v in enumerate(pattern) if v), len(pattern))
    rest = pattern[first:]
    for freq in range(1, len(rest) + 1):
        if [1 if i % freq == 0 else 0 for i in range(len(rest))] == rest:
            return first, freq
    return None


LAYOUT_ARG = "--pipeline-model-parallel-layout"

#: the layout string's layer symbols (``parse_str_to_list``'s table, the same at every version)
SYMBOLS = {"E": "embedding", "t": "decoder layer", "m": "MTP layer", "L": "loss"}


def layout_places_mtp(megatron_core: str) -> bool:
    """Whether Megatron-Core ``megatron_core`` (``X.Y.Z`` or ``X.Y.ZrcN``) places MTP layers by the layout's ``m``.
    ``pipeline_parallel_layer_layout.py: validate_layer_layout`` raised NotImplementedError for any ``m`` up to
    core_v0.14.0rc7 — every 0.14.0rcN of main and the release branch — and the MTP layers were built on the last
    stage whatever the layout said (``multi_token_prediction.py: get_mtp_num_layers_to_build``); core_v0.14.0 and
    main from d7bf5aaaa8 (2025-08-26, 0.15.0rc0) count them against ``--mtp-num-layers``."""
    v = release_of(megatron_core)
    return v[:2] > (0, 14) or (v[:2] == (0, 14) and "rc" not in megatron_core)

#: a symbol of the expanded layout and the 0-based index of the character of the text it came from
Sym = tuple[str, int]


def _count_at(text: list[Sym], i: int) -> tuple[int, int] | None:
    """``*n`` at ``text[i]``: (n, index after the digits), or None. Digits are Python's ``\\d``
    (any Unicode decimal digit, which ``int`` reads)."""
    if i + 1 >= len(text) or text[i][0] != "*" or not text[i + 1][0].isdecimal():
        return None
    j = i + 1
    while j < len(text) and text[j][0].isdecimal():
        j += 1
    return int("".join(c for c, _ in text[i + 1:j])), j


#: the most characters a layout may expand to: one symbol or ``|`` per layer and per virtual stage, and
#: no run file holds a million of those; a guard so that ``t*99999999999`` is refused, not expanded
MAX_EXPANDED = 2**20


def _repeat(out: list[Sym], piece: list[Sym], n: int) -> None:
    if len(out) + len(piece) * n > MAX_EXPANDED:
        raise UserError(f"{LAYOUT_ARG}: the repetition *{n} at character {piece[0][1] + 1} expands the layout past "
                        f"{MAX_EXPANDED:,} symbols, more layers and stages than any job has")
    out += piece * n


def _unroll_groups(text: list[Sym]) -> list[Sym]:
    """One left-to-right pass over ``(body)*n``: the body runs to the first ``)`` and is not empty;
    a ``(`` that does not open such a group stays (and later fails as a symbol), so groups do not
    nest and an unrolled body is not scanned again."""
    out: list[Sym] = []
    i = 0
    while i < len(text):
        if text[i][0] == "(":
            close = next((j for j in range(i + 1, len(text)) if text[j][0] == ")"), None)
            rep = _count_at(text, close + 1) if close is not None and close > i + 1 else None
            if close is not None and rep is not None:
                _repeat(out, text[i + 1:close], rep[0])
                i = rep[1]
                continue
        out.append(text[i])
        i += 1
    return out


def _unroll_symbols(text: list[Sym]) -> list[Sym]:
    """One left-to-right pass over ``x*n``: any one character but a newline, ``|`` included."""
    out: list[Sym] = []
    i = 0
    while i < len(text):
        rep = _count_at(text, i + 1) if text[i][0] != "\n" else None
        if rep is not None:
            _repeat(out, [text[i]], rep[0])
            i = rep[1]
            continue
        out.append(text[i])
        i += 1
    return out


def layout_stages(text: str) -> list[list[Sym]]:
    """The virtual stages a layout string lists, each as its symbols in order.

    Megatron's grammar (``megatron/core/transformer/pipeline_parallel_layer_layout.py:
    PipelineParallelLayerLayout.parse_str_to_list``, unchanged from core_v0.13.0 (c550cf6c41), where the
    file first appears, through core_v0.19.0 (5be9626709) and main d98e8a64dd): commas are dropped;
    then one pass unrolls ``(body)*n`` and a second ``x*n``; the result splits at ``|`` into stages
    and every remaining character must be ``E``, ``t``, ``m`` or ``L``. Nothing else is accepted:
    not whitespace, not nested groups (the body stops at the first ``)``), not a group without ``*n``;
    an empty stage (``||``) is a stage with no layers."""
    chars = [(c, i) for i, c in enumerate(text) if c != ","]
    stages: list[list[Sym]] = [[]]
    for c, i in _unroll_symbols(_unroll_groups(chars)):
        if c == "|":
            stages.append([])
        elif c in SYMBOLS:
            stages[-1].append((c, i))
        else:
            why = ("a group is (…) followed by *n, and groups do not nest" if c in "()" else
                   "Megatron allows no spaces" if c.isspace() else "use E, t, m, L, | and *n")
            raise UserError(f"{LAYOUT_ARG} {text!r}: character {i + 1} {c!r} is not a layer symbol "
                            f"(E embedding, t decoder layer, m MTP, L loss); {why}")
    return stages


def _where(stage: int, pp: int) -> str:
    return f"virtual stage {stage} (pp rank {stage % pp}, vp stage {stage // pp})"


def check_layout(text: str, stages: list[list[Sym]], pp: int, *, num_layers: int | None,
                 mtp_layers: int | None, megatron_core: tuple[int, ...] | None = None,
                 places_mtp: bool | None = None) -> None:
    """Megatron's checks of a parsed layout, then the one placement the run file cannot express.

    Stage ``i`` of the list is virtual stage ``i // pp`` of pipeline rank ``i % pp``
    (``PipelineParallelLayerLayout.__init__``: ``layout[vpp_rank * pp + pp_rank]``), which is the
    run file's order of ``parallel.layout``. ``arguments.py: validate_args`` needs a multiple of pp
    stages; ``validate_layer_layout`` needs, in that order, ``E`` first and ``L`` last, each exactly
    once, ``--num-layers`` ``t`` and ``--mtp-num-layers`` ``m``, no ``t`` after an ``m``, the ``m`` all
    in the last virtual stage of one rank. core_v0.13.0 refuses any ``m`` (and counts none: it builds
    the MTP layers on the last stage); core_v0.15.x also wants them with the loss (core_v0.14.0 meant
    to, but its assert tests a tuple); from core_v0.16.0 (5247a1f460) they may stand on an earlier rank
    (``parallel.mtp_stage``; without ``--megatron-core`` such a layout is refused, since the run file's
    default version predates it). ``E`` and ``L`` only count: the embedding is built on the first virtual
    stage and the head and loss on the last whatever the layout says (``pretrain_gpt.py``: ``pre_process``
    / ``post_process`` from ``is_pipeline_first_stage`` / ``is_pipeline_last_stage``), as the run file
    has them; the MTP layers are placed by the layout."""
    head = f"{LAYOUT_ARG} {text!r}"
    if len(stages) % pp:
        raise UserError(f"{head}: {len(stages)} stages do not divide over --pipeline-model-parallel-size "
                        f"{pp}; Megatron needs pp·vpp stages, one per virtual stage")
    flat = [(sym, pos, k) for k, stage in enumerate(stages) for sym, pos in stage]
    if not flat or flat[0][0] != "E":
        got = f"{flat[0][0]!r} (character {flat[0][1] + 1})" if flat else "nothing"
        raise UserError(f"{head}: the first layer must be the embedding E, got {got}")
    if flat[-1][0] != "L":
        raise UserError(f"{head}: the last layer must be the loss L, got {flat[-1][0]!r} (character {flat[-1][1] + 1})")
    for sym, name in (("E", "embedding E"), ("L", "loss L")):
        extra = [pos for s, pos, _ in flat if s == sym][1:]
        if extra:
            raise UserError(f"{head}: the {name} must appear exactly once; again at character {extra[0] + 1}")
    decoders = sum(s == "t" for s, _, _ in flat)
    if num_layers is not None and decoders != num_layers:
        raise UserError(f"{head}: lists {decoders} decoder layers (t); --num-layers is {num_layers}")
    mtp = [(n, k) for n, (s, _, k) in enumerate(flat) if s == "m"]
    if places_mtp is None:  # a version tuple alone cannot tell 0.14.0rcN from 0.14.0 (layout_places_mtp)
        places_mtp = megatron_core is None or megatron_core >= (0, 14)
    if not places_mtp:
        if mtp:  # core_v0.13.0 … 0.14.0rc7 build --mtp-num-layers on the last stage whatever the layout says
            raise UserError(f"{head}: MTP layers (m) in a layout need Megatron-Core 0.14.0 or later "
                            "(core_v0.13.0 … core_v0.14.0rc7 raise NotImplementedError)")
        return
    if len(mtp) != (mtp_layers or 0):
        raise UserError(f"{head}: lists {len(mtp)} MTP layers (m); --mtp-num-layers is {mtp_layers or 0}")
    if not mtp:
        return
    late = next((pos for s, pos, _ in flat[mtp[0][0]:] if s == "t"), None)
    if late is not None:
        raise UserError(f"{head}: decoder layers must come before the MTP layers; the t at character "
                        f"{late + 1} follows an m")
    vpp = len(stages) // pp
    early = next((k for _, k in mtp if k // pp != vpp - 1), None)
    if early is not None:
        raise UserError(f"{head}: MTP layers must be in the last virtual stage of their rank; "
                        f"{_where(early, pp)} is not")
    first = mtp[0][1]
    other = next((k for _, k in mtp if k != first), None)
    if other is not None:
        raise UserError(f"{head}: all MTP layers must be in one virtual stage; they are in "
                        f"{_where(first, pp)} and {_where(other, pp)}")
    if first != len(stages) - 1 and (megatron_core is None or megatron_core < STANDALONE_MTP):
        raise UserError(f"{head}: the MTP layers are on {_where(first, pp)}, apart from the loss, which "
                        "Megatron-Core allows from 0.16.0 on (5247a1f460); pass --megatron-core 0.16.0 or the later "
                        "version you run")


def mtp_stage(stages: list[list[Sym]]) -> int | None:
    """The virtual stage of a checked layout's MTP layers when it is not the last (``parallel.mtp_stage``:
    Megatron-Core's ``mtp_standalone``), else None."""
    at = next((k for k, stage in enumerate(stages) if any(s == "m" for s, _ in stage)), None)
    return None if at is None or at == len(stages) - 1 else at


def parse_layout(text: str, pp: int, *, num_layers: int | None = None, mtp_layers: int | None = None,
                 megatron_core: tuple[int, ...] | None = None) -> tuple[list[int], int]:
    """(decoder layers per virtual stage, vpp) from ``--pipeline-model-parallel-layout``, after
    :func:`check_layout`; the counts are ``parallel.layout`` in the run file's order."""
    counts, vpp, _ = parse_layout_mtp(text, pp, num_layers=num_layers, mtp_layers=mtp_layers,
                                      megatron_core=megatron_core)
    return counts, vpp


def parse_layout_mtp(text: str, pp: int, *, num_layers: int | None = None, mtp_layers: int | None = None,
                     megatron_core: tuple[int, ...] | None = None,
                     places_mtp: bool | None = None) -> tuple[list[int], int, int | None]:
    """:func:`parse_layout` and the MTP layers' virtual stage where it is apart from the loss
    (:func:`mtp_stage`)."""
    stages = layout_stages(str(text))
    check_layout(str(text), stages, pp, num_layers=num_layers, mtp_layers=mtp_layers, megatron_core=megatron_core,
                 places_mtp=places_mtp)
    return [sum(s == "t" for s, _ in stage) for stage in stages], len(stages) // pp, mtp_stage(stages)


def split_layers(num_layers: int, chunks: int, *, first: int | None, last: int | None,
                 embedding: bool, loss: bool, pp: int | None = None) -> list[int] | None:
    """Layers per virtual stage under the uneven-split arguments; None for an even split.

    ``--decoder-first/last-pipeline-num-layers`` name a pipeline *rank*'s layers; with virtual
    stages (``chunks = pp·vpp``, chunk ``c`` on rank ``c % pp``) each rank's layers split evenly over
    its chunks (``transformer_block.py: get_num_layers_to_build``)."""
    if first is None and last is None and not embedding and not loss:
        return None
    pp = pp or chunks
    vpp = chunks // pp
    if (first is not None or last is not None) and vpp > 1:
        per_rank = split_layers(num_layers, pp, first=first, last=last, embedding=False, loss=False)
        assert per_rank is not None  # first or last is given, so the split is explicit
        if any(n % vpp for n in per_rank):
            raise UserError(f"--decoder-first/last-pipeline-num-layers: a rank's layers {per_rank} do not divide "
                            f"over its {vpp} virtual stages")
        return [per_rank[c % pp] // vpp for c in range(chunks)]
    if first is not None or last is not None:
        middle = chunks - (first is not None) - (last is not None)
        rest = num_layers - (first or 0) - (last or 0)
        if middle < 0 or rest < 0 or (middle and rest % middle) or (not middle and rest):
            raise UserError(f"--decoder-first/last-pipeline-num-layers: {num_layers} layers do not split "
                            f"into {chunks} stages as given")
        each = rest // middle if middle else 0
        out = [each] * chunks
        if first is not None:
            out[0] = first
        if last is not None:
            out[-1] = last
        return out
    units = num_layers + embedding + loss
    if units % chunks:
        raise UserError(f"--account-for-embedding/loss-in-pipeline-split: {num_layers} layers"
                        f"{' + embedding' if embedding else ''}{' + loss' if loss else ''} do not divide "
                        f"into {chunks} virtual stages")
    out = [units // chunks] * chunks
    if embedding:
        out[0] -= 1
    if loss:
        out[-1] -= 1
    return out
