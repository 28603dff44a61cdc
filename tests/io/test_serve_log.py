"""``from-vllm`` / ``from-sglang`` on an engine's startup log (``timeline/io/serve_log.py``).

The log lines are written here in the form each engine prints them (vLLM's ``log_non_default_args``, its
API-server version line and memory lines; SGLang's ``server_args=ServerArgs(…)`` and its KV-cache line), with
made-up values.
"""

from __future__ import annotations

import json
import lzma
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from timeline.io.serve_command import read_command
from timeline.io.serve_log import LOG_SITES, _balanced, infer_vllm_version, read_serve_log, vllm_site_releases

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
    assert offline is not None and offline.usage_context == "llm_class"
    # no version line: its logger site dates it (utils.py:233 logs 'non-default args' at 0.11.0 and 0.18.0 … 0.20.2)
    assert offline.version == "0.20.2" and any("0.11.0, 0.18.0 … 0.20.2; read as 0.20.2" in n for n in offline.notes)
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


# --- a log that prints no version: dated by its logger sites (timeline/io/vllm_log_sites.json.xz) ---------------
SERVING_LOGS = ROOT / "tests/data/serving_logs.json"
#: a release as a record states it (a local build tag allowed: ``0.21.0+cu129``)
RELEASE = re.compile(r"(\d+\.\d+\.\d+(?:\.post\d+)?)(?:\+\S+)?")
#: a build of vLLM's main branch: ``X.Y.Zrc1.devN+g<commit>``, N commits after the tag before X.Y.Z
DEV_BUILD = re.compile(r"(\d+)\.(\d+)\.(\d+)rc\d+\.dev\d+(?:\+\S+)?")
SITE = re.compile(r"\[?[\w./-]+\.py:\d+\]")


def _release_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version))


def _dev_window(version: str, releases: list[str]) -> set[str]:
    """The releases around a main-branch build ``X.Y.Zrc1.devN``: from the last release before X.Y.Z to the next
    minor release X.(Y+1).0, the next one cut from main (a patch release X.Y.Z comes from its release branch, so
    main's code after the tag can be any of them)."""
    m = DEV_BUILD.fullmatch(version)
    assert m is not None
    x, y, z = (int(g) for g in m.groups())
    before = [r for r in releases if _release_key(r)[:3] < (x, y, z)]
    return {r for r in releases if _release_key(before[-1]) <= _release_key(r) <= (x, y + 1, 0)}


def test_a_calibration_logs_sites_contain_the_version_it_states() -> None:
    """Every calibration record that states its vLLM version and transcribes lines with a ``[file.py:N]`` site:
    the releases its sites point to hold that version. A build of main (``0.20.2rc1.dev9+g01d4d1ad3``) is no
    release: the releases read must meet the window around it (:func:`_dev_window`), or be none where no line of
    it sits at any release's site (its lines moved after the last release, before the next)."""
    releases = json.loads(lzma.decompress(LOG_SITES.read_bytes()))["releases"]
    checked, dated_dev = [], 0
    for rec in json.loads(SERVING_LOGS.read_text())["records"]:
        lines, version = rec.get("lines") or [], rec.get("engine_version")
        if rec["side"] != "calibration" or rec["engine"] != "vllm" or not version:
            continue
        if not any(SITE.search(line) for line in lines):
            continue
        found = vllm_site_releases("\n".join(lines))
        if (m := RELEASE.fullmatch(version)) is not None:
            assert found is not None and m.group(1) in found.releases, (rec["id"], version, found)
        else:
            window = _dev_window(version, releases)
            assert found is None or window & set(found.releases), (rec["id"], version, window, found)
            dated_dev += found is not None
        checked.append(rec["id"])
    assert len(checked) >= 8 and dated_dev >= 2, checked


def test_a_log_without_its_version_line_is_read_as_its_sites_release() -> None:
    """The logs above, their version lines left out: their sites are those of the version they printed (VLLM_LOG's
    0.11.0 alone; V0_LOG's 0.6.4 and 0.6.4.post1, whose sites are the same), the newest read; a note says so."""
    for text, printed in ((VLLM_LOG, "0.11.0"), (V0_LOG, "0.6.4.post1")):
        unversioned = "\n".join(line for line in text.splitlines() if "version" not in line and "(v0" not in line)
        version, note = infer_vllm_version(unversioned)
        assert version == printed and note is not None and note.startswith("vLLM version not printed: the logger sites [")
    log = read_serve_log("(APIServer pid=1) INFO 06-01 09:47:57 [utils.py:278] non-default args: {'model_tag': 'm', "
                         "'model': 'm', 'max_model_len': 8192}\n"
                         "(EngineCore pid=128) INFO 06-01 09:47:57 [kv_cache_utils.py:1733] GPU KV cache size: 622,408 "
                         "tokens\n")
    assert log is not None and log.version == "0.22.1"
    assert ("vLLM version not printed: the logger sites [utils.py:278], [kv_cache_utils.py:1733] are those of vLLM "
            "0.22.0 … 0.22.1; read as 0.22.1") in log.notes


