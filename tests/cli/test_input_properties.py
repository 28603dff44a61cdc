"""Property test: whatever a run file, a Hugging Face config or the command line says, timeline
exits 0, or exits 2 with exactly one ``error:`` line — never a traceback, never more than a few
seconds or a few hundred MiB.

Each example changes one key of a small valid run (dense or MoE), or one key of a small HF
config, or one command-line argument, to a value drawn from what users and typos produce:
out-of-range and non-finite numbers, wrong types, unknown names, huge counts. simulate runs
with ``--max-events 200000`` so that an example that asks for hours of work is refused by the
bound (which is itself under test) instead of run.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import resource
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from timeline.cli import main

DENSE = {"name": "prop", "model": {"preset": "llama3-8b", "num_hidden_layers": 2, "hidden_size": 128,
                                   "num_attention_heads": 4, "num_key_value_heads": 4,
                                   "intermediate_size": 256, "vocab_size": 512},
         "parallel": {"pp": 2}, "training": {"seq_len": 64, "num_microbatches": 2, "iterations": 1}}
MOE = {"name": "prop-moe", "model": {"preset": "deepseek-v3", "num_hidden_layers": 2, "first_k_dense_replace": 1,
                                     "hidden_size": 256, "n_routed_experts": 8, "moe_intermediate_size": 64,
                                     "intermediate_size": 256, "vocab_size": 512, "mtp_layers": 0},
       "parallel": {"pp": 1, "ep": 2, "dp": 2}, "training": {"seq_len": 64, "num_microbatches": 2, "iterations": 1}}
HF = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000}

KEYS = {
    "model": ["num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "vocab_size", "n_routed_experts", "num_experts_per_tok", "first_k_dense_replace",
              "moe_intermediate_size", "kv_lora_rank", "q_lora_rank", "mtp_layers", "norm", "hidden_act",
              "attention_dropout", "profile", "preset", "bogus_key"],
    "parallel": ["pp", "vpp", "tp", "sp", "cp", "ep", "etp", "dp", "layout", "bogus"],
    "training": ["micro_batch_size", "seq_len", "num_microbatches", "iterations", "dtype", "zero", "routing",
                 "routing_skew", "capacity_factor", "optimizer_step"],
    "recompute": ["policy", "modules", "method", "num_layers"],
    "schedule": ["kind", "csv", "microbatch_group_size"],
    "allocator": ["kind", "expandable_segments", "max_split_size_mb", "roundup_power2_divisions"],
    "hardware": ["gpu", "capacity_gib", "non_pytorch_gib", "bf16_tflops", "efficiency", "latency_us"],
}

NUMBERS = st.one_of(
    st.sampled_from([0, 1, 2, 3, 4, 7, 8, 16, -1, -3, 10**3, 10**6, 10**9, 10**12, 2**63, 2**64 + 1]),
    st.integers(min_value=-10, max_value=64),
    st.sampled_from([0.0, -0.0, 0.5, 1.5, 2.5, 1e-300, 1e300, math.nan, math.inf, -math.inf]),
    st.floats(allow_nan=True, allow_infinity=True),
)
WORDS = st.sampled_from(["", "none", "full", "selective", "uniform", "block", "1f1b", "dualpipev", "csv",
                         "bf16", "fp8", "int4", "megatron", "paper", "hf", "h100", "b200", "gpt2", "llama",
                         "../../x", "a" * 300, "ü", "skew", "ideal", "core_attn", "rmsnorm", "gelu"])
VALUES = st.one_of(NUMBERS, WORDS, st.booleans(), st.text(max_size=20),
                   st.lists(st.one_of(st.integers(-2, 40), WORDS), max_size=5),
                   st.dictionaries(st.sampled_from(["1MB", ">", "x", "256MB"]), st.integers(-2, 64), max_size=3))


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def _toml(data: dict) -> str:
    lines = [f"name = {_toml_value(data['name'])}"] if "name" in data else []
    for section, table in data.items():
        if section == "name":
            continue
        lines.append(f"[{section}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def _invoke(argv: list[str], cwd: Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), contextlib.chdir(cwd):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own exit
            code = exc.code if isinstance(exc.code, int) else 2
    return code, err.getvalue()


def _check(code: int, err: str) -> None:
    assert "Traceback" not in err, err
    assert code in (0, 2), (code, err)
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("note: ")]
    if code == 2:
        assert len(lines) == 1 and lines[0].startswith("error: "), err
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert peak_mib < 2048, peak_mib


COMMANDS = st.sampled_from(["static", "simulate", "schedule"])
PROPERTY = settings(max_examples=200, deadline=10_000, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def _argv(command: str, run: Path, out: Path) -> list[str]:
    if command == "simulate":
        return ["simulate", str(run), "-o", str(out), "--format", "summary,memory", "--max-events", "200000",
                "--no-progress"]
    return [command, str(run)]


@PROPERTY
@given(base=st.sampled_from([DENSE, MOE]), section=st.sampled_from(list(KEYS)), data=st.data(),
       value=VALUES, command=COMMANDS)
def test_any_one_run_file_value(base, section, data, value, command):
    key = data.draw(st.sampled_from(KEYS[section]))
    doc = json.loads(json.dumps(base))
    doc.setdefault(section, {})[key] = value
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "run.toml").write_text(_toml(doc), encoding="utf-8")
        code, err = _invoke(_argv(command, folder / "run.toml", folder / "out"), folder)
        _check(code, err)
        if code == 2:
            assert not (folder / "out").exists()


@PROPERTY
@given(key=st.sampled_from(sorted({*HF, "head_dim", "num_local_experts", "n_routed_experts", "num_experts_per_tok",
                                   "model_type", "architectures", "n_embd", "torch_dtype", "tie_word_embeddings"})),
       value=st.one_of(VALUES, st.none()), command=st.sampled_from(["static", "simulate"]))
def test_any_one_hf_config_value(key, value, command):
    cfg = dict(HF)
    cfg[key] = value
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        try:
            (folder / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
        except ValueError:  # a value JSON cannot hold
            return
        (folder / "run.toml").write_text('[model]\nhf_config = "config.json"\nprofile = "hf"\n'
                                         '[training]\nseq_len = 64\nnum_microbatches = 2\n', encoding="utf-8")
        code, err = _invoke(_argv(command, folder / "run.toml", folder / "out"), folder)
        _check(code, err)


ARGS = st.one_of(
    st.sampled_from(["--recompute", "--set", "--format", "--max-events", "--max-samples", "-o", "--force",
                     "--json", "--tensors", "--csv", "--gzip", "--snapshot-entries", "--bogus"]),
    st.sampled_from(["none", "full:uniform:0", "full:block:1,2,3", "selective:core_attn+moe", "selective:",
                     "training.seq_len=-1", "parallel.tp=3", "model.num_layers=1e9", "x=1", "a.b", "nan",
                     "summary,trace,perfetto", "", "0", "-5", "99999999999999999999", "out/../../x", "n" * 300]),
    st.text(max_size=12),
)


@PROPERTY
@given(command=st.sampled_from(["static", "simulate", "schedule", "compare", "fit", "presets", "plot", "replay"]),
       extra=st.lists(ARGS, max_size=4))
def test_any_command_line(command, extra):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "run.toml").write_text(_toml(DENSE), encoding="utf-8")
        argv = [command] + (["run.toml"] if command not in ("presets", "plot", "replay") else []) + extra
        if command == "simulate" and "--max-events" not in extra:
            argv += ["--max-events", "200000", "--format", "summary"]
        if command in ("compare", "fit") and "--max-events" not in extra:
            argv += ["--max-events", "200000"]
        code, err = _invoke(argv, folder)
        _check(code, err)


def test_the_unchanged_bases_run():
    """The examples start from runs that work: every failure above comes from the one change."""
    for base in (DENSE, MOE):
        for command in ("static", "simulate", "schedule"):
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp)
                (folder / "run.toml").write_text(_toml(base), encoding="utf-8")
                code, err = _invoke(_argv(command, folder / "run.toml", folder / "out"), folder)
                assert code == 0, (base["name"], command, err)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "config.json").write_text(json.dumps(HF), encoding="utf-8")
        (folder / "run.toml").write_text('[model]\nhf_config = "config.json"\nprofile = "hf"\n'
                                         '[training]\nseq_len = 64\nnum_microbatches = 2\n', encoding="utf-8")
        assert _invoke(["static", "run.toml"], folder)[0] == 0
