"""vLLM 0.20+ subtracts its own CUDA-graph memory estimate from the KV budget (``gpu_worker.py``
``determine_available_memory`` with ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``, default "1" from 0.20.0, "0" at 0.19.0
and 0.19.1). The estimate is measured on the device and not modelled: ``serving.cuda_graph_estimate_gib`` takes the
logged value, and a run without it says what it leaves out."""

from __future__ import annotations

from pathlib import Path

from timeline.cli import main
from timeline.io.serve_runfile import load_serve_run
from timeline.serve.budget import compute_budget
from timeline.spec.engine_versions import vllm_subtracts_cudagraph_estimate

GIB = 2**30


def _run(tmp_path: Path, version: str, extra: str = "") -> Path:
    path = tmp_path / f"run-{version}.toml"
    path.write_text('[model]\npreset = "llama3-8b"\n[hardware]\ngpu = "h100"\n[serving]\nengine = "vllm"\n'
                    f'engine_version = "{version}"\n{extra}[serving.load]\nnum_requests = 1\n')
    return path


def test_the_versions_that_subtract_it():
    assert [vllm_subtracts_cudagraph_estimate(v) for v in ("0.19.0", "0.19.1", "0.20.0", "0.24.0", "0.34.0")] == \
        [False, False, True, True, True]
    assert not vllm_subtracts_cudagraph_estimate("0.20.0rc1.dev12") and not vllm_subtracts_cudagraph_estimate("")


def test_the_logged_estimate_comes_off_the_pool(tmp_path):
    plain = compute_budget(load_serve_run(_run(tmp_path, "0.24.0")))
    given = compute_budget(load_serve_run(_run(tmp_path, "0.24.0", "cuda_graph_estimate_gib = 0.5\n")))
    assert plain.kv_pool_bytes - given.kv_pool_bytes == GIB // 2
    assert given.cuda_graph_subtracted and given.cuda_graph_estimate_bytes == GIB // 2
    assert not plain.cuda_graph_subtracted
    eager = compute_budget(load_serve_run(_run(tmp_path, "0.24.0", "cuda_graph_estimate_gib = 0.5\nenforce_eager = "
                                                                   "true\n")))
    assert eager.cuda_graph_estimate_bytes == 0  # no graphs, no estimate (cudagraph_mode NONE)


def test_a_run_without_it_says_so(tmp_path, capsys):
    assert main(["serve", str(_run(tmp_path, "0.24.0")), "-o", str(tmp_path / "a")]) == 0
    assert "Estimated CUDA graph memory" in capsys.readouterr().err
    assert main(["serve", str(_run(tmp_path, "0.19.0")), "-o", str(tmp_path / "b")]) == 0
    assert "CUDA-graph memory estimate" not in capsys.readouterr().err
    assert main(["serve", str(_run(tmp_path, "0.19.0", "cuda_graph_estimate_gib = 0.5\n")), "-o",
                 str(tmp_path / "c")]) == 2
    assert "0.20.0" in capsys.readouterr().err
