"""Data parallelism and DP attention in `timeline serve` (:mod:`timeline.serve.dp`): per-rank weights
(vLLM ``FusedMoEParallelConfig.make``: experts over tp·dp, the rest split by the rank's tp; SGLang
``DeepseekV2AttentionMLA`` split by ``attn_tp_size = tp // dp``, ``VocabParallelEmbedding(enable_tp=not
enable_dp_attention)``, the MLPs and LM head over the tp group), each rank's own KV pool from the
engine's budget rule, requests routed as the engine routes them (vLLM ``DPLBAsyncMPClient``'s
``waiting·4 + running``, SGLang's round robin) and the ranks of a MoE model stepping together."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from timeline.cli import main
from timeline.exporters.serve_summary import summary
from timeline.io.serve_runfile import load_serve_run
from timeline.serve.budget import GIB, compute_budget, profile_transients
from timeline.serve.dp import profile_moe_tokens
from timeline.serve.graph_view import device_params, step_ops
from timeline.serve.non_torch import measured_init
from timeline.serve.run import _gather_plan, serve
from timeline.serve.steptime import step_cost
from timeline.serve.transients import (
    new_allocator,
    run_through_allocator,
    sampler_tensors,
    step_transients,
    step_transients_affine,
)
from timeline.sim.batching import SchedulerConfig
from timeline.sim.dp_batching import Routing, simulate_dp
from timeline.spec.serving import Request

ROOT = Path(__file__).resolve().parents[2]
TP8_RUN = ROOT / "schedules" / "deepseek-v3-tp8-fp8-h200-serve.toml"
DP8_RUN = ROOT / "schedules" / "deepseek-v3-dp8-attn-h200-serve.toml"
LLAMA_RUN = ROOT / "schedules" / "llama3.1-8b-h100-serve.toml"

# a small DeepSeek-V3-style MLA model: 3 layers (1 dense, 2 MoE), 8 heads, 8 routed experts + 1 shared
H, FFN, MI, HEADS, QL, KVL, ROPE, NOPE, V, E, VOCAB, POS = 256, 512, 128, 8, 96, 64, 16, 32, 32, 8, 1000, 4096


def small_run(tmp_path: Path, overrides: list[str]):
    cfg = json.loads((ROOT / "tests/data/hf/deepseek-v3/config.json").read_text())
    cfg.pop("quantization_config", None)
    cfg.pop("rope_scaling", None)  # YaRN would size the rope cache by its own 4096 · 40 positions, not POS
    cfg.update(hidden_size=H, intermediate_size=FFN, moe_intermediate_size=MI, num_hidden_layers=3,
               first_k_dense_replace=1, num_attention_heads=HEADS, num_key_value_heads=HEADS, q_lora_rank=QL,
               kv_lora_rank=KVL, qk_rope_head_dim=ROPE, qk_nope_head_dim=NOPE, v_head_dim=V, n_routed_experts=E,
               num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1, vocab_size=VOCAB,
               max_position_embeddings=POS, num_nextn_predict_layers=0)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    data = {"name": "small-mla", "model": {"hf_config": "config.json"}, "hardware": {"gpu": "h200"},
            "serving": {"max_model_len": 2048, "max_num_seqs": 8, "max_num_batched_tokens": 512,
                        "load": {"num_requests": 24, "rate_per_s": 50, "seed": 1,
                                 "prompt_tokens": {"dist": "uniform", "min": 20, "max": 300},
                                 "output_tokens": {"dist": "uniform", "min": 5, "max": 60}}}}
    return load_serve_run(tmp_path / "run.toml", overrides, data=data)


def attention_elements(heads: int) -> int:
    """One MLA layer's attention weights with ``heads`` local heads: q_a (replicated), its norm,
    q_b (heads·(nope+rope) × q_lora), kv_a with the rope key (replicated), its norm, kv_b
    (heads·(nope+v) × kv_lora), o_proj (hidden × heads·v), and the layer's two RMSNorms."""
    return (QL * H + QL + heads * (NOPE + ROPE) * QL + (KVL + ROPE) * H + KVL + heads * (NOPE + V) * KVL
            + H * heads * V + 2 * H)


