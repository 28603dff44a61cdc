"""Read Megatron-LM arguments as a user has them: a functional test's ``model_config.yaml`` or a
launch script's argument list.

A YAML config is the format of Megatron-LM's functional tests
(``tests/functional_tests/test_cases/<family>/<case>/model_config.yaml``): a ``MODEL_ARGS``
mapping whose keys may or may not carry the leading ``--`` (``true`` is a bare flag, ``false``
an absent one) and an optional ``ENV_VARS`` mapping. Anything else is an argument list as a launch
script passes it to ``pretrain_gpt.py``: several arguments per line, ``\\`` continuations, ``#``
comments, a flag's values up to the next ``--``, ``$'...'`` words as bash reads them. Both become
:class:`MegatronArgs`, with the quoting a launcher removes taken off values whose grammar has none
(:data:`UNQUOTED_ARGS`); what the arguments *mean* is :mod:`timeline.io.megatron_map`'s job, not this
module's.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from timeline.errors import UserError
from timeline.io.megatron_table import ENTRY_SCRIPTS, OWN_TRAIN_SCRIPTS
from timeline.io.text import read_user_text

#: a value given as a ``$VAR`` / ``${VAR}`` reference the launcher would have expanded
VAR_RE = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")


@dataclass(frozen=True, slots=True)
class MegatronArgs:
    """Arguments by their ``--dashed-name`` (a bare flag is ``True``; several values a tuple of
    strings), the environment the job ran with, and the model family the input itself names
    (a ``pretrain_bert.py`` in the script, a ``test_cases/t5/`` folder), if any, and a functional
    test's ``MODE`` (``pretraining``, ``inference``, ``rl``; None when the input has none)."""

    args: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    family: str | None = None
    family_source: str = ""
    mode: str | None = None
    world_size: int | None = None  # a launch script's torchrun --nproc_per_node × --nnodes
    #: the entry script when it is not one of Megatron-LM's own (a fork's ``pretrain_qwen.py``): read as
    #: ``pretrain_gpt.py`` unless ``--family`` says what it builds
    fork_entry: str | None = None
    #: what reading the input assumed, for the user (a sweep script's first job)
    notes: tuple[str, ...] = ()
    #: the Megatron-Core version the input itself shows (a log's arguments block: the parser that printed it)
    megatron_core: str | None = None
    #: a log shows the optimizer stepped before its memory line (an fp16 job past its skipped first steps)
    optimizer_stepped: bool = False
    #: a log's parameter counts per (tensor rank, pipeline rank), for the run's own to be held against
    param_counts: tuple[tuple[int, int, int], ...] = ()
    #: a log's report_memory lines: (global rank, iteration, allocated, max allocated, reserved, max reserved MiB)
    measured: tuple[tuple[int, int, float, float, float, float], ...] = ()
    #: the GPU a log names (:func:`timeline.io.device_name.device_in`: collect_env's or nvidia-smi's lines)
    device_name: str | None = None
    #: a log says the job loaded a checkpoint before its iterations (``load_checkpoint``'s line)
    loaded_checkpoint: bool = False
    #: what the input leaves open, as overlays of ``args`` (an option → its value, None: absent) to hold against
    #: ``param_counts``, the one ``args`` holds first (a Megatron-Bridge summary's model-provider fields)
    alternatives: tuple[dict[str, Any], ...] = ()


#: arguments written in a grammar that has no quote, backslash or ``$`` of its own, so any left in
#: the value are quoting that the launcher would have removed (:func:`unquote`)
UNQUOTED_ARGS = ("--pipeline-model-parallel-layout", "--moe-layer-freq", "--linear-attention-freq",
                 "--hybrid-override-pattern",
                 "--hybrid-layer-pattern")

#: bash's ``$'...'`` escapes (bash(1), QUOTING) that are one character
ANSI_C = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
          "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}
ANSI_C_NUMERIC = re.compile(r"([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|u([0-9A-Fa-f]{1,4})|U([0-9A-Fa-f]{1,8})")


