"""vLLM 0.8 … 0.10 choose V0 or V1 per job (``engine/arg_utils.py`` ``EngineArgs._is_v1_supported_oracle``, read in
every release's sdist from 0.8.0 to 0.10.2): the oracle's checks a run expresses, what a V0 job's budget reads
(scheduler defaults, the non-PyTorch window, the eager profile run), ``serving.engine_v1`` (``VLLM_USE_V1``) and the
engine a startup log names."""

from __future__ import annotations

from pathlib import Path

import pytest

from timeline.cli import main
from timeline.errors import SpecError
from timeline.io.serve_log import engine_of
from timeline.io.serve_runfile import load_serve_run
from timeline.serve.budget import compute_budgets
from timeline.serve.non_torch import measured_non_torch, window
from timeline.spec.engine_versions import vllm_runs_v1, vllm_v1_fallback

HF = Path(__file__).resolve().parents[1] / "data" / "hf"
CC = "Compute Capability < 8.0"
PP_083 = "Pipeline Parallelism without Ray distributed executor"
PP_090 = PP_083 + " or multiprocessing executor or external launcher"


@pytest.mark.parametrize(("version", "features", "expected"), [
    # below compute capability 8.0 (T4: 75, V100: 70) every release from 0.8.0 to 0.10.1 runs V0; 0.10.2 drops it
    ("0.8.2", {"sm": 75}, (CC, False)),
    ("0.10.1", {"sm": 70}, (CC, False)),
    ("0.10.2", {"sm": 75}, ("", False)),
    ("0.7.3", {"sm": 75}, ("", False)),  # V0 by the version alone: no choice to make
    ("0.11.0", {"sm": 75}, ("", False)),  # no V0 engine left
    # an fp8 KV cache: V0 always at 0.8.0 / 0.8.1; then only FlashAttention 3 (compute capability 9.x) takes it
    ("0.8.1", {"sm": 90, "kv_cache_dtype": "fp8"}, ("--kv-cache-dtype", False)),
    ("0.8.2", {"sm": 90, "kv_cache_dtype": "fp8"}, ("", False)),
    ("0.9.2", {"sm": 80, "kv_cache_dtype": "fp8"}, ("--kv-cache-dtype", False)),
    ("0.9.2", {"sm": 100, "kv_cache_dtype": "fp8"}, ("--kv-cache-dtype", False)),
    ("0.10.0", {"sm": 100, "kv_cache_dtype": "fp8"}, ("", False)),  # is_kv_cache_dtype_supported: 10.0 takes any
    ("0.10.1", {"sm": 89, "kv_cache_dtype": "fp8_e4m3"}, ("--kv-cache-dtype", False)),
    ("0.10.2", {"sm": 80, "kv_cache_dtype": "fp8", "mla": True}, ("", False)),  # FlashMLA's default takes fp8
    ("0.10.2", {"sm": 80, "kv_cache_dtype": "fp8"}, ("--kv-cache-dtype", False)),
    ("0.10.2", {"sm": 80, "kv_cache_dtype": "bf16"}, ("", False)),
    # fp32 until 0.9.1, bitsandbytes until 0.8.2, speculative MTP until 0.8.5
    ("0.9.1", {"sm": 90, "dtype": "fp32"}, ("--dtype torch.float32", False)),
    ("0.9.2", {"sm": 90, "dtype": "fp32"}, ("", False)),
    ("0.8.2", {"sm": 90, "quant_method": "bitsandbytes"}, ("--quantization bitsandbytes", False)),
    ("0.8.3", {"sm": 90, "quant_method": "bitsandbytes"}, ("", False)),
    ("0.8.5", {"sm": 90, "speculative": "mtp"}, ("Speculative Decoding", False)),
    ("0.9.0", {"sm": 90, "speculative": "mtp"}, ("", False)),
    # pipeline parallelism: experimental to 0.8.2, then a check the default executor backend (None) fails to 0.9.0
    ("0.8.2", {"sm": 90, "pp": 2}, ("PP", True)),
    ("0.8.5", {"sm": 90, "pp": 2}, (PP_083, False)),
    ("0.9.0", {"sm": 90, "pp": 4}, (PP_090, False)),
    ("0.9.1", {"sm": 90, "pp": 4}, ("", False)),
    # the first check failing is the one named, in the oracle's order
    ("0.8.2", {"sm": 75, "pp": 2, "kv_cache_dtype": "fp8"}, (CC, False)),
])
def test_the_oracle_falls_back_where_that_release_does(version, features, expected):
    assert vllm_v1_fallback(version, **features) == expected


