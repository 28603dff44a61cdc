"""A serving engine's launch command read into a serving run file: ``vllm serve MODEL …``, ``python -m
vllm.entrypoints.openai.api_server …``, ``docker run … vllm/vllm-openai:TAG …``, ``python -m sglang.launch_server
…`` — one command line, or a shell script that runs one (read as bash would, never run:
:mod:`timeline.io.launch_script`), or a Kubernetes / Compose container or a Python program that runs the engine
(:mod:`timeline.io.serve_forms`).

Every option is looked up in the engine's own command-line surface (``serve_options.json``: the parsers of 18 vLLM
and 27 SGLang versions — ``EngineArgs`` / ``FrontendArgs``, ``ServerArgs`` — each read from that version's source,
with the versions each option form has: :func:`options`), so a typo is told from a real option and an option of
another version is named with the versions that have it; each real option is then mapped to a run-file key
(:data:`VLLM_MAPPED`, :data:`SGLANG_MAPPED`), listed as memory-neutral with the reason (:data:`NEUTRAL`), or refused
with one line naming what is not modelled (:data:`REFUSED`, else "not classified").
The model's ``config.json`` is the checkpoint's: a local folder the command names, the Hugging Face cache on this
machine, or ``--hf-config``; the quantization, dtype and layers come from it, as the engine reads them.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shlex
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from timeline.errors import UserError
from timeline.io.launch_script import SERVE_MODULES, SERVE_PROGRAMS, read_launch_script
from timeline.io.serve_forms import Found, fields_words, manifest_containers, python_calls
from timeline.io.serve_log import ServeLog, read_serve_log

_TABLES = Path(__file__).with_name("serve_options.json")
_CLASSES = Path(__file__).with_name("serve_option_classes.json")


#: SGLang's parser names some options after their long alias (``--tensor-parallel-size`` / ``--tp-size`` →
#: ``tensor_parallel_size``) and ``ServerArgs.from_cli_args`` renames them to the fields (``tp_size``)
_SGLANG_DESTS = {"tensor_parallel_size": "tp_size", "data_parallel_size": "dp_size",
                 "expert_parallel_size": "ep_size", "pipeline_parallel_size": "pp_size"}


@cache
def _table(engine: str) -> dict[str, Any]:
    return json.loads(_TABLES.read_text(encoding="utf-8"))[engine]


def versions(engine: str) -> list[str]:
    """The engine versions whose command line was read (release order)."""
    return list(_table(engine)["versions"])


@cache
def _forms(engine: str) -> dict[str, list[tuple[str, int, dict[str, Any]]]]:
    """Every name's forms over the versions read: (``present``, the newest version index having it, the form)."""
    out: dict[str, list[tuple[str, int, dict[str, Any]]]] = {}
    for opt in _table(engine)["options"]:
        present = opt["present"]
        dest = _SGLANG_DESTS.get(opt["dest"], opt["dest"]) if engine == "sglang" else opt["dest"]
        for name in opt["names"]:  # a BooleanOptionalAction's names include its --no- forms
            negates = bool(opt.get("boolean_optional")) and name.startswith("--no-")
            form = {"dest": dest, "takes_value": opt["takes_value"] and not negates, "nargs": opt.get("nargs"),
                    "negates": negates}
            out.setdefault(name, []).append((present, present.rfind("1"), form))
    return out


@cache
def options(engine: str, at: int | None = None) -> dict[str, dict[str, Any]]:
    """The engine's options by every name they go by (aliases and ``--no-`` negations included), over every version
    read: ``dest``, ``takes_value``, ``nargs``, ``negates`` (a ``--no-X`` of a boolean option) as version index
    ``at`` reads the name (the newest version at or before it having the name; the newest version having it when
    ``at`` is None or none before it has it), and ``present`` (one character per version: whether it has the name)."""
    out: dict[str, dict[str, Any]] = {}
    for name, forms in _forms(engine).items():
        merged = "".join("1" if "1" in bits else "0" for bits in zip(*(f[0] for f in forms), strict=True))
        earlier = [f for f in forms if at is not None and f[0][:at + 1].rfind("1") >= 0]
        pick = max(earlier, key=lambda f: f[0][:at + 1].rfind("1")) if earlier and at is not None \
            else max(forms, key=lambda f: f[1])
        out[name] = {**pick[2], "newest": pick[1], "present": merged}
    return out


def version_index(engine: str, version: str | None) -> int | None:
    """The newest version read at or before ``version`` (None: not given, or before every version read)."""
    from timeline.spec.engine_versions import parse_version

    v = parse_version(version) if version else None
    if v is None:
        return None
    best = None
    for i, name in enumerate(versions(engine)):
        w = parse_version(name)
        if w is not None and w[:len(v)] <= v:
            best = i
    return best


def presence(engine: str, name: str) -> str:
    """Which versions read have option ``name``, as ``0.7.3 … 0.9.2`` spans."""
    vs = versions(engine)
    bits = options(engine).get(name, {}).get("present", "")
    spans, start = [], None
    for i, c in enumerate(bits + "0"):
        if c == "1" and start is None:
            start = i
        elif c != "1" and start is not None:
            spans.append(vs[start] if start == i - 1 else f"{vs[start]} … {vs[i - 1]}")
            start = None
    return ", ".join(spans)


def table_source(engine: str) -> str:
    """What the engine's option table was read from."""
    vs = versions(engine)
    return f"{engine} {vs[0]} … {vs[-1]}, {len(vs)} versions' parsers from their sources on PyPI"


# -------------------------------------------------------------------------------------- finding the command

#: the images' entrypoints run the server whatever the tag; a tag that is a version (v0.8.5, 0.10.1.1) says which
_VLLM_IMAGE = re.compile(r"^(?:[\w.-]+(?::\d+)?/)*vllm/vllm-openai(?::(?:v?([0-9][\w.+]*)|[\w.+-]+))?(?:@sha256:\w+)?$")
_SGLANG_IMAGE = re.compile(r"^(?:[\w.-]+(?::\d+)?/)*lmsysorg/sglang(?::(?:v?([0-9][0-9.]*[0-9](?:\.post\d+)?)[\w.-]*"
                           r"|[\w.+-]+))?(?:@sha256:\w+)?$")


#: another image built on an engine (a name holding vllm / sglang, a tag starting with a release): its release
_ENGINE_BUILD = re.compile(r"^(?:[\w.-]+(?::\d+)?/)*([\w.-]*(?:vllm|sglang)[\w.-]*):v?(\d+\.\d+(?:\.\d+)?(?:\.post\d+)?)"
                           r"(?![\d])")


