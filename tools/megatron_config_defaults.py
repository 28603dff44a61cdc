#!/usr/bin/env python3
"""Write ``timeline/io/megatron_config_defaults.json``: the field defaults of Megatron-Core's config dataclasses at
each release the parser table reads (``timeline/io/megatron_parser_dests.json``'s versions).

Megatron-Bridge's log (from NVIDIA-NeMo/Megatron-Bridge b273cd371, 2026-02-04, ``training/config.py:
ConfigContainer.log_non_default_values``) prints only the fields of ``TransformerConfig`` /
``MLATransformerConfig``, ``OptimizerConfig`` and ``DistributedDataParallelConfig`` whose values differ from the
dataclass's own ``field.default`` (or ``default_factory()``); every other field holds that default. This reads
those defaults from each release's source with ``ast`` (nothing is imported), from a Megatron-LM git directory
(the ``fetch`` tool's mirror):

    python tools/megatron_config_defaults.py --repo /work/.mirror/NVIDIA+Megatron-LM/repo

A default that is a literal (numbers, strings, booleans, None, lists, tuples, dicts) is kept as it is; a dotted
name (``torch.float32``, ``AttnBackend.auto``) as its text; a call or a function (``F.gelu``, ``init_method_normal(…)``)
is not kept (Bridge skips callables; their fields are listed under ``unread``). A class's fields are its bases'
(``ModelParallelConfig`` → ``TransformerConfig`` → ``MLATransformerConfig``) overlaid by its own.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "timeline" / "io" / "megatron_config_defaults.json"
#: (the log's class name, file, class, base of the same files or None)
CLASSES = (
    ("ModelParallelConfig", "megatron/core/model_parallel_config.py", None),
    ("TransformerConfig", "megatron/core/transformer/transformer_config.py", "ModelParallelConfig"),
    ("MLATransformerConfig", "megatron/core/transformer/transformer_config.py", "TransformerConfig"),
    ("OptimizerConfig", "megatron/core/optimizer/optimizer_config.py", None),
    ("DistributedDataParallelConfig", "megatron/core/distributed/distributed_data_parallel_config.py", None),
)
UNREAD = object()


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def _default(node: ast.AST | None) -> Any:
    """A field's default as JSON, or :data:`UNREAD`."""
    if node is None:
        return UNREAD
    if isinstance(node, ast.Call) and _dotted(node.func) in ("field", "dataclasses.field"):
        for kw in node.keywords:
            if kw.arg == "default":
                return _default(kw.value)
            if kw.arg == "default_factory":
                factory = _dotted(kw.value)
                return {"list": [], "dict": {}, "tuple": [], "set": []}.get(factory or "", UNREAD)
        return UNREAD  # no default: a required field
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        name = _dotted(node)
        # a dtype (torch.float32) or an enum member (AttnBackend.auto: a CamelCase class), never a function
        # (F.gelu: a module alias; torch.nn.functional.silu)
        head = (name or "").split(".")[0]
        if name is not None and (name.count(".") == 1 and head == "torch" or
                                 head[:1].isupper() and any(ch.islower() for ch in head)):
            return name
        return UNREAD
    if isinstance(value, (set, frozenset, bytes, complex)):
        return UNREAD
    return list(value) if isinstance(value, tuple) else value


def class_defaults(source: str, cls: str) -> tuple[dict[str, Any], list[str]]:
    """(field → default, fields whose default is not read) of ``cls``'s own body in ``source``."""
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            out: dict[str, Any] = {}
            unread: list[str] = []
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    if "ClassVar" in ast.unparse(st.annotation):
                        continue
                    v = _default(st.value)
                    if v is UNREAD:
                        unread.append(st.target.id)
                    else:
                        out[st.target.id] = v
            return out, unread
    raise LookupError(cls)


def version_defaults(repo: Path, commit: str) -> dict[str, Any]:
    files: dict[str, str] = {}
    merged: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for name, path, base in CLASSES:
        if path not in files:
            files[path] = subprocess.run(["git", "--git-dir", str(repo), "show", f"{commit}:{path}"], check=True,
                                         capture_output=True, text=True).stdout
        own, unread = class_defaults(files[path], name)
        if base is not None:
            b, bu = merged[base]
            own = {**b, **own}
            unread = [u for u in bu if u not in own] + [u for u in unread if u not in bu]
            own = {k: v for k, v in own.items() if k not in unread or k in own}
        merged[name] = (own, sorted(set(unread) - set(own)))
    return {name: {"defaults": d, "unread": u} for name, (d, u) in merged.items() if name != "ModelParallelConfig"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help="a Megatron-LM git directory")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    table = json.loads((ROOT / "timeline" / "io" / "megatron_parser_dests.json").read_text())
    versions = []
    # class → field → [[first version index, default], …]: a change starts a new entry, [i] alone: absent from i
    runs: dict[str, dict[str, list[list[Any]]]] = {}
    unread: dict[str, dict[str, list[int]]] = {}
    for i, (label, core, commit) in enumerate(table["versions"]):
        full = subprocess.run(["git", "--git-dir", str(args.repo), "rev-parse", commit], check=True,
                              capture_output=True, text=True).stdout.strip()
        versions.append({"label": label, "megatron_core": core, "commit": full})
        for cls, got in version_defaults(args.repo, full).items():
            fields = runs.setdefault(cls, {})
            for name, value in got["defaults"].items():
                entries = fields.setdefault(name, [])
                if not entries or entries[-1][1:] != [value]:
                    entries.append([i, value])
            for name, entries in fields.items():
                if name not in got["defaults"] and entries[-1][1:]:
                    entries.append([i])
            for name in got["unread"]:
                unread.setdefault(cls, {}).setdefault(name, []).append(i)
    doc = {"source": {"repo": "NVIDIA/Megatron-LM", "tool": "tools/megatron_config_defaults.py",
                      "files": sorted({p for _, p, _ in CLASSES}),
                      "read": "dataclass field defaults (field.default or default_factory()), as Megatron-Bridge's "
                              "ConfigContainer.log_non_default_values compares them; per field [[first version "
                              "index, default], …], [i] alone: no such field from version i"},
           "versions": versions, "classes": runs, "unread": unread}
    args.out.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"wrote {args.out} ({len(versions)} versions)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
