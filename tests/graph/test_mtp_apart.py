"""MTP on a virtual stage apart from the loss (``parallel.mtp_stage``, Megatron-Core ≥ 0.16): what each
stage holds, receives and sends, at exact bytes, from Megatron-LM 5247a1f460's structure
(``gpt_model.py: GPTModel.__init__ / _postprocess``, ``multi_token_prediction.py:
MultiTokenPredictionBlock.forward``, ``transformer_block.py: has_final_layernorm_in_this_stage``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers_run import TINY_MODEL, tiny_run
from sources import forward_ops_of, source_of, template_of

from timeline.api import simulate
from timeline.graph.analytic import ops_signature
from timeline.profiles import LIMITS
from timeline.spec.validate import validate_run

H, TP, S = 256, 2, 128
T_SP = S // TP  # b = 1, sequence-parallel rows between TP regions
VOCAB = 1024 // TP  # 1,024 is a multiple of 128·tp: no padding


def run(mtp_layers: int = 1, mtp_stage: int | None = 2, layout: tuple[int, ...] = (2, 2, 0, 0), **kw):
    model = replace(TINY_MODEL, num_hidden_layers=sum(layout), mtp_layers=mtp_layers)
    return tiny_run(model=model, pp=4, tp=TP, sp=True, layout=layout, mtp_stage=mtp_stage,
                    megatron_core="0.16.0", **kw)


def names(r, chunk: int) -> list[str]:
    return [n.name for n in source_of(r).nodes(chunk)]


def ops(r, chunk: int) -> dict:
    return {o.name: o for o in forward_ops_of(r, chunk)}


def test_each_stage_holds_its_part():
    r = run()
    assert names(r, 1)[-1] == "final_norm"  # the stage of the last decoder layer normalises
    assert names(r, 2) == ["mtp.embedding", "mtp.0"]  # its own embedding (mtp_process), no output layer
    assert names(r, 3) == ["output_layer"]  # the loss stage: the head alone, no norm
    default = run(mtp_stage=None)
    assert names(default, 2) == [] and names(default, 3) == ["final_norm", "output_layer", "mtp.embedding", "mtp.0"]
    # the same parameters in all, only placed elsewhere
    held = {t.name for c in range(4) for n in source_of(r).nodes(c) for t in n.params}
    assert held == {t.name for c in range(4) for n in source_of(default).nodes(c) for t in n.params}


@pytest.mark.parametrize("depth", [1, 2])
def test_the_stages_pass_the_concatenated_hidden_states(depth):
    r = run(mtp_layers=depth)
    one = ops(r, 1)
    assert one["send_forward"].inputs["x"].name == "final_norm.out"
    two = ops(r, 2)
    assert two["recv_forward"].outputs["y"].shape == (T_SP, H)
    cat = two["mtp.concat_hidden"]
    assert [t.name for t in cat.inputs.values()] == ["input"] + [f"mtp.{k}.shared_head.norm.out" for k in range(depth)]
    assert two["send_forward"].inputs["x"].shape == ((1 + depth) * T_SP, H)
    assert ops(r, 3)["recv_forward"].outputs["y"].shape == ((1 + depth) * T_SP, H)
    assert "mtp.0.output_layer" not in two and "output.loss" not in two  # every loss is on the loss stage
    if depth == 2:  # each module runs on the previous one's normalised output
        assert two["mtp.1.hnorm"].inputs["x"].name == "mtp.0.shared_head.norm.out"
        assert two["mtp.0.hnorm"].inputs["x"].name == "input"


@pytest.mark.parametrize("depth", [1, 2])
def test_loss_stage_keeps_the_received_tensor_and_every_heads_loss(depth):
    """Views of the received tensor feed each output layer (saved whole); each vocab-parallel cross entropy
    keeps its fp32 exp_logits [s, v/tp], target mask (bool) and masked target (int64)."""
    saved = template_of(run(mtp_layers=depth), 3).saved
    per_head = S * VOCAB * 4 + S + S * 8
    assert sum(st.tensor.size_bytes for st in saved) == (1 + depth) * T_SP * H * 2 + (1 + depth) * per_head
    assert {st.tensor.name for st in saved if st.tensor.name == "input"} == {"input"}
    ops3 = ops(run(mtp_layers=depth), 3)
    order = [n for n in ops3 if n.endswith(".output_layer")]
    assert order == [f"mtp.{k}.output_layer" for k in range(depth)] + ["output.output_layer"]
    assert all(ops3[n].inputs["_save"].storage == "input" for n in order)


def test_the_mtp_stage_receives_one_gradient_of_the_whole_concatenation():
    t = template_of(run(mtp_layers=2), 2)
    grads = [a for op in t.backward for a in op.allocs if a.name == "grad:mtp.hidden_states"]
    assert [g.shape for g in grads] == [(3 * T_SP, H)]
    loss = template_of(run(mtp_layers=2), 3)
    sent = [a for op in loss.backward for a in op.allocs if a.name == "grad:input"]
    assert [g.shape for g in sent] == [(3 * T_SP, H)]


def test_mtp_with_a_decoder_layer_on_its_stage_normalises_first():
    r = run(layout=(1, 1, 2, 0))
    two = ops(r, 2)
    assert names(r, 2)[-3:] == ["final_norm", "mtp.embedding", "mtp.0"]
    assert two["mtp.0.hnorm"].inputs["x"].name == "final_norm.out"
    assert two["mtp.concat_hidden"].inputs["h0"].name == "final_norm.out"


def test_the_last_stage_named_explicitly_is_the_default():
    a, b = run(mtp_stage=3, layout=(1, 1, 1, 1)), run(mtp_stage=None, layout=(1, 1, 1, 1))
    for c in range(4):
        assert ops_signature(source_of(a), c) == ops_signature(source_of(b), c)


def test_an_interleaved_simulation_moves_the_mtp_memory_to_its_rank():
    """Stage 6 is pp rank 2's second chunk: the MTP module's weights, states and activations leave the loss's
    rank 3 for rank 2."""
    kw = {"layout": (1, 1, 1, 1, 1, 1, 0, 0), "schedule": "interleaved", "vpp": 2}
    apart, default = run(mtp_stage=6, **kw), run(mtp_stage=None, **kw)
    assert validate_run(apart, LIMITS) == []
    a, d = simulate(apart), simulate(default)
    assert a.peak(2).allocated_bytes > d.peak(2).allocated_bytes
    assert a.peak(3).allocated_bytes < d.peak(3).allocated_bytes
    assert a.peak(0).allocated_bytes == d.peak(0).allocated_bytes
