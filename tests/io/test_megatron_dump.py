"""``from-megatron`` on a job's log: the arguments block Megatron-LM prints (``timeline/io/megatron_dump.py``).

The blocks under ``tests/data/megatron/dumps/`` are Megatron-LM's own output: ``tools/megatron_dumps.py`` ran each
version's ``parse_args`` and ``validate_args`` on the calibration dataset's jobs. A block read back must give the
same run as the job's own arguments (``model_args``), at five parser versions from core_v0.12.0 to main.
"""

from __future__ import annotations

import dataclasses
import json
import lzma
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from timeline.errors import UserError
from timeline.io.megatron_args import from_mapping, read_log
from timeline.io.megatron_dump import infer_version, parse_value, printed_block, read_dump, table
from timeline.io.megatron_write import convert

ROOT = Path(__file__).resolve().parents[2]
DUMPS = ROOT / "tests/data/megatron/dumps"
DATA = ROOT.parent / "shared" / "measured" / "megatron_calibration.json"
#: file → (its parser's label, the Megatron-Core version it stands for, how many of the dataset's jobs it printed)
VERSIONS = {"core_v0.12.0": ("0.12.0", 72), "core_v0.14.0": ("0.14.0", 76), "core_v0.16.0": ("0.16.0", 131),
            "core_v0.18.0": ("0.18.0", 140), "main": ("0.20.0", 138)}
#: a functional test's folder → the family its harness runs (pretrain_t5.py, pretrain_bert.py)
FAMILIES = {"t5": "t5", "bert": "bert"}


def _dump(label: str) -> dict:
    return dict(json.loads(lzma.decompress((DUMPS / f"{label}.json.xz").read_bytes())))


def _sections(margs, world: int, core: str) -> dict | str:
    try:
        sections = convert(margs, world_size=world, megatron_core=core).sections
    except UserError as exc:
        return f"refused: {exc}"
    model = sections.get("model", {})
    if model.get("head_dim") is None and model.get("num_attention_heads"):  # the same head width, implied
        model["head_dim"] = model["hidden_size"] // model["num_attention_heads"]
    return sections


@pytest.mark.parametrize("label", sorted(VERSIONS))
def test_every_printed_block_reads_back_as_its_version(label: str) -> None:
    """The parser that printed a block is among the versions inferred: the newest of those whose parser has the
    block's names (releases with the same parser, as core_v0.12.0 … core_v0.12.3, cannot be told apart)."""
    data = _dump(label)
    assert data["provenance"]["version"] == label and len(data["jobs"]) == VERSIONS[label][1]
    versions = table()["versions"]
    labels = [v[0] for v in versions]
    dests = {i: {d for d, rows in table()["dests"].items() if any(r[4][i] == "1" for r in rows)}
             for i in range(len(labels))}
    for job in data["jobs"]:
        printed, blocks = printed_block(job["block"])
        assert blocks == 1 and printed["world_size"] == str(job["world_size"])
        i, note = infer_version(set(printed), None)
        assert i >= labels.index(label) and dests[i] == dests[labels.index(label)], job["name"]
        assert "with every name" in note


@pytest.mark.skipif(not DATA.exists(), reason=f"{DATA} is absent (the jobs' own arguments live in ../shared)")
@pytest.mark.parametrize("label", sorted(VERSIONS))
def test_a_printed_block_gives_the_run_its_arguments_give(label: str) -> None:
    core, count = VERSIONS[label]
    records = {r["name"]: r for r in json.loads(DATA.read_text())}
    compared = refused = 0
    for job in _dump(label)["jobs"]:
        family = FAMILIES.get(job["name"].split("/")[0])
        rec = records[job["name"]]
        given = _sections(from_mapping(rec["model_args"], job["env"], family=family), job["world_size"], core)
        margs = dataclasses.replace(read_log(job["block"], job["env"], core), family=family)
        assert margs.world_size == job["world_size"] and margs.megatron_core == core
        printed = _sections(margs, margs.world_size, core)
        assert printed == given, job["name"]
        compared += 1
        refused += isinstance(given, str)
    assert compared == count
    assert refused <= 8  # jobs from-megatron refuses either way (LLaVA, Megatron-FSDP under FP8, …): same message


def test_values_validate_args_converts_are_written_back_as_options_take_them() -> None:
    assert parse_value("torch.bfloat16") == "bf16" and parse_value("torch.uint8") == "fp8"
    assert parse_value("AttnBackend.auto") == "auto"
    assert parse_value("[<CudaGraphScope.attn: 2>, <CudaGraphScope.mlp: 3>]") == ["attn", "mlp"]
    assert parse_value("[0, 1, 1]") == [0, 1, 1] and parse_value("None") is None and parse_value("1e-05") == 1e-05
    assert parse_value("/data/my corpus") == "/data/my corpus"


