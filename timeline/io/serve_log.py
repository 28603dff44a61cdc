"""Read a serving engine's startup log as its launch command: what it printed of its own arguments.

- **vLLM** (from 0.9) prints the engine arguments that differ from their defaults
  (``vllm/entrypoints/utils.py: log_non_default_args``: ``non-default args: {'model': …,
  'tensor_parallel_size': 2, …}``, a Python dict of argparse dests) and its version (``vLLM API server version
  0.11.0``, the 0.18+ banner's ``version 0.19.0``, or ``Initializing a V1 LLM engine (v0.11.0)``). The dict's fields
  become the options that set them (:func:`timeline.io.serve_forms.fields_words`, as for ``LLM(…)`` keywords).
  Older vLLM prints no such dict: its engine config line (``Initializing an LLM engine (v0.6.4) with config:
  key=value, …``) and V0's profiling ``gpu_memory_utilization`` stand in. A log that prints no version (a part of
  one, pasted) is dated by its logger sites: every line carries ``[file.py:LINE]``, and where each logging call
  sits moves between releases (:func:`infer_vllm_version`, over ``vllm_log_sites.json.xz``, the sites of every
  release from 0.4.0 that ``tools/vllm_log_sites.py`` read from the wheels on PyPI).
- **SGLang** prints every field of its ``ServerArgs`` as ``__post_init__`` left them (``server_args=ServerArgs(
  model_path='…', tp_size=8, …)``, ``sglang/srt/entrypoints/http_server.py`` / ``engine.py``).

A config line or a ServerArgs line holds every value, defaults and the engine's own choices among them
(:attr:`ServeLog.complete`): the fields the rules read are taken as printed and the options not modelled that hold
values are named, not refused (:func:`timeline.io.serve_command._log_words`). A value the log prints as an object
(``LoRAModulePath(…)``, ``CompilationConfig(…)``) is not a literal: it is left out with a note. The log's own memory
lines — ``Model loading took X GiB``, ``Available KV cache memory: X GiB``, ``GPU KV cache size: N tokens``, ``# GPU
blocks: N`` (vLLM), ``KV Cache is allocated. #tokens: N`` (SGLang) — go to the run file's notes and to
``--compare``, beside what ``timeline serve`` predicts.
"""

from __future__ import annotations

import ast
import json
import lzma
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from timeline.io.device_name import device_in
from timeline.spec.engine_versions import VLLM_V0_REMOVED, VLLM_V1_DEFAULT, parse_version

#: vLLM's line (``log_non_default_args``): the dict follows
VLLM_ARGS = re.compile(r"non-default args: (?=\{)")
VLLM_VERSION = re.compile(r"vLLM API server version (?P<v>\d[\w.+-]*)|Initializing an? (?:V1 )?LLM engine "
                          r"\(v(?P<e>\d[\w.+-]*)\)|█[^\n]*?\bversion (?P<b>\d[\w.+-]*)")
#: what only the API server prints (``vllm serve``'s banner and process tag, its version line, ``api_server.py``'s
#: logger): the server's usage context, not the offline ``LLM`` class's
API_SERVER = re.compile(r"API server|APIServer|api_server|█")
#: every vLLM engine's config line (``vllm/engine/llm_engine.py`` / ``v1/engine/core.py``): ``key=value, …`` of its
#: configs as printed, the version in its head; read where a log has no ``non-default args`` line (before 0.9)
VLLM_CONFIG = re.compile(r"Initializing an? (?:V1 )?LLM engine \(v(?P<v>[^)]+)\) with config: (?P<body>[^\n]*)")
#: the engine that line names: ``vllm/engine/llm_engine.py`` (V0) "Initializing an LLM engine (vX) with config",
#: ``vllm/v1/engine/core.py`` "Initializing a V1 LLM engine (vX) with config" (read at 0.8.2, 0.8.5, 0.9.2, 0.10.1)
VLLM_ENGINE_LINE = re.compile(r"Initializing an? (?P<one>V1 )?LLM engine \(v(?P<v>[^)]+)\)")
#: the config line's names that are not the engine argument's (``EngineArgs``) name
CONFIG_NAMES = {"max_seq_len": "max_model_len", "chunked_prefill_enabled": "enable_chunked_prefill"}
#: V0's memory-profiling line names the utilisation the budget used (worker/worker.py at 0.6 … 0.8)
VLLM_UTILISATION = re.compile(r"gpu_memory_utilization(?: \(|=)(?P<u>[\d.]+)")
#: the device's total memory as PyTorch reports it, where vLLM prints it (V1's startup check "Free memory on device
#: (free/total GiB)", V0's profiling "total_gpu_memory=X GiB" / "total_gpu_memory (X GiB)")
VLLM_TOTAL = re.compile(r"Free memory on device[^(\n]*\((?P<free>[\d.]+)/(?P<a>[\d.]+) GiB\)|"
                        r"total_gpu_memory(?:=| \()(?P<b>[\d.]+) ?GiB")