def test_vllm_use_v1_overrides_the_oracle():
    assert not vllm_runs_v1("0.8.2", "auto", sm=75)
    assert vllm_runs_v1("0.8.2", "on", sm=75) and not vllm_runs_v1("0.9.2", "off", sm=90)
    assert vllm_runs_v1("0.9.2", "auto", sm=90) and not vllm_runs_v1("0.7.3", "auto", sm=90)


def _run(tmp_path: Path, gpu: str, version: str, extra: str = "", tp: int = 2):
    path = tmp_path / "run.toml"
    path.write_text(f'[model]\nhf_config = "{HF / "llama-3.1-8b" / "config.json"}"\n[parallel]\ntp = {tp}\n'
                    f'[hardware]\ngpu = "{gpu}"\n[serving]\nengine = "vllm"\nengine_version = "{version}"\n'
                    f'dtype = "fp16"\nmax_model_len = 4096\n{extra}[serving.load]\nnum_requests = 1\n')
    return load_serve_run(path)


def test_a_v0_job_on_a_v1_release_reads_v0s_budget(tmp_path):
    """vLLM 0.8.2 on T4s runs V0: the note says why; V0's scheduler defaults (no chunked prefill below 32K, so one
    ``max_model_len``-token profile step, ``SchedulerConfig.__post_init__``) where V1 takes 8,192 tokens on an
    A100 80GB; the non-PyTorch window from ``init_device``'s baseline (the distributed groups, V0's run adds none)
    where V1 0.8.x subtracts the context too; the profile run eager."""
    v0 = _run(tmp_path, "t4", "0.8.2")
    assert not v0.vllm_v1 and v0.serving.engine_v1 == "auto"
    assert any("runs its V0 engine" in n and "'Compute Capability < 8.0 is not supported by the V1 Engine. Falling "
               "back to V0.'" in n for n in v0.notes)
    assert (v0.serving.max_num_batched_tokens, v0.serving.enable_chunked_prefill) == (4096, False)
    assert window("vllm", "0.8.2", v0.vllm_v1) == "baseline" and window("vllm", "0.8.2", True) == "absolute"
    size, source = measured_non_torch(v0)
    assert source.startswith("window 'baseline': dist:") and "context" not in source
    forced = _run(tmp_path, "a100", "0.8.2", 'engine_v1 = "off"\n')
    assert not forced.vllm_v1 and not any("runs its V0 engine" in n for n in forced.notes)
    v1 = _run(tmp_path, "a100", "0.8.2")
    # V1's _set_default_args_v1 at 0.8.x: 8,192 tokens on a device of 70 GiB or more (the A100's 79.22)
    assert v1.vllm_v1 and (v1.serving.max_num_batched_tokens, v1.serving.enable_chunked_prefill) == (8192, True)
    assert measured_non_torch(v1)[1].startswith("window 'absolute': context:")
    b0, b1 = compute_budgets(forced)[0], compute_budgets(v1)[0]
    assert b0.non_torch_bytes < b1.non_torch_bytes  # V0's window holds no context
    assert b0.activation_peak_bytes < b1.activation_peak_bytes  # one 4,096-token profile step, not 8,192


@pytest.mark.parametrize(("gpu", "version", "extra", "message"), [
    ("t4", "0.8.2", 'engine_v1 = "on"\n', "refuses VLLM_USE_V1=1 with Compute Capability < 8.0"),
    ("a100", "0.11.0", 'engine_v1 = "off"\n', "has no V0 engine (removed in 0.11.0)"),
    ("a100", "0.7.3", 'engine_v1 = "on"\n', "V1 engine (an alpha before 0.8.0) is not modelled"),
])
def test_an_engine_vllm_cannot_run_is_refused(tmp_path, gpu, version, extra, message):
    with pytest.raises(SpecError) as err:
        _run(tmp_path, gpu, version, extra)
    assert "serving.engine_v1" in str(err.value) and message in str(err.value)


