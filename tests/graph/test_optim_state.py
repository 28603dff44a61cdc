"""Each optimizer's per-parameter state (timeline.graph.optim_state) in exact bytes from shapes: Adam's two
moments (each its own dtype under the precision-aware optimizer), SGD's momentum buffer or none, Muon's
momentum for 2-D hidden matrices with Adam for the embeddings, norms and biases, and the layer-wise
optimizer's ping-pong deal of whole parameters by size."""

from __future__ import annotations

from dataclasses import replace

from timeline.graph.dp_buffers import DdpRules, ddp_buffers
from timeline.graph.layer_wise_buffers import layer_wise_buffers
from timeline.graph.megatron_param import muon_managed
from timeline.graph.optim_state import main_params, ping_pong_owned
from timeline.graph.tensors import param
from timeline.spec.run import ParallelSpec, TrainingSpec

# a 1-layer model in named_parameters() order: word embeddings 100×16, a norm, fused q/k/v, a bias, the router,
# one expert's fc1 and the output layer
TENSORS = [param("embedding.word_embeddings.weight", (100, 16), module="embedding", dtype="bf16"),
           param("layers.0.input_layernorm.weight", (16,), module="norm", dtype="bf16"),
           param("layers.0.self_attn.q_proj.weight", (16, 16), module="attention", dtype="bf16"),
           param("layers.0.self_attn.k_proj.weight", (8, 16), module="attention", dtype="bf16"),
           param("layers.0.self_attn.v_proj.weight", (8, 16), module="attention", dtype="bf16"),
           param("layers.0.self_attn.o_proj.bias", (16,), module="attention", dtype="bf16"),
           param("layers.0.mlp.gate.weight", (4, 16), module="moe", dtype="bf16"),
           param("output_layer.weight", (100, 16), module="head", dtype="bf16")]
PLAIN = DdpRules(distributed_optimizer=False, bucket_size=None)


def states(tr: TrainingSpec, tensors=TENSORS, par: ParallelSpec | None = None) -> dict[str, tuple]:
    bufs = ddp_buffers([(0, tensors)], rules=PLAIN, tr=tr, par=par or ParallelSpec(), expert_rule="routed", pp_rank=0, num_chunks=1)
    return {n: (k, st) for n, k, st in main_params(tensors, bufs, tr, "routed")}


def total_state_bytes(tr: TrainingSpec, **kw) -> int:
    return sum(k * sum(b for _, b in st) for k, st in states(tr, **kw).values())


def test_adam_keeps_two_moments_each_of_its_dtype():
    adam = TrainingSpec()
    s = states(adam)
    # q/k/v are one Megatron parameter (linear_qkv, 32 × 16 = 512 elements)
    assert s["layers.0.self_attn.linear_qkv.weight"] == (512, (("exp_avg", 4), ("exp_avg_sq", 4)))
    params = 1600 + 16 + 512 + 16 + 64 + 1600
    assert total_state_bytes(adam) == params * 8
    # --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype fp16 (TE FusedAdam's dtypes)
    assert total_state_bytes(replace(adam, moment_dtype="bf16", exp_avg_sq_dtype="fp16")) == params * 4


def test_sgd_keeps_a_momentum_buffer_unless_momentum_is_zero():
    sgd = TrainingSpec(optimizer="sgd")
    assert states(sgd)["output_layer.weight"] == (1600, (("momentum_buffer", 4),))
    assert total_state_bytes(sgd) == 3808 * 4
    assert total_state_bytes(replace(sgd, sgd_momentum=0.0)) == 0


def test_muon_steps_the_hidden_matrices_and_adam_the_rest():
    assert muon_managed("layers.0.mlp.gate.weight", (4, 16))
    assert muon_managed("embedding.position_embeddings.weight", (1024, 16))  # not flagged by language_module.py
    assert not muon_managed("embedding.word_embeddings.weight", (100, 16))
    assert not muon_managed("output_layer.weight", (100, 16))
    assert not muon_managed("layers.0.input_layernorm.weight", (16,))
    muon = TrainingSpec(optimizer="muon")
    s = states(muon)
    assert s["layers.0.self_attn.linear_qkv.weight"] == (512, (("momentum_buffer", 4),))
    assert s["layers.0.mlp.gate.weight"] == (64, (("momentum_buffer", 4),))
    assert s["embedding.word_embeddings.weight"] == (1600, (("exp_avg", 4), ("exp_avg_sq", 4)))
    # Muon's parameters come first in the chain (muon.py: the Muon optimizer, then Adam's chained ones)
    assert list(s)[:2] == ["layers.0.self_attn.linear_qkv.weight", "layers.0.mlp.gate.weight"]
    assert total_state_bytes(muon) == (512 + 64) * 4 + (1600 + 16 + 16 + 1600) * 8


