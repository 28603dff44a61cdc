"""Bash launch scripts read as bash hands their arguments to Megatron-LM's entry script, never run
(:mod:`timeline.io.launch_script`): variables, arrays, defaults, arithmetic, ``if`` blocks, the launcher's world size,
and ``from-megatron`` on such a script end to end."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from timeline.cli import main
from timeline.errors import UserError
from timeline.io.launch_script import read_launch_script
from timeline.io.megatron_args import VAR_RE, read_megatron_config

#: a launch script in the shape of Megatron-LM's examples/*/train_*.sh, written for this test
SCRIPT = r"""#!/bin/bash
# a job launched the way Megatron-LM's examples launch theirs
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS_PER_NODE=8
NNODES=${SLURM_NNODES:-"2"}
WORLD_SIZE=$(($GPUS_PER_NODE*$NNODES))
CHECKPOINT_PATH=$1 #<Specify path>
TP=${TP:-2}
PRECISION="bf16"

while [[ $# -gt 0 ]]; do
    case $1 in
        --tp) TP="$2"; shift 2 ;;
        *) echo "Unknown option: $1"; exit 1 ;;
    esac
done

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NNODES
    --master_addr localhost   # the head node
)
MODEL_ARGS=(
    --num-layers 4 --hidden-size 256
    --num-attention-heads 8
    --seq-length 512 --max-position-embeddings 512
    --swiglu
)
TRAINING_ARGS=(
    --micro-batch-size 2
    --global-batch-size 64
    --lr 1e-4
)
if [[ "$PRECISION" == "fp16" ]]; then
    TRAINING_ARGS+=(--fp16)
elif [[ "$PRECISION" == "bf16" ]] || [[ -z "$PRECISION" ]]; then
    TRAINING_ARGS+=("--bf16" "--use-distributed-optimizer")
else
    TRAINING_ARGS+=(--fp32-residual-connection)
fi
if [ -n "${WANDB_API_KEY}" ]; then
    TRAINING_ARGS+=(--wandb-project x)
fi
if [ ! -f "pretrain_gpt.py" ]; then
    echo "run this from Megatron-LM's root"
    exit 1
