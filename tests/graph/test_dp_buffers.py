"""Megatron's param/grad buffer layout (timeline.graph.dp_buffers), in exact elements from shapes:
reverse order, 64-element parameter starts and lcm(dp, 128) bucket ends under the distributed
optimizer, buckets of ``bucket_size``, a bucket of its own for a shared embedding, the even
per-bucket shard split, and no padding without the distributed optimizer."""

from __future__ import annotations

from dataclasses import replace

from timeline.graph.dp_buffers import DdpRules, ddp_buffers, ddp_rules, layout, shared_embeddings
from timeline.graph.tensors import param
from timeline.spec.framework import FrameworkSpec
from timeline.spec.run import ParallelSpec, TrainingSpec

# named_parameters() order; laid out in reverse: c (100), b (70), a (1000)
A = param("a.weight", (10, 100), module="mlp", dtype="bf16")
B = param("b.bias", (70,), module="mlp", dtype="bf16")
C = param("c.weight", (100,), module="norm", dtype="bf16")
DIST = DdpRules(distributed_optimizer=True, bucket_size=None)


def test_distributed_optimizer_pads_starts_to_64_and_the_bucket_end_to_lcm_dp_128():
    numel, slots = layout([A, B, C], rules=DIST, group=3, bucket_size=None)
    # c at 0..100; b starts at 128 (next multiple of 64) .. 198; a at 256 .. 1256; end → lcm(3, 128) = 384
    assert [(s.name, s.start, s.end) for s in slots] == [("c.weight", 0, 100), ("b.bias", 128, 198),
                                                           ("a.weight", 256, 1256)]
    assert numel == 1536
    # each of the 3 ranks owns 512 elements: rank 0 all of c and b and a's first 256; the last rank a's last 232
    assert [s.shard_numel for s in slots] == [100, 70, 256]
    _, last = layout([A, B, C], rules=DIST, group=3, bucket_size=None, rank=2)
    assert [s.shard_numel for s in last] == [0, 0, 1256 - 1024]


def test_without_the_distributed_optimizer_nothing_is_padded_or_sharded():
    numel, slots = layout([A, B, C], rules=DdpRules(distributed_optimizer=False, bucket_size=None), group=8,
                          bucket_size=None)
    assert numel == 1170 and [(s.start, s.end) for s in slots] == [(0, 100), (100, 170), (170, 1170)]
    assert all(s.shard_numel == 0 for s in slots)


def test_buckets_close_at_bucket_size_and_each_is_padded_and_split_on_its_own():
    # bucket_size 150: c (0..100) stays open, b (128..198) closes bucket 0 at 198 → 256 (lcm(2, 128) = 128);
    # a starts bucket 1 at 256 and closes it at 1256 → 1280
    numel, slots = layout([A, B, C], rules=DIST, group=2, bucket_size=150)
    assert [(s.start, s.end, s.bucket) for s in slots] == [(0, 100, 0), (128, 198, 0), (256, 1256, 1)]
    assert numel == 1280
    # rank 0 owns [0, 128) of bucket 0 and [256, 768) of bucket 1
    assert [s.shard_numel for s in slots] == [100, 0, 512]


def test_a_shared_embedding_gets_a_bucket_of_its_own():
    numel, slots = layout([A, B, C], rules=DIST, group=2, bucket_size=None, shared=frozenset({"a.weight"}))
    # bucket 0 (c, b) closes before a at 198 → 256; a fills bucket 1, 256..1256 → 1280
    assert [(s.start, s.bucket) for s in slots] == [(0, 0), (128, 0), (256, 1)] and numel == 1280
    # without the distributed optimizer the mark changes nothing
    plain = DdpRules(distributed_optimizer=False, bucket_size=None)
    assert layout([A, B, C], rules=plain, group=2, bucket_size=None, shared=frozenset({"a.weight"}))[0] == 1170


def test_shared_embeddings_only_across_pipeline_chunks_with_tied_weights():
    emb = param("embedding.word_embeddings.weight", (128, 4), module="embedding", dtype="bf16")
    head = param("output_layer.weight", (128, 4), module="head", dtype="bf16")
    chunks = [(0, [emb, A]), (1, [B, head])]
    assert shared_embeddings(chunks, 2, True) == {"embedding.word_embeddings.weight", "output_layer.weight"}
    assert shared_embeddings(chunks, 2, False) == frozenset() and shared_embeddings([(0, [emb])], 1, True) == set()


