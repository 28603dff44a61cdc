"""``from-megatron`` on a job's log: the arguments block Megatron-LM prints (``timeline/io/megatron_dump.py``).

The blocks under ``tests/data/megatron/dumps/`` are Megatron-LM's own output: ``tools/megatron_dumps.py`` ran each
version's ``parse_args`` and ``validate_args`` on the jobs of the calibration dataset (five parser versions from
core_v0.12.0 to main) and on the collected records' calibration side (``collected-``: core_v0.15.0 and main), each
distinct argument set once. A block read back must give the same run as the argument vector Megatron parsed.
"""

from __future__ import annotations

import dataclasses
import json
import lzma
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from timeline.errors import UserError
from timeline.io.megatron_args import group_words, read_log
from timeline.io.megatron_dump import infer_version, parse_value, printed_block, read_dump, table
from timeline.io.megatron_write import convert

ROOT = Path(__file__).resolve().parents[2]
DUMPS = ROOT / "tests/data/megatron/dumps"
#: file → (the Megatron-Core version of the parser that printed it, how many jobs it printed a block for: Megatron's
#: own count, the rest refused by its parse_args / validate_args at that version)
VERSIONS = {"core_v0.12.0": ("0.12.0", 58), "core_v0.14.0": ("0.14.0", 60), "core_v0.16.0": ("0.16.0", 111),
            "core_v0.18.0": ("0.18.0", 118), "main": ("0.20.0", 116), "collected-core_v0.15.0": ("0.15.0", 306),
            "collected-main": ("0.20.0", 260)}
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


@pytest.mark.parametrize("name", sorted(VERSIONS))
def test_every_printed_block_reads_back_as_its_version(name: str) -> None:
    """The parser that printed a block is among the versions inferred: the newest of those whose parser has the
    block's names (releases with the same parser, as core_v0.12.0 … core_v0.12.3, cannot be told apart)."""
    data = _dump(name)
    label = data["provenance"]["version"]
    assert name.removeprefix("collected-") == label and len(data["jobs"]) == VERSIONS[name][1]
    labels = [v[0] for v in table()["versions"]]
    dests = {i: {d for d, rows in table()["dests"].items() if any(r[4][i] == "1" for r in rows)}
             for i in range(len(labels))}
    for job in data["jobs"]:
        printed, blocks = printed_block(job["block"])
        assert blocks == 1 and printed["world_size"] == str(job["world_size"])
        i, note = infer_version(set(printed), None)
        assert i >= labels.index(label) and dests[i] == dests[labels.index(label)], job["name"]
        assert "with every name" in note


@pytest.mark.parametrize("name", sorted(VERSIONS))
def test_a_printed_block_gives_the_run_its_arguments_give(name: str) -> None:
    core, count = VERSIONS[name]
    compared = 0
    for job in _dump(name)["jobs"]:
        family = FAMILIES.get(job["name"].split("/")[0])
        given = _sections(dataclasses.replace(group_words(job["argv"], env=job["env"]), family=family),
                          job["world_size"], core)
        margs = dataclasses.replace(read_log(job["block"], job["env"], core), family=family)
        assert margs.world_size == job["world_size"] and margs.megatron_core == core
        assert _sections(margs, margs.world_size, core) == given, job["name"]
        compared += 1
        if isinstance(given, str):  # refused either way, for one of the job's own arguments (or its world size)
            named = re.match(r"refused: (--[\w-]+)", given)
            assert named and (named[1] in job["argv"] or named[1] == "--world-size"), (job["name"], given)
    assert compared == count


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


def test_empty_values_with_their_trailing_space_stripped_do_not_end_the_block() -> None:
    """An editor strips the space after an empty value's dots (``  wandb_exp_name ......``): the block goes on."""
    block = _main_block(wandb_exp_name="")
    stripped = "\n".join(line.rstrip() for line in block.splitlines())
    assert "  wandb_exp_name " + "." * 34 + "\n" in stripped + "\n"
    assert printed_block(stripped)[0] == printed_block(block)[0]
    assert len(printed_block(stripped)[0]) > 800
    # a truncated block ends at the first line that is no attribute, not at a log line that looks like two words
    cut = block.split("-------------------- end")[0] + "  > building GPT model ...\n  hidden_size ... 7\n"
    assert "building" not in printed_block(cut)[0] and printed_block(cut)[0]["hidden_size"] != "7"


