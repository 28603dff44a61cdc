"""torch SDPA as CUDA runs it under the ``hf`` profile (``graph/families/sdpa.py``): the kernel by compute
capability, PyTorch version and dtype, what its autograd node keeps, and its backward's workspaces, to the byte."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers_run import TINY_MODEL, tiny_run
from sources import template_of

B, S, H, D = 2, 128, 8, 32  # tiny_run's Llama: 256 wide, 8 heads of 32


def attention(run):
    """(forward op, backward op) of layer 0's core attention."""
    t = template_of(run, 0)
    name = "layers.0.self_attn.core_attn"
    fwd = next(o for o in t.forward if o.name == name)
    bwd = next(o for o in t.backward if o.name == name)
    return t, fwd, bwd


def scratch(bwd) -> dict[str, int]:
    return {a.name.rsplit(".", 1)[1]: a.size_bytes for a in bwd.allocs if ".backward_scratch." in a.name}


def run_on(sm: int, pytorch: str, *, kv_heads: int = H, dtype: str = "bf16"):
    return tiny_run(profile="hf", pp=1, layers=1, micro_batch_size=B, sm=sm, pytorch=pytorch, dtype=dtype,
                    model=replace(TINY_MODEL, num_key_value_heads=kv_heads))


@pytest.mark.parametrize(("sm", "pytorch"), [(90, "2.11"), (90, "2.13"), (100, "2.11"), (103, "2.12")])
def test_cudnn_on_hopper_and_blackwell_from_2_11(sm, pytorch):
    _, _, bwd = attention(run_on(sm, pytorch))
    # cudnn-frontend's fp32 dQ accumulator [b, h, s, d] and fp32 softmax_sum [b, h, s], one allocation
    assert scratch(bwd) == {"workspace": 4 * B * H * S * D + 4 * B * H * S}


def test_cudnn_with_gqa_adds_dk_dv_at_every_query_head():
    t, _, bwd = attention(run_on(90, "2.11", kv_heads=2))
    assert not any(o.name.endswith("repeat_kv") for o in t.forward)  # k/v stay at kv-head width
    assert scratch(bwd) == {"workspace": 4 * B * H * S * D + 4 * B * H * S + 2 * B * H * S * 2 * D}


@pytest.mark.parametrize(("sm", "pytorch"), [(80, "2.13"), (89, "2.13"), (90, "2.10")])
def test_flash_elsewhere_with_its_accumulators(sm, pytorch):
    _, _, bwd = attention(run_on(sm, pytorch))
    # PyTorch's vendored flash-attention 2 mha_bwd: softmax_d [b, h, s_q rounded to 128] and
    # dq_accum [b, s_q rounded, h, d rounded to 32], both fp32
    assert scratch(bwd) == {"softmax_d": 4 * B * H * S, "dq_accum": 4 * B * S * H * D}


def test_flash_gqa_expands_dk_dv():
    _, _, bwd = attention(run_on(80, "2.13", kv_heads=2))
    assert scratch(bwd)["dk_expanded"] == scratch(bwd)["dv_expanded"] == 2 * B * S * H * D


def test_fp32_runs_the_efficient_kernel_without_workspaces():
    _, fwd, bwd = attention(run_on(90, "2.13", dtype="fp32"))
    assert scratch(bwd) == {}
    lse = next(t for t in fwd.allocs if t.name.endswith("softmax_lse"))
    assert lse.shape == (B, H, -(-S // 32) * 32)


def test_what_each_kernel_keeps():
    """cuDNN keeps a philox seed and offset (8 B each), flash its rng_state (16 B) and an unused scalar (8 B);
    the log-sum-exp is fp32 [b, h, s] in both (the H200 snapshots' per-layer bytes, to the byte)."""
    def kept(run):
        t, fwd, _ = attention(run)
        names = {a.storage for a in fwd.allocs}
        return sorted((st.tensor.name.rsplit(".", 1)[1], st.tensor.size_bytes) for st in t.saved
                      if st.tensor.storage in names)

    assert kept(run_on(90, "2.11")) == [("out", B * S * H * D * 2), ("philox_offset", 8), ("philox_seed", 8),
                                        ("softmax_lse", 4 * B * H * S)]
    assert kept(run_on(80, "2.11")) == [("out", B * S * H * D * 2), ("rng_state", 16), ("rng_unused", 8),
                                        ("softmax_lse", 4 * B * H * S)]
