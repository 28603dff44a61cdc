"""Run-level validation (``spec/validate.py``): every cross-section rule reports its key path and
a message that says what would be valid; a valid run reports nothing; ``suggest_layout``."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers_run import TINY_MODEL, tiny_run

from timeline.profiles import LIMITS
from timeline.spec.presets import PRESETS
from timeline.spec.run import RecomputeSpec
from timeline.spec.validate import suggest_layout, validate_run

#: a small DeepSeek-style MoE (MLA, 16 routed experts, one dense layer first)
MOE = replace(PRESETS["deepseek-v3"], name="tiny-moe", hidden_size=64, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=8, intermediate_size=128, vocab_size=512, q_lora_rank=32, kv_lora_rank=16,
              qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=16, moe_intermediate_size=32,
              first_k_dense_replace=1, mtp_layers=0)

def run(**overrides):
    """The tiny run on two pipeline ranks (one layer each) unless ``overrides`` say otherwise."""
    return tiny_run(**{"pp": 2, **overrides})


RULES = {  # id -> (overrides of ``run``, key path, words of the message)
    "tp-heads": ({"tp": 3}, "parallel.tp", "3 does not divide num_attention_heads=8; use one of 1, 2, 4, 8"),
    "tp-kv-heads": ({"tp": 4, "model": replace(TINY_MODEL, num_key_value_heads=2)}, "parallel.tp",
                    "does not divide num_key_value_heads=2; use one of 1, 2"),
    "kv-heads": ({"model": replace(TINY_MODEL, num_key_value_heads=3)}, "model.num_key_value_heads",
                 "3 does not divide num_attention_heads=8"),
    "tp-ffn": ({"tp": 4, "model": replace(TINY_MODEL, intermediate_size=510)}, "parallel.tp",
               "does not divide intermediate_size=510"),
    "sp-seq": ({"tp": 2, "sp": True, "seq_len": 127}, "training.seq_len",
               "use a multiple of tp or set parallel.sp = false"),
    "cp-seq": ({"cp": 3}, "training.seq_len", "not divisible by 2·cp=6"),
    "ep-dense": ({"ep": 2}, "parallel.ep", "set ep = 1"),
    "capacity-dense": ({"capacity_factor": 1.0}, "training.capacity_factor", "set it to 0"),
    "ep-experts": ({"model": MOE, "ep": 3, "dp": 3}, "parallel.ep",
                   "3 does not divide n_routed_experts=16; use one of 1, 2, 4, 8, 16"),
    "ep-world": ({"model": MOE, "ep": 4, "dp": 2}, "parallel.ep", "does not divide dp·tp·cp = 2"),
    "etp-ffn": ({"model": replace(MOE, moe_intermediate_size=30), "tp": 4, "etp": 4, "dp": 1},
                "parallel.etp", "4 does not divide moe_intermediate_size=30"),
    "skew-range": ({"routing": "skew", "routing_skew": 2.5}, "training.routing_skew", "must be in [1, 2]"),
    "skew-balanced": ({"routing_skew": 1.5}, "training.routing_skew", 'set routing = "skew"'),
    "vpp-interleaved": ({"schedule": "interleaved"}, "parallel.vpp", "needs vpp ≥ 2"),
    "vpp-v": ({"schedule": "zbv", "layers": 4}, "parallel.vpp", "set parallel.vpp = 2"),
    "vpp-one": ({"vpp": 2, "layers": 4}, "parallel.vpp", "set parallel.vpp = 1"),
    "layout-length": ({"layout": (2,)}, "parallel.layout", "it needs one per virtual stage, pp·vpp = 2"),
    "layout-sum": ({"layout": (1, 2)}, "parallel.layout", "sums to 3 layers; the model has 2"),
    "layout-missing": ({"layers": 3}, "parallel.layout", "give a layout, e.g. layout = [2, 1]"),
    "zero-megatron": ({"zero": 2}, "training.zero", 'use zero = 0 or 1, or profile = "paper"'),
    "hf-single-device": ({"profile": "hf"}, "parallel.pp", 'pp > 1 needs profile = "megatron"'),
    "profile": ({"profile": "deepspeed"}, "model.profile", "use one of megatron, paper, hf"),
    "recompute-ranks": ({"recompute": RecomputeSpec(policy="full", num_layers=(1, 1, 1))}, "recompute.num_layers",
                        "give one per pipeline rank (pp = 2) or a single integer"),
    "recompute-mla": ({"recompute": RecomputeSpec(policy="selective", modules=("mla_up_proj",))},
                      "recompute.modules", '"mla_up_proj" needs an MLA model'),
    "recompute-moe": ({"recompute": RecomputeSpec(policy="selective", modules=("moe_act",))},
                      "recompute.modules", '"moe_act" needs a mixture-of-experts model'),
    "distribute-policy": ({"tp": 2, "recompute": RecomputeSpec(policy="selective", distribute_saved=True)},
                          "recompute.distribute_saved", 'policy is "selective": use policy = "full"'),
    "distribute-tp": ({"recompute": RecomputeSpec(policy="full", distribute_saved=True)},
                      "recompute.distribute_saved", "tp = 1: use tp > 1 or remove it"),
    "distribute-sp": ({"tp": 2, "sp": True, "recompute": RecomputeSpec(policy="full", distribute_saved=True)},
                      "recompute.distribute_saved", "Megatron-LM refuses it with sequence parallelism"),
    "distribute-profile": ({"tp": 2, "profile": "paper",
                            "recompute": RecomputeSpec(policy="full", distribute_saved=True)},
                           "recompute.distribute_saved", 'modelled with profile = "megatron"'),
    "csv-missing": ({"schedule": "csv"}, "schedule.csv", 'needs csv = "path/to/schedule.csv"'),
    "csv-unused": ({"csv": "x.csv"}, "schedule.csv", 'only read with kind = "csv"'),
    "group-kind": ({"microbatch_group_size": 2}, "schedule.microbatch_group_size",
                   "applies to interleaved only"),
    "dualpipe-pp": ({"schedule": "dualpipe", "pp": 3, "num_microbatches": 6}, "parallel.pp",
                    'needs an even pp (its two directions meet in the middle), not 3; use pp = 4'),
    "dualpipe-m": ({"schedule": "dualpipe", "num_microbatches": 5}, "training.num_microbatches",
                   "even num_microbatches of at least 2·pp = 4 (half go each way), not 5; use 6"),
    "dualpipev-m": ({"schedule": "dualpipev", "vpp": 2, "layers": 4, "num_microbatches": 3},
                    "training.num_microbatches", "at least 2·pp = 4 micro-batches (one per chunk), not 3"),
    "interleaved-m": ({"schedule": "interleaved", "pp": 4, "vpp": 2, "layers": 8, "num_microbatches": 2},
                      "training.num_microbatches", "at least pp = 4 micro-batches, not 2"),
    "interleaved-group": ({"schedule": "interleaved", "pp": 4, "vpp": 2, "layers": 8, "num_microbatches": 8,
                           "microbatch_group_size": 3}, "schedule.microbatch_group_size",
                          "3 must lie in [pp, num_microbatches] = [4, 8]"),
    "interleaved-last-group": ({"schedule": "interleaved", "pp": 4, "vpp": 2, "layers": 8, "num_microbatches": 10,
                                "microbatch_group_size": 4}, "training.num_microbatches",
                               "leaves a last group of 2 micro-batches, fewer than pp = 4"),
    "max-split": ({"max_split_size_mb": 10}, "allocator.max_split_size_mb", "must be > 20"),
    "roundup-value": ({"roundup_power2_divisions": 3}, "allocator.roundup_power2_divisions",
                      "must be 0 or a power of two"),
    "roundup-key": ({"roundup_power2_divisions": (("3MB", 4),)}, "allocator.roundup_power2_divisions",
                    'must be a power of two in MB (e.g. "1MB", "256MB") or ">"'),
    "non-pytorch": ({"non_pytorch_gib": 80.0}, "hardware.non_pytorch_gib", "leaves nothing of capacity_gib=80"),
    "cp-comm-length": ({"cp": 2, "cp_comm_type": ("p2p", "a2a", "p2p")}, "framework.cp_comm_type",
                       "has 3 entries; give one, or one per layer (2)"),
    "cp-comm-heads": ({"cp": 2, "tp": 8, "cp_comm_type": ("a2a",)}, "framework.cp_comm_type",
                      "a2a scatters the 1 local query and 1 key/value heads over 2 ranks"),
    "cp-comm-backend": ({"cp": 2, "cp_comm_type": ("a2a",), "attention_backend": "unfused"},
                        "framework.cp_comm_type", "runs in Transformer Engine's flash or fused attention only"),
    "cp-a2a-size": ({"cp": 4, "seq_len": 128, "cp_comm_type": ("a2a+p2p",), "cp_a2a_size": 3},
                    "framework.cp_a2a_size", "3 must be at least 2 and divide cp = 4"),
    "defer-wgrad-pp": ({"pp": 1, "defer_embedding_wgrad": True}, "framework.defer_embedding_wgrad",
                       "only with pp > 1 and gradient_accumulation_fusion"),
    "defer-wgrad-fusion": ({"defer_embedding_wgrad": True, "gradient_accumulation_fusion": False},
                           "framework.defer_embedding_wgrad", "only with pp > 1"),
    # hf reads PyTorch's own [framework] keys only (its version, CUBLAS_WORKSPACE_CONFIG, workspaces)
    "hf-framework": ({"profile": "hf", "pp": 1, "attention_backend": "flash"}, "framework.attention_backend",
                     "(profile 'hf' reads only pytorch, cublas_workspace_config, workspaces)"),
}


@pytest.mark.parametrize("rule", list(RULES))
def test_rule_names_its_key_and_what_is_valid(rule):
    overrides, key, words = RULES[rule]
    problems = validate_run(run(**overrides), LIMITS)
    assert any(k == key and words in msg for k, msg in problems), problems


@pytest.mark.parametrize("overrides", [
    {}, {"model": MOE, "ep": 2, "dp": 2}, {"schedule": "interleaved", "vpp": 2, "layers": 4},
    {"schedule": "dualpipev", "vpp": 2, "layers": 4}, {"schedule": "dualpipe", "num_microbatches": 4},
    {"profile": "hf", "pp": 1}, {"profile": "paper", "zero": 3}, {"layers": 3, "layout": (2, 1)},
    {"profile": "hf", "pp": 1, "pytorch": "2.11", "cublas_workspace_config": ":4096:8", "workspaces": False},
])
def test_valid_runs_have_no_problems(overrides):
    assert validate_run(run(**overrides), LIMITS) == []


def test_every_problem_is_reported_at_once():
    keys = [k for k, _ in validate_run(run(tp=3, zero=2, max_split_size_mb=10), LIMITS)]
    assert keys == ["parallel.tp", "parallel.tp", "training.zero", "allocator.max_split_size_mb"]


@pytest.mark.parametrize(("layers", "chunks", "layout"), [
    (61, 16, [4] * 13 + [3] * 3), (4, 4, [1, 1, 1, 1]), (3, 2, [2, 1]), (2, 4, [1, 1, 0, 0]),
])
def test_suggest_layout_is_even_larger_first(layers, chunks, layout):
    got = suggest_layout(layers, chunks)
    assert got == layout and sum(got) == layers and max(got) - min(got) <= 1