#: SGLang's line: the ServerArgs dataclass's repr
SGLANG_ARGS = re.compile(r"server_args=ServerArgs\(")
#: the memory lines each engine prints at start, as notes
MEMORY_LINES = (
    re.compile(r"Model loading took [\d.]+ ?GiB[^\n]*"),
    re.compile(r"Available KV cache memory: [\d.]+ ?GiB"),
    re.compile(r"GPU KV cache size: [\d,]+ tokens"),
    re.compile(r"# GPU blocks: \d+"),
    re.compile(r"KV Cache is allocated\. #tokens: \d+[^\n]*"),
    re.compile(r"Memory profiling (?:takes|results:) [^\n]*"),
)


#: what the engine measured at start, by quantity (GiB, tokens or blocks), each as its log line prints it
MEASURED: dict[str, re.Pattern[str]] = {
    "weights_gib": re.compile(r"Model loading took (?P<x>[\d.]+) ?GiB|Load weight end\.[^\n]*mem usage=(?P<y>[\d.]+) GB"),
    "kv_pool_gib": re.compile(r"Available KV cache memory: (?P<x>[\d.]+) ?GiB"),
    "kv_tokens": re.compile(r"GPU KV cache size: (?P<x>[\d,]+) tokens|KV Cache is allocated\. #tokens: (?P<y>\d+)"),
    "kv_blocks": re.compile(r"# GPU blocks: (?P<x>\d+)"),
}


@dataclass
class ServeLog:
    """What a startup log says of the command that started it; ``complete``: every field is printed, defaults and
    the engine's own choices among them (SGLang's ServerArgs, vLLM's config line), not only what the user gave."""

    engine: str
    fields: dict[str, Any]
    version: str | None
    usage_context: str
    notes: list[str] = field(default_factory=list)
    complete: bool = False
    #: the device's total memory the log prints (GiB, as PyTorch reports it): the run's ``capacity_gib``
    capacity_gib: float | None = None
    #: what the engine measured at start (:data:`MEASURED`'s quantities the log prints)
    measured: dict[str, float] = field(default_factory=dict)
    #: the GPU's name as the log prints it (:func:`timeline.io.device_name.device_in`), None if it prints none
    device_name: str | None = None
    #: the engine a vLLM 0.8 … 0.10 log says started ("on": V1, "off": V0; ``serving.engine_v1``), None where it
    #: prints no engine line or the version has one engine only
    engine_v1: str | None = None


def _top_level(text: str, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """Each character of ``text`` from ``start`` outside quotes: (index, character, bracket depth before it)."""
    depth, quote, k = 0, "", start
    while k < len(text):
        ch = text[k]
        if quote:
            if ch == "\\":
                k += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        else:
            yield k, ch, depth
            depth += (ch in "([{") - (ch in ")]}")
        k += 1


def _balanced(text: str, start: int, open_ch: str, close_ch: str) -> str | None:
    """``text`` from ``start`` (an ``open_ch``) to its matching ``close_ch``, quotes respected; None if cut off."""
    for k, ch, depth in _top_level(text, start):
        if ch in ")]}" and depth == 1:
            return text[start:k + 1] if ch == close_ch else None
    return None


def _fields(pairs: list[tuple[str, ast.expr]]) -> tuple[dict[str, Any], list[str]]:
    """Literal values by name, and the names whose printed value is an object (not read)."""
    out: dict[str, Any] = {}
    skipped: list[str] = []
    for name, node in pairs:
        try:
            out[name] = ast.literal_eval(node)
        except (ValueError, SyntaxError, TypeError):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):  # torch.bfloat16, an enum
                out[name] = node.attr
            else:
                skipped.append(name)
    return out, skipped


_NEXT_KEY = re.compile(r"[a-z_]\w*=")


def _config_pairs(body: str) -> tuple[dict[str, Any], list[str]]:
    """``key=value, …`` of vLLM's config line: values split at top-level commas (brackets and quotes kept); a
    literal as Python, ``torch.bfloat16`` / ``LoadFormat.AUTO`` as the name an option takes, a bare word as
    itself; the names whose value is an object (``CompilationConfig(…)``) apart, not read."""
    items, start = [], 0
    for k, ch, depth in _top_level(body):
        if depth == 0 and (ch == "," or ch == " " and _NEXT_KEY.match(body, k + 1) and body[k - 1] != ","):
            items.append(body[start:k])  # a space before `key=` separates too (0.6's "…=False multi_step_…=True")
            start = k + 1
    items.append(body[start:])
    out: dict[str, Any] = {}
    skipped: list[str] = []
    for item in items:
        key, eq, raw = item.strip().partition("=")
        if not eq or not re.fullmatch(r"\w+", key):
            continue
        raw = raw.strip()
        if re.match(r"[A-Za-z_]\w*\(", raw):
            skipped.append(CONFIG_NAMES.get(key, key))
            continue
        try:
            value: Any = ast.literal_eval(raw)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            m = re.fullmatch(r"(?:torch|[A-Z]\w*)\.(\w+)", raw)
            value = m.group(1).lower() if m else raw
        out[CONFIG_NAMES.get(key, key)] = value
    return out, skipped