fi
PARALLEL_ARGS=(
	--tensor-model-parallel-size $TP
	--pipeline-model-parallel-size 2
)
DATA_ARGS=(
    "--mock-data"
    "--tokenizer-type NullTokenizer"
    "--vocab-size 32000"
    --save $CHECKPOINT_PATH
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${MODEL_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${PARALLEL_ARGS[@]} \
    ${DATA_ARGS[@]}
"""


def test_the_arguments_bash_would_pass():
    launch = read_launch_script(SCRIPT, "train.sh")
    assert launch is not None and launch.script == "pretrain_gpt.py"
    assert launch.world_size == 16  # --nproc_per_node 8 × --nnodes ${SLURM_NNODES:-"2"}
    assert launch.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert launch.words == ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8",
                            "--seq-length", "512", "--max-position-embeddings", "512", "--swiglu",
                            "--micro-batch-size", "2", "--global-batch-size", "64", "--lr", "1e-4",
                            "--bf16", "--use-distributed-optimizer",
                            "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                            "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "32000", "--save"]


@pytest.mark.skipif(not os.path.exists("/bin/bash"), reason="bash is needed to compare with")
def test_the_same_words_as_bash(tmp_path):
    """bash itself, with the launcher replaced by a printer and file tests true, agrees word for word."""
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT.replace("torchrun ", "printf '%s\\n' ").replace('[ ! -f "pretrain_gpt.py" ]', "false"))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, check=True).stdout
    words = out.splitlines()
    launch = read_launch_script(SCRIPT, "train.sh")
    assert launch is not None
    assert words[words.index("pretrain_gpt.py") + 1:] == launch.words
    assert words[:words.index("pretrain_gpt.py")] == launch.launcher[1:]


def test_an_if_that_only_running_decides_is_refused_with_its_line():
    text = 'if [ -f /etc/hosts ]; then\n  ARGS=(--num-layers 2)\nfi\ntorchrun pretrain_gpt.py ${ARGS[@]}\n'
    with pytest.raises(UserError) as err:
        read_launch_script(text, "t.sh")
    assert "line 1" in str(err.value) and "running" in str(err.value)


def test_a_variable_the_script_never_sets_keeps_its_name_as_an_argument():
    launch = read_launch_script("ARGS=(--tensor-model-parallel-size $TP)\npython pretrain_gpt.py ${ARGS[@]}\n", "t")
    assert launch is not None and launch.words == ["--tensor-model-parallel-size", "$TP"]
    assert launch.world_size is None  # not a torchrun launch


def test_quoting_and_word_splitting():
    text = ("X='a b'\nY=\"$X c\"\nA=(\"$Y\" $X \"--k=v w\")\nB=(\"${A[@]}\")\n"
            "torchrun --nproc-per-node=4 --nnodes=1:1 pretrain_gpt.py \"${B[@]}\" ${A[@]} $'--t\\tu' --n $((2*3+1))\n")
    launch = read_launch_script(text, "t")
    assert launch is not None and launch.world_size == 4
    assert launch.words == ["a b c", "a", "b", "--k=v w", "a", "b", "c", "a", "b", "--k=v", "w", "--t\tu", "--n", "7"]


def test_from_megatron_reads_a_launch_script_end_to_end(tmp_path, capsys):
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT)
    out = tmp_path / "job.toml"
    assert main(["from-megatron", str(script), "-o", str(out)]) == 0
    text = out.read_text()
    assert "tp = 2" in text and "pp = 2" in text and "dp = 4" in text  # 16 GPUs from the launcher
    assert main(["static", str(out)]) == 0
    capsys.readouterr()
    assert main(["from-megatron", str(script), "--world-size", "32", "-o", str(out), "--force"]) == 0
    assert "dp = 8" in out.read_text()
    assert "replaces the script's torchrun 16" in capsys.readouterr().err


def test_a_script_that_runs_no_entry_point_and_a_missing_world_size(tmp_path, capsys):
    none = tmp_path / "prep.sh"
    none.write_text("#!/bin/bash\nDATA=/data\npython tools/preprocess_data.py --input $DATA\n")
    with pytest.raises(UserError) as err:
        read_megatron_config(none)
    assert "runs no Megatron entry script" in str(err.value)
    bare = tmp_path / "bare.sh"
    bare.write_text(SCRIPT.replace("torchrun ${DISTRIBUTED_ARGS[@]} ", "python "))
    assert main(["from-megatron", str(bare)]) == 2
    assert "--world-size N is needed" in capsys.readouterr().err


def test_an_argument_list_is_still_an_argument_list(tmp_path):
    """A file of arguments without assignments or arrays keeps the argument-list reading (one flag per line)."""
    path = tmp_path / "args.txt"
    path.write_text("--num-layers 4\n--hidden-size 256  # width\n--bf16\n")
    margs = read_megatron_config(path)
    assert margs.args == {"--num-layers": "4", "--hidden-size": "256", "--bf16": True} and margs.world_size is None


@pytest.mark.parametrize("name", ["gpt3/train_gpt3_175b_distributed.sh", "llama/train_llama3_8b_h100_fp8.sh",
                                  "mixtral/train_mixtral_8x7b_distributed.sh", "bert/train_bert_340m_distributed.sh"])
def test_megatron_lm_s_own_example_scripts(name):
    """Megatron-LM's examples as published (a fetched mirror, when this machine has one): each reads to its
    pretrain_*.py arguments and its launcher's 8 GPUs."""
    mirror = Path("/work/.mirror/NVIDIA+Megatron-LM/repo")
    if not mirror.exists():
        pytest.skip("no Megatron-LM mirror on this machine (the fetch tool's snapshot)")
    text = subprocess.run(["git", "-C", str(mirror), "show", f"HEAD:examples/{name}"], capture_output=True,
                          text=True).stdout
    if not text:
        pytest.skip(f"examples/{name} is not in this snapshot")
    launch = read_launch_script(text, name)
    assert launch is not None and launch.script.startswith("pretrain_") and launch.world_size == 8
    assert "--num-layers" in launch.words and "--micro-batch-size" in launch.words


def test_any_text_reads_or_is_refused_in_one_line():
    """Arbitrary text made of bash's special characters never hangs or raises anything but a UserError."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    alphabet = st.sampled_from(list("ab=$(){}[]'\"\\`#;&|<> \n-_:+@*!0123456789") +
                               ["torchrun ", "pretrain_gpt.py ", "if ", "then ", "fi ", "ARR=(", "${A[@]}", "$((1+2))",
                                "while ", "do ", "done ", "case ", " in ", "esac ", ";;", "shift ", "break ",
                                "[ $# -gt 0 ]", "$1", "$((a?1:2))"])

    @hypothesis.settings(max_examples=300, deadline=None)
    @hypothesis.given(st.lists(alphabet, max_size=40).map("".join))
    def check(text: str) -> None:
        try:
            read_launch_script(text, "fuzz.sh")
            read_launch_script(text, "fuzz.sh", ["a", "--b", "3"])
        except UserError:
            pass

    check()


def test_redirections_pipes_and_command_output():
    text = ("N=$(nproc)\nif [[ \"$N\" == 8 ]]; then A=(--x); fi\n")
    with pytest.raises(UserError) as err:
        read_launch_script(text + "python pretrain_gpt.py ${A[@]}\n", "t")
    assert "tests a command's output" in str(err.value)
    launch = read_launch_script("python pretrain_gpt.py --lr 1 --log-dir x 2>&1 | tee log.txt && echo done\n", "t")
    assert launch is not None and launch.words == ["--lr", "1", "--log-dir", "x"]
    launch = read_launch_script("if [ $# -lt 1 ]; then echo usage; exit 1; fi\npython pretrain_gpt.py --lr 1\n", "t")
    assert launch is not None and launch.words == ["--lr", "1"]  # an exit in a branch does not end the reading


def test_string_variables_eval_and_unset_expansions(tmp_path, capsys):
    """The other common shape: arguments in multi-line strings, `cmd="torchrun …"`, `echo $cmd` (runs nothing),
    `eval $cmd`; an unset ${EXTRA_ARGS} among arguments expands to nothing, as in bash, and an unset value of an
    argument that changes memory is named."""
    text = ('GPUS=4\nARGS="\n  --num-layers 4 \\\n  --hidden-size 256 \\\n  --num-attention-heads 8 \\\n'
            '  --seq-length 512 --max-position-embeddings 512 --vocab-size 1000\n"\n'
            'TRAIN="--micro-batch-size 1 --global-batch-size 8 --bf16 $EXTRA_ARGS --lr 1e-4 $MORE"\n'
            'cmd="torchrun --nproc_per_node $GPUS pretrain_gpt.py $ARGS $TRAIN --tensor-model-parallel-size $TP"\n'
            'echo $cmd\neval $cmd 2>&1 | tee train.log\n')
    launch = read_launch_script(text, "t.sh")
    assert launch is not None and launch.launcher == ["torchrun", "--nproc_per_node", "4"] and launch.world_size == 4
    script = tmp_path / "train.sh"
    script.write_text(text)
    margs = read_megatron_config(script)
    # $EXTRA_ARGS, $MORE and $TP expanded to nothing in the strings' assignments, as bash expands them
    assert margs.args["--bf16"] is True and margs.args["--lr"] == "1e-4"
    assert margs.args["--tensor-model-parallel-size"] is True
    assert main(["from-megatron", str(script)]) == 2
    assert "--tensor-model-parallel-size is given without a value" in capsys.readouterr().err
    direct = tmp_path / "direct.sh"
    direct.write_text("GPUS=2\npython pretrain_gpt.py --num-layers 2 $EXTRA --bf16 $FLAGS --hidden-size 64\n")
    margs = read_megatron_config(direct)
    assert margs.args["--num-layers"] == "2" and margs.args["--hidden-size"] == "64"
    assert margs.args["--bf16"] == "$FLAGS"  # kept after an option; a flag reads it as set (ArgReader.flag)


def test_an_unset_value_in_the_command_line_is_named(tmp_path, capsys):
    script = tmp_path / "t.sh"
    script.write_text("A=1\ntorchrun --nproc_per_node 2 pretrain_gpt.py --num-layers 2 --hidden-size 64 "
                      "--num-attention-heads 4 --seq-length 128 --micro-batch-size 1 --tensor-model-parallel-size $TP\n")
    assert main(["from-megatron", str(script)]) == 2
    assert "--tensor-model-parallel-size: '$TP' is an unexpanded shell variable" in capsys.readouterr().err


def test_an_srun_job_takes_its_ranks_from_sbatch():
    text = ("#!/bin/bash\n#SBATCH --nodes=4 --ntasks-per-node=8  # one task per GPU\n#SBATCH -t 04:00:00\n"
            "srun --mpi=pmix python pretrain_gpt.py --num-layers 2\n")
    launch = read_launch_script(text, "job.sbatch")
    assert launch is not None and launch.world_size == 32
    assert read_launch_script(text.replace("--ntasks-per-node=8", ""), "j").world_size is None  # not given
    assert read_launch_script("srun -N 2 --ntasks-per-node 4 python pretrain_gpt.py --lr 1\n", "j").world_size == 8


def test_a_launcher_line_alone_is_read_as_a_launch(tmp_path):
    path = tmp_path / "cmd.txt"
    path.write_text("torchrun --nproc_per_node 4 --nnodes 2 pretrain_gpt.py \\\n  --num-layers 2 --bf16\n")
    margs = read_megatron_config(path)
    assert margs.world_size == 8 and margs.args == {"--num-layers": "2", "--bf16": True}


def test_a_command_list_runs_each_command():
    launch = read_launch_script("cd /megatron && nohup torchrun --nproc_per_node 2 pretrain_gpt.py --lr 1 "
                                "> log.txt || exit 1\n", "t")
    assert launch is not None and launch.words == ["--lr", "1"] and launch.world_size == 2
    launch = read_launch_script("( cd /megatron && python pretrain_gpt.py --lr 1 )\n", "t")
    assert launch is not None and launch.words == ["--lr", "1"]


def test_tests_in_a_command_list_guard_what_follows():
    text = ('MODE=fp8\n[ "$MODE" == "fp8" ] && ARGS+=(--fp8-format hybrid)\n[ -n "$UNSET" ] && ARGS+=(--wandb-project x)\n'
            '[[ "$MODE" == "bf16" ]] || EXTRA="--bf16"\npython pretrain_gpt.py ${ARGS[@]} $EXTRA\n')
    launch = read_launch_script(text, "t")
    assert launch is not None and launch.words == ["--fp8-format", "hybrid", "--bf16"]
    with pytest.raises(UserError) as err:
        read_launch_script("[ -f /x ] && ARGS+=(--bf16)\npython pretrain_gpt.py ${ARGS[@]}\n", "t")
    assert "line 1" in str(err.value)


def test_an_undecidable_test_guarding_an_assignment_is_refused():
    with pytest.raises(UserError) as err:
        read_launch_script("[ -f /x ] && TP=4\npython pretrain_gpt.py --tensor-model-parallel-size $TP\n", "t")
    assert "line 1" in str(err.value) and "TP=4" in str(err.value)
    launch = read_launch_script("[ -d /data ] && echo found\npython pretrain_gpt.py --lr 1\n", "t")
    assert launch is not None and launch.words == ["--lr", "1"]  # around an echo it decides nothing


CASE_SCRIPT = r"""#!/bin/bash
MODEL_SIZE=${MODEL_SIZE:-8B}
PREC="fp8"
case "${MODEL_SIZE}" in
    "800M")
        TP=1; LAYERS=24
        ;;
    7B|8B)
        TP=2
        LAYERS=32 ;;
    (70*) TP=8; LAYERS=80 ;;
    *)
        echo "unknown size $MODEL_SIZE"; exit 1
        ;;
