"""``timeline static``: the JSON document, the table, and one-line errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from timeline.cli import main

SHIPPED = Path(__file__).resolve().parents[2] / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"

BASE = """
[model]
preset = "deepseek-v3"
profile = "paper"
[parallel]
pp = 16
tp = 2
ep = 8
etp = 1
dp = 32
layout = [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 1]
[training]
moment_dtype = "bf16"
"""


def test_static_json_schema(capsys):
    assert main(["static", str(SHIPPED), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "timeline.static/1"
    assert doc["model"]["total_params"] == 671_026_397_184 + 11_610_067_968
    assert len(doc["devices"]) == 16
    d1 = doc["devices"][1]
    assert set(d1) >= {"device", "pp_rank", "stages", "represents", "layers", "params", "bytes"}
    assert d1["device"] == 64 and d1["pp_rank"] == 1 and d1["stages"] == [1] and d1["represents"] == 64
    assert d1["layers"] == [4, 5, 6, 7]
    assert set(d1["params"]["by_module"]) == {"embedding", "attention", "norm", "mlp", "moe", "mamba", "head", "mtp"}
    assert d1["bytes"] == {"weights": 12_500_729_856, "grads": 25_001_459_712, "optimizer": 5_928_075_264,
                           "total": 43_430_264_832}


def test_static_table(capsys):
    assert main(["static", str(SHIPPED)]) == 0
    out = capsys.readouterr().out
    assert "6,250,364,928" in out and "40.45" in out


def test_set_overrides_and_relative_paths(write_run, tmp_path, capsys):
    cfg = tmp_path / "cfg" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                               "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
                               "vocab_size": 1000}))
    run = write_run('[model]\nhf_config = "cfg/config.json"\n')
    assert main(["static", str(run), "--json", "--set", "training.zero=1", "--set", "parallel.dp=2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    d = doc["devices"][0]
    # per layer: q,o 64×64; k,v 64×32 (GQA); SwiGLU 3×64×128; two RMSNorms; plus the final norm
    per_layer = 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128 + 2 * 64
    assert doc["model"]["total_params"] == 2 * 1000 * 64 + 2 * per_layer + 64
    # Megatron pads the vocabulary to a multiple of 128·tp: 1,024 rows in embedding and head
    total = 2 * 1024 * 64 + 2 * per_layer + 64
    assert d["params"]["total"] == total
    # the distributed optimizer's buffer (one bucket; every parameter starts on a 64-element boundary)
    # ends padded to lcm(dp, 128) = 128 elements; each of the dp = 2 ranks owns half of it, the last
    # rank (the one modelled) the second half less the 64 padding elements
    padded = -(-total // 128) * 128
    assert padded == total + 64
    assert d["bytes"]["grads"] == padded * 4 and d["bytes"]["weights"] == padded * 2
    assert d["bytes"]["optimizer"] == (padded // 2 - 64) * 12  # fp32 master + 2 fp32 moments of the shard


BAD = [
    # (run text or None for a missing file, overrides, expected fragments)
    (None, [], ["no such file"]),
    ("[model\npreset = 1", [], ["invalid TOML"]),
    (BASE + "[bogus]\nx = 1\n", [], ["bogus", "unknown section"]),
    (BASE, ["parallel.tpp=2"], ["parallel.tpp", "unknown key", "tp"]),
    (BASE, ["parallel.tp=\"two\""], ["parallel.tp", "expected an integer"]),
    (BASE, ["training.seq_len=0"], ["training.seq_len", "positive"]),
    (BASE, ["parallel.dp=-1"], ["parallel.dp", "positive"]),
    (BASE, ["model.preset=\"gpt5\""], ["model.preset", "unknown preset", "deepseek-v3"]),
    (BASE, ["model.profile=\"deepspeed\""], ["model.profile", "megatron"]),
    (BASE, ["training.dtype=\"fp64\""], ["training.dtype", "bf16"]),
    (BASE, ["parallel.tp=3"], ["parallel.tp", "num_attention_heads=128", "use one of"]),
    (BASE.replace('preset = "deepseek-v3"', 'preset = "llama3-8b"').replace("ep = 8", "ep = 1"),
     ["parallel.tp=16", "parallel.layout=[2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2]"], ["num_key_value_heads=8"]),
    (BASE, ["parallel.ep=3"], ["parallel.ep", "n_routed_experts=256"]),
    (BASE, ["parallel.ep=64", "parallel.dp=8"], ["parallel.ep", "dp·tp·cp"]),
    (BASE, ["training.seq_len=4095"], ["training.seq_len", "tp=2"]),
    (BASE, ["parallel.cp=4", "training.seq_len=4100"], ["training.seq_len", "2·cp=8"]),
    (BASE, ["parallel.layout=[4,4]"], ["parallel.layout", "2 entries", "16"]),
    (BASE, ["parallel.layout=[4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,2]"], ["parallel.layout", "62", "61"]),
    (BASE.replace("layout = [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 1]", ""), [],
     ["parallel.layout", "61 layers", "layout = [4, 4"]),
    (BASE, ["model.profile=\"megatron\"", "training.zero=2"], ["training.zero", "megatron", "zero = 1"]),
    (BASE, ["model.profile=\"hf\""], ["parallel.pp", "megatron"]),
    (BASE, ["allocator.max_split_size_mb=10"], ["allocator.max_split_size_mb", "> 20"]),
    (BASE, ["hardware.gpu=\"tpu\""], ["hardware.gpu", "h800"]),
    (BASE, ["schedule.kind=\"interleaved\""], ["parallel.vpp", "interleaved"]),
    (BASE, ["recompute.policy=\"some\""], ["recompute.policy", "selective"]),
    (BASE, ["recompute.num_layers=[1,2]"], ["recompute.num_layers", "pp = 16"]),
    (BASE, ["schedule.kind=\"csv\""], ["schedule.csv"]),
    (BASE, ["nonsense"], ["--set", "section.key=value"]),
    ('[model]\npreset = "deepseek-v3"\nhf_config = "x.json"\n', [], ["model", "exactly one"]),
    ('[model]\nhf_config = "missing.json"\n', [], ["model.hf_config", "no such file"]),
]


@pytest.mark.parametrize(("text", "overrides", "fragments"), BAD)
def test_bad_input_one_line_exit_2(text, overrides, fragments, write_run, tmp_path, capsys):
    path = write_run(text) if text is not None else tmp_path / "absent.toml"
    args = ["static", str(path)]
    for o in overrides:
        args += ["--set", o]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert "Traceback" not in err
    assert err.startswith("error: ") and str(path) in err.splitlines()[0]
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def test_every_problem_reported_at_once(write_run, capsys):
    path = write_run(BASE)
    assert main(["static", str(path), "--set", "parallel.tp=3", "--set", "parallel.ep=3"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {path}: ")  # one line, the file named once
    keys = [part.split(": ")[0] for part in err[0].removeprefix(f"error: {path}: ").split(" | ")]
    assert keys == ["parallel.tp", "training.seq_len", "parallel.ep"]  # seq 4096 % tp 3 with SP


def test_help_teaches(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["static", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--set" in out and "examples:" in out and "--json" in out


@pytest.mark.parametrize(("profile", "stage1"), [("paper", 24_671_158_272), ("megatron", None)])
def test_static_json_activations(profile, stage1, capsys):
    assert main(["static", str(SHIPPED), "--json", "--set", f'model.profile="{profile}"']) == 0
    doc = json.loads(capsys.readouterr().out)
    for d in doc["devices"]:
        assert d["activation_bytes_per_microbatch"] == sum(x["bytes"] for x in d["layer_activation_bytes"]) > 0
    d1 = doc["devices"][1]
    assert [x["layer"] for x in d1["layer_activation_bytes"]] == [4, 5, 6, 7]
    if stage1 is not None:
        assert d1["activation_bytes_per_microbatch"] == stage1
    else:
        assert d1["activation_bytes_per_microbatch"] < 24_671_158_272 // 4  # flash attention: no s² terms


def test_static_recompute_option_and_tensors(capsys):
    assert main(["static", str(SHIPPED), "--json", "--recompute", "full:uniform:1", "--tensors"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["run"]["recompute"] == "full:uniform:1"
    d1 = doc["devices"][1]
    assert d1["activation_bytes_per_microbatch"] == 235_143_168  # arXiv 2502.07846 T9
    t = d1["saved_tensors"][0]
    assert set(t) == {"layer", "name", "op", "shape", "dtype", "bytes"}
    assert main(["static", str(SHIPPED), "--tensors", "--set", 'model.profile="megatron"']) == 0
    out = capsys.readouterr().out
    assert "activations" in out and "softmax_lse" in out


def test_static_recompute_bad_grammar(capsys):
    assert main(["static", str(SHIPPED), "--recompute", "selective:attn"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "selective:MOD" in err and "core_attn" in err


def test_a_csv_schedule_places_the_devices(tmp_path, write_run, capsys):
    """``static`` of a V-shaped schedule written as CSV holds on each rank the chunks its rows run."""
    from helpers_run import TINY_RUN_TOML

    run = write_run(TINY_RUN_TOML + "[schedule]\nkind = \"zbv\"\n", name="v.toml")
    run.write_text(run.read_text().replace("pp = 2\n", "pp = 2\nvpp = 2\n"))
    csv = tmp_path / "v.csv"
    assert main(["schedule", str(run), "--csv", str(csv)]) == 0
    capsys.readouterr()
    assert main(["static", str(run), "--set", "schedule.kind=csv", "--set", f'schedule.csv="{csv}"', "--json"]) == 0
    assert [d["stages"] for d in json.loads(capsys.readouterr().out)["devices"]] == [[0, 3], [1, 2]]