def test_pipeline_parallelism_is_experimental_on_0_8_2(tmp_path):
    """0.8.0 … 0.8.2 fall back for PP as an experimental feature: VLLM_USE_V1=1 runs V1 there."""
    assert _run(tmp_path, "a100", "0.8.2", tp=1).vllm_v1  # pp 1: V1
    path = tmp_path / "pp.toml"
    path.write_text(f'[model]\nhf_config = "{HF / "llama-3.1-8b" / "config.json"}"\n[parallel]\npp = 2\n'
                    '[hardware]\ngpu = "a100"\n[serving]\nengine = "vllm"\nengine_version = "0.8.2"\n'
                    'max_model_len = 4096\nengine_v1 = "on"\n[serving.load]\nnum_requests = 1\n')
    assert load_serve_run(path).vllm_v1


def test_the_engine_a_log_names_is_the_runs(tmp_path):
    assert engine_of("INFO llm_engine.py:240] Initializing an LLM engine (v0.8.2) with config: model='x'") == "off"
    assert engine_of("INFO core.py:58] Initializing a V1 LLM engine (v0.9.2) with config: model='x'") == "on"
    assert engine_of("INFO core.py:58] Initializing a V1 LLM engine (v0.11.0) with config: model='x'") is None
    assert engine_of("INFO llm_engine.py:249] Initializing an LLM engine (v0.6.4.post1) with config: x") is None
    log = tmp_path / "v0.log"
    log.write_text("INFO 04-01 10:00:05 llm_engine.py:243] Initializing an LLM engine (v0.9.2) with config: "
                   "model='meta-llama/Llama-3.1-8B', tokenizer='meta-llama/Llama-3.1-8B', dtype=torch.bfloat16, "
                   "max_seq_len=8192, tensor_parallel_size=1, pipeline_parallel_size=1, kv_cache_dtype=auto, "
                   "enforce_eager=False, enable_prefix_caching=False\n")
    out = tmp_path / "run.toml"
    assert main(["from-vllm", str(log), "--hf-config", str(HF / "llama-3.1-8b"), "--gpu", "h100",
                 "-o", str(out)]) == 0
    text = out.read_text()
    assert "Initializing an LLM engine -> serving.engine_v1 = off" in text
    assert not load_serve_run(out).vllm_v1


def test_vllm_use_v1_in_the_launch_environment(tmp_path):
    out = tmp_path / "run.toml"
    cmd = "VLLM_USE_V1=0 vllm serve meta-llama/Llama-3.1-8B --max-model-len 8192"
    assert main(["from-vllm", cmd, "--hf-config", str(HF / "llama-3.1-8b"), "--engine-version", "0.9.2",
                 "-o", str(out)]) == 0
    assert "$VLLM_USE_V1 -> serving.engine_v1 = off" in out.read_text()
    assert not load_serve_run(out).vllm_v1
    # a release with one engine takes the variable as vLLM does: no choice
    assert main(["from-vllm", cmd.replace("=0", "=1"), "--hf-config", str(HF / "llama-3.1-8b"), "--engine-version",
                 "0.19.0", "-o", str(out), "--force"]) == 0
    assert "has that engine only" in out.read_text() and load_serve_run(out).serving.engine_v1 == "auto"


def test_v0_long_context_chunking_skips_mla_and_sliding_models():
    """_set_default_args_v0 (0.8.0 … 0.10.2): above 32K tokens chunked prefill is on unless the model is multimodal or
    MLA, slides, or decodes speculatively; 0.7.3's create_engine_config has the same exceptions but MLA."""
    from timeline.spec.engine_versions import vllm_scheduler_defaults as d

    assert d("0.8.2", 65536, 14.7, "t4", v1=False).enable_chunked_prefill
    assert not d("0.8.2", 65536, 14.7, "t4", v1=False, mla=True).enable_chunked_prefill
    assert d("0.7.3", 65536, 79.2, "h100", mla=True).enable_chunked_prefill
    assert not d("0.7.3", 65536, 79.2, "h100", sliding=True).enable_chunked_prefill
    unchunked = d("0.9.2", 65536, 14.7, "t4", v1=False, speculative=True)
    assert (unchunked.enable_chunked_prefill, unchunked.max_num_batched_tokens) == (False, 65536)