@dataclass
class ServeCommand:
    """The engine, the words after its entry (options and a positional model), the version a container image
    tag names (None when the command does not say), and the environment."""

    engine: str
    words: list[str]
    version: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    usage_context: str = "openai_api_server"  # vLLM's: the offline LLM class's defaults when "llm_class"
    capacity_gib: float | None = None  # a startup log's printed device total (GiB, PyTorch's)
    measured: dict[str, float] = field(default_factory=dict)  # what a startup log says the engine measured
    device_name: str | None = None  # the GPU a startup log names (timeline.io.device_name)
    engine_v1: str | None = None  # the engine a vLLM 0.8 … 0.10 log names (serving.engine_v1)


def _finder(argv: list[str]) -> int | None:
    """Where a serving engine's invocation starts in a command's words: the index its arguments follow."""
    for k, w in enumerate(argv):
        base = re.sub(r".*/", "", w)
        if base in SERVE_PROGRAMS and k + 1 < len(argv) and argv[k + 1] == "serve":
            return k + 1
        if w in SERVE_MODULES and k > 0 and argv[k - 1] == "-m":
            return k
        if _VLLM_IMAGE.match(w) and k > 0:  # docker run … vllm/vllm-openai:TAG ARGS: the image's entrypoint
            rest = argv[k + 1:]
            if rest[:1] == ["serve"]:  # --entrypoint vllm: `serve MODEL …` follows the image
                return k + 1
            if not any(_finder_plain(r) for r in rest[:3]):
                return k
    return None


def _finder_plain(word: str) -> bool:
    """A word of a command given after an image (`vllm …`, `python3 -m …`): it replaces the image's entrypoint."""
    return word in (*SERVE_PROGRAMS, "python", "python3", "-m") or word in SERVE_MODULES


def read_command(text: str, source: str, engine_hint: str, env: dict[str, str] | None = None,
                 job: int = 1) -> ServeCommand:
    """The serving command of ``text``: a shell script or a command line alone (its options alone are
    ``engine_hint``'s), a Kubernetes manifest or Compose file whose container runs the engine, or a Python program
    that builds it (:mod:`timeline.io.serve_forms`); of several, the ``job``-th (from 1). A ``--config FILE``
    among its options is read in their place (:func:`expand_config`)."""
    folder = Path(source).parent if Path(source).is_file() else None  # where the command's own file is
    cmd = _find_command(text, source, engine_hint, dict(env or {}), job, folder)
    cmd.words, note = expand_config(cmd.words, folder)
    if note:
        cmd.notes.append(note)
    return cmd


def _find_command(text: str, source: str, engine_hint: str, env: dict[str, str], job: int,
                  folder: Path | None) -> ServeCommand:
    log = read_serve_log(text)
    if log is not None:  # a startup log: the arguments it printed are the command
        if job != 1:
            raise UserError(f"--job {job}: {source} is an engine's log, of one command")
        words = _log_words(log, source)
        return ServeCommand(engine=log.engine, words=words, version=log.version, env=env,
                            usage_context=log.usage_context, notes=list(log.notes), capacity_gib=log.capacity_gib,
                            measured=dict(log.measured), device_name=log.device_name, engine_v1=log.engine_v1)
    calls = python_calls(text, env, options, folder)
    python = source.endswith(".py") or re.match(r"#![^\n]*python", text) is not None
    if calls is None and python:
        import ast

        try:
            ast.parse(text)
        except SyntaxError as exc:
            raise UserError(f"{source}: line {exc.lineno}: not valid Python ({exc.msg})") from None
        raise UserError(f"{source}: a Python program that builds no serving engine (vLLM's LLM(…) or EngineArgs(…), "
                        "SGLang's sgl.Engine(…)); a server it starts in a subprocess is not followed: give that "
                        "command line")
    if calls is not None:
        call = _pick(calls, job, source, "engine-building calls")
        assert call.engine is not None and call.words is not None
        return ServeCommand(engine=call.engine, words=call.words, env=env, usage_context=call.usage_context,
                            notes=[f"read {call.what}" + (f" ({len(calls)} in {source}; --job picks another)"
                                                          if len(calls) > 1 else "")])
    containers = manifest_containers(text, env, source)
    if containers is not None:
        serving: list[tuple[Found, ServeCommand]] = []
        for c in containers:
            assert c.text is not None
            cmd = _read_shell(c.text, f"{source}: {c.what}", engine_hint, c.env)
            if cmd is not None:
                serving.append((c, cmd))
        if not serving:
            raise UserError(f"{source}: no container runs a serving engine (a command `vllm serve …` / `python3 -m "
                            "sglang.launch_server …`, or args to the vllm/vllm-openai image's own entrypoint)")
        c, cmd = _pick(serving, job, source, "containers that serve")
        if cmd.version is None and c.image:
            m = _VLLM_IMAGE.match(c.image) if cmd.engine == "vllm" else _SGLANG_IMAGE.match(c.image)
            cmd.version = m.group(1) if m else None
            fork = _ENGINE_BUILD.match(c.image) if cmd.version is None else None
            if fork and cmd.engine in fork.group(1).lower():  # a build of the engine's image (aibrix/vllm-openai:v0.7.3…)
                cmd.version = fork.group(2)
                cmd.notes.append(f"engine version {fork.group(2)} read from the tag of {c.image}, a {cmd.engine} build "
                                 "other than the project's own image (give --engine-version if it differs)")
        cmd.notes = [*c.notes, f"read {c.what} (image {c.image})" + (
            f" ({len(serving)} serving containers in {source}; --job picks another)" if len(serving) > 1 else ""),
            *cmd.notes]
        return cmd
    found = _read_shell(text, source, engine_hint, env)
    if found is None:
        raise UserError(f"{source}: no serving command found (`vllm serve MODEL …`, `python -m "
                        "vllm.entrypoints.openai.api_server …`, `docker run … vllm/vllm-openai:TAG …`, `python -m "
                        "sglang.launch_server …`, a Kubernetes or Compose container running one, or a Python program "
                        "calling LLM(…) / sgl.Engine(…))")
    if job != 1:
        raise UserError(f"--job {job}: {source} runs one serving command")
    return found


def _log_words(log: ServeLog, source: str) -> list[str]:
    """The option words of a log's printed arguments, read with the option table of the version it names (the
    newest read where it names none); an SGLang field the table has no option for is one ServerArgs sets itself."""
    at = version_index(log.engine, log.version)
    table = options(log.engine, at)
    fields = log.fields
    if log.complete:
        # every field is printed as the engine settled it: the defaults and what it computed for this GPU and model
        # (SGLang's mem_fraction_static, chunked_prefill_size, attention_backend, …) beside what the user gave. The
        # fields the rules read are taken as printed; the others cannot be told from their defaults, so those whose
        # options are not modelled are named in a note instead of refused
        mapped = VLLM_MAPPED if log.engine == "vllm" else SGLANG_MAPPED
        dests = {o["dest"] for o in table.values()}
        classes = option_classes(log.engine)
        unmodelled = sorted(k for k, v in fields.items() if k in dests and k not in mapped
                            and v not in (None, False, "", [], {}) and (k in REFUSED or classes.get(k, {}).get(
                                "class") == "refused"))
        # a False is a default unless this version's option can say it (its --no- form)
        negatable = {o["dest"] for name, o in table.items() if o.get("negates") and at is not None
                     and o["present"][at] == "1"}
        fields = {k: v for k, v in fields.items() if k in mapped and k in dests and (v is not False or k in negatable)}
        if unmodelled:
            log.notes.append(f"printed fields of options not modelled that hold values ({len(unmodelled)}: their "
                             f"defaults, or the engine's own choice, or the user's; the log does not say): "
                             f"{', '.join(unmodelled[:8])}" + (" …" if len(unmodelled) > 8 else ""))
    return fields_words(fields, table, log.engine, f"{source}: the log's arguments")


