"""Serving deployments that are not a shell command: a Kubernetes manifest or a Docker Compose file whose container
runs the engine, and a Python program that builds the engine itself (vLLM's ``LLM(...)``, SGLang's
``sgl.Engine(...)``). Each becomes what :mod:`timeline.io.serve_command` reads — a command line for the shell
reader, or the engine's option words — without running anything.

- **Kubernetes** (``v1.Container``): ``command`` replaces the image's entrypoint and ``args`` its arguments;
  ``$(NAME)`` in either is the container's ``env`` value of ``NAME`` (``$$(`` a literal ``$(``; an undefined one
  stays as written), as the kubelet expands them.
- **Compose** (services): ``entrypoint`` and ``command`` (a list, or a string split as a shell would, without
  running one); ``${NAME}``, ``${NAME:-default}``, ``${NAME-default}`` and ``$NAME`` come from the environment
  Compose runs in (``--script-env``; unset: empty, with a note).
- **Python**: the keyword arguments of the call are the engine's own fields (``EngineArgs`` / ``ServerArgs``),
  each written as the command-line option of that field; a value must be a literal, a module-level constant, an
  ``os.environ`` / ``os.getenv`` lookup (``--script-env``, else its default), an ``argparse`` option's default
  (``args.tp`` of ``add_argument("--tp", default=8)``) or a value of a module imported from a file beside the
  program (``config.MODEL_PATH`` of ``config.py``). vLLM's ``LLM`` takes the ``LLM_CLASS`` usage context's
  scheduler defaults, an ``EngineArgs`` / ``AsyncEngineArgs`` built outside the server and ``LLM`` the
  ``ENGINE_CONTEXT``'s (:func:`timeline.spec.engine_versions.vllm_scheduler_defaults`).
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from timeline.errors import UserError


@dataclass
class Found:
    """One serving deployment found in a file: ``text`` a command line for the shell reader (a container), or
    ``words`` the engine's options (a Python call) with ``engine`` and ``usage_context``."""

    what: str
    text: str | None = None
    words: list[str] | None = None
    engine: str | None = None
    image: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    usage_context: str = "openai_api_server"
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- manifests

_MANIFEST_KEY = re.compile(r"^\s*(?:-\s+)?(?:image|args|command|entrypoint|containers|services)\s*:", re.M)


def manifest_containers(text: str, env: dict[str, str], source: str = "") -> list[Found] | None:
    """The containers (Kubernetes) or services (Compose) of a YAML ``text`` that run a command; None when ``text``
    is not a YAML file holding one. A ``.yaml`` / ``.yml`` file that is not valid YAML is an error (read as a
    script, its options would be lost); Compose's ``.env`` beside the file gives defaults under ``env``."""
    yaml_file = source.lower().endswith((".yaml", ".yml"))
    if not _MANIFEST_KEY.search(text):
        return None
    import yaml

    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        if yaml_file:
            where = getattr(exc, "problem_mark", None)
            at = f"line {where.line + 1}: " if where is not None else ""
            raise UserError(f"{source}: not valid YAML ({at}{getattr(exc, 'problem', None) or exc}); fix its "
                            "indentation or quoting") from None
        return None
    if not any(isinstance(d, (dict, list)) for d in docs):
        return None
    found: list[Found] = []

    def walk(node: Any, key: str) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("image"), str) and any(k in node for k in ("command", "args", "entrypoint")):
                found.append(_container(node, key, env))
            for k, v in node.items():
                walk(v, str(k))
        elif isinstance(node, list):
            for v in node:
                walk(v, key)

    compose_env = _dotenv(source) if any(isinstance(d, dict) and "services" in d for d in docs) else {}
    env = {**compose_env, **env}
    for doc in docs:
        walk(doc, "")
    if compose_env:
        for f in found:
            f.notes.append(f"read {Path(source).parent / '.env'} as Compose does (its variables under --script-env)")
    return found or None  # no container at all: not a manifest (a script whose lines read as YAML)


def _dotenv(source: str) -> dict[str, str]:
    """Compose's ``.env`` in the project folder (the file's): ``NAME=VALUE`` lines, ``#`` comments, quotes."""
    path = Path(source).parent / ".env" if source else None
    if path is None or not path.is_file():
        return {}
    out = {}
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.removeprefix("export ").partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        out[name.strip()] = value
    return out