#: a vLLM record's logger site, ``[file.py:LINE] message`` (``vllm/logger.py: _FORMAT``: bracketed from 0.8.0,
#: ``file.py:LINE] message`` before); at DEBUG level (0.10.2 on, ``vllm/logging_utils/formatter.py:
#: NewLineFormatter``) the name is a shortened path under ``vllm/``, of which the basename is the table's
VLLM_SITE = re.compile(r"\[?(?P<path>[\w.\-/]+\.py):(?P<line>\d+)\] ?(?P<msg>.*)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # vLLM's ColoredFormatter greys the site and colours the level
#: vLLM's logger call sites at every release from 0.4.0 (``tools/vllm_log_sites.py``): by printed file name and
#: line, the template prefixes of the messages logged there and the releases having each
LOG_SITES = Path(__file__).with_name("vllm_log_sites.json.xz")


@cache
def _log_sites() -> tuple[tuple[str, ...], dict[str, dict[str, dict[str, str]]]]:
    """The releases read and the site table (:data:`LOG_SITES`), loaded once, when a log first needs it."""
    data = json.loads(lzma.decompress(LOG_SITES.read_bytes()))
    return tuple(data["releases"]), data["sites"]


def _indices(ranges: str) -> set[int]:
    """``"0-2,5"`` → ``{0, 1, 2, 5}`` (the table's release sets)."""
    out: set[int] = set()
    for part in ranges.split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def _spans(indices: set[int], releases: tuple[str, ...]) -> str:
    """Release indices as ``0.20.0 … 0.20.2, 0.22.0`` (runs of consecutive releases)."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(releases[r[0]] if len(r) == 1 else f"{releases[r[0]]} … {releases[r[-1]]}" for r in runs)


@dataclass
class SiteEvidence:
    """What a log's logger sites say of its vLLM release (:func:`vllm_site_releases`)."""

    #: the releases read (indices into the table's release list, :data:`LOG_SITES`)
    indices: set[int]
    #: the same, as release names, oldest first
    releases: list[str]
    #: the sites of the lines used, ``[file.py:N]``, in the log's order
    sites: list[str]
    #: how many lines were used
    lines: int
    #: where no release has every line's site: how many lines the releases read have (None where all do)
    most: int | None = None


def vllm_site_releases(text: str) -> SiteEvidence | None:
    """The vLLM releases whose logger sites a log's lines are at (None when no line is at a site any release has).

    Each line ``[file.py:LINE] message`` is looked up in :data:`LOG_SITES` (``tools/vllm_log_sites.py``: every
    logging call of each release's ``vllm/**/*.py``, by printed file name and the line its record carries): the
    releases having a call at that file and line whose template prefix the message starts with (both stripped;
    an empty prefix, a message that is not a literal, matches any). A line whose (file, line) no release has is
    left out (a plugin's or another package's logger), so is one whose message no release logs there, and a
    message's further lines (``vllm/logging_utils/formatter.py: NewLineFormatter`` repeats the header: the same
    header as the line before). The releases are intersected over the lines used; where no release has them all,
    those having the most lines are taken (:attr:`SiteEvidence.most`)."""
    releases, sites = _log_sites()
    used: list[tuple[str, set[int]]] = []
    last_head = None
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        m = VLLM_SITE.search(line)
        if m is None:
            continue
        head = line[:m.start("msg")]
        if head == last_head:
            continue
        last_head = head
        name, number = m["path"].rsplit("/", 1)[-1], int(m["line"])
        at = sites.get(name, {}).get(str(number))
        if at is None:
            continue
        msg = m["msg"].strip()
        match: set[int] = set()
        for prefix, ranges in at.items():
            if msg.startswith(prefix.strip()):
                match |= _indices(ranges)
        if match:
            used.append((f"[{name}:{number}]", match))
    if not used:
        return None
    labels = list(dict.fromkeys(label for label, _ in used))
    common = set.intersection(*(match for _, match in used))
    most = None
    if not common:
        counts = {i: sum(i in match for _, match in used) for i in set.union(*(match for _, match in used))}
        most = max(counts.values())
        common = {i for i, c in counts.items() if c == most}
    return SiteEvidence(common, [releases[i] for i in sorted(common)], labels, len(used), most)


def infer_vllm_version(text: str) -> tuple[str | None, str | None]:
    """The vLLM version a log that prints none was written by, read from its logger sites
    (:func:`vllm_site_releases`): the newest release of the set, and a note naming the set and the sites; (None,
    None) when no line is at a site any release has."""
    found = vllm_site_releases(text)
    if found is None:
        return None, None
    releases = _log_sites()[0]
    shown = ", ".join(found.sites[:6]) + (f" … ({len(found.sites)} sites)" if len(found.sites) > 6 else "")
    span = _spans(found.indices, releases)
    how = (f"are those of vLLM {span}" if found.most is None else
           f"are not all of any one release: vLLM {span} has the most ({found.most} of {found.lines} lines)")
    version = found.releases[-1]
    return version, f"vLLM version not printed: the logger sites {shown} {how}; read as {version}"


def read_serve_log(text: str) -> ServeLog | None:
    """The command a vLLM or SGLang startup log shows (None when ``text`` holds no such line)."""
    notes: list[str] = []
    m = VLLM_ARGS.search(text)
    if m is not None:
        body = _balanced(text, m.end(), "{", "}")
        if body is None:
            return None
        tree = ast.parse(body, mode="eval").body
        if not isinstance(tree, ast.Dict):
            return None
        pairs = [(k.value, v) for k, v in zip(tree.keys, tree.values, strict=True)
                 if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        fields, skipped = _fields(pairs)
        ver = VLLM_VERSION.search(text)
        version = (ver["v"] or ver["e"] or ver["b"]) if ver else None
        inferred = infer_vllm_version(text) if version is None else (None, None)
        version = version or inferred[0]
        # `vllm serve MODEL` sets model_tag, its positional; LLM(...) has none
        usage = "openai_api_server" if "model_tag" in fields or API_SERVER.search(text) else "llm_class"
        tag = fields.pop("model_tag", None)  # `vllm serve MODEL`'s positional, printed beside 'model'
        if tag is not None:
            fields.setdefault("model", tag)
        complete = False
        notes.append("read the log's 'non-default args' (vllm/entrypoints/utils.py: log_non_default_args)"
                     + (f" of vLLM {version}" if version else ""))
        if inferred[1]:
            notes.append(inferred[1])
        engine = "vllm"
    elif (cfg := VLLM_CONFIG.search(text)) is not None:
        fields, skipped = _config_pairs(cfg["body"])
        util = VLLM_UTILISATION.search(text)
        if util:
            fields["gpu_memory_utilization"] = float(util["u"])
        version, engine, complete = cfg["v"], "vllm", True
        usage = "openai_api_server" if API_SERVER.search(text) else "llm_class"
        notes.append(f"read the log's engine config line of vLLM {version} (every config value as the engine "
                     "settled it: the ones the rules read taken)" + (" and its gpu_memory_utilization" if util else ""))
    else:
        m = SGLANG_ARGS.search(text)
        if m is None:
            return None
        body = _balanced(text, m.end() - 1, "(", ")")
        if body is None:
            return None
        call = ast.parse("ServerArgs" + body, mode="eval").body
        if not isinstance(call, ast.Call):
            return None
        fields, skipped = _fields([(k.arg, k.value) for k in call.keywords if k.arg])
        version, usage, engine, complete = None, "openai_api_server", "sglang", True
        notes.append("read the log's server_args=ServerArgs(…): every field as SGLang left it, the ones the rules read taken")
    if skipped:
        notes.append(f"printed as objects, not read: {', '.join(skipped)}")
    for rx in MEMORY_LINES:
        hit = rx.search(text)
        if hit:
            notes.append(f"the log's own: {hit.group(0).strip()}")
    total = VLLM_TOTAL.search(text) if engine == "vllm" else None
    measured = {}
    for key, rx in MEASURED.items():
        hit = rx.search(text)
        if hit:
            measured[key] = float((hit["x"] or hit["y"]).replace(",", ""))
    return ServeLog(engine=engine, fields=fields, version=version, usage_context=usage, notes=notes,
                    complete=complete, capacity_gib=float(total["a"] or total["b"]) if total else None,
                    measured=measured, device_name=device_in(text), engine_v1=engine_of(text) if engine == "vllm" else None)


def engine_of(text: str) -> str | None:
    """``serving.engine_v1`` as a vLLM log's engine line names it (:data:`VLLM_ENGINE_LINE`): "on" for V1, "off" for
    V0, where the line's version is one of those that choose (0.8 … 0.10); None otherwise."""
    line = VLLM_ENGINE_LINE.search(text)
    v = parse_version(line["v"]) if line else None
    if line is None or v is None or not VLLM_V1_DEFAULT <= v < VLLM_V0_REMOVED:
        return None
    return "on" if line["one"] else "off"
