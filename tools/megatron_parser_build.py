"""Build one Megatron-LM version's training parser and print its actions as JSON (one line).

Run by ``tools/megatron_parser_args.py`` in a subprocess whose working directory is a ``git archive``
of that version (``megatron/`` and ``pretrain_gpt.py``); never imported. A package the checkout
imports but this machine lacks is replaced by a stub module (any attribute is a stub class, which
also serves as a base class or a decorator), so ``try: import transformer_engine`` succeeds and the
arguments optional packages add are all built. ``torch.compile`` / ``torch.jit.script`` become the
identity (Megatron compiles a few fused functions at import). Python 3.11 lacks ``typing.override``
(3.12), which later checkouts import: it is the identity too.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import types
import typing
from typing import Any

import torch  # imported before the stub finder, so torch's own optional imports stay untouched
import torch._dynamo  # noqa: F401
import torch._inductor.utils  # noqa: F401

CHECKOUT = os.getcwd()
#: packages this machine has and the checkout may import for real
REAL = {"megatron", "torch", "numpy", "yaml", "packaging", "einops", "pydantic", "typing_extensions"}


class _StubMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stub(f"{cls.__name__}.{name}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # a decorator keeps the function
        return _stub(f"{cls.__name__}()")

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __iter__(cls) -> Any:
        return iter(())

    def __bool__(cls) -> bool:
        return False

    def __or__(cls, other: Any) -> Any:
        return cls

    __ror__ = __or__


def _stub(name: str) -> Any:
    return _StubMeta(name, (), {})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stub(f"{self.__name__}.{name}")


def _imported_by_checkout() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith("<frozen") and "importlib" not in name:
            return name.startswith(CHECKOUT)
        frame = frame.f_back
    return False


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on ``sys.meta_path``: only what no real finder found, and only for the checkout's imports."""

    def __init__(self) -> None:
        self.stubbed: set[str] = set()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        top = fullname.split(".")[0]
        if top in REAL or top in sys.stdlib_module_names or top.startswith("_"):
            return None
        if top not in self.stubbed and not _imported_by_checkout():
            return None
        self.stubbed.add(top)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "99.0.0"  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _identity(fn: Any = None, *args: Any, **kwargs: Any) -> Any:
    return fn if fn is not None else (lambda g: g)


SITES: dict[int, str] = {}


def _site() -> str:
    """``path:function`` of the checkout frame that added the argument (the arguments.py function that
    built a dataclass group), and the dataclass of an ArgumentGroupFactory."""
    frame = sys._getframe(2)
    cls = ""
    while frame is not None:
        name = frame.f_code.co_filename
        owner = frame.f_locals.get("self")
        if not cls and owner is not None and hasattr(owner, "src_cfg_class"):
            src = owner.src_cfg_class
            cls = f" ({src.__module__}.{src.__qualname__})"
        if name.startswith(CHECKOUT) and not name.endswith("argument_utils.py"):
            return f"{os.path.relpath(name, CHECKOUT)}:{frame.f_code.co_name}{cls}"
        frame = frame.f_back
    return "?"


_original_add = argparse._ActionsContainer.add_argument


def _recording_add(self: Any, *args: Any, **kwargs: Any) -> Any:
    action = _original_add(self, *args, **kwargs)
    SITES[id(action)] = _site()
    return action


def literal(value: Any) -> str | None:
    """``repr`` of a default that is a literal (enums by name); None for anything else."""
    import enum
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if value is None or isinstance(value, bool | int | float | str):
        return repr(value)
    if isinstance(value, list | tuple):
        items = [literal(v) for v in value]
        if all(i is not None for i in items):
            body = ", ".join(typing.cast(list[str], items))
            return f"[{body}]" if isinstance(value, list) else f"({body}{',' if len(items) == 1 else ''})"
    return None


ACTION_NAMES = {"_StoreAction": "store", "_StoreTrueAction": "store_true", "_StoreFalseAction": "store_false",
                "_StoreConstAction": "store_const", "_AppendAction": "append", "_CountAction": "count",
                "BooleanOptionalAction": "boolean_optional"}


def extra_providers(parser: argparse.ArgumentParser) -> list[str]:
    """Call what ``pretrain_gpt.py`` passes as ``extra_args_provider`` (each name it may pass); their
    ``module:function`` names."""
    path = os.path.join(CHECKOUT, "pretrain_gpt.py")
    tree = ast.parse(open(path).read())
    imports = {a.asname or a.name: node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               for a in node.names}
    names = {n.id for node in ast.walk(tree) if isinstance(node, ast.keyword) and node.arg == "extra_args_provider"
             for n in ast.walk(node.value) if isinstance(n, ast.Name) and n.id in imports}
    for name in sorted(names):
        module = importlib.import_module(typing.cast(str, imports[name]))
        getattr(module, name)(parser)
    return [f"{imports[name]}:{name}" for name in sorted(names)]


def main() -> None:
    if not hasattr(typing, "override"):
        typing.override = lambda f: f  # type: ignore[attr-defined]
    torch.compile = _identity  # type: ignore[assignment]
    torch.jit.script = _identity  # type: ignore[assignment]
    finder = StubFinder()
    sys.meta_path.append(finder)
    sys.path.insert(0, CHECKOUT)
    argparse._ActionsContainer.add_argument = _recording_add  # type: ignore[method-assign]
    from megatron.training import arguments

    parser = argparse.ArgumentParser(allow_abbrev=False)
    arguments.add_megatron_arguments(parser)
    providers = extra_providers(parser)
    out = []
    for act in parser._actions:
        if isinstance(act, argparse._HelpAction):
            continue
        kind = type(act).__name__
        out.append({"option_strings": list(act.option_strings), "dest": act.dest,
                    "action": ACTION_NAMES.get(kind, kind),
                    "type": getattr(act.type, "__name__", None if act.type is None else repr(act.type)),
                    "nargs": act.nargs if act.nargs is None or isinstance(act.nargs, int | str) else repr(act.nargs),
                    "default": literal(act.default), "source": SITES.get(id(act), "?")})
    print(json.dumps({"actions": out, "stubbed": sorted(finder.stubbed),
                      "providers": providers}))


if __name__ == "__main__":
    main()