def ansi_c_body(line: str, i: int) -> tuple[str, int]:
    """The text of a ``$'...'`` whose body starts at ``line[i]``, and the index after its closing quote."""
    out = []
    while i < len(line) and line[i] != "'":
        if line[i] == "\\" and i + 1 < len(line):
            num = ANSI_C_NUMERIC.match(line, i + 1)
            if line[i + 1] in ANSI_C:
                out.append(ANSI_C[line[i + 1]])
                i += 2
                continue
            if num:
                digits = next(g for g in num.groups() if g is not None)
                out.append(chr(int(digits, 8 if num.group(1) else 16)))
                i = num.end()
                continue
        out.append(line[i])
        i += 1
    return "".join(out), i + 1


def ansi_c_quotes(line: str) -> str:
    """``line`` with each ``$'...'`` (outside other quotes and comments) rewritten as the single-quoted
    word bash reads it as, so :func:`shlex.split`, which knows no ``$'...'``, splits it as bash does."""
    out, i, quote = [], 0, ""
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == "\\" and quote == '"':
                out.append(line[i:i + 2])
                i += 2
                continue
            quote = "" if ch == quote else quote
        elif ch == "$" and line.startswith("$'", i):
            body, i = ansi_c_body(line, i + 2)
            out.append("'" + body.replace("'", "'\\''") + "'")
            continue
        elif ch == "\\":
            out.append(line[i:i + 2])
            i += 2
            continue
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return "".join(out) + line[i:]
        out.append(ch)
        i += 1
    return "".join(out)


def unquote(value: str) -> str:
    """A value of :data:`UNQUOTED_ARGS` as Megatron's argparse receives it: one layer of shell quoting
    (``"..."``, ``'...'``, ``$'...'``, ``\\|``) removed at a time while any is left.

    A launch script's words have been through bash once (:func:`parse_arg_list`); a
    ``model_config.yaml`` value goes through Megatron's functional-test harness
    (``tests/functional_tests/shell_test_utils/_run_training.sh``: ``echo "$value" | xargs``, then an
    ``eval`` of the argument list), which is why its YAMLs wrote ``Et*3\\\\|\\\\(tt\\\\|\\\\)*6tmL`` for
    ``Et*3|(tt|)*6tmL`` from core_v0.14.0 to core_v0.16.1 — until 7418b1b8fb (2026-02-26) double-quoted
    values holding ``|``, ``(`` or ``)`` and the YAMLs dropped the backslashes. The layout grammar has
    none of these characters, so removing them until none is left recovers the string at any of those
    versions; a value quoted more times than its launcher unquotes is accepted here where Megatron
    would refuse it."""
    text = str(value)
    while any(c in text for c in "\\'\"$"):
        try:
            words = shlex.split(ansi_c_quotes(text))
        except ValueError:
            break  # unbalanced quotes: the layout parser names the stray character
        if len(words) != 1 or words[0] == text:
            break
        text = words[0]
    return text


def _key(raw: object) -> str:
    text = str(raw).strip()
    return text if text.startswith("--") else f"--{text}"


def from_mapping(model_args: dict[str, Any], env: dict[str, Any] | None = None, *,
                 family: str | None = None, family_source: str = "", mode: str | None = None) -> MegatronArgs:
    """``MODEL_ARGS`` / ``ENV_VARS`` as the functional-test YAML holds them."""
    args: dict[str, Any] = {}
    for raw, value in (model_args or {}).items():
        if value is False:
            continue  # false = the flag is absent
        if value is None:
            # an empty value: the harness writes the bare option (_run_training.sh's yq: key + " " + value), which a
            # flag takes and an argument needing a value refuses (the mapping names it)
            value = True
        key = _key(raw)
        args[key] = unquote(value) if key in UNQUOTED_ARGS and isinstance(value, str) else value
    envs = {str(k): str(v) for k, v in (env or {}).items() if v is not None}
    return MegatronArgs(args=args, env=envs, family=family, family_source=family_source, mode=mode)


def _family_from_path(path: Path) -> tuple[str | None, str]:
    parts = path.resolve().parts
    for i, part in enumerate(parts[:-1]):
        if part == "test_cases" and i + 2 < len(parts):
            return parts[i + 1], f"the path {'/'.join(parts[i:i + 2])}/"
    return None, ""