esac
case $PREC in
    bf16) EXTRA=(--bf16) ;;
    "f"*) EXTRA=(--bf16 --fp8-format hybrid)
        case $TP in 2) EXTRA+=(--sequence-parallel) ;; esac
        ;;
esac
case "$1" in
    --help) echo usage ;;
esac
torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size $TP --num-layers $LAYERS ${EXTRA[@]}
"""


def test_a_case_block_runs_the_clause_its_word_matches():
    """``case``: literal, ``|`` alternatives, globs (quoted parts literal), a leading ``(``, nested blocks,
    clauses on one line; a clause that only echoes on ``$1`` (empty) changes nothing."""
    launch = read_launch_script(CASE_SCRIPT, "t")
    assert launch is not None
    assert launch.words == ["--tensor-model-parallel-size", "2", "--num-layers", "32", "--bf16", "--fp8-format",
                            "hybrid", "--sequence-parallel"]
    launch = read_launch_script(CASE_SCRIPT.replace(":-8B}", ":-70B}"), "t")
    assert launch is not None and launch.words[:4] == ["--tensor-model-parallel-size", "8", "--num-layers", "80"]
    # a quoted glob character is literal: "f"* matches fp8, "f*" would not
    launch = read_launch_script(CASE_SCRIPT.replace('"f"*)', '"f*")'), "t")
    assert launch is not None and launch.words[4:] == []
    # an unknown size runs the `*` clause (its exit, like a usage check's, does not end the reading): TP unset
    launch = read_launch_script(CASE_SCRIPT.replace(":-8B}", ":-3B}"), "t")
    assert launch is not None and launch.words[:2] == ["--tensor-model-parallel-size", "$TP"]


@pytest.mark.skipif(not os.path.exists("/bin/bash"), reason="bash is needed to compare with")
def test_case_blocks_give_the_same_words_as_bash(tmp_path):
    for size in ("8B", "70B", "800M"):
        text = CASE_SCRIPT.replace(":-8B}", f":-{size}}}")
        script = tmp_path / "train.sh"
        script.write_text(text.replace("torchrun ", "printf '%s\\n' "))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        words = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env,
                               check=True).stdout.splitlines()
        launch = read_launch_script(text, "train.sh")
        assert launch is not None
        assert words[words.index("pretrain_gpt.py") + 1:] == launch.words, size


def test_a_case_on_a_word_only_running_decides_is_refused_where_it_assigns():
    text = "case $(hostname) in\n  node*) TP=4 ;;\nesac\npython pretrain_gpt.py --tensor-model-parallel-size $TP\n"
    with pytest.raises(UserError) as err:
        read_launch_script(text, "t")
    assert "line 1" in str(err.value) and "case" in str(err.value)
    text = "case $(hostname) in\n  node*) echo on a node ;;\nesac\npython pretrain_gpt.py --lr 1\n"
    launch = read_launch_script(text, "t")
    assert launch is not None and launch.words == ["--lr", "1"]


def test_megatron_lm_s_hybrid_example_reads_to_a_run_file(tmp_path):
    """examples/mamba/train.sh (a ``case`` on the model scale, ``--spec … hybrid_stack_spec`` as two words,
    ``--position-embedding-type none``) converts once its tokenizer is given."""
    mirror = Path("/work/.mirror/NVIDIA+Megatron-LM/repo")
    if not mirror.exists():
        pytest.skip("no Megatron-LM mirror on this machine (the fetch tool's snapshot)")
    text = subprocess.run(["git", "-C", str(mirror), "show", "HEAD:examples/mamba/train.sh"], capture_output=True,
                          text=True).stdout
    if "case" not in text:
        pytest.skip("examples/mamba/train.sh is not in this snapshot as read here")
    script = tmp_path / "train.sh"
    script.write_text(text.replace("TOKENIZER_PATH=$2", "TOKENIZER_PATH=x\nVOCAB=(--vocab-size 256000)")
                      .replace("${options}", "${options} ${VOCAB[@]}"))
    out = tmp_path / "job.toml"
    assert main(["from-megatron", str(script), "-o", str(out)]) == 0
    import tomllib

    model = tomllib.loads(out.read_text())["model"]
    assert model["position_embedding"] == "none" and model["hybrid_override_pattern"].startswith("M-M-M--M-*")
    assert model["hidden_size"] == 1024  # the 800M clause


ARGS_SCRIPT = r"""#!/bin/bash
ENV=$1
MODEL_SIZE=$2
TP=${3:-1}
PP=${10:-1}
NARGS=$#
while [[ $# -gt 0 ]]; do
    case $1 in
        --seq) SEQ="$2"; shift 2 ;;
        --fp8) FP8=(--fp8-format hybrid); shift ;;
        --stop) break ;;
        *) shift ;;
    esac
