"""The CUDA-context rule of :mod:`timeline.serve.non_torch` against the H200 measurement taken apart
(``traces/groundtruth-h200/context_probe.json``, ``tools/probe_cuda_context.py`` on a real H200)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from timeline.serve.non_torch import CONTEXT, DEFAULT_STACK_BYTES, THREADS_PER_SM, context_bytes
from timeline.spec.hardware import GPUS, NVIDIA_SMI_TOTAL_MIB, SM_COUNTS, TORCH_TOTAL_GIB
from timeline.spec.run import HardwareSpec

PROBE = Path(__file__).resolve().parents[2] / "traces" / "groundtruth-h200" / "context_probe.json"
GIB = 1 << 30


@pytest.fixture(scope="module")
def probe() -> dict:
    return json.loads(PROBE.read_text())


def test_stack_reservation_is_sms_times_threads(probe):
    """Every step of the stack limit moves the context by SMs × resident threads × the step, to the byte,
    with the device's own attributes equal to the hardware tables the rule reads."""
    drv = probe["cases"]["driver"]
    assert drv["sm_count"] == SM_COUNTS["h200"] and drv["threads_per_sm"] == THREADS_PER_SM[int(GPUS["h200"]["sm"])]
    assert drv["limits"]["stack_bytes"] == DEFAULT_STACK_BYTES
    sweep = sorted((p["stack_bytes"], p["used_bytes"]) for p in drv["stack_sweep"])
    per_byte = drv["sm_count"] * drv["threads_per_sm"]
    for (s0, u0), (s1, u1) in zip(sweep, sweep[1:], strict=False):
        assert u1 - u0 == per_byte * (s1 - s0)
    assert drv["used_bytes"] == dict(sweep)[DEFAULT_STACK_BYTES]


def test_bare_context_is_the_rule_for_gh100(probe):
    """The runtime's version does not move the context; PyTorch adds nothing before its first kernel; the
    H200 gets the H100's figure by the rule and the measurement agrees to the log's two decimals."""
    cases = probe["cases"]
    bare = cases["driver"]["used_bytes"]
    runtimes = [c for name, c in cases.items() if name.startswith("cudart:")]
    assert len(runtimes) == 4 and {c["runtime_version"] for c in runtimes} == {11080, 12040, 12090, 13000}
    assert all(c["used_bytes"] == bare for c in runtimes)
    assert cases["torch_empty"]["non_torch_bytes"] == bare
    assert context_bytes(HardwareSpec.preset("h200"))[0] == context_bytes(HardwareSpec.preset("h100"))[0] == int(CONTEXT["h100"][0] * GIB)
    assert abs(bare - context_bytes(HardwareSpec.preset("h200"))[0]) <= 0.005 * GIB
    # the first kernel's lazily loaded module is what non_torch.json's 619 MiB holds beyond the context
    assert cases["torch_zeros"]["non_torch_bytes"] - bare == 96_468_992
    assert cases["torch_eager"]["non_torch_bytes"] - bare == 767_557_632  # every module at once (732 MiB)


def test_h200_totals_from_the_probe(probe):
    assert TORCH_TOTAL_GIB["h200"] == pytest.approx(probe["cases"]["torch_zeros"]["total_bytes"] / GIB, abs=0.005)
    assert NVIDIA_SMI_TOTAL_MIB["h200"] * 2**20 == probe["nvml_no_context"]["total_bytes"]
