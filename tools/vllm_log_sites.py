"""Build ``timeline/io/vllm_log_sites.json.xz``: the logger call sites of every vLLM release, by printed file and line.

Every vLLM log line names the logging call that wrote it (``vllm/logger.py: _FORMAT``: ``… [%(filename)s:%(lineno)d]
%(message)s``, unbracketed ``file.py:N]`` up to 0.7.3, ``%(fileinfo)s`` from 0.10.2, which is the basename at the
default level and a shortened path under ``vllm/`` at DEBUG: ``vllm/logging_utils/formatter.py: NewLineFormatter``).
Where each call sits moves between releases, so the sites a log prints date it
(:func:`timeline.io.serve_log.infer_vllm_version`).

- **Releases**: every final release and ``.postN`` on PyPI from 0.4.0 (no rc, dev; listed from
  ``https://pypi.org/pypi/vllm/json``), each from its x86_64 wheel without a build tag (CPython 3.11's where a
  release built one per Python). The wheel is never downloaded whole: HTTP range requests read its zip central
  directory, then the byte spans of its ``vllm/**/*.py`` members (spans less than 256 KiB apart in one request),
  each member checked by its CRC-32; sequential, about 1 GiB for the 78 releases to 0.34.0. The sources are kept
  under ``/tmp/vllm_src/<version>/`` (with ``SOURCE.json``: the wheel, its sha256 as PyPI lists it, the bytes
  read), so a rerun reads nothing.
- **Files**: all of ``vllm/**/*.py`` (:data:`SCOPE`); the table stays under 300 KB compressed, so no directory is
  left out (a model file's warning dates a log as well as the engine's).
- **Sites**: each logging call found with ``ast`` (:func:`file_facts`): ``logger.debug/info/warning/warn/error/
  exception/critical/fatal/log(…)`` on a logger (a name bound to ``init_logger(…)`` / ``logging.getLogger(…)`` in
  the file, or :data:`LOGGER_NAMES`), and vLLM's ``debug_once/info_once/warning_once/error_once`` on anything.
  The printed name is the file's basename; the line is the one ``LogRecord.lineno`` carries (:func:`call_lines`,
  checked by experiment on the interpreter that runs this tool: :func:`check_lineno_rule`); the message's template
  prefix is its literal text up to the first ``%`` placeholder, f-string field or ``str.format`` brace, and its
  first newline (:func:`template_prefix`).
- ``stacklevel``: the ``*_once`` methods log at the caller's line at every release that has them (checked per
  release on its ``vllm/logger.py``: :func:`check_once_helpers`); a function logging its own parameter at
  ``stacklevel=2`` (``vllm/utils.py: print_warning_once``, 0.6.3 … 0.6.6.post1; ``print_info_once``, 0.6.5 …
  0.6.6.post1) makes its callers the sites; calls at another ``stacklevel`` are left out.

Output (xz-compressed JSON): ``releases`` (oldest first), ``sites``: printed file → line → template prefix →
the releases having it (indices into ``releases`` as ranges, ``"0-3,7"``), and ``about`` (this tool, the date,
each wheel read with its sha256, the record formats and ``*_once`` plumbing by release, the line-number check).
Facts only: no vLLM code is copied into the table or this tool.

``python tools/vllm_log_sites.py`` rebuilds the table; ``--only 0.20.0`` prints one release's count (a trial).
"""

from __future__ import annotations

import argparse
import ast
import datetime
import hashlib
import json
import logging
import lzma
import re
import struct
import sys
import textwrap
import time
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

PYPI_JSON = "https://pypi.org/pypi/vllm/json"
FILES_HOST = "https://files.pythonhosted.org/packages/"
CACHE = Path("/tmp/vllm_src")
OUT = Path(__file__).resolve().parents[1] / "timeline/io/vllm_log_sites.json.xz"
FIRST = (0, 4, 0)
#: which files are read (all of ``vllm/**/*.py``; see the module docstring)
SCOPE: tuple[str, ...] = ("vllm/",)
#: a final release or its ``.postN`` (no rc, dev, alpha or beta)
RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?(?:\.post(\d+))?")
USER_AGENT = "timeline-tools/vllm_log_sites (sequential HTTP range reads)"


def release_key(version: str) -> tuple[int, int, int, int]:
    """(major, minor, micro, post) of a release string that :data:`RELEASE` matches."""
    m = RELEASE.fullmatch(version)
    if m is None:
        raise ValueError(version)
    a, b, c, p = m.groups()
    return int(a), int(b), int(c or 0), int(p or 0)