def fill_placeholders(text: str, env: dict[str, str]) -> str:
    """``$NAME`` / ``${NAME}`` in a YAML config's text replaced by ``env``'s values before YAML reads it, as
    ``envsubst`` fills a templated config before its launcher does (Megatron-MoE-ModelZoo's ``${TP}``,
    ``${SEQ_LEN}``; ``false`` then reads as YAML's false); a name ``env`` lacks stays as written, for the mapping to
    name where it matters."""
    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)",
                  lambda m: env.get(m.group(1) or m.group(2), m.group(0)), text)


def parse_yaml(text: str, path: Path, env: dict[str, str] | None = None) -> MegatronArgs:
    try:
        import yaml
    except ImportError:  # a dependency of the package; only a broken install lacks it
        raise UserError(f"{path}: reading a YAML config needs PyYAML, which this install lacks: "
                        "pip install pyyaml (or reinstall timeline)") from None

    if env:
        text = fill_placeholders(text, env)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: invalid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("MODEL_ARGS"), dict):
        raise UserError(f"{path}: expected a MODEL_ARGS mapping (Megatron-LM functional-test format)")
    env = data.get("ENV_VARS") or {}
    if not isinstance(env, dict):
        raise UserError(f"{path}: ENV_VARS must be a mapping of variable names to values")
    family, source = _family_from_path(path)
    mode = data.get("MODE")
    return from_mapping(data["MODEL_ARGS"], env, family=family, family_source=source,
                        mode=None if mode is None else str(mode))


#: an entry script: ``pretrain_<name>.py`` (Megatron-LM's own name the family they train:
#: :data:`timeline.io.megatron_table.ENTRY_SCRIPTS`), or a fork's ``train*.py`` / ``finetune*.py``
SCRIPT_RE = re.compile(r"(?:^|/)(pretrain_[A-Za-z0-9_]+|train[A-Za-z0-9_]*|finetune[A-Za-z0-9_]*)\.py$")


def parse_arg_list(text: str, path: Path | str = "<arguments>") -> MegatronArgs:
    """An argument list as a launch script passes it; ``VAR=value`` words before the script are
    its environment."""
    joined = re.sub(r"\\\r?\n", " ", text)
    words: list[str] = []
    try:
        for line in joined.splitlines():
            words += shlex.split(ansi_c_quotes(line), comments=True)
    except ValueError as exc:
        raise UserError(f"{path}: cannot split the argument list ({exc})") from None
    return group_words(words, path)


def group_words(words: list[str], path: Path | str = "<arguments>", env: dict[str, str] | None = None,
                world_size: int | None = None) -> MegatronArgs:
    """Arguments from an argument vector: each ``--name`` takes the words up to the next ``--name``; before
    the first, ``VAR=value`` words are the environment and a ``pretrain_<family>.py`` names the family."""
    args: dict[str, Any] = {}
    env = dict(env or {})
    family, source, fork = None, "", None
    current: str | None = None
    values: list[str] = []

    def close() -> None:
        if current is not None:
            args[current] = True if not values else values[0] if len(values) == 1 else tuple(values)
            if current in UNQUOTED_ARGS and len(values) == 1:
                args[current] = unquote(values[0])

    for word in words:
        if word.startswith("--") and len(word) > 2:
            close()
            name, eq, value = word.partition("=")
            current, values = name, ([value] if eq else [])
        elif current is None:
            script = SCRIPT_RE.search(word)
            if script:
                stem = script.group(1).removeprefix("pretrain_")
                own = next((f for rx, f in OWN_TRAIN_SCRIPTS if re.search(rx, word)), None)
                if own is not None:
                    family, source = own, f"the script {word}"
                elif script.group(1).startswith("pretrain_") and stem in ENTRY_SCRIPTS:
                    family, source = ENTRY_SCRIPTS[stem], f"the script {Path(word).name}"
                else:
                    fork = Path(word).name
            elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word):
                k, _, v = word.partition("=")
                env[k] = v
        else:
            values.append(word)
    close()
    if not args:
        raise UserError(f"{path}: no --arguments found (expected a model_config.yaml or a launch "
                        "script's argument list)")
    return MegatronArgs(args=args, env=env, family=family, family_source=source, world_size=world_size,
                        fork_entry=fork)


