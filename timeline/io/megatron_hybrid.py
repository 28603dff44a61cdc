"""Hybrid (Mamba + attention + MLP/MoE) models in Megatron-LM arguments: the layer pattern and the mixer sizes.

Megatron-LM trains them with ``pretrain_mamba.py`` (``MambaModel``, ``--spec`` naming
``megatron.core.models.mamba.mamba_layer_specs mamba_stack_spec``, later ``…hybrid_layer_specs hybrid_stack_spec``)
or ``pretrain_gpt.py --is-hybrid-model``. The layer kinds come from, in order (``megatron/core/ssm/
mamba_hybrid_layer_allocation.py: allocate_layers`` at 46a90b0b6c; ``arguments.py: validate_args`` and
``parse_hybrid_pattern`` from 7418b1b8fb):

- ``--hybrid-layer-pattern`` (from 2026): the main pattern before the first ``/`` (after it: MTP depths, refused
  here), with ``|`` between pipeline segments — ``segments / pp`` is the virtual pipeline size and each segment
  one virtual stage; ``--num-layers`` is derived from it;
- ``--hybrid-override-pattern`` (its deprecated spelling, also before 2026): one symbol per ``--num-layers``;
- ``--hybrid-attention-ratio`` / ``--hybrid-mlp-ratio``: ``_allocate_auto`` spaces attention evenly between
  Mamba sections, then MLPs among the remaining Mamba layers, right-justified;
- none of them: every layer a Mamba layer.

Symbols: ``M`` Mamba, ``*`` attention, ``-`` MLP, ``E`` MoE (``Symbols``). Mixer sizes: ``--mamba-state-dim`` (128),
``--mamba-head-dim`` (64), ``--mamba-num-groups`` (8), ``--mamba-num-heads`` (default ``2·hidden/head_dim``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from timeline.errors import UserError

#: ``--spec`` values that name Megatron-Core's hybrid stack (``pretrain_mamba.py`` needs one)
STACK_SPECS = ("mamba_layer_specs mamba_stack_spec", "hybrid_layer_specs hybrid_stack_spec")
PATTERN_ARGS = ("--hybrid-layer-pattern", "--hybrid-override-pattern", "--hybrid-attention-ratio",
                "--hybrid-mlp-ratio")
SYMBOLS = "M*-E"


@dataclass(frozen=True, slots=True, kw_only=True)
class Hybrid:
    """A hybrid model's layer kinds (one symbol per layer) and, for a pattern with ``|``, layers per segment."""

    pattern: str
    segments: tuple[int, ...] | None = None


def _on(raw: dict[str, Any], name: str) -> bool:
    v = raw.get(name)
    return v not in (None, False, "false", "False", "None", "none", 0, 0.0)


def stack_spec(raw: dict[str, Any]) -> bool:
    """Whether ``--spec`` names the hybrid stack."""
    spec = raw.get("--spec", "")
    # a YAML string, or the (module, function) words an argument list gives
    words = [str(w) for w in spec] if isinstance(spec, (list, tuple)) else str(spec).strip("[]").split()
    text = " ".join(words)
    return any(s in text for s in STACK_SPECS)


def is_hybrid(raw: dict[str, Any]) -> bool:
    """Whether the arguments describe a hybrid model."""
    return stack_spec(raw) or _on(raw, "--is-hybrid-model") or any(_on(raw, n) for n in PATTERN_ARGS)


def allocate_auto(layers: int, attention_ratio: float, mlp_ratio: float) -> str:
    """``mamba_hybrid_layer_allocation.py: _allocate_auto`` (46a90b0b6c; ``pattern_from_ratios`` later)."""
    kinds = ["M"] * layers
    attention = round(layers * attention_ratio)
    mamba = layers - attention
    section = mamba / (attention + 1)
    x = section
    for i in range(layers):
        if x < 0.5:
            kinds[i] = "*"
            x += section
        else:
            x -= 1
    mlp = round(layers * mlp_ratio)
    if mlp > 0:
        ratio = (mamba - mlp) / mlp
        x = ratio
        for i in range(layers):
            if kinds[i] == "M":
                if x < 0.5:
                    kinds[i] = "-"
                    x += ratio
                else:
                    x -= 1
    return "".join(kinds)


def _strip(text: str) -> str:
    """A pattern as YAML and shell scripts write it: quotes and backslash escapes around it removed."""
    return text.replace("\\", "").strip().strip("\"'")


def read_hybrid(raw: dict[str, Any]) -> Hybrid | None:
    """The hybrid layer pattern the arguments give (None: not a hybrid model)."""
    if not is_hybrid(raw):
        return None
    layer_pattern, override = raw.get("--hybrid-layer-pattern"), raw.get("--hybrid-override-pattern")
    if _on(raw, "--hybrid-layer-pattern") and _on(raw, "--hybrid-override-pattern"):
        raise UserError("--hybrid-override-pattern with --hybrid-layer-pattern: Megatron-LM accepts one of them "
                        "(arguments.py: validate_args); drop --hybrid-override-pattern")
    text = _strip(str(layer_pattern if _on(raw, "--hybrid-layer-pattern") else override or ""))
    if "/" in text:
        raise UserError(f"--hybrid-layer-pattern {text}: multi-token prediction in a hybrid model (the pattern after "
                        "'/') is not modelled; drop the MTP part")
    segments = None
    if text:
        parts = text.split("|")
        if len(parts) > 1:
            segments = tuple(len(p) for p in parts)
        text = "".join(parts)
        bad = sorted(set(text) - set(SYMBOLS))
        if bad:
            raise UserError(f"--hybrid-layer-pattern {text}: {''.join(bad)!r} is not a layer symbol; use M (Mamba), "
                            "* (attention), - (MLP), E (MoE), | between pipeline segments")
    layers = raw.get("--num-layers")
    n = int(layers) if layers not in (None, "None") else len(text)
    attn, mlp = float(raw.get("--hybrid-attention-ratio") or 0.0), float(raw.get("--hybrid-mlp-ratio") or 0.0)
    if not text:
        if not n:
            raise UserError("--num-layers is required for a hybrid model without --hybrid-layer-pattern")
        return Hybrid(pattern=allocate_auto(n, attn, mlp))
    if len(text) != n:
        raise UserError(f"--num-layers {n}: the hybrid pattern has {len(text)} layers (arguments.py: validate_args "
                        "asserts they match); give --num-layers {len(text)} or drop it")
    if attn > 0 or mlp > 0:
        auto = allocate_auto(n, attn, mlp)
        if any(auto.count(s) != text.count(s) for s in "M*-"):  # _layer_counts_match
            raise UserError(f"--hybrid-attention-ratio {attn} / --hybrid-mlp-ratio {mlp}: the pattern's layer counts "
                            "differ from the ratios' (Megatron-LM raises ValueError); drop the ratios")
    return Hybrid(pattern=text, segments=segments)