done
OVERLAP=$(( ($TP > 1) ? 1 : 0 ))
HALF=$(( -7 / 2 ))
MOD=$(( -7 % 3 ))
POW=$(( 2 ** 3 ** 2 ))
LOGIC=$(( (TP >= 2 && PP == 1) || !0 ))
if [ $OVERLAP -eq 1 ]; then EXTRA="--overlap-grad-reduce"; fi
torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size $TP --pipeline-model-parallel-size $PP \
    --seq-length ${SEQ:-128} ${FP8[@]} $EXTRA --x $NARGS $HALF $MOD $POW $LOGIC --size $MODEL_SIZE
"""


def test_positional_arguments_shift_loops_and_arithmetic():
    """``$1`` … ``${10}``, ``$#``, a ``while`` loop over the arguments with ``case`` and ``shift``, ``break``, and
    ``$(( … ))`` with comparisons, the ternary, C division and ``**`` (right-associative)."""
    argv = ["dsw", "8B", "4", "--seq", "4096", "--fp8", "x", "y", "z", "2"]
    launch = read_launch_script(ARGS_SCRIPT, "t", argv)
    assert launch is not None
    assert launch.words == ["--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "2",
                            "--seq-length", "4096", "--fp8-format", "hybrid", "--overlap-grad-reduce",
                            "--x", "10", "-3", "-1", "512", "1", "--size", "8B"]
    # without arguments: $# = 0, the defaults; `--stop` ends the loop before the later --seq
    launch = read_launch_script(ARGS_SCRIPT, "t")
    assert launch is not None and launch.words[:6] == ["--tensor-model-parallel-size", "1",
                                                       "--pipeline-model-parallel-size", "1", "--seq-length", "128"]
    launch = read_launch_script(ARGS_SCRIPT, "t", ["a", "b", "2", "--stop", "--seq", "9"])
    assert launch is not None and launch.words[4:6] == ["--seq-length", "128"]


@pytest.mark.skipif(not os.path.exists("/bin/bash"), reason="bash is needed to compare with")
def test_positional_arguments_give_the_same_words_as_bash(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text(ARGS_SCRIPT.replace("torchrun ", "printf '%s\\n' "))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for argv in (["dsw", "8B", "4", "--seq", "4096", "--fp8", "x", "y", "z", "2"], [], ["a", "b", "2", "--stop"]):
        words = subprocess.run(["bash", str(script), *argv], capture_output=True, text=True, env=env,
                               check=True).stdout.splitlines()
        launch = read_launch_script(ARGS_SCRIPT, "train.sh", argv)
        assert launch is not None
        ours = [w for w in launch.words if not VAR_RE.fullmatch(w)]  # an unset $NAME: kept for the mapping only
        assert words[words.index("pretrain_gpt.py") + 1:] == ours, argv


def test_quoted_at_is_one_word_per_argument():
    text = 'python pretrain_gpt.py --lr 1 "$@"\n'
    launch = read_launch_script(text, "t", ["--seq-length", "512", "--name", "a b"])
    assert launch is not None and launch.words == ["--lr", "1", "--seq-length", "512", "--name", "a b"]
    launch = read_launch_script(text, "t")
    assert launch is not None and launch.words == ["--lr", "1"]


def test_an_exit_ends_the_script_when_its_arguments_are_given():
    text = 'case $1 in\n  --help) echo usage; exit 0 ;;\nesac\npython pretrain_gpt.py --lr 1\n'
    with pytest.raises(UserError, match="line 2: the script exits there"):
        read_launch_script(text, "t", ["--help"])
    launch = read_launch_script(text, "t", ["--go"])
    assert launch is not None and launch.words == ["--lr", "1"]
    with pytest.raises(UserError, match="still running after"):  # no shift: the loop never ends
        read_launch_script("while [ $# -gt 0 ]; do X=1; done\npython pretrain_gpt.py\n", "t", ["a"])


def test_from_megatron_takes_the_scripts_arguments(tmp_path, capsys):
    script = tmp_path / "run.sh"
    script.write_text(ARGS_SCRIPT.replace(" --x $NARGS $HALF $MOD $POW $LOGIC --size $MODEL_SIZE", "")
                      .replace("--tensor-model-parallel-size $TP", "--tensor-model-parallel-size $TP --num-layers 4 "
                               "--hidden-size 256 --num-attention-heads 8 --micro-batch-size 1 --global-batch-size 8 "
                               "--bf16 --max-position-embeddings 4096"))
    out = tmp_path / "job.toml"
    assert main(["from-megatron", str(script), "--script-args", "dsw 8B 4 --seq 2048", "-o", str(out)]) == 0
    import tomllib

    data = tomllib.loads(out.read_text())
    assert data["parallel"]["tp"] == 4 and data["training"]["seq_len"] == 2048
    assert data["framework"]["overlap_grad_reduce"] is True
    args = tmp_path / "args.txt"
    args.write_text("--num-layers 4\n")
    assert main(["from-megatron", str(args), "--script-args", "a"]) == 2
    assert "--script-args" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.exists("/bin/bash"), reason="bash is needed to compare with")
def test_arithmetic_matches_bash_to_the_64_bit_wrap():
    exprs = ["2**3**2", "(5 > 1) ? 1 : 0", "-7/2", "-7%3", "9223372036854775807+1", "1<<64", "2**64", "!0 && 3",
             "3 > 2 > 1", "~5 ^ 3 | 8 & 12", "1 ? 2 ? 3 : 4 : 5", "2**62*4", "-(-9223372036854775807-1)"]
    script = "echo " + " ".join(f"$(({e}))" for e in exprs)
    bash = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.split()
    launch = read_launch_script(f"python pretrain_gpt.py {' '.join(f'$(({e}))' for e in exprs)}\n", "t")
    assert launch is not None and launch.words == bash
    with pytest.raises(UserError, match="not integer arithmetic"):
        read_launch_script("python pretrain_gpt.py --n $((1/0))\n", "t")


#: continuations as users write them: a commented-out argument whose line still ends in a backslash (bash ends a
#: comment at its newline), a backslash-newline inside double quotes (removed) and single quotes (kept)
CONTINUED = r"""#!/bin/bash
GPUS_PER_NODE=4
# --distribute-saved-activations \
torchrun --nproc_per_node $GPUS_PER_NODE pretrain_gpt.py \
       --tensor-model-parallel-size $GPUS_PER_NODE \
       --num-layers 48 "--hidden-\
size" 3072 \
       --data-path 'a\
b' \
       --num-attention-heads 24
