"""Trace files: round trip, schema/provenance checks, and what a run may ask of a trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from timeline.errors import SpecError, UserError
from timeline.io.runfile import load_run
from timeline.io.trace_file import read_trace, read_trace_provenance, write_trace

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "traces" / "llama3-8b-layer.parquet"
DSV3 = ROOT / "traces" / "deepseek-v3-moe-layer.parquet"


def test_round_trip_is_lossless_and_deterministic(tmp_path):
    trace = read_trace(LLAMA)
    write_trace(trace, tmp_path / "a.parquet")
    write_trace(read_trace(tmp_path / "a.parquet"), tmp_path / "b.parquet")
    again = read_trace(tmp_path / "b.parquet")
    assert again.ops == trace.ops and again.storages == trace.storages
    assert again.params == trace.params and again.layers == trace.layers
    assert again.provenance == trace.provenance
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()


@pytest.mark.parametrize("path", [LLAMA, DSV3], ids=["llama", "dsv3"])
def test_shipped_traces_carry_provenance(path):
    prov = read_trace_provenance(path)
    assert prov["schema"] == "timeline.trace/1" and prov["torch"].startswith("2.13")
    assert prov["transformers"] == "5.24.0" and prov["micro_batch_size"] == 1 and prov["seq_len"] == 4096
    assert prov["command"].startswith("timeline capture") and prov["config"]["num_hidden_layers"] == 1
    assert path.stat().st_size < 200_000


def test_not_a_trace(tmp_path):
    bad = tmp_path / "x.parquet"
    bad.write_text("nope")
    with pytest.raises(UserError, match="not a Parquet file"):
        read_trace(bad)
    with pytest.raises(UserError, match="no such trace file"):
        read_trace(tmp_path / "missing.parquet")


def run_text(**training) -> str:
    lines = "\n".join(f"{k} = {v}" for k, v in {"micro_batch_size": 1, "seq_len": 4096, **training}.items())
    return f'[model]\ntrace = "{LLAMA}"\nnum_layers = 32\n[training]\n{lines}\n'


def test_run_loads_the_trace(write_run):
    run = load_run(write_run(run_text()))
    assert run.model_source.startswith("trace:") and run.trace is not None
    assert run.model.num_hidden_layers == 32 and run.model.hidden_size == 4096


def test_other_sizes_name_the_capture_command(write_run):
    with pytest.raises(SpecError) as exc:
        load_run(write_run(run_text(seq_len=2048)))
    text = str(exc.value)
    assert "captured at micro_batch_size = 1, seq_len = 4096" in text
    assert ("timeline capture --preset llama3-8b --set num_hidden_layers=1 --micro-batch-size 1 --seq-len 2048"
            in text)


def test_context_parallelism_and_selective_recompute_are_refused(write_run):
    assert load_run(write_run(run_text()), ["parallel.tp=2"]).parallel.tp == 2  # TP/SP/EP shard a trace
    with pytest.raises(SpecError, match="parallel.cp: a captured trace shards over tp, sp and ep only"):
        load_run(write_run(run_text()), ["parallel.cp=2"])
    with pytest.raises(SpecError, match="selective recompute names modules"):
        load_run(write_run(run_text()), ["recompute.policy=selective"])
    full = load_run(write_run(run_text()), ["recompute.policy=full", "recompute.method=block"])
    assert full.recompute.policy == "full"


def test_shipped_llama_trace_under_tp8_holds_the_presets_parameters(write_run, capsys):
    """The 1-layer Llama-3-8B trace repeated to 32 layers under tp = 8: per device, the parameters and
    static bytes of the analytic ``llama3-8b`` preset (weights + the trace's fp32 rotary buffers,
    ``inv_freq`` and ``original_inv_freq`` of head_dim/2 = 64 each)."""
    import json

    from timeline.cli import main

    def device(text: str) -> dict:
        assert main(["static", str(write_run(text)), "--set", "parallel.tp=8", "--json"]) == 0
        return json.loads(capsys.readouterr().out)["devices"][0]

    trace = device(run_text())
    preset = device('[model]\npreset = "llama3-8b"\n[training]\nmicro_batch_size = 1\nseq_len = 4096\n')
    # Llama-3-8B under tp = 8: q, k, v, o and the SwiGLU MLP split, two RMSNorms whole per layer; the
    # vocabulary (128,256) padded to 128·tp = 1,024 → 129,024 rows for the embedding and the head
    h, kv, ffn, layers, vocab = 4096, 1024, 14336, 32, 129_024
    per_layer = (2 * h * h + 2 * kv * h + 3 * ffn * h) // 8 + 2 * h
    assert trace["params"] == preset["params"]
    assert trace["params"]["total"] == layers * per_layer + 2 * vocab * h // 8 + h
    assert trace["bytes"]["grads"] == preset["bytes"]["grads"]
    assert trace["bytes"]["optimizer"] == preset["bytes"]["optimizer"]
    assert trace["bytes"]["weights"] - preset["bytes"]["weights"] == trace["buffers"] * 4 == 2 * 64 * 4


def test_shipped_deepseek_trace_places_experts_under_ep_and_refuses_mla_under_tp(write_run, capsys):
    """DeepSeek-V3's MoE layer under ep = 8: 256/8 routed experts of 3 · 7168 · 2048 per layer, the shared
    expert and router whole, activations unchanged (each EP rank receives b·s·top_k rows without tp);
    under tp its MLA projections (q_a_proj, …) match no rule and the run is refused naming the key."""
    import json

    from timeline.cli import main

    text = f'[model]\ntrace = "{DSV3}"\nnum_layers = 2\n[training]\nmicro_batch_size = 1\nseq_len = 4096\n'

    def device(*sets: str) -> dict:
        assert main(["static", str(write_run(text)), *(a for s in sets for a in ("--set", s)), "--json"]) == 0
        return json.loads(capsys.readouterr().out)["devices"][0]

    whole, ep8 = device(), device("parallel.ep=8", "parallel.dp=8")
    routed = 256 * 3 * 7168 * 2048
    assert whole["params"]["by_module"]["moe"] - ep8["params"]["by_module"]["moe"] == 2 * routed * 7 // 8
    assert ep8["layer_activation_bytes"] == whole["layer_activation_bytes"]
    with pytest.raises(SpecError, match=r"parallel\.tp: the trace's layer parameter 'model\.layers\.0\.self_attn\."
                       r"q_a_proj\.weight' matches no sharding rule"):
        load_run(write_run(text), ["parallel.tp=2"])
