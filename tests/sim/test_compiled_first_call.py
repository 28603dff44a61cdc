"""The first call of Megatron's compiled cross-entropy steps on PyTorch 2.2 … 2.5 (``profiles/megatron_autotune.py``):
Inductor benchmarks each multi-configuration kernel on clones of the arguments it writes, inside Triton's
``do_bench`` and its 256e6-byte flush buffer, once per process."""

from __future__ import annotations

import numpy as np
import pytest
from helpers_run import collected_record, tiny_run, validate_measured

from timeline.profiles.megatron_autotune import FLUSH_BYTES, first_call
from timeline.result.build import build_timeline
from timeline.spec.framework import FrameworkSpec

SOFTMAX = 128 * 1024 * 4  # fp32 [rows, V]: seq 128 × micro-batch 1, the tiny model's vocabulary, tp = 1


@pytest.mark.parametrize(("pytorch", "forward"), [("2.1", None), ("2.2", 3), ("2.3", 2), ("2.4.1", 2), ("2.5", 2),
                                                  ("2.6", None), ("2.13", None)])
def test_the_copies_follow_the_pytorch_version(pytorch, forward):
    rules = [r for r in first_call(FrameworkSpec(cross_entropy_fusion="native", pytorch=pytorch)) if r.tag != "gdn"]
    if forward is None:
        assert rules == []
    else:
        assert [(r.forward_copies, r.backward_copies, r.flush_bytes) for r in rules] == [(forward, 1, 256_000_000)]


def test_only_the_native_loss_without_deterministic_algorithms_is_autotuned():
    def loss_rules(fw: FrameworkSpec) -> list:
        return [r for r in first_call(fw) if r.tag != "gdn"]

    for fusion in ("none", "te"):
        assert loss_rules(FrameworkSpec(cross_entropy_fusion=fusion, pytorch="2.2")) == []
    assert loss_rules(FrameworkSpec(cross_entropy_fusion="native", pytorch="2.2", deterministic=True)) == []


@pytest.mark.parametrize(("pytorch", "flush"), [("2.5", 256_000_000), ("2.6", 256 * 2**20), ("2.10", 256 * 2**20)])
def test_gated_delta_net_kernels_flush_triton_s_buffer(pytorch, flush):
    """fla's autotuned kernels: one flush buffer at the first forward's and the first backward's GDN op, the
    buffer Triton's do_bench holds (256e6 bytes before Triton 3.2, PyTorch 2.6's pin; 256 MiB from it)."""
    (gdn,) = [r for r in first_call(FrameworkSpec(pytorch=pytorch)) if r.tag == "gdn"]
    assert (gdn.flush_bytes, gdn.forward_copies, gdn.backward_copies, gdn.backward_same_op) == (flush, 0, 0, False)


def _autotune(pytorch: str, **overrides):
    """(name, sign, bytes, microbatch, iteration, requested after the event) of every autotune event of the
    last device, and its requested bytes just before the first of them."""
    tl = build_timeline(tiny_run(cross_entropy_fusion="native", pytorch=pytorch, iterations=2, **overrides))
    d = max(range(tl.num_devices), key=lambda i: tl.devices[i].pp_rank)
    ev = tl.events(d)
    requested = np.cumsum(ev.sign.astype(np.int64) * ev.size)
    rows = [(tl.names[t], int(s), int(z), int(m), int(i), int(r)) for k, (t, s, z, m, i, r) in enumerate(
        zip(ev.tensor, ev.sign, ev.size, ev.microbatch, ev.iteration, requested, strict=True))
        if tl.names[t].startswith("autotune.")]
    first = next(k for k, t in enumerate(ev.tensor) if tl.names[t].startswith("autotune."))
    return rows, int(requested[first - 1])