def test_one_buffer_per_chunk_dense_then_expert_with_bucketing_on_the_first_chunk_only():
    expert = param("layers.0.mlp.experts.fc1", (4, 64), module="moe", dtype="bf16", expert=True)
    tr = TrainingSpec(zero=1)
    par = ParallelSpec(pp=2, vpp=2, dp=4, ep=2)  # EDP = dp·tp·cp / (ep·etp) = 2
    rules = DdpRules(distributed_optimizer=True, bucket_size=150)
    bufs = ddp_buffers([(0, [A, B, C, expert]), (2, [A, B, C])], rules=rules, tr=tr, par=par, expert_rule="routed",
                       pp_rank=0, num_chunks=4)
    assert [(b.label, b.group) for b in bufs] == [("chunk0", 4), ("chunk0.expert", 2), ("chunk2", 4)]
    assert [1 + max(s.bucket for s in b.slots) for b in bufs] == [2, 1, 1]  # chunk 2: disable_bucketing
    assert [b.numel for b in bufs] == [1280, 256, 1280]
    # pipeline ranks after the first keep one bucket
    later = ddp_buffers([(1, [A, B, C])], rules=rules, tr=tr, par=par, expert_rule="routed", pp_rank=1,
                        num_chunks=4)
    assert [(s.start, s.bucket) for s in later[0].slots] == [(0, 0), (128, 0), (256, 0)] and later[0].numel == 1280


def test_bucket_size_follows_megatrons_default_only_with_overlap_grad_reduce():
    tr, par = TrainingSpec(zero=1), ParallelSpec(dp=64, cp=2)
    assert ddp_rules(FrameworkSpec(), tr, par, tied=True).bucket_size is None
    assert ddp_rules(FrameworkSpec(overlap_grad_reduce=True), tr, par, tied=True).bucket_size == 128_000_000
    assert ddp_rules(FrameworkSpec(overlap_grad_reduce=True), tr, ParallelSpec(dp=8), tied=True).bucket_size == \
        40_000_000
    assert ddp_rules(FrameworkSpec(overlap_grad_reduce=True, ddp_bucket_size=1000), tr, par,
                     tied=False).bucket_size == 1000
    busbw = ddp_rules(FrameworkSpec(ddp_pad_for_busbw=True), tr, par, tied=False)
    assert layout([A], rules=busbw, group=3, bucket_size=None)[0] == 3 * 2 ** 16  # lcm(3, 128, 65536)


def test_overlap_param_gather_with_optimizer_step_unbuckets_every_chunk_and_chains_the_first_chunk_first():
    """training.py: get_model disables bucketing for every chunk under the flag; optimizer/__init__.py gives the
    first chunk's dense parameters an optimizer of their own, before the other chunks' and the experts'."""
    fw = FrameworkSpec(overlap_grad_reduce=True, ddp_bucket_size=150, overlap_param_gather_with_optimizer_step=True)
    tr, par = TrainingSpec(zero=1), ParallelSpec(pp=2, vpp=2, dp=4, ep=2)
    rules = ddp_rules(fw, tr, par, tied=False)
    assert rules.bucket_size is None and rules.first_chunk_optimizer
    expert = param("layers.0.mlp.experts.fc1", (4, 64), module="moe", dtype="bf16", expert=True)
    bufs = ddp_buffers([(0, [A, B, C, expert]), (2, [A, B, C])], rules=rules, tr=tr, par=par, expert_rule="routed",
                       pp_rank=0, num_chunks=4)
    # chunk 0 is one bucket now: c 0..100, b 128..198, a 256..1256 → lcm(4, 128) = 128 → 1280
    assert [(b.label, b.optimizer, 1 + max(s.bucket for s in b.slots), b.numel) for b in bufs] == [
        ("chunk0", 0, 1, 1280), ("chunk0.expert", 2, 1, 256), ("chunk2", 1, 1, 1280)]
    plain = ddp_buffers([(0, [A, B, C, expert]), (2, [A, B, C])], rules=replace(rules, first_chunk_optimizer=False,
                                                                               bucket_size=150),
                        tr=tr, par=par, expert_rule="routed", pp_rank=0, num_chunks=4)
    assert [(b.optimizer, 1 + max(s.bucket for s in b.slots)) for b in plain] == [(0, 2), (1, 1), (0, 1)]