def _get(url: str, start: int | None = None, end: int | None = None, suffix: int | None = None) -> bytes:
    """One HTTP GET, with a byte range (``start``…``end`` inclusive, or the last ``suffix`` bytes) when given."""
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    if suffix is not None:
        req.add_header("Range", f"bytes=-{suffix}")
    elif start is not None and end is not None:
        req.add_header("Range", f"bytes={start}-{end}")
    for attempt in range(4):
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                data: bytes = resp.read()
                if (suffix is not None or start is not None) and resp.status != 206:
                    raise RuntimeError(f"{url}: range not honoured (HTTP {resp.status})")
                return data
        except (OSError, RuntimeError) as exc:  # URLError is an OSError
            if attempt == 3:
                raise
            print(f"  retry {attempt + 1} after {exc}", file=sys.stderr)
            time.sleep(2 + 4 * attempt)
    raise AssertionError("unreachable")


@dataclass
class Wheel:
    """The PyPI file a release's source is read from."""

    version: str
    filename: str
    url: str
    sha256: str
    size: int


def list_releases(pypi: dict) -> list[Wheel]:
    """Every final release (and ``.postN``) from 0.4.0 on, oldest first, each with the wheel read for it: the x86_64
    wheel without a build tag (the one ``pip install vllm==X`` takes on Linux), CPython 3.11's where a release
    still built one wheel per Python (0.4.x, 0.5.0, 0.5.1)."""
    out = []
    for version, files in pypi["releases"].items():
        if not RELEASE.fullmatch(version) or release_key(version) < (*FIRST, 0):
            continue
        wheels = [f for f in files if f["packagetype"] == "bdist_wheel" and "x86_64" in f["filename"]
                  and not f.get("yanked")]
        # a build tag is a fifth dash-separated field (vllm-0.20.1-1-cp38-abi3-…): the re-uploads are skipped
        plain = [f for f in wheels if len(f["filename"].split("-")) == 5] or wheels
        pick = sorted(plain, key=lambda f: ("cp311" not in f["filename"], "abi3" not in f["filename"]))
        if not pick:
            print(f"{version}: no x86_64 wheel, skipped", file=sys.stderr)
            continue
        f = pick[0]
        # the JSON API's url, absolute or (through a mirror) relative: its blake2 path under the files host
        m = re.search(r"[0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{60}/[^/]+$", f["url"])
        url = FILES_HOST + m.group(0) if m else urljoin(PYPI_JSON, f["url"])
        out.append(Wheel(version, f["filename"], url, f["digests"]["sha256"], int(f["size"])))
    return sorted(out, key=lambda w: release_key(w.version))


# --- the wheel's zip, read by byte ranges ------------------------------------------------------------------------
# Zip layout (PKWARE APPNOTE 6.3.10, sections 4.3.6, 4.3.12, 4.3.14-4.3.16): end-of-central-directory record at the
# end (zip64 locator and record before it where the counts overflow), the central directory before that, one entry
# per member with its local header offset; each member is a local header (30 bytes, name, extra) then its data.


@dataclass
class Member:
    name: str
    method: int
    csize: int
    usize: int
    crc: int
    offset: int
    end: int = 0  # where the next member's local header starts (or the central directory)