T = TypeVar("T")


def _pick(items: list[T], job: int, source: str, what: str) -> T:
    if not 1 <= job <= len(items):
        raise UserError(f"--job {job}: {source} holds {what}: {len(items)} (give 1 … {len(items)})")
    return items[job - 1]


def _read_shell(text: str, source: str, engine_hint: str, env: dict[str, str]) -> ServeCommand | None:
    """The serving command of a shell script or command line, or None where it runs none."""
    launch = read_launch_script(text, source, env=env, finder=_finder)
    if launch is None and text.lstrip().startswith("-"):  # the options alone, for the engine the command names
        try:
            words = shlex.split(re.sub(r"\\\r?\n", " ", text), comments=True)
        except ValueError as exc:
            raise UserError(f"{source}: cannot split the options ({exc})") from None
        return ServeCommand(engine=engine_hint, words=words)
    if launch is None:
        return None
    entry = launch.script
    version = None
    if entry == "sglang.launch_server" or (entry == "serve" and re.sub(r".*/", "", launch.launcher[-1]) == "sglang"):
        engine = "sglang"
        for w in launch.launcher:
            m = _SGLANG_IMAGE.match(w)
            if m and m.group(1):
                version = m.group(1)
    else:
        engine = "vllm"
        for w in [entry, *launch.launcher][::-1]:  # the image the command runs in (`docker run IMAGE vllm serve …` too)
            m = _VLLM_IMAGE.match(w)
            if m and m.group(1):
                version = m.group(1)
                break
    return ServeCommand(engine=engine, words=list(launch.words), version=version, env=dict(launch.env),
                        notes=list(launch.notes))


# -------------------------------------------------------------------------------------- parsing the options

@dataclass
class Parsed:
    model: str | None
    values: dict[str, Any]  # dest → value (True for a flag; False for a --no- negation)
    given: dict[str, str]  # dest → the option name as written
    unknown: list[str]
    other_version: list[str] = field(default_factory=list)  # real options the engine version given lacks


def _literal(text: Any) -> Any:
    """A dotted JSON key's value as FlexibleArgumentParser takes it: JSON where it parses, else the string."""
    try:
        return json.loads(str(text))
    except ValueError:
        return str(text)


def parse_words(engine: str, words: list[str], version: str | None = None) -> Parsed:
    """The options as the engine's argparse reads them: ``--name value`` / ``--name=value``, flags, ``--no-`` negations;
    the first bare word is the model (``vllm serve MODEL``); an option of no version of the table is unknown."""
    at = version_index(engine, version)
    table = options(engine, at)
    values: dict[str, Any] = {}
    given: dict[str, str] = {}
    unknown: list[str] = []
    other: list[str] = []
    model = None
    k = 0
    while k < len(words):
        w = words[k]
        k += 1
        if not w.startswith("-") or re.fullmatch(r"-\d+(\.\d+)?", w):
            if model is None and engine == "vllm":
                model = w
                continue
            unset = re.fullmatch(r"\$\{?([A-Za-z_]\w*)\}?", w)
            if unset:  # a variable the shell reader found unset (a container's env from a secret, a script's input)
                raise UserError(f"${unset.group(1)} (in the command's words) is not set where the command is read; "
                                f"give its value with --script-env {unset.group(1)}=VALUE (--script-env "
                                f"{unset.group(1)}= for none)")
            raise UserError(f"{w!r}: a word outside any option (the model is given once: {model!r})")
        name, eq, inline = w.partition("=")
        if re.fullmatch(r"-O\d", name):  # vLLM's -O3: the optimization level glued to its flag
            name, eq, inline = "-O", "=", name[2:]
        dotted = None
        if engine == "vllm" and name.startswith("--") and "." in name:
            # FlexibleArgumentParser: --compilation-config.cudagraph_mode X is a key of the JSON option
            name, dotted = name.split(".", 1)
        # vLLM's FlexibleArgumentParser reads --max_model_len as --max-model-len; SGLang's argparse does not
        opt = table.get(name) or (table.get(name.replace("_", "-")) if engine == "vllm" else None)
        if opt is None and name.startswith("--"):
            # argparse's allow_abbrev (both parsers keep the default): an unambiguous prefix names its option (--tp)
            hits = {table[n]["dest"]: n for n in table if n.startswith(name if engine == "sglang"
                                                                         else name.replace("_", "-"))}
            if len(hits) == 1:
                opt = table[next(iter(hits.values()))]
        if opt is None or (dotted is not None and not opt["takes_value"]):
            unknown.append(name if dotted is None else f"{name}.{dotted}")
            if not eq and k < len(words) and not words[k].startswith("-"):
                k += 1  # its value, most likely
            continue
        if at is not None and opt["present"][at] != "1":
            other.append(name)
        if opt["takes_value"] and opt.get("nargs") in ("+", "*"):  # several words, up to the next option
            items = [inline] if eq else []
            while not eq and k < len(words) and not words[k].startswith("-"):
                items.append(words[k])
                k += 1
            value: Any = " ".join(items)
        elif opt["takes_value"] and opt.get("nargs") == "?" and (eq or k >= len(words) or words[k].startswith("-")):
            value = inline if eq else True
        elif opt["takes_value"]:
            if eq:
                value = inline
            elif k < len(words) and not re.fullmatch(r"--?[A-Za-z].*", words[k]):
                value = words[k]
                k += 1
            else:  # argparse: "expected one argument"
                raise UserError(f"{name} is given without a value")
            if dotted is not None:  # one key of a JSON option, merged into what the option already holds
                merged = json.loads(values[opt["dest"]]) if opt["dest"] in values else {}
                node = merged
                *path, last = dotted.split(".")
                for part in path:
                    node = node.setdefault(part, {})
                node[last] = _literal(value)
                value = json.dumps(merged)
        else:
            value = not opt["negates"]
            if eq:  # --flag=false is argparse's error for store_true; accept the spelled value
                value = inline.strip().lower() not in ("false", "0", "no")
        values[opt["dest"]] = value
        given[opt["dest"]] = name
    if engine == "vllm" and values.get("model"):
        model = str(values["model"])
    if engine == "sglang":
        model = str(values["model_path"]) if values.get("model_path") else None
    return Parsed(model=model, values=values, given=given, unknown=unknown, other_version=other)


