"""TE FlashAttention's backward (flash-attn 2 ``mha_bwd``, the CP ring's ``AttnFuncWithCPAndKVP2P.backward``):
the workspaces it allocates beside dq, dk, dv, in exact bytes from the shapes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers_run import TINY_MODEL, tiny_run
from sources import template_of

from timeline.graph.families.flash_bwd import head_dim_rounded, nsplits
from timeline.graph.ops import Op
from timeline.result.build import build_timeline
from timeline.spec.hardware import GPUS, SM_COUNTS

TP, B = 2, 2
HEADS = TINY_MODEL.num_attention_heads // TP  # 4 local query heads
D = TINY_MODEL.attn_head_dim  # 32
CORE = "layers.1.self_attn.core_attn"


def _unit(seq_len: int = 200, cp: int = 1, kv_heads: int = 8, backend: str = "flash", gpu: str = "h100",
          deterministic: bool = False) -> Op:
    run = tiny_run(pp=1, layers=2, tp=TP, cp=cp, micro_batch_size=B, seq_len=seq_len, attention_backend=backend,
                   deterministic=deterministic, gpu=gpu, model=replace(TINY_MODEL, num_key_value_heads=kv_heads))
    (u,) = [o for o in template_of(run, 0).backward_i if o.name == CORE]
    return u


def _scratch(u: Op) -> dict[str, tuple[tuple[int, ...], str, int]]:
    pre = f"{CORE}.backward_scratch."
    return {a.name[len(pre):]: (a.shape, a.dtype, a.size_bytes) for a in u.allocs if a.name.startswith(pre)}


def test_the_rounding_rules():
    """mha_bwd: head_size_rounded = d rounded up to 32 for d ≤ 192, else 256; nsplits = ceil(SMs / (b·h))."""
    assert [head_dim_rounded(d) for d in (32, 64, 80, 128, 160, 192, 256)] == [32, 64, 96, 128, 160, 192, 256]
    assert nsplits(132, 2, 4) == 17 and nsplits(108, 2, 4) == 14 and nsplits(132, 4, 64) == 1
    assert SM_COUNTS == {"h100": 132, "h800": 132, "h200": 132, "a100": 108, "gb200": 148, "b200": 148,
                         "a100-40gb": 108, "l40s": 142, "a6000": 84, "rtx3090": 82, "rtx4090": 128,
                         "rtx-pro-6000": 188, "rtx5090": 170, "a800": 108, "a40": 84, "a30": 56, "a10": 72, "l4": 58,
                         "rtx-a4000": 48, "rtx-a5000": 64, "rtx4080": 76, "rtx4070ti-super": 66, "rtx5080": 84,
                         "t4": 40, "rtx-pro-4500": 82}
    assert set(SM_COUNTS) == set(GPUS)  # every GPU kind has its count


def test_non_deterministic_backward_allocates_softmax_d_and_the_fp32_dq_accumulator():
    """After dq, dk, dv (empty_like the bshd q, k, v): softmax_d fp32 [b, h, s_q rounded to 128] and
    dq_accum fp32 [b, s_q_rounded, h, d_rounded]; all freed when the backward returns."""
    s = 200  # rounds to 256
    u = _unit(seq_len=s)
    rows = B * s
    grads = [a for a in u.allocs if a.name.startswith("grad:")]
    assert [a.size_bytes for a in grads] == [rows * HEADS * D * 2] * 3
    assert _scratch(u) == {"softmax_d": ((B, HEADS, 256), "fp32", 4 * B * HEADS * 256),
                           "dq_accum": ((B, 256, HEADS, 32), "fp32", 4 * B * 256 * HEADS * 32)}
    assert list(u.allocs[:3]) == grads  # dq, dk, dv first, then mha_bwd's workspaces
    assert {a.storage for a in u.allocs if "backward_scratch" in a.name} <= set(u.frees)


@pytest.mark.parametrize(("gpu", "splits"), [("h100", 17), ("a100", 14), ("b200", 19)])
def test_deterministic_backward_splits_the_accumulator_over_the_sms(gpu, splits):
    """deterministic: dq_accum = zeros([nsplits, b, s_q_rounded, h, d_rounded]), nsplits = ceil(SMs / (b·h))."""
    shape, dtype, size = _scratch(_unit(seq_len=128, gpu=gpu, deterministic=True))["dq_accum"]
    assert shape == (splits, B, 128, HEADS, 32) and dtype == "fp32"
    assert size == splits * 4 * B * 128 * HEADS * 32


def test_gqa_expands_dk_and_dv_to_every_query_head():
    """Fewer K/V heads than query heads: dk_expanded, dv_expanded [b, s_k, h, d] in q's dtype, beside the
    kv-width dk, dv."""
    s = 128
    u = _unit(seq_len=s, kv_heads=2)  # 1 local kv head, 4 query heads
    sc = _scratch(u)
    assert sc["dk_expanded"] == sc["dv_expanded"] == ((B, s, HEADS, D), "bf16", B * s * HEADS * D * 2)
    grads = [a.size_bytes for a in u.allocs if a.name.startswith("grad:")]
    assert grads == [B * s * HEADS * D * 2, B * s * 1 * D * 2, B * s * 1 * D * 2]
    assert "dk_expanded" not in _scratch(_unit(seq_len=s))


def test_a_cp_ring_backward_holds_its_buffers_and_the_last_steps_tensors():
    """cp = 2: dq, two p2p buffers [2, *kv.shape] (K/V with their gradient), the last step's dq_ and dkv_
    (all local queries against all local keys) and its mha_bwd workspaces on s/cp queries."""
    s, cp = 256, 2
    u = _unit(seq_len=s, cp=cp, kv_heads=4)  # 2 local kv heads
    rows = B * s // cp  # 256
    q, kv = rows * HEADS * D * 2, rows * 2 * (2 * D) * 2  # bytes of q and of the k+v concatenation
    sc = _scratch(u)
    assert sc["dkv_p2p0"][2] == sc["dkv_p2p1"][2] == 2 * kv
    assert sc["dq_step"][2] == q and sc["dkv_step"][2] == kv
    assert sc["softmax_d"] == ((B, HEADS, 128), "fp32", 4 * B * HEADS * 128)
    assert sc["dq_accum"][2] == 4 * B * 128 * HEADS * 32
    assert sc["dk_expanded"][2] == B * (s // cp) * HEADS * D * 2
    assert [a.size_bytes for a in u.allocs if a.name.startswith("grad:")] == [q]  # dq; dk/dv views of a buffer
    assert list(sc) == ["dkv_p2p0", "dkv_p2p1", "dq_step", "dkv_step", "softmax_d", "dq_accum", "dk_expanded",
                        "dv_expanded"]


def test_fused_attention_allocates_no_flash_workspaces():
    """cuDNN FusedAttention's backward workspaces are not readable from open source: none is modelled."""
    assert _scratch(_unit(backend="fused")) == {}
    assert _scratch(_unit(backend="fused", cp=2, seq_len=256)) == {}