#       --load $CHECKPOINT_PATH \
if [ -f x ]; then
    echo
fi
"""


def test_line_continuations_as_bash_reads_them(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text(CONTINUED.replace("torchrun ", "printf '%s\\n' "))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    words = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, check=True).stdout
    words = words.splitlines()
    launch = read_launch_script(CONTINUED, "train.sh")
    assert launch is not None and launch.world_size == 4
    assert launch.words == ["--tensor-model-parallel-size", "4", "--num-layers", "48", "--hidden-size", "3072",
                            "--data-path", "a\\\nb", "--num-attention-heads", "24"]
    # bash prints the single-quoted backslash-newline as it is: two lines of output for one word
    assert words[words.index("pretrain_gpt.py") + 1:] == "\n".join(launch.words).split("\n")
    # lines are counted through continuations: the file test deciding an array is on line 12
    with pytest.raises(UserError, match=r"^train.sh: line 12: the test `\[ -f x \]` \(files, processes\)"):
        read_launch_script(CONTINUED.replace("    echo\n", "    X=(1)\n"), "train.sh")


#: a sweep as users write one: parallel arrays walked by index, the job launched once per configuration
SWEEP = r"""#!/bin/bash
hidden_sizes=(1536 1920 2304 3072)
num_layers=(40 54 64 72)
model_parallel_gpus=(1 2 4 8)
for i in ${!hidden_sizes[@]}; do
    MP=${model_parallel_gpus[$i]}
    LAST=${num_layers[i+1]:-none}
    ARGS="--tensor-model-parallel-size $MP \
        --num-layers ${num_layers[$i]} --hidden-size ${hidden_sizes[$i]} --kv-channels ${hidden_sizes[-1]}"
    torchrun --nproc_per_node $MP --nnodes 1 pretrain_gpt.py $ARGS --seq-length $LAST
    echo "done"
done
for precision in bf16 fp16; do
    torchrun --nproc_per_node 8 pretrain_gpt.py --$precision
done
"""


def test_a_sweeps_for_loops_run_every_job_as_bash_does(tmp_path):
    script = tmp_path / "sweep.sh"
    script.write_text(SWEEP.replace("torchrun ", "printf '%s\\n' ").replace("pretrain_gpt.py", "JOB"))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, check=True).stdout
    for k in range(1, 7):
        launch = read_launch_script(SWEEP, "sweep.sh", job=k)
        assert launch is not None and launch.jobs == 6
        bash_words = out.split("JOB\n")[k].replace("done\n", "").split("--nproc_per_node")[0].strip("\n").split("\n")
        assert launch.words == bash_words, k
    first = read_launch_script(SWEEP, "sweep.sh")
    assert first is not None and first.world_size == 1 and first.words == [
        "--tensor-model-parallel-size", "1", "--num-layers", "40", "--hidden-size", "1536", "--kv-channels", "3072",
        "--seq-length", "54"]
    last = read_launch_script(SWEEP, "sweep.sh", job=4)
    assert last is not None and last.world_size == 8 and last.words[-2:] == ["--seq-length", "none"]
    with pytest.raises(UserError, match=r"^--job 7: sweep.sh launches 6 jobs \(give 1 … 6\)$"):
        read_launch_script(SWEEP, "sweep.sh", job=7)


def test_from_megatron_reads_a_sweeps_first_job_or_the_one_asked_for(tmp_path, capsys):
    script = tmp_path / "sweep.sh"
    script.write_text(SWEEP.replace("--seq-length $LAST", "--seq-length 1024 --num-attention-heads 8 "
                                    "--max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 8"))
    assert main(["from-megatron", str(script)]) == 0
    captured = capsys.readouterr()
    note = "sweep.sh launches 6 jobs (a loop); the first is read (--job 1 … 6 picks one)"
    assert f"note: {note}" in captured.err and f"# note: {note}" in captured.out
    assert "hidden_size = 1536" in captured.out and "--world-size 1`" in captured.out
    assert main(["from-megatron", str(script), "--job", "3"]) == 0
    captured = capsys.readouterr()
    assert "launches 6 jobs" not in captured.err and "hidden_size = 2304" in captured.out
    assert "sweep.sh --job 3 --world-size 4`" in captured.out
    assert main(["from-megatron", str(script), "--job", "9"]) == 2
    assert capsys.readouterr().err.strip() == f"error: --job 9: {script} launches 6 jobs (give 1 … 6)"


#: [[ … ]] conditions as bash evaluates them: arithmetic sides of -eq … -ge (empty is 0), && / || inside
CONDITIONS = r"""#!/bin/bash
N=3
if [[ $BATCH -eq 0 ]]; then A=unset-is-zero; else A=other; fi
if [[ N+1 -gt 3 && $N -le 3 ]]; then B=both; else B=not-both; fi
if [[ $N -eq 4 || -z "$BATCH" ]]; then C=either; else C=neither; fi
if [[ $N*2 -ge 7 ]] || [ "$N" = 3 ]; then D=joined; else D=none; fi
torchrun pretrain_gpt.py --a $A --b $B --c $C --d $D
"""


def test_double_bracket_conditions_as_bash_evaluates_them(tmp_path):
    script = tmp_path / "cond.sh"
    script.write_text(CONDITIONS.replace("torchrun ", "printf '%s\\n' "))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    words = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, check=True).stdout
    launch = read_launch_script(CONDITIONS, "cond.sh")
    assert launch is not None
    assert launch.words == words.splitlines()[1:] == ["--a", "unset-is-zero", "--b", "both", "--c", "either",
                                                      "--d", "joined"]
    # in [ ], an empty side of -eq is bash's "integer expression expected": not decided here either
    with pytest.raises(UserError, match="compares values that are not numbers"):
        read_launch_script(CONDITIONS.replace("[[ $BATCH -eq 0 ]]", "[ \"$BATCH\" -eq 0 ]"), "cond.sh")


#: constructs of public cluster recipes (AWS's slurm recipes, Megatron-DeepSpeed sweeps, OneFlow's autotests)
RECIPES = r"""#!/bin/bash
: "${NUM_LAYERS:=2}"
IMAGE=/
[[ -d ${IMAGE} ]] || { echo "no image: $IMAGE" ; exit 1 ; }
[ "$NUM_LAYERS" = 3 ] && { NUM_LAYERS=30; HIDDEN=1; }
USE_FP16=${1:-true}
IPs=(10.0.0.1 10.0.0.2)
for i in "${!IPs[@]}"; do
    if [ "${IPs[$i]}" == "10.0.0.2" ]; then NODE_RANK=$i; break; fi