def _block(lines: dict[str, str], prefix: str = "") -> str:
    body = [f"{prefix}  {k} {'.' * (48 - len(k))} {v}" for k, v in sorted(lines.items(), key=lambda kv: kv[0].lower())]
    return "\n".join([f"{prefix}------------------------ arguments ------------------------", *body,
                      f"{prefix}-------------------- end of arguments ---------------------"])


def _main_block(prefix: str = "", **over: str) -> str:
    """A main block of a small job, from the dumps' first main job, with ``over`` values."""
    printed, _ = printed_block(_dump("main")["jobs"][0]["block"])
    return _block({**printed, **over}, prefix)


def test_a_log_with_launcher_prefixes_long_names_and_memory_lines() -> None:
    """torchrun --tee's ``[default0]:`` before every line, names of 48 characters or more (no dots), and
    report_memory's line; a second block (a restart) is noted, the first read."""
    text = ("[default0]:using world size: 8\n" + _main_block("[default0]:", micro_batch_size="3")
            + "\n[default0]: [Rank 0] (after 10 iterations) memory (MB) | allocated: 1550.40 | max allocated: "
              "20561.49 | reserved: 28404.0 | max reserved: 28404.0\n" + _main_block("[default0]:"))
    dump = read_dump(text)
    assert dump.args["--micro-batch-size"] == "3"
    assert any("2 arguments blocks" in n for n in dump.notes)
    assert dump.memory[0].max_allocated == 20561.49 and dump.memory[0].iteration == 10
    long = "inference_dynamic_batching_cuda_graph_mixed_prefill_count"
    assert len(long) >= 48 and f"  {long}  " in _main_block()
    assert long in printed_block(_main_block())[0]


def test_a_forks_own_argument_is_refused_by_name_unless_passed_over(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text(_main_block(zero_stage="3", deepspeed_config="None"))
    cmd = [sys.executable, "-m", "timeline", "from-megatron", str(log)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and "--zero-stage" in done.stderr and "Traceback" not in done.stderr
    out = tmp_path / "run.toml"
    done = subprocess.run([*cmd, "--ignore-arg", "zero-stage", "-o", str(out)], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "passed over: deepspeed_config" in done.stderr  # no value: nothing to classify


def test_from_megatron_reads_a_log_end_to_end(tmp_path: Path) -> None:
    """The CLI on a log: world size, version and the log's memory lines from the log; the run file simulates."""
    log = tmp_path / "train.log"
    log.write_text("starting\n" + _main_block() + "\n [Rank 0] (after 2 iterations) memory (MB) | allocated: "
                   "1.0 | max allocated: 2.0 | reserved: 3.0 | max reserved: 4.0\n")
    out = tmp_path / "run.toml"
    done = subprocess.run([sys.executable, "-m", "timeline", "from-megatron", str(log), "-o", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "read as Megatron-Core 0.20.0 (main)" in done.stderr
    text = out.read_text()
    assert "max allocated 2.0 MiB" in text
    run = tomllib.loads(text)
    job = _dump("main")["jobs"][0]
    par = run["parallel"]
    assert par.get("tp", 1) * par.get("pp", 1) * par.get("dp", 1) * par.get("cp", 1) == job["world_size"]
    sim = subprocess.run([sys.executable, "-m", "timeline", "simulate", str(out), "-o", str(tmp_path / "sim"),
                          "--format", "summary", "--no-progress"], capture_output=True, text=True, cwd=ROOT)
    assert sim.returncode == 0, sim.stderr


def test_a_log_takes_no_launch_script_options(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(_main_block())
    done = subprocess.run([sys.executable, "-m", "timeline", "from-megatron", str(log), "--script-args", "1"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and "--script-args" in done.stderr and "job's log" in done.stderr


def test_the_logs_padded_vocab_stands_in_for_a_tokenizer_file_not_here() -> None:
    block = _main_block(vocab_size="None", tokenizer_type="HuggingFaceTokenizer", tokenizer_model="/data/tok")
    text = block + "\n > padded vocab (size: 128256) with 0 dummy tokens (new size: 128256)\n"
    assert read_dump(text).vocab_size == 128256
    margs = read_log(text, None, None)
    assert margs.args["--vocab-size"] == "128256" and any("padded vocab (size: 128256)" in n for n in margs.notes)
    assert "--vocab-size" not in read_log(block, None, None).args