def test_a_printed_version_is_not_overridden_by_the_sites() -> None:
    sites_of_0_22 = "(EngineCore pid=1) INFO 06-01 09:47:57 [kv_cache_utils.py:1733] GPU KV cache size: 1 tokens\n"
    log = read_serve_log(VLLM_LOG + sites_of_0_22)
    assert log is not None and log.version == "0.11.0"
    assert not any("not printed" in n for n in log.notes)


def test_lines_at_no_releases_site_are_left_out() -> None:
    """A site no release has (a plugin's logger, another package's, a line past the file's end) is left out, so is a
    message no release logs at that site, and a message's further lines (the same header repeated): none of
    them narrows the releases read; a log with only such lines is not dated."""
    line = "(EngineCore pid=1) INFO 06-01 09:47:57 [kv_cache_utils.py:1733] GPU KV cache size: 1 tokens\n"
    alone = vllm_site_releases(line)
    assert alone is not None and alone.releases == ["0.22.0", "0.22.1"] and alone.lines == 1
    noise = ("(APIServer pid=1) INFO 06-01 09:47:50 [my_vllm_plugin.py:12] Loaded the plugin\n"
             "(EngineCore pid=1) INFO 06-01 09:47:57 [kv_cache_utils.py:99999] GPU KV cache size: 2 tokens\n"
             "(EngineCore pid=1) INFO 06-01 09:47:58 [kv_cache_utils.py:1733] a message logged at no release's site\n")
    continued = line + line.replace("GPU KV cache size: 1 tokens", "the message's second line")
    for text in (noise + line, continued):
        found = vllm_site_releases(text)
        assert found is not None and found.releases == alone.releases and found.lines == 1
    assert vllm_site_releases(noise) is None and infer_vllm_version(noise) == (None, None)


def test_a_site_is_read_in_each_of_vllms_record_formats() -> None:
    """``file.py:N]`` before 0.8.0, ``[file.py:N]`` after, a shortened path at DEBUG level (0.10.2 on), the
    colour codes of vLLM's ColoredFormatter: the same site."""
    forms = ("INFO 06-01 09:47:57 kv_cache_utils.py:1733] GPU KV cache size: 1 tokens",
             "DEBUG 06-01 09:47:57 [v1/core/kv_cache_utils.py:1733] GPU KV cache size: 1 tokens",
             "\x1b[32mINFO\x1b[0m 06-01 09:47:57 \x1b[90m[kv_cache_utils.py:1733]\x1b[0m GPU KV cache size: 1 tokens")
    for text in forms:
        found = vllm_site_releases(text)
        assert found is not None and found.releases == ["0.22.0", "0.22.1"], text


def test_sites_of_no_one_release_are_read_as_the_releases_having_the_most() -> None:
    """0.22's GPU KV cache line beside 0.24's available-memory and KV-cache lines: no release has all three; 0.24.0
    has two of them, and the note says the sites disagree."""
    text = ("[kv_cache_utils.py:1733] GPU KV cache size: 1 tokens\n"
            "[gpu_worker.py:508] Available KV cache memory: 1.00 GiB\n"
            "[kv_cache_utils.py:2146] GPU KV cache size: 2 tokens\n")
    found = vllm_site_releases(text)
    assert found is not None and found.most == 2 and found.lines == 3 and "0.24.0" in found.releases
    version, note = infer_vllm_version(text)
    assert version == found.releases[-1] and note is not None
    assert f"are not all of any one release: vLLM {version} has the most (2 of 3 lines)" in note


def test_the_site_table_names_every_release_and_wheel_read() -> None:
    """The table (``tools/vllm_log_sites.py``): every final release from 0.4.0 in order, the wheel each was read
    from with its sha256, and small enough to ship (≤ 400 KB)."""
    assert LOG_SITES.stat().st_size <= 400_000
    data = json.loads(lzma.decompress(LOG_SITES.read_bytes()))
    releases = data["releases"]
    assert releases[0] == "0.4.0" and releases == sorted(releases, key=_release_key)
    assert not any(re.search(r"rc|dev|a\d|b\d", r) for r in releases)
    files = data["about"]["files"]
    assert [f["release"] for f in files] == releases
    assert all(re.fullmatch(r"[0-9a-f]{64}", f["sha256"]) and f["file"].endswith(".whl") for f in files)


def test_the_tables_line_rule_holds_on_this_interpreter() -> None:
    """The line a record carries for a call written over several lines, and for vLLM's two ``*_once`` shapes, is
    the one the table was built with (``tools/vllm_log_sites.py: call_lines``), run here."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from vllm_log_sites import check_lineno_rule
    finally:
        sys.path.remove(str(ROOT / "tools"))
    assert check_lineno_rule().startswith("Python ")