def test_an_fp16_logs_iteration_lines_say_whether_the_optimizer_stepped() -> None:
    """From-megatron takes an fp16 job's first iterations as skipped steps (no Adam moments yet); the log's
    ``number of skipped iterations`` per interval says whether a step came before its memory line."""
    block = _main_block(fp16="True", bf16="False", loss_scale="None")
    line = (" iteration {it:8d}/     100 | consumed samples: 8 | lm loss: 1.0 | loss scale: 1.0 | "
            "number of skipped iterations: {sk:3d} | number of nan iterations:   0 |\n")
    memory = " [Rank 0] (after 20 iterations) memory (MB) | allocated: 1 | max allocated: 2 | reserved: 3 | " \
             "max reserved: 4\n"
    all_skipped = block + "\n" + line.format(it=10, sk=10) + line.format(it=20, sk=10) + memory
    stepped = block + "\n" + line.format(it=10, sk=10) + line.format(it=20, sk=7) + memory
    later = block + "\n" + line.format(it=10, sk=10) + line.format(it=20, sk=10) + memory + line.format(it=30, sk=0)
    assert [read_dump(t).optimizer_stepped for t in (all_skipped, stepped, later)] == [False, True, False]
    core = "0.20.0"
    for text, step in ((all_skipped, False), (stepped, True)):
        margs = read_log(text, None, core)
        sections = convert(margs, world_size=margs.world_size, megatron_core=core).sections
        assert sections["training"]["dtype"] == "fp16"
        assert sections["training"].get("optimizer_step", True) is step


def test_the_model_the_log_says_it_built_is_the_family() -> None:
    block = _main_block()
    assert read_log(block, None, None).family is None
    bert = read_log(block + "\nbuilding BERT model ...\n", None, None)
    assert (bert.family, bert.family_source) == ("bert", "the log's 'building BERT model ...'")
    assert read_log(block + "\n> building T5 model ...\n", None, None).family == "t5"
    assert read_log(block + "\nbuilding a multimodal model ...\n", None, None).family == "vlm"