def _container(node: dict[str, Any], key: str, env: dict[str, str]) -> Found:
    image = str(node["image"])
    name = str(node.get("name") or key or image)
    notes: list[str] = []
    if "args" in node or isinstance(node.get("env"), list):  # Kubernetes: command, args, env [{name, value}]
        cenv = {str(e["name"]): str(e["value"]) for e in node.get("env") or []
                if isinstance(e, dict) and "name" in e and "value" in e}
        entry = _k8s_words(node.get("command"), cenv, f"{name}.command")
        args = _k8s_words(node.get("args"), cenv, f"{name}.args")
        what = f"container {name!r}"
    else:  # Compose: entrypoint, command, environment
        raw = node.get("environment") or {}
        items = raw.items() if isinstance(raw, dict) else (str(e).partition("=")[::2] for e in raw)
        cenv = {str(k): "" if v is None else _interpolate(str(v), env, f"{name}.environment", notes)
                for k, v in items}
        image = _interpolate(image, env, f"{name}.image", notes)
        entry = _compose_words(node.get("entrypoint"), env, f"{name}.entrypoint", notes)
        args = _compose_words(node.get("command"), env, f"{name}.command", notes)
        what = f"service {name!r}"
    words = [*entry, *(args or [])] if entry is not None else ["docker", "run", image, *(args or [])]
    return Found(what=what, text=shlex.join(words), image=image, env={**cenv, **env}, notes=notes)


def _k8s_words(value: Any, env: dict[str, str], where: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise UserError(f"{where}: a Kubernetes container's command and args are lists of strings")

    def expand(word: str) -> str:  # the kubelet's $(VAR) expansion (an undefined one stays as written)
        return re.sub(r"\$\$\(|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                      lambda m: "$(" if m.group(1) is None else env.get(m.group(1), m.group(0)), word)

    return [expand(str(w)) for w in value]


def _interpolate(text: str, env: dict[str, str], where: str, notes: list[str]) -> str:
    """Compose's interpolation: ``${NAME}``, ``${NAME:-default}``, ``${NAME-default}``, ``$NAME``, ``$$``."""
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        if name in env and (env[name] or m.group(2) != ":-"):
            return env[name]
        if m.group(2):
            return m.group(3) or ""
        notes.append(f"{where}: ${name} is not set in the environment given (--script-env): read as empty, as "
                     "Compose does")
        return ""
    return re.sub(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)", one, text)


def _compose_words(value: Any, env: dict[str, str], where: str, notes: list[str]) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, list):
        return [_interpolate(str(w), env, where, notes) for w in value]
    try:
        return shlex.split(_interpolate(str(value), env, where, notes))
    except ValueError as exc:
        raise UserError(f"{where}: cannot split {value!r} ({exc})") from None


# ---------------------------------------------------------------------------------------------- Python

#: the calls that build an engine: vLLM's offline class and engine arguments, SGLang's offline engine
_CALLS = {"LLM": ("vllm", "llm_class"), "EngineArgs": ("vllm", "engine_context"),
          "AsyncEngineArgs": ("vllm", "engine_context"),
          "Engine": ("sglang", ""), "ServerArgs": ("sglang", "")}
_CALL_RE = re.compile(r"\b(?:LLM|EngineArgs|AsyncEngineArgs|Engine|ServerArgs)\s*\(")


def python_calls(text: str, env: dict[str, str], table_of: Any, folder: Path | None = None) -> list[Found] | None:
    """The engine-building calls of a Python program ``text`` in line order (None when it is not Python or builds
    none), each as option words (``table_of(engine)``: the engine's option table, name → option); ``folder``: where
    the program is, for the modules it imports from beside it."""
    if not _CALL_RE.search(text):
        return None
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    scope = _Scope(env=dict(env))
    scope.read_modules(tree, folder)
    scope.read_names(tree)
    scope.read_argparse(tree)
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name in _CALLS and _from_engine(func, name, _CALLS[name][0], tree):
            calls.append((node.lineno, node.col_offset, node, name))
    found = [_call(node, name, *_CALLS[name], scope, table_of(_CALLS[name][0])) for *_, node, name in sorted(
        calls, key=lambda c: c[:2])]
    return found or None


def _from_engine(func: ast.expr, name: str, engine: str, tree: ast.Module) -> bool:
    """Whether the call is the engine's own: ``vllm.LLM`` / ``sgl.Engine`` (a name bound to the engine's package),
    or a bare name imported from it; a bare ``LLM`` / ``EngineArgs`` imported from nowhere is vLLM's, one imported
    from another package (another engine's ``LLM``) is not, and ``Engine`` / ``ServerArgs`` must come from SGLang."""
    packages = {"vllm": ("vllm",), "sglang": ("sglang", "sgl")}[engine]
    aliases = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
               if a.name.split(".")[0] == engine}
    if isinstance(func, ast.Attribute):
        root = func.value
        while isinstance(root, ast.Attribute):
            root = root.value
        return isinstance(root, ast.Name) and (root.id in aliases or root.id in packages)
    sources = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
               and any((a.asname or a.name) == name for a in n.names)]
    if sources:
        return any(m.split(".")[0] == engine for m in sources)
    return engine == "vllm"  # a snippet without its imports: LLM(...) is vLLM's