#: a bash script rather than an argument list: a shebang, a statement that is an assignment alone
#: (``TP=2``, ``export X=1``, ``ARGS=(``), an array expansion, or a launcher (whose own options come before the
#: entry script)
SCRIPT_HINTS = re.compile(r"\A#!|^[ \t]*(export[ \t]+)?[A-Za-z_][A-Za-z0-9_]*\+?=(\(|[^ \t\n]*[ \t]*(#.*)?$)|"
                          r"\$\{[A-Za-z_][A-Za-z0-9_]*\[[@*]\]\}|"
                          r"(^|[ \t;])(torchrun|srun|mpirun|deepspeed|python[0-9.]*[ \t]+-m[ \t]+torch\.distributed\.\w+)"
                          r"[ \t]", re.M)


def read_script(text: str, path: Path, script_args: list[str] | None = None,
                script_env: dict[str, str] | None = None, job: int | None = None,
                entry: str | None = None) -> MegatronArgs:
    """A bash launch script (:mod:`timeline.io.launch_script`) run with the positional arguments ``script_args``
    in the environment ``script_env``: the arguments it hands the entry script."""
    from timeline.io.launch_script import read_launch_script

    launch = read_launch_script(text, str(path), script_args, script_env, job or 1, entry)
    if launch is None:
        raise UserError(f"{path}: a shell script that runs no Megatron entry script (pretrain_gpt.py, "
                        "pretrain_mamba.py, …"
                        + (f"; {entry} is not run either" if entry else ", or the script --entry NAME.py names")
                        + "); give its argument list or the script that launches the job")
    # an unset variable (kept as its $NAME) is an option's value right after the option, which the mapping then
    # names where it matters; anywhere else it expands to nothing, as in bash
    words = [w for k, w in enumerate(launch.words)
             if not (VAR_RE.fullmatch(w) and (k == 0 or not launch.words[k - 1].startswith("--")))]
    margs = group_words([launch.script, *words], path, env=launch.env, world_size=launch.world_size)
    if margs.family is None and margs.fork_entry is None:  # an entry named by --entry (`sft.py`)
        margs = dataclasses.replace(margs, fork_entry=Path(launch.script).name)
    notes = [f"{path.name}: {n}" for n in launch.notes]
    if launch.jobs > 1 and job is None:
        notes.append(f"{path.name} launches {launch.jobs} jobs (a loop); the first is read (--job 1 … {launch.jobs} "
                     "picks one)")
    return dataclasses.replace(margs, notes=tuple(notes))


def read_log(text: str, env: dict[str, str] | None, megatron_core: str | None) -> MegatronArgs:
    """A job's log: its printed arguments block (:mod:`timeline.io.megatron_dump`), in the environment ``env``
    (the block holds no environment variable)."""
    from timeline.io.device_name import device_in
    from timeline.io.megatron_dump import read_dump

    dump = read_dump(text, megatron_core)
    args = dict(dump.args)
    notes = list(dump.notes)
    if dump.vocab_size is not None and "--vocab-size" not in args:
        args["--vocab-size"] = str(dump.vocab_size)
        notes.append(f"the tokenizer's vocabulary is the log's own 'padded vocab (size: {dump.vocab_size})' "
                     "(vocab_utils.py: _vocab_size_with_padding)")
    notes += [m.note() for m in dump.memory[:8]]
    if len(dump.memory) > 8:
        notes.append(f"… and {len(dump.memory) - 8} more report_memory lines")
    return MegatronArgs(args=args, env=dict(env or {}), world_size=dump.world_size, notes=tuple(notes),
                        megatron_core=dump.megatron_core, optimizer_stepped=dump.optimizer_stepped,
                        loaded_checkpoint=dump.loaded_checkpoint,
                        family=dump.family, family_source=f"the log's '{dump.family_line}'" if dump.family else "",
                        param_counts=dump.param_counts,
                        measured=tuple((m.rank, m.iteration, m.allocated, m.max_allocated, m.reserved, m.max_reserved)
                                       for m in dump.memory), device_name=device_in(text))


