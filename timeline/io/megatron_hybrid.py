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
    #: MTP depths the pattern gives after its '/' separators (each depth's own layer pattern is ``mtp_pattern``)
    mtp_depths: int = 0
    mtp_pattern: str = ""


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


#: the MTP depth patterns modelled: an attention layer then an MoE or an MLP layer — the transformer layer a GPT
#: model's MTP depth runs (each hybrid layer has its own pre-norm, fused into the attention's qkv linear and
#: TENorm before the MLP, as a TransformerLayer's)
MTP_PATTERNS = ("*E", "*-")


def _mtp_part(text: str) -> tuple[str, int, str]:
    """(main pattern, MTP depths, one depth's pattern) of a unified pattern ``main/mtp/mtp…``
    (``megatron/core/models/hybrid/hybrid_layer_allocation.py: parse_hybrid_pattern``@d98e8a64dd: empty parts after
    the separator give no MTP, the depths' patterns must be identical; ``arguments.py: validate_args`` then takes
    ``--mtp-num-layers`` from the depth count)."""
    if "/" not in text:
        return text, 0, ""
    main, *mtps = text.split("/")
    if all(p == "" for p in mtps):
        return main, 0, ""
    if len(set(mtps)) != 1:
        raise UserError(f"--hybrid-layer-pattern {text}: Megatron-LM requires every MTP depth's pattern to be the "
                        f"same (parse_hybrid_pattern raises), here {', '.join(repr(p) for p in mtps)}")
    if mtps[0] not in MTP_PATTERNS:
        raise UserError(f"--hybrid-layer-pattern {text}: an MTP depth of {mtps[0]!r} is not modelled; the depths "
                        "modelled are an attention layer then an MoE or an MLP layer ('*E', '*-')")
    return main, len(mtps), mtps[0]


def read_hybrid(raw: dict[str, Any]) -> Hybrid | None:
    """The hybrid layer pattern the arguments give (None: not a hybrid model)."""
    if not is_hybrid(raw):
        return None
    layer_pattern, override = raw.get("--hybrid-layer-pattern"), raw.get("--hybrid-override-pattern")
    if _on(raw, "--hybrid-layer-pattern") and _on(raw, "--hybrid-override-pattern"):
        raise UserError("--hybrid-override-pattern with --hybrid-layer-pattern: Megatron-LM accepts one of them "
                        "(arguments.py: validate_args); drop --hybrid-override-pattern")
    text = _strip(str(layer_pattern if _on(raw, "--hybrid-layer-pattern") else override or ""))
    legacy_mtp, depths = raw.get("--mtp-hybrid-override-pattern"), str(raw.get("--mtp-num-layers"))
    if legacy_mtp not in (None, "None", False) and depths.isdigit() and int(depths) > 0 and "/" not in text:
        # arguments.py: validate_args (d98e8a64dd) turns the deprecated pair into the unified pattern
        text = text + "/" + "/".join([_strip(str(legacy_mtp))] * int(depths))
    text, mtp_depths, mtp_pattern = _mtp_part(text)
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
    return Hybrid(pattern=text, segments=segments, mtp_depths=mtp_depths, mtp_pattern=mtp_pattern)