def test_the_simulated_backward_allocates_and_frees_them_within_the_attention_backward():
    """In the simulated timeline each workspace is allocated and freed by the attention's backward op of
    every micro-batch: requested bytes rise by exactly the workspaces there and fall back."""
    run = tiny_run(pp=1, layers=2, tp=TP, micro_batch_size=B, seq_len=128, attention_backend="flash",
                   deterministic=True, gpu="a100", iterations=1)
    tl = build_timeline(run)
    ev, names = tl.events(0), np.array(tl.names)
    acc = np.nonzero(names == f"{CORE}.backward_scratch.dq_accum")[0][0]
    rows = np.nonzero(ev.tensor == acc)[0]
    sizes = 14 * 4 * B * 128 * HEADS * 32  # nsplits = ceil(108 / (2·4)) = 14 on an A100
    assert [int(ev.sign[i]) for i in rows] == [1, -1] * run.training.num_microbatches
    assert {int(ev.size[i]) for i in rows} == {sizes}
    assert {str(names[ev.op[i]]) for i in rows} == {CORE}


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_a_cp_ring_forward_keeps_one_rng_state_per_step(cp):
    """AttnFuncWithCPAndKVP2P.forward saves ``*rng_states`` (TE 2.6 … 2.14 context_parallel.py): each ring
    step's flash-attn forward returns its own [2] int64 philox state, one 512-byte block each."""
    run = tiny_run(pp=1, layers=2, tp=TP, cp=cp, micro_batch_size=B, seq_len=256, attention_backend="flash")
    saved = {st.tensor.name: st.tensor for st in template_of(run, 0).saved if st.layer == 1}
    states = sorted(n for n in saved if n.startswith(f"{CORE}.rng_state"))
    assert states == [f"{CORE}.rng_state"] + [f"{CORE}.rng_state_step{i}" for i in range(1, cp)]
    assert {(saved[n].shape, saved[n].dtype, saved[n].size_bytes) for n in states} == {((2,), "int64", 16)}
    tl = build_timeline(run)
    ev, names = tl.events(0), tl.names
    blocks = {names[t]: int(b) for t, b, s in zip(ev.tensor, tl.memory[0].block_bytes, ev.sign, strict=True)
              if s > 0 and names[t].startswith(f"{CORE}.rng_state_step")}
    assert blocks == {f"{CORE}.rng_state_step{i}": 512 for i in range(1, cp)}
