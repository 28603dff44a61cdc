"""PyTorch's default cuBLAS workspace per GPU generation and PyTorch version (``[framework] pytorch``).

``parseChosenWorkspaceSize`` (aten/src/ATen/cuda/CublasHandlePool.cpp): ``:4096:8`` (32 MiB) on
compute capability 9.0 in every version, on majors 10 and 12 from 2.12 (pytorch/pytorch#175344),
on major 11 from 2.14 (#189312); ``:4096:2:16:8`` (8.125 MiB) elsewhere; an explicit
``CUBLAS_WORKSPACE_CONFIG`` wins everywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_run import tiny_run

from timeline.errors import UserError
from timeline.io.runfile import run_from_data
from timeline.profiles.megatron_workspaces import torch_workspace_bytes
from timeline.result.build import build_timeline

MIB = 1 << 20
SMALL = 4096 * 1024 * 2 + 16 * 1024 * 8  # :4096:2:16:8


@pytest.mark.parametrize(("sm", "pytorch", "expected"), [
    (90, "2.9", 32 * MIB), (90, "2.13", 32 * MIB),
    (80, "2.13", SMALL),
    (100, "2.11", SMALL), (100, "2.11.1", SMALL), (100, "2.12", 32 * MIB), (100, "2.13.0", 32 * MIB),
    (120, "2.11", SMALL), (120, "2.12", 32 * MIB),
    (110, "2.13", SMALL), (110, "2.14", 32 * MIB),
])
def test_default_size_by_generation_and_version(sm, pytorch, expected):
    assert torch_workspace_bytes("", sm, pytorch) == expected


def test_explicit_config_wins_on_every_generation():
    assert torch_workspace_bytes(":4096:8", 100, "2.11") == 32 * MIB
    assert torch_workspace_bytes(":16:8", 90, "2.13") == 128 * 1024


def _torch_workspaces(run) -> dict[str, int]:
    """The PyTorch cuBLAS workspaces the last pipeline rank's device allocates (name → bytes)."""
    tl = build_timeline(run)
    d = max(range(tl.num_devices), key=lambda i: tl.devices[i].pp_rank)
    ev = tl.events(d)
    return {tl.names[t]: int(s) for t, s, sign in zip(ev.tensor, ev.size, ev.sign, strict=True)
            if sign > 0 and tl.names[t].startswith("workspace.torch_cublas")}


def test_a_blackwell_job_holds_the_version_s_workspaces():
    """The head's stage runs torch GEMMs: one workspace per (handle, stream), forward and backward."""
    before = _torch_workspaces(tiny_run(sm=100, pytorch="2.11"))
    after = _torch_workspaces(tiny_run(sm=100, pytorch="2.12"))
    assert before == {"workspace.torch_cublas_forward": SMALL, "workspace.torch_cublas_backward": SMALL}
    assert after == {"workspace.torch_cublas_forward": 32 * MIB, "workspace.torch_cublas_backward": 32 * MIB}
    assert _torch_workspaces(tiny_run(sm=90, pytorch="2.11")) == after


def test_a_version_that_is_not_one_names_the_key():
    data = {"name": "x", "model": {"preset": "llama3-8b", "num_hidden_layers": 1, "profile": "megatron"},
            "framework": {"pytorch": "latest"}}
    with pytest.raises(UserError, match=r"framework\.pytorch.*'latest' is not a version"):
        run_from_data(data, Path("x.toml"))