def read_bridge_config(text: str, cfg: dict[str, Any], env: dict[str, str] | None,
                       megatron_core: str | None, extra: dict[str, Any] | None = None) -> MegatronArgs:
    """A Megatron-Bridge job's ``ConfigContainer`` (:mod:`timeline.io.megatron_bridge`), in the environment ``env``;
    a hybrid (Mamba) provider is the ``mamba`` family. ``extra``: Megatron-LM options the user gives for what a
    configuration summary leaves out (``--script-args``)."""
    from timeline.io.device_name import device_in
    from timeline.io.megatron_bridge import provider_alternatives, read_bridge
    from timeline.io.megatron_dump import PARAMS

    args, core, notes = read_bridge(cfg, megatron_core)
    if extra:  # the user's own options for what a summary leaves out, over what was read
        args = {**args, **extra}
    model = cfg["model"]
    hybrid = bool(model.get("is_hybrid_model")) or "mamba" in str(model.get("_target_", "")).lower()
    if hybrid and "_summary" in cfg and not any(k in args for k in ("--hybrid-override-pattern",
                                                                     "--hybrid-layer-pattern")):
        raise UserError("a hybrid (Mamba) model's layer pattern is a model-provider field the Megatron-Bridge "
                        "configuration summary never prints; give it, e.g. --script-args '--hybrid-override-pattern "
                        "M-M*-…', or read the run_config.yaml a checkpoint saves")
    # get_model / _print_num_params ("number of parameters on (tensor, pipeline) model parallel rank (T, P): N")
    counts = {(int(m["tp"]), int(m["pp"])): int(m["n"]) for m in PARAMS.finditer(text)}
    return MegatronArgs(args=args, env=dict(env or {}), family="mamba" if hybrid else None,
                        family_source="the Megatron-Bridge config's hybrid model provider" if hybrid else "",
                        notes=tuple(notes), megatron_core=core, device_name=device_in(text),
                        param_counts=tuple((t, p, n) for (t, p), n in sorted(counts.items())),
                        alternatives=tuple(provider_alternatives(cfg, extra or {})) if "_summary" in cfg else ())


def read_megatron_config(path: str | Path, script_args: list[str] | None = None,
                         script_env: dict[str, str] | None = None, job: int | None = None,
                         entry: str | None = None, megatron_core: str | None = None) -> MegatronArgs:
    """Read CONFIG: YAML when it ends in ``.yaml``/``.yml``, a job's log when it holds Megatron's printed
    arguments block (``megatron_core``: the version the user says ran it), a launch script (run with
    ``script_args`` in the environment ``script_env``), else an argument list."""
    from timeline.io.megatron_bridge import bridge_config
    from timeline.io.megatron_dump import has_arguments_block

    path = Path(path)
    text = read_user_text(path, "a model_config.yaml or an argument list")
    if (bridge := bridge_config(text)) is not None:
        summary = "_summary" in bridge
        for given, name in ((None if summary else script_args, "--script-args"), (job, "--job"), (entry, "--entry")):
            if given is not None:
                raise UserError(f"{name}: {path} is a Megatron-Bridge configuration (its ConfigContainer is the job); "
                                f"drop {name}")
        extra = parse_arg_list(" ".join(shlex.quote(a) for a in script_args), path).args if script_args else None
        return read_bridge_config(text, bridge, script_env, megatron_core, extra)
    if path.suffix.lower() not in (".yaml", ".yml") and has_arguments_block(text):
        for given, name in ((script_args, "--script-args"), (job, "--job"), (entry, "--entry")):
            if given is not None:
                raise UserError(f"{name}: {path} is a job's log (its printed arguments block is the job); drop "
                                f"{name}")
        return read_log(text, script_env, megatron_core)
    script = bool(SCRIPT_HINTS.search(text)) and path.suffix.lower() not in (".yaml", ".yml")
    if script_args is not None and not script:
        raise UserError(f"--script-args: {path} is not a launch script (positional arguments are a script's)")
    if job is not None and not script:
        raise UserError(f"--job: {path} is not a launch script (a script that launches several jobs is)")
    if entry is not None and not script:
        raise UserError(f"--entry: {path} is not a launch script (the entry script is what a launch script runs)")
    yaml_file = path.suffix.lower() in (".yaml", ".yml")
    if script_env and not script and not yaml_file:
        raise UserError(f"--script-env: {path} is an argument list (give its values as arguments); it fills a launch "
                        "script's environment or a YAML config's ${NAME} placeholders")
    if yaml_file:
        return parse_yaml(text, path, script_env)
    if script:
        return read_script(text, path, script_args, script_env, job, entry)
    return parse_arg_list(text, path)