def test_pytorch_2_2_holds_three_softmax_copies_and_the_flush_buffer_once_in_the_first_forward():
    rows, before = _autotune("2.2")
    forward = [r for r in rows if r[0].startswith("autotune.forward.")]
    backward = [r for r in rows if r[0].startswith("autotune.backward.")]
    made = [(r[0], r[2]) for r in forward if r[1] > 0]
    assert made == [("autotune.forward.flush", FLUSH_BYTES)] + [
        (f"autotune.forward.copy{j}.exp_logits", SOFTMAX) for j in range(3)]
    assert sorted((n, z) for n, s, z, *_ in forward if s < 0) == sorted(made)  # all freed again
    assert {(r[3], r[4]) for r in forward + backward} == {(0, 0)}  # the first micro-batch of the first iteration
    # at the top of the set: everything the loss op holds, the flush buffer and three softmax-sized copies
    assert max(r[5] for r in forward) - before == FLUSH_BYTES + 3 * SOFTMAX
    assert [(r[0], r[2]) for r in backward if r[1] > 0] == [("autotune.backward.flush", FLUSH_BYTES),
                                                              ("autotune.backward.copy0.exp_logits", SOFTMAX)]


def test_pytorch_2_5_writes_the_division_in_place_and_2_13_copies_to_the_host():
    rows, _ = _autotune("2.5")
    assert sum(1 for r in rows if r[1] > 0 and r[0].startswith("autotune.forward.copy")) == 2
    tl = build_timeline(tiny_run(cross_entropy_fusion="native", pytorch="2.13", iterations=1))
    assert not any(n.startswith("autotune.") for n in tl.names)


@pytest.mark.parametrize(("commit", "golden"), [("93aa335b95", "lts_dgx_a100"), ("46fdcd5b7e", "dev")])
def test_megatron_s_fused_loss_test_on_the_old_images_simulates_within_a_tenth_of_a_percent(commit, golden):
    """``gpt3_mr_mcore_te_tp2_pp2_cross_entropy_loss_fusion_dgx_a100_1N8G`` recorded in NGC PyTorch 24.01 (torch 2.2)
    and 24.10 (torch 2.5): 2,658,189,824 and 2,245,028,864 bytes (golden values of Megatron-LM at those commits),
    −33.7 % and −21.5 % before the first call was modelled."""
    rec = collected_record("gpt3_mr_mcore_te_tp2_pp2_cross_entropy_loss_fusion_dgx_a100_1N8G", f"{commit}:{golden}")
    alloc = validate_measured().predict(rec)[0]
    assert abs(alloc / int(rec["measured"]["max_allocated_bytes_first_iter"]) - 1) < 0.001


BERT = """[model]
preset = "megatron-gpt"
architecture = "bert"
binary_head = true
type_vocab_size = 2
num_layers = 2
hidden_size = 256
num_attention_heads = 4
intermediate_size = 1024
vocab_size = 1024
max_position_embeddings = 128
[training]
micro_batch_size = 1
seq_len = 128
num_microbatches = 2
[framework]
attention_backend = "unfused"
cross_entropy_fusion = "native"
pytorch = "2.2"
"""


def test_bert_s_backward_copies_come_at_its_language_model_loss_not_the_binary_head_s(tmp_path):
    """The binary head's loss (``binary_head.loss``) runs its backward first; the compiled steps are the
    vocab-parallel loss's (``output.loss``)."""
    from helpers_run import edited_run

    tl = build_timeline(edited_run(tmp_path, BERT))
    ev = tl.events(0)
    ops = {tl.names[t]: tl.names[o] for t, o in zip(ev.tensor, ev.op, strict=True) if tl.names[t].startswith("autotune.")}
    assert ops == {f"autotune.{p}.{n}": "output.loss" for p, n in (
        ("forward", "flush"), ("forward", "copy0.exp_logits"), ("forward", "copy1.exp_logits"),
        ("forward", "copy2.exp_logits"), ("backward", "flush"), ("backward", "copy0.exp_logits"))}
    loss_bwd = min(t for t, name, s in zip(ev.t_us, (tl.names[x] for x in ev.tensor), ev.sign, strict=True)
                   if name == "output.loss.backward_scratch.exp_logits" and s > 0)
    assert min(t for t, name in zip(ev.t_us, (tl.names[x] for x in ev.tensor), strict=True)
               if name == "autotune.backward.flush") == loss_bwd