done
USE_X="${2:-1}"
CMD="torchrun --nproc_per_node 8 --nnodes ${#IPs[@]} --node_rank $NODE_RANK pretrain_gpt.py --num-layers $NUM_LAYERS"
if $USE_FP16; then
    CMD+=" --fp16"
fi
$CMD $( [ "${USE_X}" = "1" ] && echo "--num-experts 8 --moe-router-topk 2" ) $(printf -- '--%s-size %d ' hidden 64 ffn 128)
"""


def test_cluster_recipe_constructs_as_bash_reads_them(tmp_path):
    script = tmp_path / "recipe.sh"
    script.write_text(RECIPES.replace('CMD="torchrun ', 'CMD="printf %s\\n '))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for args in ([], ["false", "0"]):
        words = subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env=env,
                               check=True).stdout.splitlines()
        launch = read_launch_script(RECIPES, "recipe.sh", args)
        assert launch is not None and launch.world_size == 16 and launch.launcher[-2:] == ["--node_rank", "1"]
        assert launch.words == words[words.index("pretrain_gpt.py") + 1:], args
    assert read_launch_script(RECIPES, "recipe.sh").words == [  # type: ignore[union-attr]
        "--num-layers", "2", "--fp16", "--num-experts", "8", "--moe-router-topk", "2", "--hidden-size", "64",
        "--ffn-size", "128"]


def test_what_only_running_decides_is_refused_where_it_reaches_the_job():
    """A file test that only sets a launcher option reads (AWS's `--auto-resume=1` for srun); the same value among
    the job's arguments, a command whose output stands as arguments, or a memory-sizing variable is refused."""
    deferred = ('AUTO=""\nif [ -d "/opt/sagemaker_cluster" ]; then AUTO="--auto-resume=1"; fi\n'
                "srun ${AUTO} -l python -m torch.distributed.run --nproc_per_node=8 pretrain_gpt.py --num-layers 2 ")
    launch = read_launch_script(deferred, "s.sh")
    assert launch is not None and launch.launcher == ["srun", "-l", "python", "-m", "torch.distributed.run",
                                                      "--nproc_per_node=8"] and launch.world_size == 8
    with pytest.raises(UserError, match=r"^s.sh: line 3: AUTO reaches the job's arguments, and its value only running "
                                        r"the script decides \(line 2: the test `\[ -d /opt/sagemaker_cluster \]`"):
        read_launch_script(deferred + "$AUTO", "s.sh")
    with pytest.raises(UserError, match=r"^s.sh: line 3: a test only running the script decides whether `X=1` runs"):
        read_launch_script(deferred.replace("srun", "[ -n $AUTO ] && X=1\nsrun"), "s.sh")
    with pytest.raises(UserError, match=r"^s.sh: \$PYTORCH_CUDA_ALLOC_CONF sizes the job's memory, and its value only"):
        read_launch_script(deferred.replace('AUTO="--auto-resume=1"', "export PYTORCH_CUDA_ALLOC_CONF=x"), "s.sh")
    with pytest.raises(UserError, match=r"^s.sh: line 1: `\$\(cat args.txt\)`: the job's arguments include a command's "
                                        r"output, which only running the script decides"):
        read_launch_script("torchrun pretrain_gpt.py --num-layers 2 $(cat args.txt)", "s.sh")
    # a command's output as an argument's value stays a value (the mapping names it where it matters)
    launch = read_launch_script("torchrun pretrain_gpt.py --save /ckpt/$(date +%s) --wandb-exp-name $(hostname)",
                                "s.sh")
    assert launch is not None and launch.words == ["--save", "/ckpt/$(date +%s)", "--wandb-exp-name", "$(hostname)"]


def test_a_command_that_copies_an_entry_script_runs_no_job():
    text = ("cp pretrain_gpt_synthetic.py ./Megatron-LM/\ncd Megatron-LM\n"
            "python -m torch.distributed.launch --nproc_per_node 4 pretrain_gpt_synthetic.py --num-layers 2\n")
    launch = read_launch_script(text, "s.sh")
    assert launch is not None and launch.script == "pretrain_gpt_synthetic.py" and launch.words == ["--num-layers", "2"]
    assert launch.world_size == 4 and launch.jobs == 1


def test_sbatch_directives_give_the_environment_sbatch_sets():
    """AWS's recipes: ``--nnodes=$SLURM_JOB_NUM_NODES`` under ``#SBATCH --nodes=2``, and a branch that only echoes and
    assigns a launcher option under a file test."""
    text = ("#!/bin/bash\n#SBATCH --nodes=2 # two p4d\n#SBATCH --ntasks-per-node 8\n"
            "TORCHRUN_ARGS=(--nproc_per_node=8 --nnodes=$SLURM_JOB_NUM_NODES)\nAUTO=\"\"\n"
            'if [ -d "/opt/sagemaker_cluster" ]; then\n    echo "enabling --auto-resume=1"\n'
            '    AUTO="--auto-resume=1"\nfi\n'
            'srun ${AUTO} -l python -m torch.distributed.run "${TORCHRUN_ARGS[@]}" pretrain_gpt.py '
            "--num-layers $((SLURM_NTASKS_PER_NODE * 2))\n")
    launch = read_launch_script(text, "s.sbatch")
    assert launch is not None and launch.world_size == 16 and launch.words == ["--num-layers", "16"]
    assert launch.launcher == ["srun", "-l", "python", "-m", "torch.distributed.run", "--nproc_per_node=8",
                               "--nnodes=2"]
    # what the user gives is the environment over sbatch's
    over = read_launch_script(text, "s.sbatch", env={"SLURM_JOB_NUM_NODES": "4"})
    assert over is not None and over.world_size == 32


def test_source_reads_the_file_beside_the_script(tmp_path, capsys):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "model.sh").write_text("NUM_LAYERS=4\nexport NVTE_FUSED_ATTN=0\n[ -n \"$1\" ] && TP=$1\n")
    script = tmp_path / "run.sh"
    script.write_text("source configs/model.sh 2\n. ./missing.sh\ntorchrun --nproc_per_node 2 pretrain_gpt.py "
                      "--num-layers $NUM_LAYERS --tensor-model-parallel-size $TP --hidden-size 128 "
                      "--num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 "
                      "--global-batch-size 8 --vocab-size 1000\n")
    launch = read_launch_script(script.read_text(), str(script))
    assert launch is not None and launch.words[:4] == ["--num-layers", "4", "--tensor-model-parallel-size", "2"]
    assert launch.env["NVTE_FUSED_ATTN"] == "0"
    assert launch.notes == ["line 2: `source ./missing.sh`: not found here or beside the script; the variables it "
                            "sets are unset"]
    assert main(["from-megatron", str(script)]) == 0
    captured = capsys.readouterr()
    assert "note: run.sh: line 2: `source ./missing.sh`: not found" in captured.err
    assert "\nnum_layers = 4\n" in captured.out and "\ntp = 2\n" in captured.out


