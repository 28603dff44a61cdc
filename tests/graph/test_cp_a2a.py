"""Context parallelism by all-to-all (``cp_comm_type`` a2a, a2a+p2p; timeline.graph.families.cp_a2a), in
bytes from shapes: the tiny model (hidden 256, 8 heads of 32, bf16, one sequence of 128 tokens). At cp = 2
a rank holds 64 tokens; a2a sends copies of its q, k, v [64, 256], receives [128, 128] (the whole sequence,
4 heads), reorders them (the tensors attention reads and saves) and sends the output back; no K/V ring.
a2a+p2p at cp = 4 over an a2a group of 2 runs the ring over the other 2 ranks on the gathered chunks."""

from __future__ import annotations

from helpers_run import sim_plan, tiny_run

ATTN = "layers.0.self_attn.core_attn"


def _forward(attn: str = ATTN, **kw) -> tuple[dict[str, int], int]:
    """(bytes of each tensor the core attention ``attn`` makes in the forward, activation bytes per micro-batch)."""
    run = tiny_run(pp=1, dp=1, iterations=1, seq_len=128, **kw)
    p = sim_plan(run)
    ph = p.compiled[0][(0, "F")]
    made = {ph.tensor_names[t]: int(size) for t, sign, size in zip(ph.ev_tensor.tolist(), ph.ev_sign.tolist(),
                                                                  ph.ev_size.tolist(), strict=True)
            if sign > 0 and ph.tensor_names[t].startswith(attn)}
    return made, p.templates[0][0].activation_bytes


def test_a2a_exchanges_q_k_v_and_the_output_and_keeps_no_ring():
    made, act = _forward(cp=2, cp_comm_type=("a2a",))
    local = 64 * 256 * 2  # [64 tokens, 8 heads · 32] bf16 = [128 tokens, 4 heads · 32] after the exchange
    for stage in ("send", "reorder"):
        assert all(made[f"{ATTN}.cp_a2a.{stage}.{x}"] == local for x in "qkv"), stage
    assert all(made[f"{ATTN}.cp_a2a.recv_{x}"] == local for x in "qkv")
    assert made[f"{ATTN}.out"] == local and made[f"{ATTN}.cp_a2a_out.contiguous.y"] == local
    # the softmax statistics of 4 heads over the whole 128 tokens: [1, 4, 128] fp32
    assert made[f"{ATTN}.softmax_lse"] == 4 * 128 * 4
    assert not any("kv_ring" in n or "kv_p2p" in n or "rng_state_step" in n for n in made)
    p2p, p2p_act = _forward(cp=2)
    assert p2p[f"{ATTN}.kv_ring"] == 2 * 64 * 512 * 2 and p2p[f"{ATTN}.softmax_lse"] == 8 * 64 * 4
    # the p2p ring saves the K/V chunk it ends on ([64, k+v] bf16) and a second rng_state; a2a saves k and v
    # at their exchanged shapes, the same bytes as the local k, which the p2p rule saves too (fused backend)
    assert p2p_act - act == 64 * 512 * 2 - local + 16


def test_a2a_p2p_runs_the_ring_over_the_rest_of_the_group_on_the_gathered_chunks():
    made, _ = _forward(cp=4, cp_comm_type=("a2a+p2p",), cp_a2a_size=2)
    local = 32 * 256 * 2  # 32 tokens per rank
    assert made[f"{ATTN}.cp_a2a.recv_q"] == local  # [64, 128]: 64 tokens of 4 heads
    # the ring over 2 ranks: two chunks of [64, k + v = 256] in flight; one extra ring step's rng_state
    assert made[f"{ATTN}.kv_ring"] == 2 * 64 * 256 * 2 and made[f"{ATTN}.kv_p2p"] == 64 * 256 * 2
    assert {n for n in made if "rng_state_step" in n} == {f"{ATTN}.rng_state_step1"}


def test_one_type_per_layer():
    """Megatron's cp_comm_type list: layer i's attention runs the i-th type."""
    first, _ = _forward(cp=2, layers=2, cp_comm_type=("p2p", "a2a"))
    second, _ = _forward("layers.1.self_attn.core_attn", cp=2, layers=2, cp_comm_type=("p2p", "a2a"))
    assert f"{ATTN}.kv_ring" in first and not any("cp_a2a" in n for n in first)
    assert "layers.1.self_attn.core_attn.cp_a2a.recv_q" in second and not any("kv_ring" in n for n in second)
