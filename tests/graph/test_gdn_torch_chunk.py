"""Megatron-Core's gated delta net under ``--deterministic-mode`` (``[framework] deterministic``): the convolution
as ``act_fn(conv1d(qkv)[..., :seq_len])`` and the rule as ``torch_chunk_gated_delta_rule``, torch ops under autograd
(``graph/families/gdn.py: torch_chunk``, rules ``gdn_conv_torch`` and ``gdn_torch_chunk``).

The closed form (:func:`timeline.profiles.megatron_gdn.torch_chunk_elements`) is held against the function's own autograd
graph, captured on the CPU at core_v0.17.0 (``tests/data/gdn_torch_chunk.json``, written by
``tools/probe_gdn_torch_chunk.py``); the layer around it against the same test model as
``test_activations_megatron_gdn.py``."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from sources import template_of
from test_activations_megatron_gdn import BASE, CONV, KD, NK, NV, RUN, TP, VD, B, S

from timeline.io.megatron_args import from_mapping
from timeline.io.megatron_write import convert
from timeline.io.runfile import load_run
from timeline.profiles.megatron_gdn import TORCH_CHUNK, torch_chunk_elements

DATA = json.loads((Path(__file__).resolve().parents[1] / "data" / "gdn_torch_chunk.json").read_text())
MASKS = 2 * TORCH_CHUNK * TORCH_CHUNK  # the two [64, 64] bool masks of one call


def predicted(row: dict) -> tuple[int, int, int]:
    """(kept, forward transient, backward peak) bytes of one call on ``row``'s shape."""
    kept, work, back = torch_chunk_elements(row["s"], row["k"], row["v"])
    units = row["b"] * row["h"]
    view = row["b"] * row["s"] * row["v"] if row["h"] == 1 else 0  # one head: the output's transpose is a view
    return units * kept * 4 + MASKS, (units * work - view) * 4, units * back * 4


def test_the_reference_is_the_functions_own_graph():
    assert "core_v0.17.0" in DATA["source"] and "torch_chunk_gated_delta_rule" in DATA["source"]
    assert len(DATA["rows"]) == 13 and all(r["unsaved_at_forward_end"] == 0 for r in DATA["rows"])


@pytest.mark.parametrize("row", [r for r in DATA["rows"] if r["s"] > TORCH_CHUNK],
                         ids=lambda r: f"b{r['b']}s{r['s']}h{r['h']}k{r['k']}v{r['v']}")
def test_what_the_rule_keeps_is_its_saved_tensors_to_the_byte(row):
    """Every shape of two chunks or more, padded tail (s = 300) and several sequences and heads included."""
    assert predicted(row)[0] == row["kept"]