#: C-style loops and arithmetic commands (slime's recipes build --moe-layer-freq this way), and what the second hunt
#: of public scripts met: `srun … bash -c "$CMD"`, a build step under a file test, an entry script named otherwise
ARITHMETIC = r"""#!/bin/bash
arr=()
for ((i=0; i<4; i++)); do
    if (( i < 2 )); then arr+=($((i*2))); else arr+=(1); fi
done
N=0
(( N += 3, M = N * 2 ))
for (( ; N < 5 ; )); do N=$((N+1)); done
(( M > 5 )) && BIG=yes
if [ ! -d "$M/build" ]; then
    cd "$M"; python setup.py build_ext --inplace; cd -
fi
torchrun --nproc_per_node 8 pretrain_gpt.py --a ${arr[@]} --n $N --m $M --big $BIG
"""


def test_arithmetic_loops_and_commands_as_bash_runs_them(tmp_path):
    script = tmp_path / "a.sh"
    script.write_text(ARITHMETIC.replace("torchrun ", "printf '%s\\n' ").replace("python setup.py", "true"))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    words = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path,
                           check=True).stdout.splitlines()
    launch = read_launch_script(ARITHMETIC, "a.sh")
    assert launch is not None and launch.world_size == 8
    assert launch.words == words[words.index("pretrain_gpt.py") + 1:] == [
        "--a", "0", "2", "1", "1", "--n", "5", "--m", "6", "--big", "yes"]


def test_a_shell_string_and_an_entry_named_otherwise(tmp_path):
    text = ('#SBATCH --nodes=4\n#SBATCH --ntasks-per-node=4\nCMD="python3 pretrain_gpt.py --num-layers 4"\n'
            'srun -lu bash -c "RANK=\\$SLURM_PROCID $CMD --hidden-size 64"\n')
    launch = read_launch_script(text, "s.sh")
    assert launch is not None and launch.words == ["--num-layers", "4", "--hidden-size", "64"]
    assert launch.world_size == 16 and launch.launcher[:2] == ["srun", "-lu"]
    sft = 'RUN_PY="tasks/rl/sft.py"\ntorchrun --nproc_per_node 2 $RUN_PY --num-layers 4\n'
    assert read_launch_script(sft, "s.sh") is None
    launch = read_launch_script(sft, "s.sh", entry="sft.py")
    assert launch is not None and launch.script == "tasks/rl/sft.py" and launch.words == ["--num-layers", "4"]


#: functions as wrappers write them: defined, then called with their own positional parameters
FUNCTIONS = r"""#!/bin/bash
setup() {
    export NCCL_DEBUG=INFO
    LAYERS=${1:-4}
}
function run_job {
    local tp=$1
    if [ "$tp" -gt 8 ]; then
        echo "too large"; return 1
    fi
    torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers $LAYERS --tensor-model-parallel-size $tp "${@:2}"
}
noop()
{
    return 0
}
setup 6
noop
run_job 16 --never
run_job 2 --hidden-size 64 ${@:1:1}
"""


def test_functions_run_where_they_are_called_as_bash_runs_them(tmp_path):
    script = tmp_path / "f.sh"
    script.write_text(FUNCTIONS.replace("torchrun ", "printf '%s\\n' "))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    words = subprocess.run(["bash", str(script), "--seq-length", "x"], capture_output=True, text=True, env=env,
                           check=True).stdout.splitlines()
    launch = read_launch_script(FUNCTIONS, "f.sh", ["--seq-length", "x"])
    assert launch is not None and launch.env["NCCL_DEBUG"] == "INFO" and launch.jobs == 1
    assert launch.words == words[words.index("pretrain_gpt.py") + 1:] == [
        "--num-layers", "6", "--tensor-model-parallel-size", "2", "--hidden-size", "64", "--seq-length"]


def test_a_test_only_running_decides_refuses_where_it_guards_a_function_that_runs_the_job():
    text = ('launch() { torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 "$@"; }\n'
            "if [ -f /etc/never-here ]; then launch --a; else launch --b; fi\n")
    with pytest.raises(UserError, match=r"^g.sh: line 2: the test `\[ -f /etc/never-here \]`"):
        read_launch_script(text, "g.sh")
    # a package installed under such a test is not the job
    other = "if [ -d /x ]; then pip install vllm; fi\ntorchrun --nproc_per_node 2 pretrain_gpt.py --num-layers 2\n"
    launch = read_launch_script(other, "g.sh")
    assert launch is not None and launch.words == ["--num-layers", "2"]