def _central_directory(url: str, size: int) -> list[Member]:
    tail = _get(url, suffix=min(size, 1 << 16))
    k = tail.rfind(b"PK\x05\x06")
    if k < 0:
        raise RuntimeError(f"{url}: no end-of-central-directory record in the last 64 KiB")
    (_, _, _, _, count, cd_size, cd_offset, _) = struct.unpack("<4sHHHHIIH", tail[k:k + 22])
    loc = tail.rfind(b"PK\x06\x07", 0, k)
    if loc >= 0 and (cd_offset == 0xFFFFFFFF or count == 0xFFFF):
        (zip64_at,) = struct.unpack("<Q", tail[loc + 8:loc + 16])
        rec = _get(url, zip64_at, zip64_at + 55)
        count, cd_size, cd_offset = struct.unpack("<QQQ", rec[32:56])
    tail_start = size - len(tail)
    if cd_offset >= tail_start:
        cd = tail[cd_offset - tail_start:cd_offset - tail_start + cd_size]
    else:
        cd = _get(url, cd_offset, cd_offset + cd_size - 1)
    members: list[Member] = []
    p = 0
    for _ in range(count):
        (sig, _, _, _, method, _, _, crc, csize, usize, nlen, xlen, clen, _, _, _,
         offset) = struct.unpack("<4sHHHHHHIIIHHHHHII", cd[p:p + 46])
        if sig != b"PK\x01\x02":
            raise RuntimeError(f"{url}: bad central directory entry at {p}")
        name = cd[p + 46:p + 46 + nlen].decode("utf-8")
        extra = cd[p + 46 + nlen:p + 46 + nlen + xlen]
        if 0xFFFFFFFF in (csize, usize, offset):  # zip64 extended information extra field (APPNOTE 4.5.3)
            q = 0
            while q + 4 <= len(extra):
                tag, ln = struct.unpack("<HH", extra[q:q + 4])
                if tag == 1:
                    vals = list(struct.unpack(f"<{ln // 8}Q", extra[q + 4:q + 4 + ln // 8 * 8]))
                    if usize == 0xFFFFFFFF:
                        usize = vals.pop(0)
                    if csize == 0xFFFFFFFF:
                        csize = vals.pop(0)
                    if offset == 0xFFFFFFFF:
                        offset = vals.pop(0)
                q += 4 + ln
        members.append(Member(name, method, csize, usize, crc, offset))
        p += 46 + nlen + xlen + clen
    members.sort(key=lambda m: m.offset)
    for a, b in zip(members, members[1:] + [None], strict=True):
        a.end = b.offset if b is not None else cd_offset
    return members


def _inflate(m: Member, blob: bytes, base: int) -> bytes:
    """The member's bytes from ``blob`` (the wheel's bytes from ``base``), checked by its CRC-32."""
    at = m.offset - base
    sig, *_rest, nlen, xlen = struct.unpack("<4sHHHHHIIIHH", blob[at:at + 30])
    if sig != b"PK\x03\x04":
        raise RuntimeError(f"{m.name}: bad local header")
    data = blob[at + 30 + nlen + xlen:at + 30 + nlen + xlen + m.csize]
    if m.method == 8:
        out = zlib.decompressobj(-15).decompress(data)
    elif m.method == 0:
        out = data
    else:
        raise RuntimeError(f"{m.name}: compression method {m.method}")
    if zlib.crc32(out) != m.crc or len(out) != m.usize:
        raise RuntimeError(f"{m.name}: CRC or size mismatch")
    return out


def fetch_sources(wheel: Wheel, gap: int = 1 << 18) -> Path:
    """The release's ``vllm/**/*.py`` under ``CACHE/<version>/`` (read once, by byte ranges of the wheel: the
    central directory, then the selected members' spans, spans less than ``gap`` bytes apart merged)."""
    root = CACHE / wheel.version
    done = root / "SOURCE.json"
    if done.exists():
        return root
    members = [m for m in _central_directory(wheel.url, wheel.size)
               if m.name.startswith("vllm/") and m.name.endswith(".py")]
    groups: list[list[Member]] = []
    for m in members:
        if groups and m.offset - groups[-1][-1].end <= gap:
            groups[-1].append(m)
        else:
            groups.append([m])
    fetched = 0
    for group in groups:
        start, end = group[0].offset, group[-1].end - 1
        blob = _get(wheel.url, start, end)
        fetched += len(blob)
        for m in group:
            path = root / m.name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(_inflate(m, blob, start))
    done.write_text(json.dumps({"filename": wheel.filename, "url": wheel.url, "sha256": wheel.sha256,
                                "size": wheel.size, "members": len(members), "requests": len(groups) + 1,
                                "bytes_read": fetched}, indent=1))
    print(f"{wheel.version}: {len(members)} .py files, {len(groups) + 1} range requests, {fetched / 2**20:.1f} MiB",
          file=sys.stderr)
    return root


# --- the logger call sites of one release's source ------------------------------------------------------------
#: the ``logging.Logger`` methods whose first argument is the message (``Logger.log`` takes the level first)
LEVELS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical", "fatal"})
#: vLLM's own ``*_once`` methods (``vllm/logger.py``: ``_VllmLogger``, patched onto each logger by ``init_logger``)
ONCE = frozenset({"debug_once", "info_once", "warning_once", "error_once"})
#: names a logger object goes by where the file does not bind it itself (a parameter, e.g.
#: ``vllm/entrypoints/utils.py: log_version_and_model(lgr, …)``)
LOGGER_NAMES = frozenset({"logger", "_logger", "lgr", "LOGGER", "_LOGGER"})
#: the calls that make a logger (``vllm/logger.py: init_logger``, or the standard library's ``getLogger``)
MAKERS = frozenset({"init_logger", "getLogger"})
#: a template prefix is kept to this many characters (a shorter prefix only matches more messages)
PREFIX_CHARS = 60


def _literal(node: ast.expr, braces: bool = False) -> tuple[str, bool]:
    """The literal text a message expression starts with, and whether that is the whole expression: a string
    constant up to its first ``%`` (``braces``: or ``{``, a ``str.format`` template), an f-string's constant head,
    a ``+`` concatenation's literal head, a ``%``-formatting's template head."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
        cut = min([k for k in (text.find("%"), text.find("{") if braces else -1) if k >= 0], default=-1)
        return (text, True) if cut < 0 else (text[:cut], False)
    if isinstance(node, ast.JoinedStr):
        out = ""
        for part in node.values:
            if not isinstance(part, ast.Constant):
                return out, False
            head, whole = _literal(part)
            out += head
            if not whole:
                return out, False
        return out, True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        head, whole = _literal(node.left, braces)
        if not whole:
            return head, False
        tail, whole = _literal(node.right, braces)
        return head + tail, whole
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return _literal(node.left, braces)[0].split("%")[0], False
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"
            and isinstance(node.func.value, (ast.Constant, ast.JoinedStr, ast.BinOp))):
        return _literal(node.func.value, braces=True)[0], False
    return "", False


def template_prefix(node: ast.expr | None) -> str:
    """What every message of a call starts with, as printed on the record's first line: the literal head
    (:func:`_literal`) up to its first newline (``vllm/logging_utils/formatter.py: NewLineFormatter`` prints each
    further line under the header again), stripped, at most :data:`PREFIX_CHARS` characters. Empty when the
    message is not a literal: it matches any message."""
    if node is None:
        return ""
    return _literal(node)[0].split("\n")[0].strip()[:PREFIX_CHARS].rstrip()


def _message_arg(call: ast.Call, method: str) -> ast.expr | None:
    """The message argument of a logging call (``Logger.log(level, msg, …)``: the second), or its ``msg=``."""
    k = 1 if method == "log" else 0
    if len(call.args) > k and not isinstance(call.args[k], ast.Starred):
        return call.args[k]
    return next((kw.value for kw in call.keywords if kw.arg == "msg"), None)


def _stacklevel(call: ast.Call) -> int | None:
    """The call's ``stacklevel=`` (1 when not given; None when it is not a constant)."""
    for kw in call.keywords:
        if kw.arg == "stacklevel":
            return kw.value.value if isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, int) else None
    return 1


def call_lines(call: ast.Call) -> set[int]:
    """The line ``LogRecord.lineno`` carries for a call written over several lines: the line of the method name
    (``func.end_lineno``) on CPython 3.10-3.13, the call's first line on 3.8/3.9; they differ only where the
    attribute itself is split (``(logger\n  .info(…))``), and then both are kept. Checked on this interpreter by
    :func:`check_lineno_rule`."""
    return {call.func.end_lineno or call.lineno, call.lineno}


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


@dataclass
class FileFacts:
    """What one source file gives, whatever the release (cached by its content): the logging calls that print
    their own line, as (line, template prefix); the helpers it defines (a function logging its own parameter at
    ``stacklevel=2``: name → the parameter's position); the number of calls whose attribute is split."""

    sites: set[tuple[int, str]]
    helpers: dict[str, int]
    split: int


class _Scan(ast.NodeVisitor):
    """One pass over a file: the logger calls with the enclosing function's parameters, and the names bound to a
    logger (``x = init_logger(__name__)``, ``self.logger = logging.getLogger(…)``)."""

    def __init__(self) -> None:
        self.params: list[list[str]] = []
        self.bound: set[str] = set()
        self.calls: list[tuple[ast.Call, str, str, list[str]]] = []  # call, method, receiver, enclosing params

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        params = [a.arg for a in node.args.posonlyargs + node.args.args]
        self.params.append(params[1:] if params[:1] in (["self"], ["cls"]) else params)
        self.generic_visit(node)
        self.params.pop()

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def _assign(self, targets: list[ast.expr], value: ast.expr | None) -> None:
        if isinstance(value, ast.Call) and _name(value.func) in MAKERS:
            self.bound.update(ast.unparse(t) for t in targets if isinstance(t, (ast.Name, ast.Attribute)))

    def visit_Assign(self, node: ast.Assign) -> None:
        self._assign(node.targets, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._assign([node.target], node.value)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Attribute) and (f.attr in LEVELS or f.attr in ONCE or f.attr == "log"):
            v = f.value
            receiver = (v.id if isinstance(v, ast.Name) else f"<{_name(v.func)}>" if isinstance(v, ast.Call)
                        else ast.unparse(v) if isinstance(v, ast.Attribute) else "")
            self.calls.append((node, f.attr, receiver, self.params[-1] if self.params else []))
        self.generic_visit(node)


def file_facts(tree: ast.Module, logger_module: bool) -> FileFacts:
    """:class:`FileFacts` of one parsed file (``logger_module``: it is ``vllm/logger.py``, whose ``*_once``
    plumbing logs at ``stacklevel`` 2 or 3 and is no site)."""
    scan = _Scan()
    scan.visit(tree)
    sites: set[tuple[int, str]] = set()
    helpers: dict[str, int] = {}
    split = 0
    for call, method, receiver, params in scan.calls:
        is_logger = (method in ONCE or receiver in LOGGER_NAMES or receiver in scan.bound
                     or receiver.rsplit(".", 1)[-1] in LOGGER_NAMES or receiver.strip("<>") in MAKERS)
        if not is_logger:
            continue
        msg = _message_arg(call, method)
        level = _stacklevel(call)
        if level != 1:
            # prints a caller's line: vllm/logger.py's *_once plumbing (check_once_helpers), or a helper
            if not logger_module and level == 2 and isinstance(msg, ast.Name) and msg.id in params:
                enclosing = next(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                                 and n.lineno <= call.lineno <= (n.end_lineno or n.lineno)
                                 and msg.id in [a.arg for a in n.args.posonlyargs + n.args.args])
                helpers[enclosing.name] = params.index(msg.id)
            continue
        lines = call_lines(call)
        split += len(lines) > 1
        sites.update((line, template_prefix(msg)) for line in lines)
    return FileFacts(sites, helpers, split)


def helper_sites(tree: ast.Module, helpers: dict[str, int]) -> set[tuple[int, str]]:
    """The sites of a file's calls of the release's helpers (:class:`FileFacts`): each call's line, with the
    template prefix of the argument the helper logs."""
    out: set[tuple[int, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func) in helpers:
            k = helpers[_name(node.func)]
            arg = node.args[k] if len(node.args) > k and not isinstance(node.args[k], ast.Starred) else None
            out.update((line, template_prefix(arg)) for line in call_lines(node))
    return out


def check_once_helpers(logger_py: str) -> str:
    """How a release's ``*_once`` records get their line (``vllm/logger.py`` at that release): the method
    ``init_logger`` patches onto the logger is either the ``lru_cache``'d ``_print_X_once`` itself (0.7.0 …
    0.11.0: one Python frame; ``functools.lru_cache`` is C and ``types.MethodType`` adds none) or
    ``_VllmLogger.X_once``, which calls ``_print_X_once`` (0.11.1 on: two frames). The record carries the caller's
    line only where the inner ``logger.X(…, stacklevel=s)`` has ``s`` = frames + 1: checked here, else an error.
    Returns a short summary."""
    tree = ast.parse(logger_py)
    levels: dict[str, int | None] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name.startswith("_print_") and fn.name.endswith("_once"):
            inner = [c for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                     and c.func.attr in LEVELS]
            levels[fn.name] = _stacklevel(inner[0]) if inner else None
    patched: dict[str, int] = {}
    for d in ast.walk(tree):
        if isinstance(d, ast.Dict):
            for k, v in zip(d.keys, d.values, strict=True):
                if isinstance(k, ast.Constant) and k.value in ONCE and v is not None:
                    patched[k.value] = 1 if isinstance(v, ast.Name) else 2
    if not patched:
        return "none"
    for method, frames in patched.items():
        level = levels.get(f"_print_{method}")
        if level != frames + 1:
            raise RuntimeError(f"vllm/logger.py: {method} goes through {frames} frame(s) but logs at "
                               f"stacklevel={level}: the record would not carry the caller's line")
    return "; ".join(f"{m}: {f} frame(s) to the caller, stacklevel={f + 1}" for m, f in sorted(patched.items()))


def log_format(logger_py: str) -> str:
    """The record format a release's ``vllm/logger.py`` sets (its ``_FORMAT``, as written: ``%(filename)s`` up to
    0.10.1, ``%(fileinfo)s`` from 0.10.2; bracketed from 0.8.0)."""
    for node in ast.parse(logger_py).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_FORMAT" for t in node.targets):
            return ast.unparse(node.value)
    return "?"


def in_scope(rel: str) -> bool:
    """Whether a file (its path in the wheel) is read: under :data:`SCOPE`."""
    return rel.startswith(SCOPE)


Site = tuple[str, int, str]  # printed file name, line, template prefix
_FACTS: dict[tuple[str, bool], FileFacts] = {}  # by (content hash, is vllm/logger.py), over the releases


def release_sites(root: Path) -> tuple[set[Site], dict[str, Any]]:
    """Every logger call site of the release under ``root`` (its files :func:`in_scope`): the printed file name
    (the basename: ``%(filename)s``, and ``%(fileinfo)s`` at the default level), the line the record carries, the
    template prefix; and a summary of how they were found. A call whose ``stacklevel`` is above 1 prints a
    caller's line: a function (outside ``vllm/logger.py``) that logs its own parameter at ``stacklevel=2``
    (``vllm/utils.py: print_warning_once`` from 0.6.3, ``print_info_once`` from 0.6.5) is a helper, and each
    call of it by name is a site with that argument's prefix; ``vllm/logger.py``'s ``*_once`` methods are sites
    at their caller (:func:`check_once_helpers`)."""
    sources: dict[str, bytes] = {}
    for path in sorted(root.glob("vllm/**/*.py")):
        rel = path.relative_to(root).as_posix()
        if in_scope(rel):
            sources[rel] = path.read_bytes()
    facts: dict[str, FileFacts] = {}
    for rel, src in sources.items():
        key = (hashlib.sha1(src).hexdigest(), rel == "vllm/logger.py")
        if key not in _FACTS:
            _FACTS[key] = file_facts(ast.parse(src, filename=rel), key[1])
        facts[rel] = _FACTS[key]
    helpers = {name: k for f in facts.values() for name, k in f.helpers.items()}
    sites: set[Site] = set()
    for rel, f in facts.items():
        base = rel.rsplit("/", 1)[-1]
        sites.update((base, line, prefix) for line, prefix in f.sites)
        if helpers and any(name.encode() in sources[rel] for name in helpers):
            sites.update((base, line, prefix) for line, prefix in helper_sites(ast.parse(sources[rel]), helpers))
    logger_py = (root / "vllm/logger.py").read_text(encoding="utf-8")
    return sites, {"files": len(sources), "once": check_once_helpers(logger_py), "format": log_format(logger_py),
                   "helpers": sorted(helpers), "split_calls": sum(f.split for f in facts.values())}


def check_lineno_rule() -> str:
    """Run logging calls written over several lines on this interpreter and check that each record's
    ``lineno`` is one of :func:`call_lines`' (``logging.Logger.findCaller`` reads the calling frame's
    ``f_lineno``, the line of the instruction that calls; CPython 3.11's docs of ``LogRecord`` give no rule
    for a call over several lines, hence the experiment). Also the two ``*_once`` shapes of ``vllm/logger.py``
    (:func:`check_once_helpers`), rebuilt here from the facts: an ``lru_cache``'d function bound with
    ``MethodType`` logging at ``stacklevel=2``, and a method calling an ``lru_cache``'d function logging at
    ``stacklevel=3``."""
    src = textwrap.dedent("""\
        import functools, logging, types
        def run(lg):
            @functools.lru_cache
            def one(self, msg, *args):
                self.info(msg, *args, stacklevel=2)
            @functools.lru_cache
            def inner(self, msg, *args):
                self.info(msg, *args, stacklevel=3)
            def two(self, msg, *args):
                inner(self, msg, *args)
            lg.once1 = types.MethodType(one, lg)
            lg.once2 = types.MethodType(two, lg)
            lg.info(
                "a %s",
                1)
            (lg
                .info("b"))
            lg.info("c %s", sum([1,
                                 2]))
            lg.once1(
                "d %s", 1)
            lg.once2(
                "e %s",
                1)
        """)
    code = compile(src, "lineno_probe.py", "exec")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    lg = logging.getLogger("vllm_log_sites.lineno_probe")
    lg.propagate, lg.handlers = False, [Keep()]
    lg.setLevel(logging.INFO)
    space: dict[str, Any] = {}
    exec(code, space)  # the probe above, nothing else
    space["run"](lg)
    calls = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr in ("info", "once1", "once2") and isinstance(n.func.value, ast.Name)
             and n.func.value.id == "lg"]
    want = {_literal(c.args[0])[0].strip(): call_lines(c) for c in calls}
    got = {r.msg.split("%")[0].strip(): r.lineno for r in records}
    bad = {m: (got.get(m), sorted(lines)) for m, lines in want.items() if got.get(m) not in lines}
    if bad:
        raise RuntimeError(f"LogRecord.lineno is not the line call_lines gives: {bad}")
    return f"Python {sys.version.split()[0]}: " + ", ".join(f"{m!r} at {got[m]}" for m in sorted(got))


def _ranges(indices: set[int]) -> str:
    """``{0, 1, 2, 5}`` → ``"0-2,5"``."""
    out: list[str] = []
    for i in sorted(indices):
        if out and i == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ",".join(out)


def build(wheels: list[Wheel]) -> dict[str, Any]:
    """The table: every release read, and by printed file → line → template prefix, the releases having it."""
    table: dict[Site, set[int]] = {}
    formats: dict[str, set[int]] = {}
    once: dict[str, set[int]] = {}
    helpers: dict[str, set[int]] = {}
    files = []
    for i, wheel in enumerate(wheels):
        root = fetch_sources(wheel)
        sites, info = release_sites(root)
        for site in sites:
            table.setdefault(site, set()).add(i)
        formats.setdefault(info["format"], set()).add(i)
        once.setdefault(info["once"], set()).add(i)
        for h in info["helpers"]:
            helpers.setdefault(h, set()).add(i)
        src = json.loads((root / "SOURCE.json").read_text())
        files.append({"release": wheel.version, "file": wheel.filename, "sha256": wheel.sha256,
                      "py_files": info["files"], "sites": len(sites)})
        print(f"{wheel.version}: {info['files']} files, {len(sites)} sites, {src['bytes_read'] / 2**20:.1f} MiB read",
              file=sys.stderr)
    nested: dict[str, dict[str, dict[str, str]]] = {}
    for (base, line, prefix), indices in sorted(table.items()):
        nested.setdefault(base, {}).setdefault(str(line), {})[prefix] = _ranges(indices)
    return {
        "about": {
            "tool": "tools/vllm_log_sites.py",
            "date": datetime.date.today().isoformat(),
            "what": "vLLM's logger call sites by printed file name (basename) and record line: for each, the "
                    "template prefix of the message (its literal text before the first placeholder; '' when not "
                    "a literal) and the releases (indices into 'releases', as ranges) whose source has it",
            "source": "the vllm/**/*.py members of each release's x86_64 wheel on PyPI, read by HTTP range "
                      "requests (zip central directory, then the members' spans); each member checked by its "
                      "CRC-32. sha256: the whole wheel's, as PyPI lists it (not recomputed: the wheel is never "
                      "downloaded whole)",
            "lineno_rule": check_lineno_rule(),
            "log_formats": {fmt: _ranges(ix) for fmt, ix in formats.items()},
            "once_methods": {k: _ranges(ix) for k, ix in once.items()},
            "helpers": {k: _ranges(ix) for k, ix in helpers.items()},
            "files": files,
        },
        "releases": [w.version for w in wheels],
        "sites": nested,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--only", nargs="*", help="read just these releases (a trial; writes nothing)")
    ap.add_argument("-o", "--output", type=Path, default=OUT)
    args = ap.parse_args(argv)
    pypi = json.loads(_get(PYPI_JSON))
    wheels = list_releases(pypi)
    if args.only:
        for w in wheels:
            if w.version in args.only:
                sites, info = release_sites(fetch_sources(w))
                print(w.version, len(sites), info)
        return 0
    data = build(wheels)
    raw = json.dumps(data, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode("utf-8")
    args.output.write_bytes(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME))
    print(f"{args.output}: {len(data['releases'])} releases, {sum(len(v) for v in data['sites'].values())} "
          f"(file, line) pairs, {len(raw)} bytes of JSON, {args.output.stat().st_size} bytes xz", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
