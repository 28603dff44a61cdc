"""Megatron-Core 0.16 on runs tensor parallelism above the KV groups (``transformer/attention.py``:
``Attention.__init__`` and ``get_query_key_value_tensors``): each rank's 1/tp of the fused QKV columns is
all-gathered along the last dimension, the rank's group sliced out of the whole, its q heads (num_heads / tp) and
its one k and v head kept as views of it. Sizes below are the tiny model's: hidden 256, 8 heads of 32, 2 KV
groups, tp 4."""

from __future__ import annotations

from dataclasses import replace

from helpers_run import TINY_MODEL, tiny_run
from sources import devices_of, forward_ops_of

from timeline.profiles import LIMITS
from timeline.spec.validate import validate_run

MODEL = replace(TINY_MODEL, num_key_value_heads=2, num_hidden_layers=2)
HEADS, GROUPS, HD, TP, ROWS = 8, 2, 32, 4, 128
COLS = (HEADS + 2 * GROUPS) * HD  # the fused QKV's columns over all ranks: 384


def test_megatron_core_from_0_16_runs_it_and_before_refuses_naming_the_release():
    assert validate_run(tiny_run(model=MODEL, tp=TP, megatron_core="0.16.0"), LIMITS) == []
    (problem,) = validate_run(tiny_run(model=MODEL, tp=TP, megatron_core="0.15.0"), LIMITS)
    assert problem[0] == "parallel.tp" and 'megatron_core = "0.16.0"' in problem[1]


def test_each_rank_gathers_every_qkv_column_and_keeps_its_group_as_views():
    ops = {op.name: op for op in forward_ops_of(tiny_run(model=MODEL, tp=TP, megatron_core="0.16.0"), 0)}
    p = "layers.0.self_attn"
    assert ops[f"{p}.linear_qkv"].outputs["qkv"].shape == (ROWS, COLS // TP)
    assert ops[f"{p}.qkv.all_gather"].outputs["y"].shape == (TP * ROWS, COLS // TP)  # the gather buffer
    whole = ops[f"{p}.qkv.cat"].outputs["y"]
    assert whole.shape == (ROWS, COLS)
    rope = ops[f"{p}.rope"]
    assert (rope.outputs["q"].shape, rope.outputs["k"].shape) == ((ROWS, HEADS // TP * HD), (ROWS, HD))
    attn = ops[f"{p}.core_attn"]
    assert attn.inputs["v"].shape == (ROWS, HD)
    # SelfAttention.forward holds value, a view of the whole gathered tensor, until after linear_proj
    assert ops[f"{p}.linear_proj"].inputs["_qkv"].storage == whole.storage


def test_the_weights_are_the_column_parallel_share_of_the_fused_projection():
    dev = devices_of(tiny_run(model=MODEL, tp=TP, megatron_core="0.16.0", pp=1))[0]
    qkv = sum(t.numel for t in dev.tensors if t.name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")))
    assert qkv == 2 * (COLS // TP) * 256  # two layers, each rank COLS / tp rows of hidden 256


def test_serving_engines_replicate_kv_heads_and_gather_nothing(tmp_path):
    """vLLM replicates KV heads over tp instead (``QKVParallelLinear``: ``num_kv_head_replicas = tp //
    total_num_kv_heads``): Llama-3.1-8B (32 heads, 8 KV heads of 128) at tp 16 gives each rank 2 q heads and one
    whole k and v head, weights and step alike, and no gather."""
    from pathlib import Path

    from timeline.io.serve_runfile import load_serve_run
    from timeline.serve.graph_view import _params, step_ops

    hf = Path(__file__).resolve().parents[1] / "data" / "hf" / "llama-3.1-8b" / "config.json"
    path = tmp_path / "r.toml"
    path.write_text(f'[model]\nhf_config = "{hf}"\n[parallel]\ntp = 16\n[hardware]\ngpu = "h100"\n'
                    '[serving]\nengine = "vllm"\n[serving.load]\nnum_requests = 1\n')
    run = load_serve_run(path)
    shapes = {t.name: t.shape for t in _params(run, 0)}
    assert shapes["layers.0.self_attn.q_proj.weight"] == (2 * 128, 4096)
    assert shapes["layers.0.self_attn.k_proj.weight"] == shapes["layers.0.self_attn.v_proj.weight"] == (128, 4096)
    ops = step_ops(run, 64)
    (qkv,) = [op for op in ops if op.name == "layers.0.self_attn.linear_qkv"]
    assert [t.shape for t in qkv.outputs.values()] == [(64, (2 + 2) * 128)]
    assert not any(op.name.endswith("qkv.all_gather") for op in ops)