def test_the_layer_wise_deal_is_a_ping_pong_over_parameters_sorted_by_size():
    # layer_wise_optimizer.py's own example: 4 ranks, 10 parameters p0 … p9 already sorted by size
    params = [(f"p{i}", i + 1, False) for i in range(10)]
    dealt = [sorted(ping_pong_owned(params, 4, 1, r, 0), key=lambda n: int(n[1:])) for r in range(4)]
    assert dealt == [["p0", "p7", "p8"], ["p1", "p6", "p9"], ["p2", "p5"], ["p3", "p4"]]
    # expert parameters are dealt over the expert-DP ranks in a loop of their own; a group of one keeps all
    mixed = [("a", 1, True), ("b", 2, False), ("c", 3, True), ("d", 4, False)]
    assert ping_pong_owned(mixed, 2, 2, 1, 1) == {"c", "d"}
    assert ping_pong_owned(mixed, 1, 1, 0, 0) == {"a", "b", "c", "d"}


def test_the_layer_wise_optimizer_keeps_the_last_rank_s_parameters_only():
    tr = TrainingSpec(optimizer="muon", muon_layer_wise=True)
    s = states(tr, par=ParallelSpec(dp=2))
    # sorted by size: norm 16, bias 16, router 64, qkv 512, word embeddings 1600, output 1600 → loop 0 1 1 0 0 1;
    # kept in chain order: Muon's, then Adam's weight-decay group, then its no-decay one
    assert list(s) == ["layers.0.mlp.gate.weight", "output_layer.weight", "layers.0.self_attn.o_proj.bias"]
    assert total_state_bytes(tr, par=ParallelSpec(dp=2)) == 64 * 4 + (16 + 1600) * 8


def test_the_padded_layer_wise_layout_packs_whole_matrices_into_shards_largest_first():
    from timeline.graph.layer_wise_buffers import layer_wise_layout

    mats = [param(f"m{i}.weight", (n, 64), module="mlp", dtype="bf16") for i, n in enumerate((3, 1, 2, 2))]
    numel, slots = layer_wise_layout(mats, rules=DdpRules(distributed_optimizer=True, bucket_size=None), group=2,
                                     bucket_size=None, rank=1)
    # largest first (m0 192; m2, m3 128 in reverse order: m3 then m2; m1 64) to the least-loaded shard:
    # m0 → 0, m3 → 1, m2 → 1 (at 128), m1 → 0 (at 192); shards padded to lcm(64, lcm(2, 128) / 2) = 64 → 256 each
    assert numel == 512
    at = {s.name: (s.start, s.end, s.shard_numel) for s in slots}
    assert at == {"m0.weight": (0, 192, 0), "m1.weight": (192, 256, 0),
                  "m3.weight": (256, 384, 128), "m2.weight": (384, 512, 128)}


def test_under_the_padded_layout_a_rank_keeps_its_shard_s_matrices_and_adam_s_byte_shards():
    tr = TrainingSpec(optimizer="muon", muon_layer_wise=True, zero=1)
    par = ParallelSpec(dp=2)
    bufs = layer_wise_buffers([(0, TENSORS)], rules=DdpRules(distributed_optimizer=True, bucket_size=None,
                                                             layer_wise="padded"),
                              tr=tr, par=par, expert_rule="routed", pp_rank=0, num_chunks=1)
    # Adam's buffer first (the word embeddings come first), then Muon's (linear_qkv, the router)
    assert [(b.optimizer, b.numel) for b in bufs] == [(1, 3328), (0, 1024)]
    s = {n: (k, st) for n, k, st in main_params(TENSORS, bufs, tr, "routed")}
    # Muon's shards: linear_qkv (512, shard 0), the router (64, shard 1): rank 1 keeps the router whole
    assert s["layers.0.mlp.gate.weight"] == (64, (("momentum_buffer", 4),))
    assert "layers.0.self_attn.q_proj.weight" not in s
    # Adam's byte-level layout (reverse order, 64-aligned starts): output 0…1600, the bias 1600…1616, the norm
    # 1664…1680, the word embeddings 1728…3328; rank 1's half [1664, 3328) holds the norm and the word embeddings
    assert {n: k for n, (k, _) in s.items() if n != "layers.0.mlp.gate.weight"} == {
        "embedding.word_embeddings.weight": 1600, "layers.0.input_layernorm.weight": 16}
