"""``from-vllm`` / ``from-sglang`` on an engine's startup log (``timeline/io/serve_log.py``).

The log lines are written here in the form each engine prints them (vLLM's ``log_non_default_args``, its
API-server version line and memory lines; SGLang's ``server_args=ServerArgs(…)`` and its KV-cache line), with
made-up values.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from timeline.io.serve_command import read_command
from timeline.io.serve_log import _balanced, read_serve_log

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "tests/data/hf/llama-3.1-8b"
QWEN = ROOT / "tests/data/hf/qwen2.5-7b-instruct"

VLLM_LOG = """\
INFO 11-03 05:51:41 [__init__.py:216] Automatically detected platform cuda.
(APIServer pid=5385) INFO 11-03 05:51:44 [api_server.py:1839] vLLM API server version 0.11.0
(APIServer pid=5385) INFO 11-03 05:51:44 [utils.py:233] non-default args: {'model_tag': 'meta-llama/Llama-3.1-8B', \
'port': 8005, 'model': 'meta-llama/Llama-3.1-8B', 'dtype': 'bfloat16', 'max_model_len': 8192, 'served_model_name': \
['llama {x}'], 'tensor_parallel_size': 2, 'gpu_memory_utilization': 0.85, 'enable_prefix_caching': False, \
'lora_modules': [LoRAModulePath(name='a', path='b', base_model_name=None)]}
(EngineCore_DP0 pid=5600) INFO 11-03 05:52:10 [gpu_model_runner.py:2653] Model loading took 7.5110 GiB and 3.2 seconds
(EngineCore_DP0 pid=5600) INFO 11-03 05:52:20 [gpu_worker.py:298] Available KV cache memory: 60.12 GiB
(EngineCore_DP0 pid=5600) INFO 11-03 05:52:20 [kv_cache_utils.py:1087] GPU KV cache size: 985,000 tokens
"""

SGLANG_LOG = """\
[2026-02-18 03:19:27] INFO server_args.py:1830: Attention backend not specified. Use fa3 backend by default.
[2026-02-18 03:19:27] INFO engine.py:156: server_args=ServerArgs(model_path='Qwen/Qwen2.5-7B-Instruct', \
tokenizer_path='Qwen/Qwen2.5-7B-Instruct', load_format='auto', model_loader_extra_config='{}', context_length=None, \
host='127.0.0.1', port=30000, dtype='auto', quantization=None, kv_cache_dtype='auto', mem_fraction_static=0.835, \
max_running_requests=128, max_total_tokens=20480, chunked_prefill_size=8192, max_prefill_tokens=16384, \
schedule_policy='fcfs', page_size=1, tp_size=2, pp_size=1, dp_size=1, ep_size=1, attention_backend='fa3', \
hicache_ratio=2.0, cpu_offload_gb=0, cuda_graph_bs=[1, 2, 4, 8], disable_cuda_graph=False, enable_lora=None, \
mm_process_config={}, forward_hooks=None)
[2026-02-18 03:19:30 TP0] KV Cache is allocated. #tokens: 20480, K size: 0.12 GB, V size: 0.12 GB
"""


def test_a_dict_or_call_is_read_to_its_closing_bracket_quotes_respected() -> None:
    text = "x {'a': '}', 'b': [1, {'c': ')'}]} tail"
    assert _balanced(text, 2, "{", "}") == "{'a': '}', 'b': [1, {'c': ')'}]}"
    assert _balanced("{'a': 1", 0, "{", "}") is None  # a line cut off: nothing read


def test_vllms_non_default_args_are_its_command() -> None:
    log = read_serve_log(VLLM_LOG)
    assert log is not None and (log.engine, log.version, log.usage_context) == ("vllm", "0.11.0", "openai_api_server")
    assert log.fields["tensor_parallel_size"] == 2 and log.fields["served_model_name"] == ["llama {x}"]
    assert "model_tag" not in log.fields and "lora_modules" not in log.fields
    assert any("not read: lora_modules" in n for n in log.notes)
    assert any("Available KV cache memory: 60.12 GiB" in n for n in log.notes)
    cmd = read_command(VLLM_LOG, "vllm.log", "vllm")
    assert cmd.engine == "vllm" and cmd.version == "0.11.0"
    words = cmd.words
    assert words[words.index("--tensor-parallel-size") + 1] == "2" and "--no-enable-prefix-caching" in words
    # LLM(...) prints its non-default args too, without the server's model_tag, banner or process tag
    offline = read_serve_log("INFO 05-09 06:31:27 [utils.py:233] non-default args: {'dtype': 'bfloat16', "
                             "'max_model_len': 8192, 'model': 'meta-llama/Llama-3.1-8B'}\n")
    assert offline is not None and offline.usage_context == "llm_class" and offline.version is None
    # a server whose log has no version line but the banner (0.18 on), or only its args: still the server's
    banner = ("(APIServer pid=1) INFO 04-19 10:18:36 [utils.py:299]   █▄█▀ █     █     █     █  version 0.19.0\n"
              "(APIServer pid=1) INFO 04-19 10:18:36 [utils.py:233] non-default args: {'model_tag': 'm', 'model': "
              "'m', 'max_model_len': 8192}\n")
    served = read_serve_log(banner)
    assert served is not None and (served.version, served.usage_context) == ("0.19.0", "openai_api_server")
    tagged = read_serve_log("INFO [utils.py:233] non-default args: {'model_tag': 'm', 'max_model_len': 8192}\n")
    assert tagged is not None and tagged.usage_context == "openai_api_server" and tagged.fields["model"] == "m"


def _converted(tool: str, text: str, hf: Path, tmp_path: Path) -> tuple[dict, str, Path]:
    """``timeline from-vllm`` / ``from-sglang`` on a log holding ``text``: the run file (parsed), stderr, its path."""
    log = tmp_path / f"{tool}.log"
    log.write_text(text)
    out = tmp_path / "run.toml"
    done = subprocess.run([sys.executable, "-m", "timeline", tool, str(log), "--hf-config", str(hf), "--gpu", "h100",
                           "-o", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return tomllib.loads(out.read_text()), done.stderr, out


def test_from_vllm_writes_the_run_a_log_shows(tmp_path: Path) -> None:
    run, _, out = _converted("from-vllm", VLLM_LOG, LLAMA, tmp_path)
    assert run["parallel"]["tp"] == 2
    sv = run["serving"]
    assert (sv["engine_version"], sv["max_model_len"], sv["gpu_memory_utilization"]) == ("0.11.0", 8192, 0.85)
    assert sv["enable_prefix_caching"] is False
    assert "GPU KV cache size: 985,000 tokens" in out.read_text()
    assert "capacity_gib" not in run["hardware"]  # the log prints no device total: the preset's
    served = subprocess.run([sys.executable, "-m", "timeline", "serve", str(out), "-o", str(tmp_path / "s")],
                            capture_output=True, text=True, cwd=ROOT)
    assert served.returncode == 0, served.stderr


def test_sglangs_server_args_give_the_fields_the_rules_read(tmp_path: Path) -> None:
    """SGLang prints every field as its __post_init__ left them: the fields the rules read are taken as printed
    (mem_fraction_static as SGLang computed it); those of options not modelled are named, not refused, since the
    log cannot tell a default or SGLang's own choice from the user's."""
    log = read_serve_log(SGLANG_LOG)
    assert log is not None and log.engine == "sglang" and log.fields["mem_fraction_static"] == 0.835
    run, stderr, _ = _converted("from-sglang", SGLANG_LOG, QWEN, tmp_path)
    assert run["parallel"]["tp"] == 2
    sv = run["serving"]
    assert (sv["mem_fraction_static"], sv["max_total_tokens"], sv["max_num_seqs"]) == (0.835, 20480, 128)
    # attention_backend as SGLang chose it is named; cpu_offload_gb 0 offloads nothing, enable_lora None is off
    assert "the log does not say): attention_backend\n" in stderr


def test_a_text_without_an_engines_log_lines_is_read_as_a_command() -> None:
    assert read_serve_log("vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 4\n") is None
    cmd = read_command("vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 4\n", "cmd", "vllm")
    assert cmd.words[-1] == "4"


V0_LOG = """\
INFO 11-18 10:00:01 api_server.py:585] vLLM API server version 0.6.4.post1
INFO 11-18 10:00:05 llm_engine.py:249] Initializing an LLM engine (v0.6.4.post1) with config: \
model='meta-llama/Llama-3.1-8B-Instruct', speculative_config=None, tokenizer='meta-llama/Llama-3.1-8B-Instruct', \
tokenizer_mode=auto, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=20000, load_format=LoadFormat.AUTO, \
tensor_parallel_size=1, pipeline_parallel_size=1, disable_custom_all_reduce=False, quantization=None, \
enforce_eager=False, kv_cache_dtype=auto, device_config=cuda, decoding_config=DecodingConfig(\
guided_decoding_backend='outlines'), seed=0, served_model_name=meta-llama/Llama-3.1-8B-Instruct, \
num_scheduler_steps=1, chunked_prefill_enabled=False multi_step_stream_outputs=True, enable_prefix_caching=False, \
compilation_config=CompilationConfig(level=0, backend='', custom_ops=[], splitting_ops=['vllm.unified_attention'])
INFO 11-18 10:00:40 worker.py:232] Memory profiling results: total_gpu_memory=23.58GiB initial_memory_usage=15.20GiB \
peak_torch_memory=17.06GiB non_torch_memory=0.26GiB kv_cache_size=4.10GiB gpu_memory_utilization=0.93
INFO 11-18 10:00:40 gpu_executor.py:113] # GPU blocks: 2099, # CPU blocks: 2048
"""


def test_an_older_vllms_engine_config_line_gives_its_settled_values(tmp_path: Path) -> None:
    """Before 0.9 vLLM prints no 'non-default args': its config line (every value as the engine settled it; one
    comma missing in 0.6's, before multi_step_stream_outputs) and the profiling line's utilisation stand in."""
    log = read_serve_log(V0_LOG)
    assert log is not None and log.complete and log.version == "0.6.4.post1"
    f = log.fields
    assert (f["max_model_len"], f["dtype"], f["load_format"], f["enable_chunked_prefill"]) == (20000, "bfloat16",
                                                                                                "auto", False)
    assert f["gpu_memory_utilization"] == 0.93 and f["multi_step_stream_outputs"] is True
    assert any("not read: decoding_config, compilation_config" in n for n in log.notes)
    run, _, _ = _converted("from-vllm", V0_LOG, LLAMA, tmp_path)
    assert run["hardware"]["capacity_gib"] == 23.58  # the profiling line's total_gpu_memory
    sv = run["serving"]
    assert (sv["engine_version"], sv["max_model_len"], sv["gpu_memory_utilization"]) == ("0.6.4.post1", 20000, 0.93)
    assert "enable_chunked_prefill" not in sv and "enable_prefix_caching" not in sv  # 0.6.4's False: its defaults


def test_a_v1_logs_device_total_is_the_capacity() -> None:
    line = ("(EngineCore_DP0 pid=1) INFO 03-01 10:00:00 [gpu_worker.py:212] Free memory on device cuda:0 "
            "(79.12/94.97 GiB) on startup. Desired GPU memory utilization is (0.9, 85.47 GiB).\n")
    log = read_serve_log(VLLM_LOG + line)
    assert log is not None and log.capacity_gib == 94.97
    assert read_serve_log(VLLM_LOG).capacity_gib is None  # type: ignore[union-attr]


def test_compare_prints_the_engines_own_numbers_beside_the_budget(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(VLLM_LOG)
    out = tmp_path / "run.toml"
    done = subprocess.run([sys.executable, "-m", "timeline", "from-vllm", str(log), "--hf-config", str(LLAMA),
                           "--gpu", "h100", "-o", str(out), "--compare"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    rows = {line.split("  ")[0].strip(): line for line in done.stdout.splitlines()[1:] if line.strip()}
    assert set(rows) >= {"weights GiB", "KV pool GiB", "KV tokens"}
    assert "7.51" in rows["weights GiB"] and "60.12" in rows["KV pool GiB"] and "985,000" in rows["KV tokens"]
    served = subprocess.run([sys.executable, "-m", "timeline", "serve", str(out), "-o", str(tmp_path / "s")],
                            capture_output=True, text=True, cwd=ROOT)
    pool = re.search(r"KV pool ([\d.]+) \(([\d,]+) blocks of (\d+) tokens", " ".join(served.stdout.split()))
    assert pool is not None
    assert f"{float(pool[1]):>12,.2f}" in rows["KV pool GiB"]
    assert f"{int(pool[2].replace(',', '')) * int(pool[3]):>12,.0f}" in rows["KV tokens"]
    plain = tmp_path / "cmd.sh"
    plain.write_text("vllm serve meta-llama/Llama-3.1-8B -tp 2\n")
    refused = subprocess.run([sys.executable, "-m", "timeline", "from-vllm", str(plain), "--hf-config", str(LLAMA),
                              "--compare"], capture_output=True, text=True, cwd=ROOT)
    assert refused.returncode == 2 and "--compare" in refused.stderr
