"""Print the arguments block a Megatron-LM job prints, by running that version's own ``parse_args`` and
``validate_args`` on an argument vector (one job per line of JSON on stdin, one JSON line per job out).

Run by ``tools/megatron_dumps.py`` in a subprocess whose working directory is a ``git archive`` of the
version (``megatron/`` and ``pretrain_gpt.py``); never imported. Packages this machine lacks are stubs
(``tools/megatron_parser_build.py``'s finder); the GPU ``validate_args`` asks about is an H100 (compute
capability 9.0), and only global rank 0 prints. Each job's input: ``{"argv": [...], "world_size": N,
"env": {...}}``; output: ``{"block": TEXT}`` (``_print_args``' lines, verbatim) or ``{"error": TEXT}``
(what Megatron raised: the job would not have started).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import types
import typing

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_parser_build as build  # noqa: E402  (imports torch before the stub finder)


def main() -> None:
    if not hasattr(typing, "override"):
        typing.override = lambda f: f  # type: ignore[attr-defined]
    torch = build.torch
    torch.compile = build._identity  # type: ignore[assignment]
    torch.jit.script = build._identity  # type: ignore[assignment]
    props = types.SimpleNamespace(major=9, minor=0, name="NVIDIA H100 80GB HBM3", total_memory=85_520_809_984,
                                  multi_processor_count=132)
    torch.cuda.get_device_properties = lambda *a, **k: props  # type: ignore[assignment]
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)  # type: ignore[assignment]
    sys.meta_path.append(build.StubFinder())
    sys.path.insert(0, build.CHECKOUT)
    from megatron.training import arguments

    with contextlib.suppress(ImportError):
        import megatron.training.utils as utils

        utils.is_rank0 = lambda: True  # type: ignore[attr-defined]
    base_env = dict(os.environ)
    for line in sys.stdin:
        job = json.loads(line)
        os.environ.clear()
        os.environ.update(base_env)
        os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(job["world_size"]),
                           **{k: str(v) for k, v in job.get("env", {}).items()}})
        sys.argv = ["pretrain_gpt.py", *job["argv"]]
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                args = arguments.parse_args()
                arguments.validate_args(args, {})
            text = out.getvalue()
            start = text.index("------------------------ arguments")
            end = text.index("---------------------", text.index("end of arguments"))
            block = text[start:text.index("\n", end) if "\n" in text[end:] else len(text)]
            print(json.dumps({"block": block}), flush=True)
        except BaseException as exc:  # noqa: BLE001 — SystemExit from argparse too: the job would not start
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:600]}), flush=True)


if __name__ == "__main__":
    main()
