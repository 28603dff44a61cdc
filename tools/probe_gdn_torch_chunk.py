"""What Megatron-Core's deterministic gated-delta rule holds, measured on its own autograd graph (CPU, no GPU).

``python3 tools/probe_gdn_torch_chunk.py --git MEGATRON_LM_GIT_DIR [--ref core_v0.17.0] [-o tests/data/gdn_torch_chunk.json]``

Reads ``torch_chunk_gated_delta_rule`` out of Megatron-LM at ``--ref`` (``megatron/core/ssm/gated_delta_net.py``,
or ``gated_delta_net/gdn.py`` from 07e958fc74) into a temporary module — nothing of it is kept — and runs
``timeline capture`` (the capture extra: PyTorch on the CPU, fake tensors) on one call per shape: bf16 ``q``, ``k``
``[b, s, h, k]``, ``v`` ``[b, s, h, v]``, bf16 ``beta`` and fp32 ``g`` ``[b, s, h]``, each made a non-leaf by adding a
one-element bf16 parameter (as the layer's tensors are), the output summed into the loss. From the trace's
allocations and frees it writes, per shape:

* ``kept``: the bytes of every storage autograd saved (``unsaved_at_forward_end``: what else is alive when the
  forward returns, besides the loss — nothing);
* ``forward_transient``: the forward's peak over what it keeps, less the wrapper's five inputs (held by the caller
  through the call, as the layer's forward holds them) and the function's 16-bit output;
* ``backward_peak``: the backward's peak over what the forward kept, less the loss gradient's seed (one bf16
  scalar).

``timeline.profiles.megatron_gdn.torch_chunk_elements`` is held against these numbers in
``tests/graph/test_gdn_torch_chunk.py``. Nothing here is read by the package.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
#: (b, s, h, k, v): chunk counts 1 … 32, a padded tail, widths on both sides of each other, several heads
SHAPES = ((1, 64, 1, 64, 64), (1, 256, 1, 64, 64), (1, 512, 1, 64, 64), (1, 1024, 1, 64, 64),
          (1, 512, 1, 32, 96), (1, 1024, 1, 32, 96), (1, 2048, 1, 32, 96), (1, 1024, 1, 128, 128),
          (1, 512, 1, 96, 32), (1, 1024, 1, 96, 32), (2, 512, 3, 64, 64), (2, 300, 2, 128, 64),
          (1, 1024, 2, 96, 128))
FILES = ("megatron/core/ssm/gated_delta_net/gdn.py", "megatron/core/ssm/gated_delta_net.py")

WRAPPER = '''
import ast, os, torch, torch.nn.functional as F
SRC = open(os.path.join(os.path.dirname(__file__), "rule_source.py")).read()
fn = next(n for n in ast.parse(SRC).body if isinstance(n, ast.FunctionDef) and n.name == "torch_chunk_gated_delta_rule")
ns = {"torch": torch, "F": F}
exec(compile(ast.Module([fn], []), "rule_source", "exec"), ns)
B, S, H, K, V = (int(os.environ[x]) for x in ("PROBE_B", "PROBE_S", "PROBE_H", "PROBE_K", "PROBE_V"))


class Rule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.zeros(1, dtype=torch.bfloat16))

    def forward(self, q, k, v, g, beta):
        q, k, v, beta = (x + self.p for x in (q, k, v, beta))
        g = g + self.p.float()  # held by the caller through the call, as the layer's forward holds its g
        return ns["torch_chunk_gated_delta_rule"](q, k, v, g=g, beta=beta)[0]


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Rule()])

    def forward(self, *a):
        return self.layers[0](*a)


def build():
    bf = torch.bfloat16
    return Model(), (torch.randn(B, S, H, K, dtype=bf), torch.randn(B, S, H, K, dtype=bf),
                     torch.randn(B, S, H, V, dtype=bf), -torch.rand(B, S, H), torch.rand(B, S, H, dtype=bf))
'''


def rule_source(git: str, ref: str) -> tuple[str, str]:
    """(the file's text, its path) holding ``torch_chunk_gated_delta_rule`` at ``ref``."""
    for path in FILES:
        p = subprocess.run(["git", f"--git-dir={git}", "show", f"{ref}:{path}"], capture_output=True, text=True)
        if p.returncode == 0 and "def torch_chunk_gated_delta_rule" in p.stdout:
            return p.stdout, path
    raise SystemExit(f"no torch_chunk_gated_delta_rule in {', '.join(FILES)} at {ref}")


def measure(trace: Path, b: int, s: int, h: int, k: int, v: int) -> dict[str, int]:
    rows = pq.read_table(trace).to_pylist()
    size: dict[int, int] = {}
    for r in rows:
        for st, n in zip(r["out_storage"], r["out_nbytes"], strict=True):
            size.setdefault(st, n)
    live: set[int] = set()
    cur, end_f, peak = 0, None, {"F": 0, "B": 0}
    for r in rows:
        if r["phase"] != "F" and end_f is None:
            end_f = cur
        for st in r["allocs"]:
            if st not in live:
                live.add(st)
                cur += size.get(st, 0)
        phase = "F" if r["phase"] == "F" else "B"
        peak[phase] = max(peak[phase], cur)
        for st in r["frees"]:
            if st in live:
                live.discard(st)
                cur -= size.get(st, 0)
    kept = sum(size.get(st, 0) for st in {st for r in rows for st in r["saves"]})
    assert end_f is not None
    inputs = b * s * h * (2 * k * 2 + v * 2 + 4 + 2)  # q + p, k + p, v + p (bf16), g + p (fp32), beta + p (bf16)
    out = b * s * h * v * 2
    loss = 2  # the bf16 sum the loss is, made after the forward's peak; the backward's seed is its size too
    return {"kept": kept, "forward_transient": peak["F"] - (end_f - loss) - inputs - out,
            "backward_peak": peak["B"] - end_f - loss, "unsaved_at_forward_end": end_f - kept - loss}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--git", required=True, help="a Megatron-LM git directory")
    ap.add_argument("--ref", default="core_v0.17.0")
    ap.add_argument("-o", "--out", default=str(ROOT / "tests" / "data" / "gdn_torch_chunk.json"))
    a = ap.parse_args()
    text, path = rule_source(a.git, a.ref)
    commit = subprocess.run(["git", f"--git-dir={a.git}", "rev-parse", a.ref + "^{commit}"], capture_output=True,
                            text=True, check=True).stdout.strip()
    import torch

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "rule_source.py").write_text(text)
        (Path(tmp) / "probe_model.py").write_text(WRAPPER)
        for b, s, h, k, v in SHAPES:
            env = os.environ | {"PROBE_B": str(b), "PROBE_S": str(s), "PROBE_H": str(h), "PROBE_K": str(k),
                                "PROBE_V": str(v)}
            trace = Path(tmp) / "trace.parquet"
            subprocess.run([sys.executable, "-m", "timeline", "capture", "--module", f"{tmp}/probe_model.py:build",
                            "--optimizer", "none", "--autocast", "off", "-o", str(trace), "--force"], env=env,
                           check=True, capture_output=True)
            rows.append({"b": b, "s": s, "h": h, "k": k, "v": v, **measure(trace, b, s, h, k, v)})
            print(rows[-1], file=sys.stderr)
    doc = {"source": f"NVIDIA/Megatron-LM {a.ref} ({commit[:10]}) {path}: torch_chunk_gated_delta_rule",
           "how": "tools/probe_gdn_torch_chunk.py: timeline capture of one call per shape on the CPU "
                  f"(PyTorch {torch.__version__}); bytes",
           "chunk_size": 64, "rows": rows}
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
