"""Capture frictions of plain PyTorch modules: init ops reading scalars, state shared by every
layer, and the dtype label of a ``--module`` trace."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

RUN = """\
[model]
trace = "{trace}"
profile = "hf"
[training]
micro_batch_size = 2
seq_len = 8
num_microbatches = 1
iterations = 1
dtype = "fp32"
optimizer_step = false
[allocator]
kind = "ideal"
"""


@pytest.fixture(scope="module")
def shared_trace(tmp_path_factory) -> Path:
    from timeline.cli import main

    out = tmp_path_factory.mktemp("shared") / "shared.parquet"
    assert main(["capture", "--module", "captures:shared_cache_factory", "-o", str(out)]) == 0
    return out


def test_trunc_normal_init_and_fp32_label(shared_trace):
    from timeline.io.trace_file import read_trace

    trace = read_trace(shared_trace)
    assert trace.provenance["dtype"] == "fp32"  # from the module's parameters, not --dtype's bf16
    assert "--dtype fp32" in trace.provenance["command"]


def test_state_shared_by_every_layer_simulates_when_all_layers_are_captured(shared_trace):
    from timeline.io.runfile import load_run
    from timeline.result.build import build_timeline

    run_file = shared_trace.with_suffix(".toml")
    run_file.write_text(RUN.format(trace=shared_trace.name))
    tl = build_timeline(load_run(run_file))
    # the cache layer 0 made (32 fp32) stays alive for layers 1 and 2 to read
    assert tl.peak(0).requested_bytes > 0
    names = set(tl.sim.names)
    assert any(n.startswith("layers.0.rope:") for n in names)  # the cache, named by the module that made it


def test_repeating_a_layer_that_reads_shared_state_is_refused(shared_trace):
    from timeline.cli import main

    run_file = shared_trace.with_suffix(".toml")
    run_file.write_text(RUN.format(trace=shared_trace.name).replace('profile = "hf"', 'profile = "hf"\nnum_layers = 5'))
    assert main(["simulate", str(run_file), "-o", str(shared_trace.parent / "out"), "--force"]) == 2


def test_construction_failures_blame_construction(tmp_path, capsys):
    from timeline.cli import main

    assert main(["capture", "--module", "captures:data_dependent_init_factory", "-o", str(tmp_path / "x.parquet")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: capture failed at aten.nonzero")
    assert "while building the model, before the step" in err[0]