#: getopts, read from a here-string, printf -v and a here-document, as recipe scripts write them
OPTS_SCRIPT = """\
#!/bin/bash
TP=1; PP=1; VERBOSE=0; MODEL=small
while getopts ":t:p:vm:" opt; do
  case $opt in
    t) TP=$OPTARG ;;
    p) PP=$OPTARG ;;
    v) VERBOSE=1 ;;
    m) MODEL=$OPTARG ;;
    \\?) echo "bad option -$OPTARG" ;;
  esac
done
shift $((OPTIND - 1))
printf -v LAYERS "%d" 24
printf -v TAG "%s-%s" "$MODEL" "$TP"
IFS=',' read -r HIDDEN HEADS REST <<< "1024, 16,a,b"
read -r -a SIZES <<< "  7   8  9 "
read X Y <<< "one two three"
cat > /tmp/never-written.yaml <<-EOF
	torchrun pretrain_gpt.py --num-layers 99
	EOF
cat <<'DONE'
python pretrain_gpt.py --hidden-size 1
DONE
torchrun pretrain_gpt.py --tensor-model-parallel-size $TP --pipeline-model-parallel-size $PP --num-layers $LAYERS \\
  --hidden-size $HIDDEN --num-attention-heads $HEADS --x "$REST" --v $VERBOSE --tag $TAG --s ${SIZES[1]} \\
  --n ${#SIZES[@]} --y "$Y" --rest "$@"
"""


@pytest.mark.skipif(not os.path.exists("/bin/bash"), reason="bash is needed to compare with")
def test_getopts_read_and_printf_v_give_the_same_words_as_bash(tmp_path):
    script = tmp_path / "train.sh"
    # bash runs it with torchrun and cat printing their words (cat's input and redirection stay bash's)
    script.write_text(OPTS_SCRIPT.replace("torchrun ", "printf '%s\\n' ").replace("cat > /tmp/never-written.yaml",
                                                                                 "cat > /dev/null"))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for argv in ([], ["-t", "4", "-p2"], ["-vt8", "-m", "big", "--", "-p", "9"], ["-x", "-t", "2", "left", "-p", "3"]):
        out = subprocess.run(["bash", str(script), *argv], capture_output=True, text=True, env=env,
                             check=True).stdout.splitlines()
        launch = read_launch_script(OPTS_SCRIPT, "train.sh", argv)
        assert launch is not None
        assert out[out.index("pretrain_gpt.py") + 1:] == launch.words, argv


def test_read_from_other_input_is_undecided_until_it_reaches_the_job():
    text = "read -r TP < tp.txt\necho $TP\npython pretrain_gpt.py --lr 1\n"
    launch = read_launch_script(text, "t")
    assert launch is not None and launch.words == ["--lr", "1"]
    with pytest.raises(UserError, match="TP reaches the job's arguments"):
        read_launch_script("read -r TP\npython pretrain_gpt.py --tensor-model-parallel-size $TP\n", "t")


@pytest.mark.skipif(not os.path.exists("/bin/bash"), reason="bash is needed to compare with")
def test_shell_option_clusters_before_the_script_as_bash_reads_them(tmp_path):
    for flags in (["-c"], ["-lc"], ["-ec", "--"], ["-lc", "--"]):
        inner = "TP=4; {} pretrain_gpt.py --tensor-model-parallel-size $TP --y \"$1\""
        argv = ["bash", *flags, inner.format("printf '%s\\n'"), "zero", "one"]
        out = subprocess.run(argv, capture_output=True, text=True, env={"PATH": os.environ.get("PATH", "/bin")},
                             check=True).stdout.splitlines()
        launch = read_launch_script(shlex.join(["bash", *flags, inner.format("python"), "zero", "one"]), "t")
        assert launch is not None and out[1:] == launch.words, flags


#: constructs public launch scripts use (Megatron-LM post_training/modelopt/*.sh, Pai-Megatron-Patch's *_lite.sh):
#: the script's own folder from $0, a file sourced from it, [[ -v NAME ]], a command substitution quoted inside a
#: ${NAME:-…} default and inside double quotes
SCRIPT_DIR_SOURCE = r"""#!/bin/bash
SCRIPT_DIR="$(dirname "$(readlink -f "$0")")"
HERE=$(dirname $0)
source "${SCRIPT_DIR}/conf/args.sh"
CP=1
if [[ -v CP && "$CP" != "1" ]]; then BACKEND=fused; else BACKEND=auto; fi
if [[ -v NOT_SET ]]; then X=set; else X=unset; fi
GPUS=${GPUS_PER_NODE:-$(python -c "import torch; print(torch.cuda.device_count())")}
NAME="$(basename "$0" .sh)"
torchrun --nproc_per_node 4 pretrain_gpt.py --pipeline-model-parallel-size $PP --attention-backend $BACKEND \
  --x $X --name "$NAME" --here $(basename "$HERE")
"""


@pytest.mark.skipif(not os.path.exists("/bin/bash"), reason="bash is needed to compare with")
def test_a_scripts_own_folder_and_quoted_substitutions_give_the_same_words_as_bash(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "args.sh").write_text("PP=2\n")
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT_DIR_SOURCE.replace("torchrun ", "printf '%s\\n' "))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    words = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env,
                           check=True).stdout.splitlines()
    launch = read_launch_script(SCRIPT_DIR_SOURCE, str(script))
    assert launch is not None and launch.notes == []
    assert words[words.index("pretrain_gpt.py") + 1:] == launch.words
    assert launch.words[:4] == ["--pipeline-model-parallel-size", "2", "--attention-backend", "auto"]


def test_a_module_entry_and_megatron_s_own_train_scripts_are_read_as_such(tmp_path):
    """`torchrun -m pretrain_gpt` runs pretrain_gpt.py; train_rl.py and examples/multimodal/train.py are
    Megatron-LM's own entries (an RL loop, a VLM), not a fork's."""
    args = "--num-layers 2 --hidden-size 64 --num-attention-heads 4"
    launch = read_launch_script(f"torchrun --nproc_per_node 2 -m pretrain_gpt {args}\n", "t.sh")
    assert launch is not None and launch.script == "pretrain_gpt.py" and launch.words[:2] == ["--num-layers", "2"]
    for entry, family in (("train_rl.py", "rl"), ("examples/multimodal/train.py", "multimodal-example")):
        script = tmp_path / "run.sh"
        script.write_text(f"torchrun --nproc_per_node 2 {entry} {args}\n")
        margs = read_megatron_config(script)
        assert (margs.family, margs.fork_entry) == (family, None)


def test_a_source_only_running_decides_is_refused_as_an_assignment_would_be():
    text = 'if [ ! -f "$1" ]; then PP=8; else source "$1"; fi\npython pretrain_gpt.py --lr 1 ' \
           '--pipeline-model-parallel-size $PP\n'
    with pytest.raises(UserError, match=r"line 1: the test `\[ ! -f \$1 \]`"):
        read_launch_script(text, "t.sh", ["dist.sh"])