def test_transient_and_backward_peak_from_eight_chunks():
    """From 512 tokens (eight chunks) the forward's end and the last chunk's backward are the peaks: to the byte in
    all but two shapes — values a third of the keys' width at eight chunks (the forward's loop peaks 4 KiB above),
    and values wider than keys on two heads (the backward 16 KiB, 0.24 %, below)."""
    long = [r for r in DATA["rows"] if r["s"] >= 8 * TORCH_CHUNK]
    off = [(r["s"], r["k"], r["v"], p - m) for r in long
           for p, m in zip(predicted(r)[1:], (r["forward_transient"], r["backward_peak"]), strict=True) if p != m]
    assert off == [(512, 96, 32, -4096), (1024, 96, 128, 16384)]
    short = [r for r in DATA["rows"] if r["s"] < 8 * TORCH_CHUNK]
    for r in short:  # the loop's own temporaries peak higher on one to four chunks: under it, by at most 47 %
        assert 0.5 * r["forward_transient"] <= predicted(r)[1] <= r["forward_transient"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    path = tmp_path_factory.mktemp("gdn_torch") / "run.toml"
    path.write_text(RUN)
    run = load_run(path, [])
    return run, replace(run, framework=replace(run.framework, deterministic=True))


def test_the_deterministic_layer_keeps_the_torch_graph_instead_of_flas(runs):
    """Per GDN layer: the rule's saved tensors (b = 2 sequences × 4 value heads of 512 tokens) and the convolution's
    whole padded output [b·(s + 3), (2K + V)/tp] replace what fla's kernel keeps — q and k at the value heads, v,
    the cumulative g, A and the sigmoid beta; the attention layer is the same."""
    fla, det = (template_of(r, 0) for r in runs)
    t, nv = B * S, NV // TP
    kept, _, _ = torch_chunk_elements(S, KD, VD)
    torch_rule = B * nv * kept * 4 + MASKS
    preact = B * (S + CONV - 1) * (2 * NK * KD + NV * VD) // TP * 2
    fla_only = 2 * 2 * t * nv * KD + 2 * t * nv * VD + 4 * t * nv + 2 * t * nv * 64 + 2 * t * nv
    assert det.layer_activation_bytes[0] - fla.layer_activation_bytes[0] == torch_rule + preact - fla_only
    assert det.layer_activation_bytes[3] == fla.layer_activation_bytes[3]
    names = {st.tensor.name for st in det.saved if st.layer == 0}
    assert {"layers.0.linear_attn.torch_chunk.kept", "layers.0.linear_attn.conv.preact"} <= names
    assert not names & {"layers.0.linear_attn.chunk.A", "layers.0.linear_attn.query"}


def test_the_backward_peaks_in_the_rules_first_chunk_before_any_input_gradient(runs):
    """The unit allocates the five input gradients (bf16 q, k, v and beta, fp32 g) beside a scratch that brings it
    to the measured peak; the forward holds the rule's transient while it runs; l2norm is the autotuned kernel."""
    from timeline.result.build import build_timeline

    tl = build_timeline(runs[1])
    ev = tl.events(0)
    sizes = {}
    for t, s, z in zip(ev.tensor, ev.sign, ev.size, strict=True):
        if s > 0:
            sizes.setdefault(tl.names[t], int(z))
    t, nv = B * S, NV // TP
    _, work, back = torch_chunk_elements(S, KD, VD)
    grads = 2 * (2 * t * nv * KD + t * nv * VD + t * nv) + 4 * t * nv
    p = "layers.0.linear_attn.torch_chunk_gated_delta_rule"
    assert sizes[f"{p}.backward_scratch.backward"] == B * nv * back * 4 - grads
    assert sizes["layers.0.linear_attn.torch_chunk.work"] == B * nv * work * 4
    flush = [tl.names[o] for t_, s, o in zip(ev.tensor, ev.sign, ev.op, strict=True)
             if tl.names[t_] == "autotune.gdn.forward.flush" and s > 0]
    assert flush == ["layers.0.linear_attn.l2norm"]
    assert math.ceil(S / TORCH_CHUNK) == 8


def test_from_megatron_deterministic_mode_runs_the_torch_path():
    """--deterministic-mode (config.deterministic_mode) selects the torch path; NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 alone
    asks TE for deterministic kernels but leaves the gated delta net on fla (deterministic_mode false)."""
    gdn = BASE | {"--experimental-attention-variant": "gated_delta_net", "--linear-attention-freq": 2}
    conv = convert(from_mapping(gdn | {"--deterministic-mode": True}), world_size=2)
    fw = conv.sections["framework"]
    assert fw["deterministic"] is True and fw.get("deterministic_mode") is None
    # 2 × 512 tokens, 32 value heads of 128 (TransformerConfig's defaults) at TP 1: 8 chunks per sequence
    assert any(n.endswith("409 MiB kept per layer and micro-batch on a rank where fla's kernels keep 28 MiB")
               for n in conv.notes)
    fw = convert(from_mapping(gdn, {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}), world_size=2).sections["framework"]
    assert fw["deterministic"] is True and fw["deterministic_mode"] is False


def test_deterministic_mode_false_keeps_fla(runs):
    fla, det = runs
    env_only = replace(det, framework=replace(det.framework, deterministic_mode=False))
    assert template_of(env_only, 0).layer_activation_bytes == template_of(fla, 0).layer_activation_bytes