def test_the_logs_parameter_counts_check_the_model_and_give_a_vocabulary_the_arguments_do_not(tmp_path: Path) -> None:
    """``get_model``'s ``number of parameters on (tensor, pipeline) model parallel rank (0, P)`` is held against
    the run's own count; where the arguments name no tokenizer (GPT-2's vocabulary assumed), the vocabulary is
    solved from the first rank's count: the count is affine in the padded rows."""
    from timeline.cli.from_megatron import _run_of, _stage_params, param_count_notes, solved_vocab
    from timeline.io.megatron_write import run_file_text

    block = _main_block(vocab_size="None", tokenizer_type="None", tokenizer_model="None")
    margs = read_log(block, None, None)
    assert "--vocab-size" not in margs.args and not margs.param_counts

    def text_with(vocab: int | None) -> str:
        args = margs.args if vocab is None else {**margs.args, "--vocab-size": str(vocab)}
        conv = convert(dataclasses.replace(margs, args=args), world_size=margs.world_size,
                       megatron_core=margs.megatron_core)
        return run_file_text(conv, name="job", source="job.log", world_size=margs.world_size)

    run = _run_of(text_with(151_643))  # Qwen2's tokenizer: 151,643 tokens, 151,680 rows (tp 1) or more
    counts = _stage_params(run)
    logged = tuple((0, p, n) for p, n in enumerate(counts))
    line = "".join(f" > number of parameters on (tensor, pipeline) model parallel rank (0, {p}): {n}\n"
                   for p, n in enumerate(counts))
    assert read_log(block + "\n" + line, None, None).param_counts == logged
    guessed = text_with(None)
    assert _run_of(guessed).model.vocab_size == 50_257
    assert param_count_notes(guessed, logged)[0].startswith("the log counts")
    solved = solved_vocab(guessed, logged)
    step = run.framework.make_vocab_size_divisible_by * run.parallel.tp
    assert solved is not None and -(-solved // step) == -(-151_643 // step)  # the same padded rows
    assert param_count_notes(text_with(solved), logged)[0].startswith("the log's parameter count equals the run's")
    assert solved_vocab(guessed, ((0, 0, counts[0] + 1),)) is None  # no whole number of rows: nothing solved
    log = tmp_path / "job.log"
    log.write_text(block + "\n" + line)
    out = tmp_path / "run.toml"
    done = subprocess.run([sys.executable, "-m", "timeline", "from-megatron", str(log), "-o", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert tomllib.loads(out.read_text())["model"]["vocab_size"] == solved
    assert "the log's parameter count equals the run's" in done.stderr and "the vocabulary is" in done.stderr


def test_the_dest_table_is_the_parser_tables_own() -> None:
    """``timeline/io/megatron_parser_dests.json`` is derived from ``tests/data/megatron/parser_args.json``
    (``tools/megatron_parser_args.py --dests-only``): regenerate it when the parser table changes."""
    sys.path.insert(0, str(ROOT / "tools"))
    from megatron_parser_args import dests_of

    parsers = json.loads((ROOT / "tests/data/megatron/parser_args.json").read_text())
    assert dests_of(parsers) == table()["dests"]
    assert [v[0] for v in table()["versions"]] == [v["label"] for v in parsers["provenance"]["versions"]]
    assert {"world_size", "rank", "data_parallel_size", "params_dtype"} <= set(table()["assigned"])


@pytest.mark.parametrize("name", sorted(VERSIONS))
def test_what_validate_args_derived_is_what_the_run_holds(name: str) -> None:
    """Megatron's own ``validate_args`` is the oracle for the sizes it derives: the FFN width (4h, or SwiGLU's
    rounded ⅔ of it), the head width, the KV heads, the data-parallel size, the virtual pipeline size, the micro-batch
    count, the expert sizes — each as the block prints it, against the run from-megatron writes."""
    core, _ = VERSIONS[name]
    compared = refused = 0
    for job in _dump(name)["jobs"]:
        family = FAMILIES.get(job["name"].split("/")[0])
        sections = _sections(dataclasses.replace(read_log(job["block"], job["env"], core), family=family),
                             job["world_size"], core)
        if isinstance(sections, str):
            refused += 1
            continue
        p = {k: parse_value(v) for k, v in printed_block(job["block"])[0].items()}
        model, par, tr = sections["model"], sections["parallel"], sections["training"]
        held = {"dp": (par.get("dp"), p["data_parallel_size"]), "seq": (tr["seq_len"], p["seq_length"]),
                "vpp": (par.get("vpp", 1), p.get("virtual_pipeline_model_parallel_size") or 1),
                "ep": (par.get("ep", 1), p["expert_model_parallel_size"]), "cp": (par.get("cp", 1),
                                                                                p["context_parallel_size"])}
        if "intermediate_size" in model and p.get("ffn_hidden_size") is not None:
            held["ffn"] = (model["intermediate_size"], p["ffn_hidden_size"])
        if not p.get("multi_latent_attention"):
            held["head width"] = (model["head_dim"], p["kv_channels"])
            held["kv heads"] = (model.get("num_key_value_heads"), p["num_query_groups"] if p.get(
                "group_query_attention") else p["num_attention_heads"])
        if p.get("num_experts"):
            held["experts"] = (model.get("n_routed_experts"), p["num_experts"])
            held["expert ffn"] = (model.get("moe_intermediate_size"), p["moe_ffn_hidden_size"])
        if not p.get("rampup_batch_size"):
            held["micro-batches"] = (tr["num_microbatches"],
                                     p["global_batch_size"] // (p["micro_batch_size"] * p["data_parallel_size"]))
        assert {k: v for k, v in held.items() if v[0] != v[1]} == {}, job["name"]
        compared += 1
    assert compared > 0 and compared + refused == len(_dump(name)["jobs"])


def test_from_megatron_compare_prints_the_logs_peaks_beside_the_simulated(tmp_path: Path) -> None:
    """``--compare``: each report_memory line's max allocated / max reserved beside the simulated peaks of its
    pipeline rank's device, as ``simulate`` reports them (warm-up none: Megatron's peaks are never reset)."""
    log = tmp_path / "train.log"
    log.write_text(_main_block() + "\n [Rank 0] (after 1 iterations) memory (MB) | allocated: 800.0 | max allocated: "
                   "950.0 | reserved: 1000.0 | max reserved: 1100.0\n"
                   " [Rank 0] (after 2 iterations) memory (MB) | allocated: 900.0 | max allocated: "
                   "1000.0 | reserved: 1100.0 | max reserved: 1200.0\n")
    out = tmp_path / "run.toml"
    done = subprocess.run([sys.executable, "-m", "timeline", "from-megatron", str(log), "-o", str(out), "--compare"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if "1,000.0 /" in line)
    assert row.split()[:3] == ["0", "0", "2"] and "1,200.0 /" in row
    sim = subprocess.run([sys.executable, "-m", "timeline", "simulate", str(out), "-o", str(tmp_path / "s"),
                          "--format", "summary", "--no-progress"], capture_output=True, text=True, cwd=ROOT)
    assert sim.returncode == 0, sim.stderr
    dev = json.loads((tmp_path / "s" / "summary.json").read_text())["devices"][0]
    assert f"/ {dev['peak_allocated_bytes'] / 2**20:>10,.1f}" in row
    assert f"/ {dev['peak_reserved_bytes'] / 2**20:>10,.1f}" in row
    # the line after iteration 1: against one simulated iteration (the peak so far)
    first = next(line for line in done.stdout.splitlines() if "950.0 /" in line)
    one = subprocess.run([sys.executable, "-m", "timeline", "simulate", str(out), "-o", str(tmp_path / "s1"),
                          "--format", "summary", "--no-progress", "--set", "training.iterations=1"],
                         capture_output=True, text=True, cwd=ROOT)
    assert one.returncode == 0, one.stderr
    dev1 = json.loads((tmp_path / "s1" / "summary.json").read_text())["devices"][0]
    assert f"/ {dev1['peak_allocated_bytes'] / 2**20:>10,.1f}" in first
    assert dev1["peak_allocated_bytes"] < dev["peak_allocated_bytes"]
    bare = tmp_path / "bare.log"
    bare.write_text(_main_block())
    refused = subprocess.run([sys.executable, "-m", "timeline", "from-megatron", str(bare), "--compare"],
                             capture_output=True, text=True, cwd=ROOT)
    assert refused.returncode == 2 and "--compare" in refused.stderr and "report_memory" in refused.stderr


def _older_block(label: str, **over: str) -> str:
    """A block as ``label`` (a release before core_v0.12.0) prints one: the first core_v0.12.0 job's values for the
    names both parsers have, the older parser's own dests at their defaults there (``megatron_parser_older.json``,
    read from that release's source), with ``over`` values."""
    from timeline.io.megatron_dump import older_table

    o = older_table()
    j = [v[0] for v in o["versions"]].index(label)
    old = {d: rows for d, rows in o["dests"].items() if any(r[4][j] == "1" for r in rows)}
    printed, _ = printed_block(_dump("core_v0.12.0")["jobs"][0]["block"])
    values = {k: v for k, v in printed.items() if k in old or k in table()["assigned"]}
    for dest, rows in old.items():
        if dest not in printed and dest not in table()["dests"]:
            row = next(r for r in rows if r[4][j] == "1")
            values[dest] = str(parse_value(row[3]))
    return _block({**values, **over})


def test_a_release_before_core_v0_12_is_read_with_its_own_parser(tmp_path: Path) -> None:
    """core_v0.6.0's block: its own arguments (--no-delay-grad-reduce's delay_grad_reduce True, one_logger_entity
    hwinf_dcm, …) at their defaults there are left out, not refused; its version is read from them."""
    block = _older_block("core_v0.6.0", use_mcore_models="True")
    dump = read_dump(block)
    assert (dump.version, dump.megatron_core) == ("core_v0.6.0", "0.6.0")
    assert not any(k in dump.args for k in ("--no-delay-grad-reduce", "--one-logger-entity", "--use-legacy-models"))
    assert any("at their default there" in n for n in dump.notes)
    new = read_dump(_dump("core_v0.12.0")["jobs"][0]["block"])
    # the same job, printed by the older release: the options of the names both parsers have
    assert dump.args.items() <= new.args.items() and len(dump.args) > 10
    # before core_v0.8.0 the legacy model is the default: use_mcore_models False is --use-legacy-models
    assert read_dump(_older_block("core_v0.6.0", use_mcore_models="False")).args["--use-legacy-models"] is True
    assert "--use-legacy-models" not in read_dump(_older_block("core_v0.9.0")).args  # 0.8 on: mcore's default
    # an older argument given a value its memory is not modelled for: passed on by its option, refused by name
    log = tmp_path / "old.log"
    log.write_text(_older_block("core_v0.6.0", use_mcore_models="True", standalone_embedding_stage="True"))
    done = subprocess.run([sys.executable, "-m", "timeline", "from-megatron", str(log)], capture_output=True,
                          text=True, cwd=ROOT)
    assert done.returncode == 2 and "--standalone-embedding-stage" in done.stderr
    assert "Traceback" not in done.stderr
    # use_dist_ckpt: the checkpoint format core_v0.12.0 names --ckpt-format
    dist = read_dump(_older_block("core_v0.7.0", use_mcore_models="True", use_dist_ckpt="True",
                                  dist_ckpt_format="zarr"))
    assert dist.args["--ckpt-format"] == "zarr" and dist.version == "core_v0.7.0"
    assert read_dump(_older_block("core_v0.7.0", use_mcore_models="True", use_dist_ckpt="False")
                     ).args["--ckpt-format"] == "torch"


def test_lines_srun_cut_in_two_are_joined() -> None:
    """srun's ``--label`` (``0: ``) before torchrun's ``[default0]:``: output buffering cuts an attribute's line in
    two (the rest under ``0: `` alone), cuts the inner prefix itself (``0: [`` then ``0: default0]:  name …``), puts an
    empty labelled line between two, or cuts a long list value over several lines; every attribute is read whole."""
    lines = _main_block("0: [default0]:", micro_batch_size="3", data_path="['/data/a_tokens', '/data/b_tokens']")
    out = []
    for line in lines.splitlines():
        if "  micro_batch_size " in line:
            out += [line[:-3], "0: " + line[-3:]]  # "… micro_batch_size ......" / "0: .. 3"
        elif "  data_path " in line:
            cut = line.index("a_tok")
            out += [line[:cut], "0: " + line[cut:cut + 20], "0: " + line[cut + 20:]]
        elif "  seq_length " in line:
            out += ["0: [", "0: " + line[len("0: ["):], "0: "]
        else:
            out.append(line)
    printed, _ = printed_block("\n".join(out))
    whole, _ = printed_block(lines)
    assert printed == whole and printed["micro_batch_size"] == "3"
    assert printed["data_path"] == "['/data/a_tokens', '/data/b_tokens']"
    # srun's label alone as the whole prefix: a number cut in its digits, a list left open, are joined; another
    # process's line under the same label is not taken into the value before it
    alone = _main_block(" 0: ", lr="0.0001", data_path="['/data/a_tokens', '/data/b_tokens']")
    cut = []
    for line in alone.splitlines():
        if "  lr " in line:
            cut += [line[:-2], " 0: " + line[-2:]]
        elif "  data_path " in line:
            k = line.index("b_tok")
            cut += [line[:k], " 0: " + line[k:]]
        elif "  seq_length " in line:
            cut += [line, " 0: WARNING: something else"]
        else:
            cut.append(line)
    got, _ = printed_block("\n".join(cut))
    assert got["lr"] == "0.0001" and got["data_path"] == "['/data/a_tokens', '/data/b_tokens']"
    assert got == printed_block(alone)[0]  # the other line skipped: the block is closed after it
    # a first block cut short by a restart, whose own block follows: read up to the restart, nothing after it
    first = "\n".join(lines.splitlines()[:40]) + "\n0: [default0]:  successfully loaded checkpoint from /c\n"
    got, blocks = printed_block(first + lines)
    assert blocks == 2 and "successfully" not in got and len(got) == len(printed_block(first)[0])
    # a block cut before its world_size: validate_args's own "using world size" line gives it
    text = "0: [default0]:using world size: 16, data-parallel size: 16\n" + "\n".join(
        ln for ln in lines.splitlines() if "  world_size " not in ln)
    assert read_dump(text).world_size == 16


def test_a_long_log_file_name_gives_a_valid_run_name(tmp_path: Path) -> None:
    log = tmp_path / ("github.com_owner_repo_blob_" + "0123456789abcdef" * 6 + "_logs_job #7.out.log")
    log.write_text(_main_block())
    out = tmp_path / "run.toml"
    done = subprocess.run([sys.executable, "-m", "timeline", "from-megatron", str(log), "-o", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    name = tomllib.loads(out.read_text())["name"]
    assert len(name) == 100 and name.startswith("github.com_owner_repo_blob_0123") and " " not in name


def test_a_memory_line_srun_cut_is_read_whole_and_a_loaded_checkpoint_means_resumed(tmp_path: Path) -> None:
    mem = ("0: [default0]:[Rank 0] (after 2 iterations) memory (MB) | allocated: 14234.91 | max allocated: 40146.02 | "
           "reserved: 41370.00 | max reserved: 41370.00")
    for cut in (mem.index("erved: 41370"), mem.rindex("41370") + 3):  # in a word, in the last number
        text = _main_block("0: [default0]:") + "\n" + mem[:cut] + "\n0: " + mem[cut:] + "\n0: [default0]: iteration"
        (line,) = read_dump(text).memory
        assert (line.iteration, line.max_allocated, line.reserved, line.max_reserved) == (2, 40146.02, 41370.0,
                                                                                           41370.0)
    # a line followed by an elision ("..." of a log pasted into notes): not a number's rest
    (line,) = read_dump(_main_block() + "\n" + mem[3:] + "\n...\n").memory
    assert line.max_reserved == 41370.0
    log = tmp_path / "resumed.log"
    log.write_text(_main_block() + "\n  successfully loaded checkpoint from /ckpt [ t 1/1, p 1/1 ] at iteration 500\n")
    done = subprocess.run([sys.executable, "-m", "timeline", "from-megatron", str(log), "-o", str(tmp_path / "r.toml")],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "read as --resumed" in done.stderr
    assert tomllib.loads((tmp_path / "r.toml").read_text())["training"]["resumed"] is True
