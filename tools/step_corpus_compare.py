"""Simulate corpus steps (``tests/data/steps/``) at configurations a public report measured, and print the
simulated numbers beside the reported ones. Too large for the test suite (full-size models): a tool.

Each report names the step function, the device capacity the reporter ran on and what the report
states; the step file's docstring carries the same provenance. An out-of-memory report gives the
request that failed and the bytes already allocated then, so the simulated run gets the reporter's
capacity and its first OOM is compared; it is also run on an 80 GiB device for its unconstrained peak.

    .venv/bin/python tools/step_corpus_compare.py
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from timeline.capture.step import capture_step
from timeline.io.runfile import load_run
from timeline.io.trace_file import write_trace
from timeline.result.build import build_timeline

STEPS = Path(__file__).parents[1] / "tests" / "data" / "steps"
GIB = 2**30
RUN = """\
[model]
trace = "step.parquet"
profile = "hf"
[training]
dtype = "fp32"
warmup_iterations = 0
iterations = 1
[hardware]
capacity_gib = {capacity}
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    step: str  # file:function under tests/data/steps
    source: str
    capacity_gib: float  # the reporter's device, as its message states it
    oom_request_bytes: int  # the allocation that failed
    oom_allocated_bytes: int  # "already allocated" when it failed


REPORTS = (
    Report(step="nanogpt.py:nanogpt_issue88",
           source="karpathy/nanoGPT issue #88, comment of 2023-03-08: train.py --batch_size=32 --compile=False",
           capacity_gib=15.78, oom_request_bytes=round(6.14 * GIB), oom_allocated_bytes=round(10.16 * GIB)),
)


def step_function(spec: str):
    name, func = spec.split(":")
    loader = importlib.util.spec_from_file_location(f"corpus_{Path(name).stem}", STEPS / name)
    assert loader is not None and loader.loader is not None
    module = importlib.util.module_from_spec(loader)
    sys.modules[loader.name] = module
    loader.loader.exec_module(module)
    return getattr(module, func)


def main() -> int:
    for rep in REPORTS:
        t0 = time.perf_counter()
        trace = capture_step(step_function(rep.step), steps=1)
        captured_s = time.perf_counter() - t0
        with tempfile.TemporaryDirectory() as tmp:
            write_trace(trace, Path(tmp) / "step.parquet")
            out = {}
            for capacity in (rep.capacity_gib, 80):
                (Path(tmp) / "run.toml").write_text(RUN.format(capacity=capacity))
                out[capacity] = build_timeline(load_run(Path(tmp) / "run.toml"))
        small, big = out[rep.capacity_gib], out[80]
        print(f"{rep.step}: {rep.source} (captured in {captured_s:.0f} s, {len(trace.ops)} ops)")
        print(f"  unconstrained peak allocated {big.peak(0).allocated_bytes / GIB:.2f} GiB, "
              f"reserved {big.peak(0).reserved_bytes / GIB:.2f} GiB")
        ooms = small.memory[0].oom
        if not ooms:
            print(f"  no OOM on {rep.capacity_gib} GiB; reported: request {rep.oom_request_bytes / GIB:.2f} GiB "
                  f"with {rep.oom_allocated_bytes / GIB:.2f} GiB allocated")
            continue
        first = ooms[0]
        print(f"  first OOM on {rep.capacity_gib} GiB: {first['tensor']} requests "
              f"{first['request_bytes'] / GIB:.2f} GiB with {first['allocated_bytes'] / GIB:.2f} GiB allocated "
              f"(reserved {first['reserved_bytes'] / GIB:.2f} GiB)")
        print(f"  reported: request {rep.oom_request_bytes / GIB:.2f} GiB with "
              f"{rep.oom_allocated_bytes / GIB:.2f} GiB allocated; allocated error "
              f"{first['allocated_bytes'] / rep.oom_allocated_bytes - 1:+.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