def test_vllm_dp_rank_holds_whole_attention_and_its_experts(tmp_path):
    run = small_run(tmp_path, ["parallel.tp=1", "parallel.dp=4", "parallel.ep=4"])
    b = compute_budget(run)
    bf16 = 2
    moe_layer = E * H * bf16 + E * 4 + (E // 4) * 3 * MI * H * bf16 + 3 * MI * H * bf16  # router, bias, 2 experts, shared
    expected = (3 * attention_elements(HEADS) * bf16 + 3 * FFN * H * bf16 + 2 * moe_layer
                + 2 * 1024 * H * bf16 + H * bf16  # embedding and LM head (1,000 rows padded to 64), final norm
                + 3 * HEADS * (NOPE + V) * KVL * bf16  # W_UK_T / W_UV of every layer's heads
                + POS * ROPE * bf16)  # the rope cos/sin cache
    assert b.weights_bytes == expected == 4_436_480
    # the latent KV is not split: (kv_lora_rank + rope) · 2 B per layer, over the 3 layers
    assert (b.kv_bytes_per_token_layer, b.kv_bytes_per_token) == (160, 480)
    assert b.kv_pool_bytes == b.requested_bytes - b.weights_bytes - b.activation_peak_bytes - b.non_torch_bytes
    assert b.num_kv_blocks == b.kv_pool_bytes // (16 * 160) // 3
    # ep = 1: every expert split over tp·dp = 4 GPUs instead, the same bytes
    assert compute_budget(small_run(tmp_path, ["parallel.tp=1", "parallel.dp=4"])).weights_bytes == expected


def test_sglang_dp_attention_splits_attention_by_tp_over_dp(tmp_path):
    run = small_run(tmp_path, ["serving.engine=sglang", "serving.enable_dp_attention=true", "parallel.tp=4",
                               "parallel.dp=2"])
    params = {t.name: t.shape for t in device_params(run)}
    assert params["layers.0.self_attn.q_b_proj.nope.weight"] == (HEADS // 2 * NOPE, QL)  # attn_tp = 2
    assert params["layers.0.mlp.gate_proj.weight"] == (FFN // 4, H)  # the dense MLP over the tp group
    assert params["embedding.word_embeddings.weight"] == (1024, H) and params["output_layer.weight"] == (256, H)
    b = compute_budget(run)
    bf16 = 2
    moe_layer = E * H * bf16 + E * 4 + E * 3 * (MI // 4) * H * bf16 + 3 * (MI // 4) * H * bf16
    expected = (3 * attention_elements(HEADS // 2) * bf16 + 3 * (FFN // 4) * H * bf16 + 2 * moe_layer
                + 1024 * H * bf16 + 256 * H * bf16 + H * bf16)
    assert b.weights_bytes == expected == 2_425_344
    total = b.total_bytes
    free0 = total - measured_init(run)[0]  # the context and the distributed groups (timeline.serve.non_torch)
    rest = free0 - expected - (free0 - int(free0 * run.serving.mem_fraction_static))
    assert b.num_kv_blocks == rest // 480 and b.kv_pool_bytes == rest // 480 * 480
    # max_running_requests and chunked_prefill_size divided by dp_size: 8 → 4, 512 → 256 per rank
    assert b.req_to_token_bytes == (4 + 1) * (2048 + 4) * 4


def test_shipped_dp8_totals_follow_the_formula():
    dp8, tp8 = load_serve_run(DP8_RUN), load_serve_run(TP8_RUN)
    p_dp, p_tp = device_params(dp8), device_params(tp8)
    experts = [t for t in p_dp if t.expert]
    # 58 MoE layers × 32 whole experts (256 over ep = 8) × gate, up, down of 2,048 × 7,168 on every rank
    assert sum(t.numel for t in experts) == 58 * 32 * 3 * 2048 * 7168
    assert sum(t.numel for t in experts) == sum(t.numel for t in p_tp if t.expert)  # TP8 splits each instead
    q_b = {t.name: t.shape for t in p_dp}["layers.0.self_attn.q_b_proj.nope.weight"]
    assert q_b == (128 * 128, 1536)  # all 128 heads on every rank (8 × TP8's)
    b = compute_budget(dp8)
    assert b.kv_bytes_per_token == 61 * 1152 == 70_272
    # the non-torch part the file's vLLM 0.19.0 counts: V1's run part at tp 1 with the CUDA-graph profiling
    # 0.18 adds to the window (0.25 GiB, the llm-d-planner version sweep on H100)
    assert b.non_torch_bytes == int(0.25 * GIB)
    assert b.kv_pool_bytes == b.requested_bytes - b.weights_bytes - b.activation_peak_bytes - b.non_torch_bytes
    assert b.num_kv_blocks == b.kv_pool_bytes // (64 * 1152) // 61


def test_vllm_moe_layer_runs_on_every_ranks_tokens():
    dp8 = load_serve_run(DP8_RUN)
    assert profile_moe_tokens(dp8) == 8 * 8192  # every rank's profile run of max_num_batched_tokens at once
    moe = next(op for op in step_ops(dp8, 8192, 0, profile_moe_tokens(dp8)) if op.rule == "fused_moe")
    shapes = {k: t.shape for k, t in moe.extras.items()}
    assert shapes["dispatch.hidden_states"] == (65_536, 7168) == shapes["experts_output"]
    assert shapes["dispatch.router_logits"] == (65_536, 256)
    # fused_experts works on at most VLLM_FUSED_MOE_CHUNK_SIZE = 32,768 of them at once, top-8 rows each
    assert shapes["cache13"] == (32_768 * 8 * 7168,) and shapes["cache2"] == (32_768 * 8, 2048)
    assert moe.outputs["y"].shape == (8192, 7168)  # combined back to the rank's own tokens
    one = load_serve_run(DP8_RUN, ["parallel.dp=1", "parallel.ep=1"])
    assert profile_moe_tokens(one) == 0 and "dispatch.hidden_states" not in next(
        op for op in step_ops(one, 8192) if op.rule == "fused_moe").extras
    # the gathered buffers (hidden, logits, output: 65,536 rows, live together in the op) raise the profile peak
    gathered = 65_536 * (7168 + 256 + 7168) * 2
    b = compute_budget(dp8)

    def peak(plan) -> int:
        return run_through_allocator(new_allocator(dp8, b.total_bytes), plan)

    alone = peak(step_transients(step_ops(dp8, 8192), sampler_tensors(dp8, 256, profile=True)))
    assert b.activation_peak_bytes == peak(profile_transients(dp8)) >= alone + gathered


def test_vllm_ranks_pad_to_the_busiest_and_idle_ranks_run_dummy_batches(tmp_path):
    res = serve(small_run(tmp_path, ["parallel.tp=1", "parallel.dp=4", "parallel.ep=4"]))
    by_start: dict[float, list] = {}
    for rk in res.ranks:
        for s in rk.sched.steps:
            by_start.setdefault(s.t_start_us, []).append(s)
    assert all(len(steps) == 4 for steps in by_start.values())  # every rank runs every step
    for steps in by_start.values():
        most = max(s.num_tokens for s in steps)
        assert all(s.padded_tokens == most and s.moe_tokens == 4 * most for s in steps)
        assert all(s.dummy == (s.num_tokens == 0) for s in steps)
    assert any(s.dummy for steps in by_start.values() for s in steps)


@pytest.mark.parametrize("overrides", [["parallel.tp=1", "parallel.dp=4", "parallel.ep=4"],
                                       ["serving.engine=sglang", "serving.enable_dp_attention=true", "parallel.tp=4",
                                        "parallel.dp=4"]], ids=["vllm", "sglang"])
def test_a_ranks_step_plan_is_its_tokens_and_the_gathered_ones(tmp_path, overrides):
    run = small_run(tmp_path, overrides)
    template, per_token, per_moe = _gather_plan(run)
    extra = sampler_tensors(run, 3)
    for tokens, moe in ((37, 200), (5, 41), (300, 1200)):
        exact = step_transients(step_ops(run, tokens, 0, moe), extra)
        assert step_transients_affine(template, per_token, per_moe, tokens, moe, extra) == exact
    # an idle rank (no tokens of its own) allocates only the MoE layers' gathered buffers and workspaces
    idle = step_transients_affine(template, per_token, per_moe, 0, 12, [0] * len(extra))
    sizes = [size for size, j in idle.plan if j < 0]
    assert sizes == [b * 12 for b in per_moe] and sum(sizes) > 0
    assert all(b == 0 or a == 0 for a, b in zip(per_token, per_moe, strict=True))  # each tensor: one or the other


def test_dp_step_time_counts_the_gathered_tokens():
    run = load_serve_run(DP8_RUN)
    b = compute_budget(run)
    cost = step_cost(run, device_params(run), b.weights_bytes, b.kv_bytes_per_token)
    assert cost.moe_layers == 58 and cost.tp == 1
    alone, gathered = cost.step_us(1, 2000, 2000.0), cost.step_us(1, 2000, 2000.0, 8)
    # decode is bandwidth-bound: 8 gathered tokens reach 8·8/256 = 1/4 of the rank's experts (one token: 1/32),
    # and each MoE layer all-gathers and reduce-scatters the 8 rows
    extra_read = cost.expert_weight_bytes * (8 * 8 / 256 - 8 / 256) / cost.cost.hbm_bytes_per_us
    comm = 2 * 58 * cost.cost.comm_us(8 * 7168 * 2, "ep")
    assert gathered == pytest.approx(alone + extra_read + comm, rel=1e-12)


def test_round_robin_and_least_loaded_routing():
    cfg = SchedulerConfig(num_blocks=1000, block_size=16, max_num_seqs=8, max_num_batched_tokens=256,
                          max_model_len=4096, enable_chunked_prefill=True, enable_prefix_caching=False)
    reqs = (Request(rid=0, arrival_us=0.0, prompt_tokens=100, output_tokens=500),  # long: busy past 200 ms
            Request(rid=1, arrival_us=0.0, prompt_tokens=10, output_tokens=2),  # done within a few steps
            Request(rid=2, arrival_us=200_000.0, prompt_tokens=10, output_tokens=2),
            Request(rid=3, arrival_us=200_000.0, prompt_tokens=10, output_tokens=2),
            Request(rid=4, arrival_us=200_000.0, prompt_tokens=10, output_tokens=2))
    rr = simulate_dp(cfg, reqs, 2, Routing(rule="round_robin"), False, lambda r, b, p, m: 1000.0)
    assert rr.rank_of == [0, 1, 0, 1, 0]
    ll = simulate_dp(cfg, reqs, 2, Routing(rule="least_loaded", refresh_us=100_000.0, waiting_weight=4), False,
                     lambda r, b, p, m: 1000.0)
    # t = 0: both idle → 0, then rank 0 counts one waiting (score 4) → 1; t = 200 ms (the counts refreshed then):
    # rank 0 runs request 0 (score 1), rank 1 is idle (0) → 1, whose waiting then scores 4 → 0 (now 1 + 4 = 5) → 1
    assert ll.rank_of == [0, 1, 1, 0, 1]
    assert [len(r.states) for r in ll.ranks] == [2, 3]
    assert all(s.finish_us > 0 for r in ll.ranks for s in r.states)


def test_moe_ranks_step_together_and_dense_ranks_do_not(tmp_path):
    res = serve(small_run(tmp_path, ["serving.engine=sglang", "serving.enable_dp_attention=true", "parallel.tp=4",
                                     "parallel.dp=4"]))
    starts = [{(s.t_start_us, s.t_end_us) for s in rk.sched.steps} for rk in res.ranks]
    everyone = set().union(*starts)
    # a step's start and end are the same on every rank that ran it: the ranks share one clock of steps
    assert len({t0 for t0, _ in everyone}) == len(everyone)
    assert sum(rk.requests for rk in res.ranks) == 24 == len(res.sched.states)
    assert res.rank_of == [i % 4 for i in range(24)]  # SGLang's round robin, in arrival order
    dense = serve(load_serve_run(LLAMA_RUN, ["parallel.dp=2", "serving.load.num_requests=40"]))
    a, b = ({s.t_start_us for s in rk.sched.steps} for rk in dense.ranks)
    assert a != b  # each rank on its own clock
    replicas = serve(small_run(tmp_path, ["serving.engine=sglang", "parallel.tp=2", "parallel.dp=2"]))
    assert replicas.data_parallel["lockstep"] is False and not replicas.data_parallel["dp_attention"]
    assert replicas.rank_of == [i % 2 for i in range(24)]


def test_outputs_have_a_row_per_rank(tmp_path):
    out = tmp_path / "dp"
    assert main(["serve", str(DP8_RUN), "--set", "serving.load.num_requests=40", "-o", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    rows = s["devices"]
    assert [r["dp_rank"] for r in rows] == list(range(8)) and all(r["represents"] == 1 for r in rows)
    assert sum(r["requests"] for r in rows) == 40 == s["requests"]["total"]
    assert s["data_parallel"]["routing"] == "least_loaded" and s["data_parallel"]["lockstep"]
    assert s["steps"]["total"] == sum(r["steps"] for r in rows)
    mem = pq.read_table(out / "memory.parquet").to_pydict()
    assert sorted(set(mem["device"])) == list(range(8)) and len(mem["device"]) == s["steps"]["total"]
    req = pq.read_table(out / "requests.parquet").to_pydict()
    assert [req["dp_rank"].count(r) for r in range(8)] == [r["requests"] for r in rows]
    assert "enable_dp_attention" not in s["run"]["serving"]  # SGLang's flag, absent from a vLLM run


def test_summary_of_one_rank_is_unchanged_by_the_dp_fields():
    res = serve(load_serve_run(LLAMA_RUN, ["serving.load.num_requests=5"]))
    s = summary(res)
    assert "data_parallel" not in s and "dp_rank" not in s["devices"][0]
    assert "enable_dp_attention" not in s["run"]["serving"]


@pytest.mark.parametrize("overrides,key", [
    (["serving.enable_dp_attention=true", "parallel.dp=2"], "serving.enable_dp_attention"),  # vLLM has no flag
    (["serving.engine=sglang", "serving.enable_dp_attention=true"], "parallel.dp"),  # dp-size > 1
    (["serving.engine=sglang", "serving.enable_dp_attention=true", "parallel.dp=3"], "parallel.dp"),  # 3 ∤ 8
    (["serving.engine=hf", "serving.enable_dp_attention=true", "parallel.tp=1"], "serving.enable_dp_attention"),
    (["parallel.dp=2", "parallel.pp=2", "parallel.tp=4", "parallel.ep=8"], "parallel.pp"),
    (["serving.engine=sglang", "serving.enable_dp_attention=true", "parallel.dp=8", "parallel.ep=64"],
     "parallel.ep"),
])
def test_bad_dp_combinations_are_one_error_line(tmp_path, capsys, overrides, key):
    args = [a for o in overrides for a in ("--set", o)]
    assert main(["serve", str(TP8_RUN), *args, "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0]
    assert not (tmp_path / "out").exists()


def test_dp_attention_needs_mla(tmp_path, capsys):
    args = ["--set", "serving.engine=sglang", "--set", "serving.enable_dp_attention=true", "--set", "parallel.dp=2"]
    assert main(["serve", str(LLAMA_RUN), *args, "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "serving.enable_dp_attention" in err[0] and "MLA" in err[0]
