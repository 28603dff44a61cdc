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


def moe_layer_pattern(value: object, num_layers: int) -> list[int]:
    """1/0 per decoder layer (MoE/dense) from ``--moe-layer-freq``."""
    arg = "--moe-layer-freq"
    text = str(value).strip()
    if re.fullmatch(r"\d+", text):
        k = int(text)
        if k < 1:
            raise UserError(f"{arg}: must be ≥ 1, got {k}")
        return [1 if i % k == 0 else 0 for i in range(num_layers)]
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise UserError(f"{arg}: {text!r} is neither an integer nor a list expression") from None
    pattern = _list_value(tree.body, arg)
    if len(pattern) != num_layers or set(pattern) - {0, 1}:
        raise UserError(f"{arg}: {text!r} must give 0 or 1 for each of the {num_layers} layers "
                        f"(it gives {len(pattern)} values)")
    return pattern


def pattern_to_model(pattern: list[int]) -> tuple[int, int]:
    """(first_k_dense_replace, moe_layer_freq) reproducing ``pattern``, or a UserError."""
    first = next((i for i, v in enumerate(pattern) if v), len(pattern))
    rest = pattern[first:]
    for freq in range(1, len(rest) + 1):
        if [1 if i % freq == 0 else 0 for i in range(len(rest))] == rest:
            return first, freq
    raise UserError(f"--moe-layer-freq: the pattern {pattern} is not k dense layers followed by every "
                    "n-th layer MoE, which is what the model can express")


def parse_layout(text: str, pp: int) -> tuple[list[int], int]:
    """(layers per virtual stage, vpp) from ``--pipeline-model-parallel-layout``."""
    arg = "--pipeline-model-parallel-layout"
    stages = [s.strip() for s in str(text).split("|")]
    counts: list[int] = []
    for i, stage in enumerate(stages):
        expanded = re.sub(r"([EtmL])\*(\d+)", lambda mt: mt.group(1) * int(mt.group(2)), stage)
        if set(expanded) - set("EtmL"):
            raise UserError(f"{arg}: stage {i} {stage!r} has symbols other than E, t, m, L, *n")
        if "E" in expanded and i != 0:
            raise UserError(f"{arg}: the embedding (E) must be on the first stage")
        if ("L" in expanded or "m" in expanded) and i != len(stages) - 1:
            raise UserError(f"{arg}: MTP (m) and the loss (L) must be on the last stage")
        counts.append(expanded.count("t"))
    if len(counts) % pp:
        raise UserError(f"{arg}: {len(counts)} stages do not divide over pipeline-model-parallel-size {pp}")
    return counts, len(counts) // pp


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