def expand_config(words: list[str], folder: Path | None) -> tuple[list[str], str]:
    """``--config FILE.yaml`` replaced by the options it holds, placed before the command line's (which win), after
    the positional model: vLLM's ``FlexibleArgumentParser._pull_args_from_config`` / ``load_config_file``
    (``vllm/utils/__init__.py`` at 0.11.0) and SGLang's ``ConfigArgumentMerger`` (``server_args_config_parser.py`` at
    0.5.5) — each key ``--key``, a list its items, ``true`` the bare flag, ``false`` nothing. The file is looked for
    where the command runs (this folder), then beside the command's own file. Returns (words, a note or "")."""
    at = next((k for k, w in enumerate(words) if w == "--config" or w.startswith("--config=")), None)
    if at is None:
        return words, ""
    name, _, inline = words[at].partition("=")
    raw = inline if inline else (words[at + 1] if at + 1 < len(words) else "")
    if not raw or raw.startswith("-"):
        raise UserError("--config is given without a file")
    rest = words[:at] + words[at + (1 if inline else 2):]
    path = Path(raw).expanduser()
    tries = [path] if path.is_absolute() else [path, *([folder / path] if folder else [])]
    found = next((p for p in tries if p.is_file()), None)
    if found is None:
        raise UserError(f"--config {raw}: no such file here or beside the command's file (give the engine's options "
                        "on the command line, or run from where the file is)")
    if found.suffix.lower() not in (".yaml", ".yml"):
        raise UserError(f"--config {raw}: the engines read a YAML file (.yaml or .yml)")
    import yaml

    try:
        data = yaml.safe_load(found.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UserError(f"--config {raw}: cannot read it ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"--config {raw}: expected a mapping of option names to values")
    added: list[str] = []
    for key, value in data.items():
        if isinstance(value, bool):
            added += [f"--{key}"] if value else []
        elif isinstance(value, list):
            added += [f"--{key}", *(str(v) for v in value)] if value else []
        else:
            added += [f"--{key}", json.dumps(value) if isinstance(value, dict) else str(value)]
    model = 1 if rest and not rest[0].startswith("-") else 0  # `vllm serve MODEL --config …`: after the model
    return rest[:model] + added + rest[model:], f"read --config {found} ({len(data)} options, the command line's win)"


def unknown_line(engine: str, names: list[str]) -> str:
    table = options(engine)
    listed = []
    for n in names:
        close = difflib.get_close_matches(n, table, n=2, cutoff=0.75)
        listed.append(f"{n} (did you mean {' or '.join(close)}?)" if close else n)
    what = "an option" if len(names) == 1 else f"{len(names)} options"
    return (f"{', '.join(listed)}: {what} of no {engine} command line this tool has read ({table_source(engine)}); "
            f"a typo, or a plugin's option (--ignore-arg passes over it; an --engine-version later than "
            f"{versions(engine)[-1]} has such options passed over with a note)")


def after_every_table(engine: str, version: str | None) -> bool:
    """Whether ``version`` is later than the newest release whose command line was read: its options may include
    ones added since, which no table has."""
    from timeline.spec.engine_versions import parse_version

    v, newest = parse_version(version or ""), parse_version(versions(engine)[-1])
    return v is not None and newest is not None and v > newest


def newer_options_note(engine: str, version: str, names: list[str]) -> str:
    """The note for options no table read has, of a version :func:`after_every_table`."""
    table = options(engine)
    hints = []
    for n in names:
        close = difflib.get_close_matches(n, table, n=2, cutoff=0.75)
        hints.append(f"{n} (or a typo of {' / '.join(close)}?)" if close else n)
    return (f"{', '.join(hints)}: of no {engine} command line read ({table_source(engine)}); {engine} {version} is "
            f"later, so {'they' if len(names) > 1 else 'it'} may be its own: passed over as memory-neutral, "
            "unverified — if one moves memory, these numbers miss it")


def version_line(engine: str, version: str, names: list[str]) -> str:
    """Real options the named engine version does not have, each with the versions that do."""
    listed = "; ".join(f"{n} is an option of {engine} {presence(engine, n)}" for n in names)
    return (f"{listed} — not of {engine} {version} (give the version the command ran with --engine-version, or drop "
            f"{'it' if len(names) == 1 else 'them'})")


# -------------------------------------------------------------------------------------- the model's config

def hf_cache_config(model: str) -> Path | None:
    """``config.json`` of ``model`` (``org/name``) in the Hugging Face cache on this machine: ``$HF_HUB_CACHE``, else
    ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``; the snapshot ``refs/main`` names, else the newest."""
    if "/" not in model or model.count("/") != 1:
        return None
    hub = os.environ.get("HF_HUB_CACHE") or (Path(os.environ["HF_HOME"]) / "hub" if os.environ.get("HF_HOME")
                                             else Path.home() / ".cache" / "huggingface" / "hub")
    repo = Path(hub) / ("models--" + model.replace("/", "--"))
    ref = repo / "refs" / "main"
    if ref.is_file():
        snap = repo / "snapshots" / ref.read_text(encoding="utf-8").strip() / "config.json"
        if snap.is_file():
            return snap
    snaps = sorted((repo / "snapshots").glob("*/config.json"), key=lambda p: p.stat().st_mtime) \
        if (repo / "snapshots").is_dir() else []
    return snaps[-1] if snaps else None


def model_config(model: str | None, explicit: str | None) -> Path:
    """The checkpoint's ``config.json``: ``--hf-config`` (a file or a folder holding one), the model as a local folder,
    or the Hugging Face cache."""
    if explicit:
        p = Path(explicit).expanduser()
        p = p / "config.json" if p.is_dir() else p
        if not p.is_file():
            raise UserError(f"--hf-config {explicit}: no such file (give the checkpoint's config.json or its folder)")
        return p
    if model is None:
        raise UserError("the command names no model (vllm serve MODEL / --model, SGLang's --model-path)")
    local = Path(model).expanduser()
    if (local / "config.json").is_file():
        return local / "config.json"
    cached = hf_cache_config(model)
    if cached is not None:
        return cached
    raise UserError(f"{model}: its config.json is not on this machine (not a local folder, not in the Hugging Face "
                    f"cache); give --hf-config PATH, e.g. after `huggingface-cli download {model} config.json`")


# -------------------------------------------------------------------------------------- the mapping

#: run-file keys the engines' options set, by the option's dest (vLLM: ``EngineArgs`` fields)
VLLM_MAPPED = {
    "tensor_parallel_size": "parallel.tp", "pipeline_parallel_size": "parallel.pp",
    "data_parallel_size": "parallel.dp", "enable_expert_parallel": "parallel.ep (tp · dp)",
    "gpu_memory_utilization": "serving.gpu_memory_utilization", "max_model_len": "serving.max_model_len",
    "max_num_seqs": "serving.max_num_seqs", "max_num_batched_tokens": "serving.max_num_batched_tokens",
    "block_size": "serving.block_size", "kv_cache_dtype": "serving.kv_cache_dtype",
    "enforce_eager": "serving.enforce_eager", "enable_prefix_caching": "serving.enable_prefix_caching",
    "enable_chunked_prefill": "serving.enable_chunked_prefill", "dtype": "serving.dtype",
    "quantization": "serving.quantization / weight_dtype (online fp8, bitsandbytes) / the checkpoint's config",
    "cuda_graph_sizes": "serving.cuda_graph_sizes", "cudagraph_capture_sizes": "serving.cuda_graph_sizes",
    "max_cudagraph_capture_size": "serving.max_cudagraph_capture_size",
    "compilation_config": "serving.cudagraph_mode / cuda_graph_sizes (its cudagraph_* keys)",
    "speculative_config": "serving.speculative_method / num_speculative_tokens (MTP)",
    "limit_mm_per_prompt": "serving.limit_mm_per_prompt (images)", "model": "model.hf_config",
    "num_gpu_blocks_override": "serving.num_gpu_blocks_override",
    "kv_cache_memory_bytes": "serving.kv_cache_memory_bytes",
    "disable_custom_all_reduce": "serving.disable_custom_all_reduce",
}
#: SGLang's ``ServerArgs`` fields
SGLANG_MAPPED = {
    "model_path": "model.hf_config", "tp_size": "parallel.tp", "dp_size": "parallel.dp", "ep_size": "parallel.ep",
    "pp_size": "parallel.pp", "mem_fraction_static": "serving.mem_fraction_static",
    "context_length": "serving.max_model_len", "max_running_requests": "serving.max_num_seqs",
    "chunked_prefill_size": "serving.max_num_batched_tokens", "page_size": "serving.block_size",
    "kv_cache_dtype": "serving.kv_cache_dtype", "disable_cuda_graph": "serving.enforce_eager",
    "enable_dp_attention": "serving.enable_dp_attention", "dtype": "serving.dtype",
    "quantization": "the checkpoint's quantization_config", "disable_radix_cache": "serving.enable_prefix_caching",
    "enable_ep_moe": "parallel.ep = tp (0.4's server_args.py: ep_size = tp_size)",
    "max_total_tokens": "serving.max_total_tokens",
    "disable_custom_all_reduce": "serving.disable_custom_all_reduce",
    "cuda_graph_max_bs": "serving.cuda_graph_max_bs", "cuda_graph_bs": "serving.cuda_graph_max_bs (the largest)",
    "max_prefill_tokens": "serving.max_prefill_tokens",
    "attn_dp_size": "serving.enable_dp_attention, parallel.dp (0.5.22's spelling of DP attention)",
    "cuda_graph_max_bs_decode": "serving.cuda_graph_max_bs",
    "cuda_graph_bs_decode": "serving.cuda_graph_max_bs (the largest)",
    "enable_piecewise_cuda_graph": "serving.prefill_cuda_graph = \"on\"",
    "disable_piecewise_cuda_graph": "serving.prefill_cuda_graph = \"off\"",
    "disable_prefill_cuda_graph": "serving.prefill_cuda_graph = \"off\"",
    "cuda_graph_backend_prefill": "serving.prefill_cuda_graph = \"off\" (disabled; another backend is refused)",
}

_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "half": "fp16", "fp16": "fp16",
           "float32": "fp32", "float": "fp32", "fp32": "fp32"}
_KV_DTYPES = {"auto": "auto", "bfloat16": "bf16", "bf16": "bf16", "fp8": "fp8", "fp8_e4m3": "fp8_e4m3",
              "fp8_e5m2": "fp8_e5m2", "fp8_ds_mla": "fp8_ds_mla"}
#: ``--speculative-config``'s methods that are a model's own multi-token-prediction layers
MTP_METHODS = ("mtp", "deepseek_mtp", "qwen3_next_mtp", "mimo_mtp", "glm4_moe_mtp", "ernie_mtp", "longcat_flash_mtp")


def human_int(name: str, text: Any) -> int:
    """An integer as vLLM's ``human_readable_int`` reads it (``vllm/utils``: ``1k`` = 1,000, ``1K`` = 1,024, ``25.6k``,
    ``1m`` / ``1M``, ``1g`` / ``1G``), or a plain one."""
    s = str(text).strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", s)
    if not m:
        raise UserError(f"{name} {s!r}: expected an integer (or vLLM's 32k / 32K form)")
    number, unit = m.groups()
    if not unit:
        if "." in number:
            raise UserError(f"{name} {s!r}: expected an integer")
        return int(number)
    if unit.isupper():  # binary: an integer count of KiB / MiB / GiB
        if "." in number:
            raise UserError(f"{name} {s!r}: a binary multiplier (K, M, G) takes an integer")
        return int(number) * 1024 ** ("KMG".index(unit) + 1)
    return int(float(number) * 1000 ** ("kmg".index(unit) + 1))


def _int(name: str, v: Any) -> int:
    try:
        return int(str(v))
    except ValueError:
        raise UserError(f"{name}: expected an integer, got {v!r}") from None


def _float(name: str, v: Any) -> float:
    try:
        return float(str(v))
    except ValueError:
        raise UserError(f"{name}: expected a number, got {v!r}") from None


def _json(name: str, v: Any) -> dict[str, Any]:
    try:
        data = json.loads(str(v))
    except ValueError:
        raise UserError(f"{name}: {v!r} is not JSON (give it as '{{\"key\": value}}')") from None
    if not isinstance(data, dict):
        raise UserError(f"{name}: expected a JSON object, got {v!r}")
    return data


@dataclass
class Mapped:
    """The run file's sections, and for its header: option → key, option → why memory-neutral."""

    sections: dict[str, dict[str, Any]]
    mapped: dict[str, str]
    neutral: dict[str, str]


def _sglang_prefill_tokens(v: dict[str, Any], given: dict[str, str], sv: dict[str, Any],
                           mapped: dict[str, str]) -> None:
    """``--chunked-prefill-size`` ≤ 0 turns SGLang's chunked prefill off (a prefill batch then holds up to
    ``--max-prefill-tokens``, :func:`timeline.io.serve_runfile._sglang_defaults`); ``--max-prefill-tokens`` is
    ``serving.max_prefill_tokens``."""
    chunk = sv.get("max_num_batched_tokens")
    if isinstance(chunk, int) and chunk <= 0:
        sv.pop("max_num_batched_tokens")
        sv["enable_chunked_prefill"] = False
        mapped[given["chunked_prefill_size"]] = "serving.enable_chunked_prefill = false (a prefill batch: " \
            "max_prefill_tokens)"
    if "max_prefill_tokens" in v:
        sv["max_prefill_tokens"] = _int(given["max_prefill_tokens"], v["max_prefill_tokens"])
        mapped[given["max_prefill_tokens"]] = "serving.max_prefill_tokens"


def async_scheduling_refusal(version: str, pp: int, speculative: bool) -> str | None:
    """Why vLLM ``version`` refuses to start with ``--async-scheduling`` beside pipeline parallelism or
    speculative decoding, None where it starts: ``EngineArgs.create_engine_config`` (engine/arg_utils.py, read at
    0.10.1, 0.10.2 and 0.11.0) raises for pp > 1 and for any speculative config; ``VllmConfig.__post_init__``
    (config/vllm.py, read at 0.11.2 … 0.14.0) for pp > 1 and for a method not EAGLE/MTP-kind; at 0.15.0 (read up to
    0.19.0) pp > 1 no longer raises."""
    from timeline.spec.engine_versions import parse_version

    v = parse_version(version)
    if v is None or not (0, 10, 1) <= v < (0, 15):
        return None
    if pp > 1:
        return (f"--async-scheduling with pipeline parallelism: vLLM {version} raises \"Async scheduling is not "
                "(yet) compatible with pipeline_parallel_size > 1\" (engine/arg_utils.py up to 0.11.0, "
                "config/vllm.py to 0.14); drop --async-scheduling")
    if speculative and v < (0, 11, 2):
        return (f"--async-scheduling with speculative decoding: vLLM {version} raises \"Currently, speculative "
                "decoding is not supported with async scheduling.\" (engine/arg_utils.py: "
                "EngineArgs.create_engine_config); drop --async-scheduling")
    return None


def map_options(engine: str, parsed: Parsed, checkpoint_quantized: bool) -> Mapped:
    """The run file's ``[parallel]`` and ``[serving]`` from the parsed options (``checkpoint_quantized``: the
    checkpoint's config has a ``quantization_config``, which then decides the weights)."""
    v, given = parsed.values, parsed.given
    par: dict[str, Any] = {}
    sv: dict[str, Any] = {"engine": engine}
    mapped: dict[str, str] = {}
    table = VLLM_MAPPED if engine == "vllm" else SGLANG_MAPPED

    def put(dest: str, section: dict[str, Any], key: str, value: Any) -> None:
        section[key] = value
        mapped[given[dest]] = table[dest]

    if v.get("disable_custom_all_reduce"):  # both engines' --disable-custom-all-reduce (a flag)
        put("disable_custom_all_reduce", sv, "disable_custom_all_reduce", True)
    if engine == "vllm":
        for dest, key in (("tensor_parallel_size", "tp"), ("pipeline_parallel_size", "pp"),
                          ("data_parallel_size", "dp")):
            if dest in v:
                put(dest, par, key, _int(given[dest], v[dest]))
        if v.get("enable_expert_parallel"):  # vllm/config/parallel.py: the experts spread over TP × DP ranks
            put("enable_expert_parallel", par, "ep", par.get("tp", 1) * par.get("dp", 1))
        if "gpu_memory_utilization" in v:
            put("gpu_memory_utilization", sv, "gpu_memory_utilization",
                _float(given["gpu_memory_utilization"], v["gpu_memory_utilization"]))
        for dest in ("max_model_len", "max_num_batched_tokens"):
            if dest in v:
                put(dest, sv, dest, human_int(given[dest], v[dest]))
        for dest in ("max_num_seqs", "block_size", "num_gpu_blocks_override"):
            if dest in v:
                put(dest, sv, dest, _int(given[dest], v[dest]))
        if "kv_cache_memory_bytes" in v:  # arg_utils.py (0.11.0): a human_readable_int (20G, 20g)
            put("kv_cache_memory_bytes", sv, "kv_cache_memory_bytes",
                human_int(given["kv_cache_memory_bytes"], v["kv_cache_memory_bytes"]))
        for dest in ("enforce_eager", "enable_prefix_caching", "enable_chunked_prefill"):
            if dest in v:
                put(dest, sv, dest, bool(v[dest]))
        for dest in ("cuda_graph_sizes", "cudagraph_capture_sizes"):
            if dest in v:
                sizes = [_int(given[dest], x) for x in re.split(r"[\s,\[\]]+", str(v[dest])) if x]
                put(dest, sv, "cuda_graph_sizes", sizes)
        if "max_cudagraph_capture_size" in v:
            put("max_cudagraph_capture_size", sv, "max_cudagraph_capture_size",
                _int(given["max_cudagraph_capture_size"], v["max_cudagraph_capture_size"]))
        if "compilation_config" in v:
            level = _compilation(given["compilation_config"], v["compilation_config"], sv)
            mapped[given["compilation_config"]] = ("(an optimization level: no memory of its own here)" if level
                                                   else table["compilation_config"])
        if "speculative_config" in v:
            spec = _json(given["speculative_config"], v["speculative_config"])
            method = str(spec.get("method", ""))
            if method not in MTP_METHODS:
                raise UserError(f"{given['speculative_config']}: method {method!r}: only a model's own MTP layers "
                                f"({', '.join(MTP_METHODS)}) are modelled; a draft model, EAGLE or n-gram is not")
            sv["speculative_method"] = "mtp"
            sv["num_speculative_tokens"] = _int("num_speculative_tokens", spec.get("num_speculative_tokens", 1))
            mapped[given["speculative_config"]] = table["speculative_config"]
        if "limit_mm_per_prompt" in v:
            put("limit_mm_per_prompt", sv, "limit_mm_per_prompt", _images(given["limit_mm_per_prompt"],
                                                                           v["limit_mm_per_prompt"]))
    else:
        for dest, key in (("tp_size", "tp"), ("dp_size", "dp"), ("ep_size", "ep"), ("pp_size", "pp")):
            if dest in v:
                put(dest, par, key, _int(given[dest], v[dest]))
        if "mem_fraction_static" in v:
            put("mem_fraction_static", sv, "mem_fraction_static",
                _float(given["mem_fraction_static"], v["mem_fraction_static"]))
        for dest, key in (("context_length", "max_model_len"), ("max_running_requests", "max_num_seqs"),
                          ("chunked_prefill_size", "max_num_batched_tokens"), ("page_size", "block_size"),
                          ("max_total_tokens", "max_total_tokens")):
            if dest in v:
                put(dest, sv, key, _int(given[dest], v[dest]))
        _sglang_prefill_tokens(v, given, sv, mapped)
        if v.get("disable_cuda_graph"):
            put("disable_cuda_graph", sv, "enforce_eager", True)
        for dest in ("cuda_graph_max_bs", "cuda_graph_max_bs_decode"):  # the decode graphs' (0.5.23's name)
            if dest in v:
                put(dest, sv, "cuda_graph_max_bs", _int(given[dest], v[dest]))
        for dest in ("cuda_graph_bs", "cuda_graph_bs_decode"):  # server_args.py: cuda_graph_max_bs = max(cuda_graph_bs)
            if dest in v:
                sizes = [_int(given[dest], x) for x in re.split(r"[\s,\[\]]+", str(v[dest])) if x]
                if sizes:
                    put(dest, sv, "cuda_graph_max_bs", max(sizes))
        for dest, state in (("enable_piecewise_cuda_graph", "on"), ("disable_piecewise_cuda_graph", "off"),
                            ("disable_prefill_cuda_graph", "off")):
            if v.get(dest):
                put(dest, sv, "prefill_cuda_graph", state)
        if "cuda_graph_backend_prefill" in v:
            # 0.5.14 on: --cuda-graph-backend-prefill X, and the flags folded into it (--disable-piecewise-cuda-graph
            # sets "disabled"; --enable-breakable-cuda-graph / --enforce-piecewise-cuda-graph force a backend)
            name, value = given["cuda_graph_backend_prefill"], v["cuda_graph_backend_prefill"]
            if value == "disabled" or name == "--disable-piecewise-cuda-graph":
                put("cuda_graph_backend_prefill", sv, "prefill_cuda_graph", "off")
            else:
                raise UserError(f"{name}{'' if value is True else f' {value}'}: a prefill CUDA-graph backend chosen "
                                "by hand (forced past the release's own rules) is not modelled; leave the "
                                "backend to the release's default (drop the option)")
        if v.get("enable_dp_attention"):
            put("enable_dp_attention", sv, "enable_dp_attention", True)
            # server_args.py (0.4, 0.5): with DP attention and no --dp-size, dp_size = tp_size
            par.setdefault("dp", par.get("tp", 1))
        if "attn_dp_size" in v:
            # 0.5.22 on (arg_groups/parallel_hook.py handle_deprecated_dp_attention): --enable-dp-attention --dp-size N
            # is rewritten to --attn-dp-size N with dp_size 1; both are DP attention over N groups inside tp
            groups = _int(given["attn_dp_size"], v["attn_dp_size"])
            if groups > 1:
                if int(par.get("dp", 1)) > 1 and not v.get("enable_dp_attention"):
                    raise UserError(f"{given['attn_dp_size']} {groups} with {given['dp_size']} {par['dp']}: data-"
                                    "parallel replicas of an attention-DP engine are not modelled; give one of them")
                put("attn_dp_size", sv, "enable_dp_attention", True)
                par["dp"] = groups
        if v.get("enable_ep_moe"):  # 0.4's server_args.py: ep_size = tp_size
            put("enable_ep_moe", par, "ep", par.get("tp", 1))
        if v.get("disable_radix_cache"):
            put("disable_radix_cache", sv, "enable_prefix_caching", False)
    if "dtype" in v and str(v["dtype"]) != "auto":
        dtype = _DTYPES.get(str(v["dtype"]).lower())
        if dtype is None:
            raise UserError(f"{given['dtype']} {v['dtype']!r}: expected auto, bfloat16, float16 or float32")
        put("dtype", sv, "dtype", dtype)
    if "kv_cache_dtype" in v:
        kv = _KV_DTYPES.get(str(v["kv_cache_dtype"]).lower())
        if kv is None:
            raise UserError(f"{given['kv_cache_dtype']} {v['kv_cache_dtype']!r}: a KV cache dtype not modelled "
                            f"(modelled: {', '.join(_KV_DTYPES)})")
        put("kv_cache_dtype", sv, "kv_cache_dtype", kv)
    if "quantization" in v and v["quantization"] not in (None, "None"):
        q = str(v["quantization"]).lower()
        if checkpoint_quantized:
            if engine == "vllm":
                sv["quantization"] = q
            mapped[given["quantization"]] = ("serving.quantization (the checkpoint's quantization_config decides the "
                                             "format; gptq / awq keep it off Marlin)")
        elif q == "bitsandbytes" and engine == "vllm":
            # model_loader/bitsandbytes_loader.py _unquantized_generator: NF4 in blocks of 64, whatever else is asked
            put("quantization", sv, "weight_dtype", "nf4")
            sv["quant_group_size"] = 64
            mapped[given["quantization"]] = "serving.weight_dtype = nf4 (bitsandbytes quantizes at load: NF4, blocks of 64)"
        elif q == "fp8" and engine == "vllm":
            # vllm/model_executor/layers/quantization/fp8.py: Fp8Config on an unquantized checkpoint quantizes each
            # weight at load, one scale per tensor
            put("quantization", sv, "weight_dtype", "fp8")
            sv["quant_group_size"] = 0
            mapped[given["quantization"]] = ("serving.weight_dtype = fp8, quant_group_size = 0: vLLM keeps one fp32 "
                                             "scale per tensor; the run file's nearest format, one per output row, "
                                             "counts 4 B a row more")
        else:
            raise UserError(f"{given['quantization']} {q}: quantizing an unquantized checkpoint at load with {q} is "
                            "not modelled (a checkpoint published quantized is read from its config.json)")
    return Mapped(sections={"parallel": par, "serving": sv}, mapped=mapped, neutral={})


def _compilation(name: str, raw: Any, sv: dict[str, Any]) -> bool:
    """``--compilation-config`` / ``-O``: a level (``-O3``: no memory of its own here; True) or JSON whose
    ``cudagraph_mode``, ``cudagraph_capture_sizes`` and ``max_cudagraph_capture_size`` set the graphs; its other keys
    change no memory modelled."""
    text = str(raw).strip()
    if re.fullmatch(r"\d+", text):
        return True
    cfg = _json(name, text)
    if "cudagraph_mode" in cfg:
        mode = str(cfg["cudagraph_mode"]).lower()
        from timeline.spec.serving import CUDAGRAPH_MODES

        if mode not in CUDAGRAPH_MODES:
            raise UserError(f"{name}: cudagraph_mode {cfg['cudagraph_mode']!r}: expected one of "
                            f"{', '.join(m.upper() for m in CUDAGRAPH_MODES)}")
        sv["cudagraph_mode"] = mode
    if "cudagraph_capture_sizes" in cfg:
        sv["cuda_graph_sizes"] = [_int(name, x) for x in cfg["cudagraph_capture_sizes"]]
    if "max_cudagraph_capture_size" in cfg:
        sv["max_cudagraph_capture_size"] = _int(name, cfg["max_cudagraph_capture_size"])
    return False


def _images(name: str, raw: Any) -> int:
    """``--limit-mm-per-prompt``: JSON (``{"image": 2, "video": 0}``) or the older ``image=2,video=1``; the images."""
    text = str(raw).strip()
    if text.startswith("{"):
        cfg = _json(name, text)
        return _int(name, cfg.get("image", 0))
    pairs = dict(p.split("=", 1) for p in text.split(",") if "=" in p)
    return _int(name, pairs.get("image", 0))


#: options that change no GPU memory the engine budgets, by dest, with why (both engines' names)
NEUTRAL: dict[str, str] = {
    **dict.fromkeys(("host", "port", "uds", "api_key", "served_model_name", "root_path", "allowed_origins",
                     "allow_credentials", "allowed_methods", "allowed_headers", "ssl_keyfile", "ssl_certfile",
                     "ssl_ca_certs", "ssl_cert_reqs", "middleware", "uvicorn_log_level", "disable_uvicorn_access_log",
                     "chat_template", "chat_template_content_format", "response_role", "return_tokens_as_token_ids",
                     "disable_frontend_multiprocessing", "enable_request_id_headers", "enable_auto_tool_choice",
                     "tool_call_parser", "tool_parser_plugin", "tool_server", "reasoning_parser",
                     "enable_prompt_tokens_details", "enable_force_include_usage", "enable_server_load_tracking",
                     "enable_tokenizer_info_endpoint", "log_config_file", "max_log_len", "disable_log_requests",
                     "enable_log_requests", "disable_log_stats", "disable_fastapi_docs", "h11_max_incomplete_event_size",
                     "h11_max_header_count", "api_server_count", "lora_modules", "prompt_adapters",
                     "exclude_tools_when_tool_choice_none", "enable_log_outputs", "log_error_stack",
                     "trust_request_chat_template", "default_chat_template_kwargs", "tokens_only", "ssl_ciphers",
                     "enable_ssl_refresh", "log_requests", "log_level", "log_level_http", "enable_metrics",
                     "show_time_cost", "decode_log_interval", "api_key_path", "file_storage_path",
                     "enable_cache_report", "collect_tokens_histogram", "enable_request_time_stats_logging",
                     "crash_dump_folder", "kv_events_config", "otlp_traces_endpoint", "collect_detailed_traces",
                     "show_hidden_metrics_for_version", "enable_trace", "oltp_traces_endpoint", "skip_server_warmup",
                     "warmups", "watchdog_timeout", "dist_timeout", "sleep_on_idle"),
                    "the HTTP frontend, logging and metrics: no device memory"),
    **dict.fromkeys(("trust_remote_code", "tokenizer", "tokenizer_mode", "tokenizer_path", "skip_tokenizer_init",
                     "revision", "code_revision", "tokenizer_revision", "download_dir", "seed", "random_seed",
                     "config_format", "generation_config", "override_generation_config", "max_logprobs",
                     "logprobs_mode", "hf_token", "model_impl", "load_format", "ignore_patterns", "use_tqdm_on_load",
                     "safetensors_load_strategy", "model_loader_extra_config", "pt_load_map_location",
                     "worker_cls", "worker_extension_cls", "distributed_executor_backend", "dist_init_addr",
                     "nnodes", "node_rank", "nccl_port", "data_parallel_address", "data_parallel_rpc_port",
                     "data_parallel_start_rank", "data_parallel_size_local", "data_parallel_backend",
                     "headless", "enable_multimodal", "mm_processor_kwargs", "media_io_kwargs", "allowed_local_media_path",
                     "allowed_media_domains", "guided_decoding_backend", "structured_outputs_config",
                     "grammar_backend", "reasoning_backend", "scheduling_policy", "schedule_policy",
                     "stream_interval", "stream_output", "enable_sleep_mode", "disable_log_stats_", "device"),
                    "how the engine loads, names, tokenizes and schedules requests: the same tensors on the device"),
    "swap_space": "host memory for preempted requests' blocks (V0), not device memory",
    "enable_reasoning": "a reasoning parser on the output text: no device memory",
    "use_v2_block_manager": "the V0 block manager's implementation (a no-op from 0.6.2): the same pool",
    "allow_deprecated_quantization": "permits a deprecated quantization method's name: the checkpoint's weights",
    **dict.fromkeys(("async_scheduling", "schedule_conservativeness"),
                    "when the scheduler runs and how eagerly it admits requests: the same pool and steps' tensors"),
}
#: options whose memory is not modelled, with what they do
REFUSED = {
    "cpu_offload_gb": "weights kept in host memory and streamed in are not modelled",
    "enable_lora": "LoRA adapters' weights and their slots are not modelled",
    "kv_transfer_config": "disaggregated prefill's KV connector buffers are not modelled",
    "hf_overrides": "a config changed at load (hf_overrides) is not read; give the changed config.json with --hf-config",
    "enable_eplb": "expert-parallel load balancing's redundant experts are not modelled",
    "speculative_draft_model_path": "a draft model's weights and cache are not modelled",
    "speculative_algorithm": "SGLang's speculative decoding is not modelled",
    "num_speculative_tokens": "speculative decoding's draft (≤ 0.8's flat options): give --speculative-config, which "
                              "reads MTP",
    "speculative_model": "a draft model's weights and cache are not modelled",
    "num_scheduler_steps": "V0's multi-step scheduling holds several steps' outputs: not modelled",
    "attention_backend": "an attention backend chosen by hand sets the KV layout, block size and workspaces: not read",
    "language_model_only": "a vision-language checkpoint served without its tower is not modelled",
    "enable_flashinfer_mla": "FlashInfer's MLA kernels are not modelled",
    "ep_num_redundant_experts": "redundant experts' extra weights are not modelled",
    "disaggregation_mode": "disaggregated prefill's KV transfer buffers are not modelled",
}


@cache
def option_classes(engine: str) -> dict[str, dict[str, str]]:
    """The options :data:`NEUTRAL` and :data:`REFUSED` do not name, each read in the engine's source:
    ``serve_option_classes.json`` (dest → class ``neutral`` | ``refused``, ``why``, ``source``)."""
    data: dict[str, dict[str, dict[str, str]]] = json.loads(_CLASSES.read_text(encoding="utf-8"))
    return data[engine]


def classify(engine: str, parsed: Parsed, ignored: tuple[str, ...]) -> tuple[dict[str, str], list[str]]:
    """The parsed options that are neither mapped nor neutral: refused in one line (each with what it does where
    known); ``ignored`` option names are passed over. Returns the neutral options (name → why) and those passed
    over."""
    table = VLLM_MAPPED if engine == "vllm" else SGLANG_MAPPED
    neutral: dict[str, str] = {}
    passed: list[str] = []
    refused: list[str] = []
    for dest, name in parsed.given.items():
        if dest in table:
            continue
        if name in ignored or name.lstrip("-") in ignored:
            passed.append(name)
            continue
        read = option_classes(engine).get(dest)
        if dest in REFUSED:
            refused.append(f"{name}: {REFUSED[dest]}")
        elif dest in NEUTRAL:
            neutral[name] = NEUTRAL[dest]
        elif read is not None and read["class"] == "neutral":
            neutral[name] = read["why"]
        elif read is not None:
            refused.append(f"{name}: {read['why']}")
        else:
            refused.append(f"{name}: not classified (what it does to device memory is not read)")
    if refused:
        names = ",".join(r.split(":")[0].lstrip("-") for r in refused)
        raise UserError("; ".join(refused) + f"; --ignore-arg {names} passes over "
                        + ("it" if len(refused) == 1 else "them") + " (its memory not modelled)")
    return neutral, passed
