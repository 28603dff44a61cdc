"""``timeline from-megatron``: stdout or -o, the header block, a file that simulates as it stands,
and bad input as one ``error:`` line with exit 2 and nothing half-written."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from timeline.cli import main
from timeline.io.runfile import load_run

ARGS = {"num-layers": 2, "hidden-size": 128, "num-attention-heads": 4, "seq-length": 256, "micro-batch-size": 1,
        "global-batch-size": 4, "bf16": True, "tensor-model-parallel-size": 2, "sequence-parallel": True,
        "pipeline-model-parallel-size": 2, "save": "${CHECKPOINT_SAVE_PATH}", "log-interval": 1}


def _config(tmp: Path, args: dict = ARGS, env: dict | None = None) -> Path:
    path = tmp / "test_cases" / "gpt" / "tiny_case" / "model_config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({"MODEL_ARGS": args, "ENV_VARS": env or {"NCCL_ALGO": "Ring"}}))
    return path


def test_writes_a_run_file_that_loads_and_says_where_each_argument_went(tmp_path, capsys):
    out = tmp_path / "job.toml"
    assert main(["from-megatron", str(_config(tmp_path)), "--world-size", "8", "-o", str(out)]) == 0
    text = out.read_text()
    assert "#   --num-layers -> model.num_layers" in text
    assert "#   --save (checkpointing)" in text and "$NCCL_ALGO" in text
    run = load_run(out)
    assert run.name == "tiny_case" and run.parallel.dp == 2 and run.training.num_microbatches == 2
    assert run.model.hidden_dropout == 0.1 and run.framework.attention_backend == "fused"


def test_stdout_without_output(tmp_path, capsys):
    assert main(["from-megatron", str(_config(tmp_path)), "--world-size", "4", "--gpu", "gb200",
                 "--te-version", "2.3"]) == 0
    text = capsys.readouterr().out
    assert 'gpu = "gb200"' in text and 'transformer_engine = "2.3"' in text


def test_pytorch_version_is_written_and_checked(tmp_path, capsys):
    cfg = str(_config(tmp_path))
    assert main(["from-megatron", cfg, "--world-size", "4", "--gpu", "gb200", "--pytorch-version", "2.11"]) == 0
    assert 'pytorch = "2.11"' in capsys.readouterr().out
    assert main(["from-megatron", cfg, "--world-size", "4"]) == 0
    assert 'pytorch = "2.13"' in capsys.readouterr().out
    assert main(["from-megatron", cfg, "--world-size", "4", "--pytorch-version", "2"]) == 2
    assert capsys.readouterr().err.strip() == "error: --pytorch-version '2': expected X.Y or X.Y.Z"


def test_optimizer_impl_is_written_only_where_transformer_engine_is_absent(tmp_path, capsys):
    local = {k: v for k, v in ARGS.items() if k != "sequence-parallel"} | {"transformer-impl": "local"}
    cfg = str(_config(tmp_path / "a", local))
    assert main(["from-megatron", cfg, "--world-size", "4", "--optimizer-impl", "torch_foreach"]) == 0
    assert 'optimizer_impl = "torch_foreach"' in capsys.readouterr().out
    assert main(["from-megatron", cfg, "--world-size", "4"]) == 0  # TE's FusedAdam, the default: not written
    assert "\noptimizer_impl =" not in capsys.readouterr().out
    # TE's layers (Megatron's default --transformer-impl) need TE installed, and then its Adam is imported
    assert main(["from-megatron", str(_config(tmp_path / "b")), "--world-size", "4", "--optimizer-impl",
                 "apex_fused"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --optimizer-impl apex_fused: means Transformer Engine is not installed") \
        and "--transformer-impl local" in err and "\n" not in err


def test_megatron_core_version_is_written_and_checked(tmp_path, capsys):
    cfg = str(_config(tmp_path))
    assert main(["from-megatron", cfg, "--world-size", "4", "--megatron-core", "0.15.0rc3"]) == 0
    assert 'megatron_core = "0.15.0rc3"' in capsys.readouterr().out
    assert main(["from-megatron", cfg, "--world-size", "4"]) == 0
    captured = capsys.readouterr()  # no version: the newest release read, said in a note
    assert 'megatron_core = "0.19.0"' in captured.out and "read as 0.19.0, the newest release" in captured.err
    assert main(["from-megatron", cfg, "--world-size", "4", "--megatron-core", "core_r0.15"]) == 2
    assert capsys.readouterr().err.strip() == "error: --megatron-core 'core_r0.15': expected X.Y, X.Y.Z or X.Y.ZrcN"


def test_bad_input_is_one_error_line_and_nothing_written(tmp_path, capsys):
    out = tmp_path / "job.toml"
    cfg = _config(tmp_path, ARGS | {"fp4-format": "e2m1"})
    assert main(["from-megatron", str(cfg), "--world-size", "8", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --fp4-format")
    assert not out.exists() and list(tmp_path.iterdir()) == [tmp_path / "test_cases"]


def test_refuses_a_family_named_by_its_folder(tmp_path, capsys):
    path = tmp_path / "test_cases" / "t5" / "case" / "model_config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({"MODEL_ARGS": ARGS}))
    assert main(["from-megatron", str(path), "--world-size", "8"]) == 2
    assert "T5" in capsys.readouterr().err


def test_existing_output_needs_force(tmp_path, capsys):
    out = tmp_path / "job.toml"
    out.write_text("keep")
    cfg = _config(tmp_path)
    assert main(["from-megatron", str(cfg), "--world-size", "8", "-o", str(out)]) == 2
    assert out.read_text() == "keep"
    assert main(["from-megatron", str(cfg), "--world-size", "8", "-o", str(out), "--force"]) == 0
    assert out.read_text().startswith("# written by")


def test_world_size_that_does_not_divide(tmp_path, capsys):
    assert main(["from-megatron", str(_config(tmp_path)), "--world-size", "6"]) == 2
    assert "tp·pp·cp" in capsys.readouterr().err


@pytest.mark.parametrize("name, text, needle", [
    ("missing.yaml", None, "no such file"),
    ("bad.yaml", "MODEL_ARGS: [unclosed", "invalid YAML"),
    ("nomodel.yaml", "ENV_VARS: {}\n", "MODEL_ARGS"),
    ("empty.txt", "# nothing here\n", "no --arguments"),
    ("var.txt", "--num-layers $LAYERS --hidden-size 64 --num-attention-heads 4 --seq-length 64 "
                "--micro-batch-size 1", "--num-layers"),
])
def test_unreadable_configs_are_one_error_line(tmp_path, capsys, name, text, needle):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    assert main(["from-megatron", str(path), "--world-size", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and needle in err[0]


@pytest.mark.parametrize(("args", "megatron_core", "needle"), [
    ({"num-layer": 2}, None, "--num-layer: not an argument of Megatron-LM's training parser (core_v0.12.0 … main); "
                             "did you mean --num-layers"),
    ({"step-batch-size-schedule": "0:4 1M:8"}, "0.14.0",
     "--step-batch-size-schedule: introduced in Megatron-Core 0.18.0 (core_v0.18.0); --megatron-core 0.14.0"),
    ({"use-legacy-models": True}, "0.19.0", "--use-legacy-models: removed after Megatron-Core 0.17.1 (core_v0.17.1)"),
])
def test_an_argument_no_version_or_not_this_version_has_is_one_line(tmp_path, capsys, args, megatron_core, needle):
    extra = ["--megatron-core", megatron_core] if megatron_core else []
    assert main(["from-megatron", str(_config(tmp_path, ARGS | args)), "--world-size", "8", *extra]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_functional_tests_inference_mode_is_refused_as_a_job(tmp_path, capsys):
    path = _config(tmp_path)
    path.write_text(yaml.safe_dump({"MODE": "inference", "MODEL_ARGS": ARGS | {"num-tokens-to-generate": 8}}))
    assert main(["from-megatron", str(path), "--world-size", "8"]) == 2
    assert capsys.readouterr().err.strip().endswith("MODE: inference: an inference job (MODE: inference); "
                                                    "timeline simulates training")


def test_resumed_writes_a_run_that_loads_the_optimizer_state(tmp_path, capsys):
    cfg = str(_config(tmp_path, ARGS | {"ckpt-fully-parallel-load": True}))
    assert main(["from-megatron", cfg, "--world-size", "8"]) == 0  # nothing loaded: the flag moves nothing
    assert "resumed = false" in capsys.readouterr().out
    # dp·cp = 2: a fully parallel load broadcasts each shard into the tensor the plain load reads into
    assert main(["from-megatron", cfg, "--world-size", "8", "--resumed"]) == 0
    assert "resumed = true" in capsys.readouterr().out
    out = tmp_path / "job.toml"
    assert main(["from-megatron", str(_config(tmp_path / "b")), "--world-size", "8", "--resumed", "-o", str(out)]) == 0
    run = load_run(out)
    assert run.training.resumed and run.framework.checkpoint_format == "torch_dist"
    # EP 2 over a DP·CP group of 4 (tp 2 on 16 GPUs): expert shards half the group needs; the run is the plain
    # load's, and the user is told the exchange buffers can add to the peak before the first iterations
    moe = ARGS | {"ckpt-fully-parallel-load": True, "num-experts": 4, "expert-model-parallel-size": 2,
                  "moe-router-topk": 2}
    out = tmp_path / "moe.toml"
    assert main(["from-megatron", str(_config(tmp_path / "c", moe)), "--world-size", "16", "--resumed",
                 "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "--ckpt-fully-parallel-load over the DP·CP group of 4: it holds 2 different expert shards" in err
    assert "note: --ckpt-fully-parallel-load over the DP·CP group of 4" in out.read_text()
    assert load_run(out).training.resumed


A5000 = ["--gpu", "my-a5000", "--gpu-field", "capacity_gib=23.68", "--gpu-field", "sm=86", "--gpu-field", "sms=64",
         "--gpu-field", "bf16_tflops=111.1", "--gpu-field", "hbm_gbps=768"]
MULTI = ["--gpu-field", "interconnect=pcie", "--gpu-field", "nvlink_gbps=56.25", "--gpu-field", "network_gbps=25"]


def test_a_gpu_no_preset_holds_with_its_fields(tmp_path, capsys):
    """Any GPU name, its fields given by --gpu-field, goes into the run file as given; the file loads with them
    (and the conversion's compute-capability rules read the given ``sm``)."""
    out = tmp_path / "job.toml"
    assert main(["from-megatron", str(_config(tmp_path)), "--world-size", "8", *A5000, *MULTI, "-o", str(out)]) == 0
    run = load_run(out)
    hw = run.hardware
    assert (hw.gpu, hw.capacity_gib, hw.sm, hw.sms, hw.bf16_tflops, hw.hbm_gbps, hw.interconnect, hw.nvlink_gbps,
            hw.network_gbps) == ("my-a5000", 23.68, 86, 64, 111.1, 768.0, "pcie", 56.25, 25.0)


@pytest.mark.parametrize("extra, fragments", [
    (A5000, ["--gpu my-a5000: no preset", "interconnect: ", "nvlink_gbps: ", "network_gbps: "]),  # 8 GPUs: links
    (["--gpu", "my-a5000"], ["sms: ", "capacity_gib: "]),
    (["--gpu-field", "smz=3"], ["--gpu-field 'smz=3'", "sms"]),
    (["--gpu-field", "sms=many"], ["sms takes an integer"]),
])
def test_a_gpu_without_its_fields_is_one_error_line(tmp_path, capsys, extra, fragments):
    out = tmp_path / "job.toml"
    assert main(["from-megatron", str(_config(tmp_path)), "--world-size", "8", *extra, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    assert all(f in err[0] for f in fragments), err[0]
    assert not out.exists()


FORK_SCRIPT = """#!/bin/bash
TP=$1
PP=$2
NUM_LAYERS=6
if [ -z ${MP_PP0_LAYERS} ]; then
    uneven=""
else
    uneven="--decoder-first-pipeline-num-layers ${MP_PP0_LAYERS}"
fi
TRAIN_ITERS=$(( ${TRAIN_TOKENS} / 1024 ))
if [ ${TRAIN_ITERS} -gt 0 ]; then
    iters="--train-iters ${TRAIN_ITERS}"
fi
torchrun --nproc_per_node 8 --nnodes 1 pretrain_qwen.py \\
    --num-layers ${NUM_LAYERS} --hidden-size 128 --num-attention-heads 4 --seq-length 256 \\
    --max-position-embeddings 256 --micro-batch-size 1 --global-batch-size 8 --bf16 \\
    --tensor-model-parallel-size ${TP} --pipeline-model-parallel-size ${PP} ${uneven} \\
    ${iters} --vocab-size 1024 --tokenizer-type NullTokenizer \\
    --patch-tokenizer-type Qwen2Tokenizer --extra-vocab-size 293 --train-mode pretrain
"""
FORK_IGNORE = ["--ignore-arg", "patch-tokenizer-type,extra-vocab-size,train-mode"]


def test_a_forks_launch_script_as_a_user_runs_it(tmp_path, capsys):
    """A Pai-Megatron-Patch-style script: positional arguments, variables from the environment it starts in
    (``--script-env``), its own arguments named all at once, its own entry script read as pretrain_gpt.py with a
    note in the error stream and the run file's header."""
    script = tmp_path / "run_mcore_qwen.sh"
    script.write_text(FORK_SCRIPT)
    out = tmp_path / "job.toml"
    base = ["from-megatron", str(script), "--script-args", "2 4", "-o", str(out)]
    # TRAIN_TOKENS is the environment's: unset, the block that reads it cannot be decided; not a number, likewise
    assert main(base) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {script}: line 14: iters reaches the job's arguments, and its value only running the script decides "
        "(line 11: `[ ${TRAIN_ITERS} -gt 0 ]` reads a variable whose value is undecided: $(( ${TRAIN_TOKENS} / 1024 "
        ")): TRAIN_TOKENS is not set (give its value with --script-env TRAIN_TOKENS=N, or check --script-args)); "
        "pass the job's arguments as a list instead")
    assert main([*base, "--script-env", "TRAIN_TOKENS=/data/tokens"]) == 2
    assert "TRAIN_TOKENS is '/data/tokens', not a number (check --script-args)" in capsys.readouterr().err
    # every argument of no Megatron-LM version in one line, with the --ignore-arg that passes over them all
    assert main([*base, "--script-env", "TRAIN_TOKENS=1048576"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "; if they are a fork's (or a pre-core_v0.12 Megatron-LM's) own arguments, --ignore-arg "
        "patch-tokenizer-type,extra-vocab-size,train-mode passes over them; a job of a Megatron-LM later than main "
        "(--megatron-core 0.20.0 or later) has them passed over with a note")
    # 6 layers over 4 stages: Megatron-LM asserts the even split too, and the error says how to give another
    assert main([*base, "--script-env", "TRAIN_TOKENS=1048576", *FORK_IGNORE]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: --num-layers 6 does not divide into --pipeline-model-parallel-size 4: Megatron-LM refuses this job "
        "too (get_num_layers_to_build); give --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers "
        "or --pipeline-model-parallel-layout, or another --pipeline-model-parallel-size")
    assert not out.exists()
    assert main([*base, "--script-env", "TRAIN_TOKENS=1048576", "--script-env", "MP_PP0_LAYERS=3", *FORK_IGNORE]) == 0
    err = capsys.readouterr().err
    note = ("pretrain_qwen.py is not one of Megatron-LM's entry scripts (a fork's): read as pretrain_gpt.py, "
            "building GPTModel; if it builds another model (a vision-language one), give --family")
    assert f"note: {note}" in err
    text = out.read_text()
    assert f"# note: {note}\n" in text
    assert "--script-env TRAIN_TOKENS=1048576 --script-env MP_PP0_LAYERS=3" in text.splitlines()[0]
    run = load_run(out)
    assert run.parallel.layout == (3, 1, 1, 1) and run.parallel.tp == 2 and run.parallel.dp == 1


def test_family_says_what_a_forks_entry_script_builds(tmp_path, capsys):
    script = tmp_path / "run.sh"
    script.write_text(FORK_SCRIPT.replace("NUM_LAYERS=6", "NUM_LAYERS=8"))
    base = ["from-megatron", str(script), "--script-args", "2 4", "--script-env", "TRAIN_TOKENS=1048576",
            *FORK_IGNORE]
    assert main([*base, "--family", "vlm"]) == 2  # read as pretrain_vlm.py, whose model_provider asserts the format
    assert capsys.readouterr().err.strip() == ("error: --ckpt-format torch_dist: pretrain_vlm.py asserts \"Only "
                                               "ckpt-format torch is supported for VLM training currently\"; give "
                                               "--ckpt-format torch")
    assert main([*base, "--family", "gpt"]) == 0
    captured = capsys.readouterr()
    others = [ln for ln in (captured.err + captured.out).splitlines()  # but the default-version note
              if "note:" in ln and "no Megatron-Core version given" not in ln]
    assert not others and " --family gpt " in captured.out
    # Megatron-LM's own entry script already says what it builds
    script.write_text(FORK_SCRIPT.replace("pretrain_qwen.py", "pretrain_bert.py").replace("NUM_LAYERS=6", "NUM_LAYERS=8"))
    assert main([*base, "--family", "gpt"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --family gpt: the script pretrain_bert.py already says the job "
                                               "trains a bert model (drop --family)")


def test_script_env_is_checked(tmp_path, capsys):
    script = tmp_path / "run.sh"
    script.write_text(FORK_SCRIPT)
    assert main(["from-megatron", str(script), "--script-env", "1X=3"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --script-env 1X=3: give NAME=VALUE, NAME a shell variable's "
                                               "name (e.g. --script-env MP_PP0_LAYERS=6)")
    args = tmp_path / "args.txt"
    args.write_text("--num-layers 2 --hidden-size 128\n")
    assert main(["from-megatron", str(args), "--world-size", "8", "--script-env", "A=1"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --script-env: {args} is an argument list (give its values as arguments); it fills a launch script's "
        "environment or a YAML config's ${NAME} placeholders")


def test_script_env_fills_a_yaml_configs_placeholders_and_an_empty_value_is_named(tmp_path, capsys):
    """Megatron-MoE-ModelZoo's templated YAMLs (``${TP}``, ``${SEQ_LEN}``, filled by envsubst before launch); an
    empty value is the bare option the functional-test harness writes, which a value-taking argument refuses."""
    cfg = _config(tmp_path, ARGS | {"tensor-model-parallel-size": "${TP}", "seq-length": "$SEQ_LEN",
                                    "num-layers-per-virtual-pipeline-stage": "${VP}"})
    assert main(["from-megatron", str(cfg), "--world-size", "8"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --seq-length: '$SEQ_LEN' is an unexpanded shell variable and the argument changes memory; "
        "give its value (from-megatron --script-env SEQ_LEN=…)")
    assert main(["from-megatron", str(cfg), "--world-size", "8", "--script-env", "TP=4",
                 "--script-env", "SEQ_LEN=512", "--script-env", "VP=false"]) == 0  # filled text: YAML's false
    out = capsys.readouterr().out
    assert "\nvpp = 1\n" in out
    assert "\ntp = 4\n" in out and "\nseq_len = 512\n" in out and "--script-env TP=4 --script-env SEQ_LEN=512" in out
    empty = _config(tmp_path / "e", ARGS | {"moe-token-dispatcher-type": None, "num-experts": 4})
    assert main(["from-megatron", str(empty), "--world-size", "8"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --moe-token-dispatcher-type is given without a value (in a launch script, a variable that expands to "
        "nothing; in a YAML config, an empty value or an unfilled ${VAR}?); give its value")


def test_an_invalid_run_file_is_named_by_its_config_not_the_temporary_file(tmp_path, capsys, monkeypatch):
    """What the written run file's own check says names CONFIG (the temporary sibling is the tool's business)."""
    import timeline.io.megatron_write as mw

    real = mw.run_file_text
    monkeypatch.setattr(mw, "run_file_text", lambda *a, **k: real(*a, **k).replace("num_layers = 2",
                                                                                   "num_layers = -2"))
    cfg = _config(tmp_path)
    for extra in ([], ["-o", str(tmp_path / "job.toml")]):
        assert main(["from-megatron", str(cfg), "--world-size", "8", *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]  # after the conversion's notes
        assert err.startswith(f"error: {cfg}: model.num_layers") and "partial" not in err and "run.toml" not in err
    assert not (tmp_path / "job.toml").exists() and list(tmp_path.iterdir()) == [tmp_path / "test_cases"]


def test_vocab_size_stands_in_for_a_tokenizer_file_not_on_this_machine(tmp_path, capsys):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\nTOKENIZER_MODEL=/data/tokenizer.model\ntorchrun --nproc_per_node 4 pretrain_gpt.py "
                      "--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 256 "
                      "--max-position-embeddings 256 --micro-batch-size 1 --global-batch-size 4 --bf16 "
                      "--tokenizer-type Llama2Tokenizer --tokenizer-model ${TOKENIZER_MODEL}\n")
    assert main(["from-megatron", str(script)]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --tokenizer-type Llama2Tokenizer: its vocabulary size is unknown without reading "
        "/data/tokenizer.model (not on this machine); run where the tokenizer file is, or give "
        "`from-megatron --vocab-size N` (the tokenizer's vocabulary)")
    assert main(["from-megatron", str(script), "--vocab-size", "32000"]) == 0
    out = capsys.readouterr().out
    assert "\nvocab_size = 32000\n" in out and f"{script} --vocab-size 32000 --world-size 4`" in out.splitlines()[0]