class _Unknown(Exception):
    pass


_AMBIGUOUS = object()


@dataclass
class _Scope:
    """What a value may read: names assigned one followable value, argparse defaults, the environment given."""

    env: dict[str, str]
    names: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    #: modules the program imports from files beside it (``import config`` of ``config.py``): their names
    modules: dict[str, dict[str, Any]] = field(default_factory=dict)

    def value(self, node: ast.expr) -> Any:
        """A value the program gives without running: a literal, a known name, an environment lookup, an
        argparse default, a container or f-string of those, int()/float()/str()/bool() of one."""
        try:
            return ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
        if isinstance(node, ast.Name) and node.id in self.names:
            if self.names[node.id] is _AMBIGUOUS:
                raise _Unknown(f"{node.id} is assigned more than one value")
            return self.names[node.id]
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in self.modules:
            names = self.modules[node.value.id]
            if node.attr in names and names[node.attr] is not _AMBIGUOUS:
                return names[node.attr]
            raise _Unknown(f"{node.value.id}.{node.attr} is not a value its module gives without running")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr in self.defaults:
            return self.defaults[node.attr]
        looked = self.environ(node)
        if looked is not None:
            return looked
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1 \
                and not node.keywords and node.func.id in ("int", "float", "str", "bool"):
            inner = self.value(node.args[0])
            try:
                if node.func.id == "bool":
                    return inner if isinstance(inner, bool) else str(inner).lower() in ("1", "true", "yes")
                return {"int": int, "float": float, "str": str}[node.func.id](inner)
            except ValueError:
                raise _Unknown(f"{node.func.id}({inner!r}) fails") from None
        if isinstance(node, ast.Dict) and all(k is not None for k in node.keys):
            return {self.value(k): self.value(v) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[arg-type]
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.value(e) for e in node.elts]
        if isinstance(node, ast.JoinedStr):
            return "".join(str(self.value(v.value)) if isinstance(v, ast.FormattedValue) else str(self.value(v))
                           for v in node.values)
        raise _Unknown(ast.unparse(node))

    def environ(self, node: ast.expr) -> Any:
        """``os.environ.get("X", d)``, ``os.getenv("X", d)``, ``os.environ["X"]``: the environment given, else
        ``d``; None when ``node`` is no such lookup."""
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("os.environ", "environ"):
            key = str(self.value(node.slice))
            if key in self.env:
                return self.env[key]
            raise _Unknown(f"os.environ[{key!r}] is not given (--script-env {key}=VALUE)")
        if isinstance(node, ast.Call) and node.args and ast.unparse(node.func) in (
                "os.environ.get", "os.getenv", "environ.get", "getenv"):
            key = str(self.value(node.args[0]))
            if key in self.env:
                return self.env[key]
            if len(node.args) > 1:
                return self.value(node.args[1])
            raise _Unknown(f"{ast.unparse(node)} has no default (--script-env {key}=VALUE)")
        return None

    def read_names(self, tree: ast.Module) -> None:
        """Names assigned one value the reader can follow, anywhere in the program (a name assigned two different
        values is ambiguous)."""
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            for t in targets:
                if not isinstance(t, ast.Name):
                    continue
                try:
                    v = self.value(value)
                except _Unknown:
                    continue
                self.names[t.id] = _AMBIGUOUS if t.id in self.names and self.names[t.id] != v else v

    def read_modules(self, tree: ast.Module, folder: Path | None) -> None:
        """``import NAME`` / ``from NAME import X`` of a file ``NAME.py`` beside the program: its module-level values,
        read the same way (one level: what it imports in turn is not followed)."""
        if folder is None:
            return
        for node in ast.walk(tree):
            pairs: list[tuple[str, str | None, ast.alias | None]]
            if isinstance(node, ast.Import):
                pairs = [(a.name, a.asname or a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                pairs = [(node.module, None, a) for a in node.names]
            else:
                continue
            for module, alias, imported in pairs:
                path = folder / f"{module.replace('.', '/')}.py"
                if not path.is_file():
                    continue
                try:
                    sub = _Scope(env=self.env)
                    sub.read_names(ast.parse(path.read_text(encoding="utf-8")))
                except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
                    continue
                if alias is not None:
                    self.modules[alias] = sub.names
                elif imported is not None and imported.name in sub.names:
                    self.names[imported.asname or imported.name] = sub.names[imported.name]

    def read_argparse(self, tree: ast.Module) -> None:
        """``add_argument("--tp", …, default=8)`` → ``tp``: 8 (the attribute ``parse_args`` gives it)."""
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument" and node.args):
                continue
            flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            kw = {k.arg: k.value for k in node.keywords if k.arg}
            dest = kw.get("dest")
            name = (dest.value if isinstance(dest, ast.Constant) else
                    next((f.lstrip("-") for f in flags if f.startswith("--")), flags[0].lstrip("-") if flags else ""))
            name = str(name).replace("-", "_")
            try:
                if "default" in kw:
                    self.defaults[name] = self.value(kw["default"])
                elif (action := kw.get("action")) is not None and isinstance(action, ast.Constant) \
                        and action.value == "store_true":
                    self.defaults[name] = False
            except _Unknown:
                continue


def _call(node: ast.Call, name: str, engine: str, usage: str, scope: _Scope, table: dict[str, dict[str, Any]]) -> Found:
    where = f"{name}(…) at line {node.lineno}"
    kwargs: dict[str, Any] = {}
    for k in node.keywords:
        if k.arg is None:
            raise UserError(f"{where}: **{ast.unparse(k.value)}: keyword arguments unpacked from a variable are not "
                            "read; write them out")
        try:
            kwargs[k.arg] = scope.value(k.value)
        except _Unknown as exc:
            raise UserError(f"{where}: {k.arg}={ast.unparse(k.value)}: a value this reader cannot follow without "
                            f"running the program ({exc}); write it as a literal") from None
    if node.args:
        if name not in ("LLM", "Engine") or len(node.args) > 1:
            raise UserError(f"{where}: positional arguments other than the model are not read; give keywords")
        try:
            kwargs.setdefault("model" if engine == "vllm" else "model_path", scope.value(node.args[0]))
        except _Unknown as exc:
            raise UserError(f"{where}: the model {ast.unparse(node.args[0])}: a value this reader cannot follow ({exc}); "
                            "write it as a literal") from None
    return Found(what=where, words=fields_words(kwargs, table, engine, where), engine=engine,
                 usage_context=usage or "openai_api_server")


def fields_words(kwargs: dict[str, Any], table: dict[str, dict[str, Any]], engine: str, where: str) -> list[str]:
    """The command-line words of the engine's fields ``kwargs`` (a field's option: its ``--dest-with-dashes`` name,
    else any name of that dest)."""
    by_dest: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for opt_name, opt in table.items():
        if opt_name.startswith("--"):
            by_dest.setdefault(opt["dest"], []).append((opt_name, opt))
    words: list[str] = []
    for key, value in kwargs.items():
        opts = by_dest.get(key)
        if not opts:
            import difflib

            close = difflib.get_close_matches(key, by_dest, n=2, cutoff=0.75)
            raise UserError(f"{where}: {key}: a field of no {engine} version's engine arguments this tool has read"
                            + (f" (did you mean {' or '.join(close)}?)" if close else ""))
        if value is None:
            continue
        plain = "--" + key.replace("_", "-")
        opts.sort(key=lambda o: (o[0] != plain, o[1].get("negates", False), o[0]))
        if isinstance(value, bool):
            flag = next((n for n, o in opts if not o["takes_value"] and (not o.get("negates")) == value), None)
            if flag is None and value is False and opts[0][1].get("boolean_optional"):
                flag = "--no-" + opts[0][0][2:]
            if flag is not None:
                words.append(flag)
            elif opts[0][1]["takes_value"]:
                words += [opts[0][0], str(value)]
            continue  # a store_true flag's False: its default
        opt_name, opt = opts[0]
        if isinstance(value, dict):
            words += [opt_name, json.dumps(value)]
        elif isinstance(value, list):
            items = [json.dumps(v) if isinstance(v, (dict, list)) else str(v) for v in value]
            words += [opt_name, *items] if opt.get("nargs") in ("+", "*") else [opt_name, json.dumps(value)]
        else:
            words += [opt_name, str(value)]
    return words
