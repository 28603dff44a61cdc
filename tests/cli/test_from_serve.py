"""``timeline from-vllm`` / ``from-sglang``: a serving engine's launch command read into a run file that
``timeline serve`` runs as it stands; every option mapped, neutral or refused in one line; the model's config.json
found where the engine would find it; bad input one ``error:`` line, exit 2, nothing written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from timeline.cli import main
from timeline.io.serve_command import _forms, human_int, options
from timeline.io.serve_runfile import load_serve_run
from timeline.spec.engine_versions import VLLM_DEFAULT

HF = Path(__file__).resolve().parents[1] / "data" / "hf"


def test_a_vllm_serve_command_becomes_a_run_file_that_serves(tmp_path, capsys):
    out = tmp_path / "run.toml"
    cmd = ("vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 2 --gpu-memory-utilization 0.85 "
           "--max-model-len 32k --max-num-seqs 128 --enable-prefix-caching --kv-cache-dtype fp8 --port 8000 "
           "--served-model-name llama")
    assert main(["from-vllm", cmd, "--hf-config", str(HF / "llama-3.1-8b"), "--engine-version", "0.10.1",
                 "-o", str(out)]) == 0
    text = out.read_text()
    assert "#   --max-model-len -> serving.max_model_len" in text and "#   --port (the HTTP frontend" in text
    run = load_serve_run(out)
    sv = run.serving
    assert run.parallel.tp == 2 and sv.engine == "vllm" and sv.engine_version == "0.10.1"
    assert (sv.gpu_memory_utilization, sv.max_model_len, sv.max_num_seqs) == (0.85, 32000, 128)
    assert sv.kv_cache_dtype == "fp8" and sv.enable_prefix_caching is True
    assert main(["serve", str(out), "-o", str(tmp_path / "served"), "--format", "summary"]) == 0


def test_a_docker_command_gives_the_engine_version_and_a_script_is_read_as_bash(tmp_path, capsys):
    script = tmp_path / "serve.sh"
    script.write_text("#!/bin/bash\nMODEL=${MODEL:-Qwen/Qwen3-8B}\nTP=2\n"
                      "docker run --gpus all -p 8000:8000 --ipc=host vllm/vllm-openai:v0.10.1.1 \\\n"
                      "    --model $MODEL --tensor-parallel-size $TP \\\n    --max-num-batched-tokens 16384\n")
    assert main(["from-vllm", str(script), "--hf-config", str(HF / "qwen3-8b" / "config.json")]) == 0
    out = capsys.readouterr().out
    assert 'engine_version = "0.10.1.1"' in out and "\ntp = 2\n" in out and "max_num_batched_tokens = 16384" in out


def test_sglang_launch_server(tmp_path, capsys):
    cmd = ("python3 -m sglang.launch_server --model-path Qwen/Qwen3-8B --tp 2 --mem-fraction-static 0.8 "
           "--context-length 16384 --host 0.0.0.0 --port 30000")
    out = tmp_path / "run.toml"
    assert main(["from-sglang", cmd, "--hf-config", str(HF / "qwen3-8b"), "--engine-version", "0.5.5",
                 "-o", str(out)]) == 0
    run = load_serve_run(out)
    assert run.serving.engine == "sglang" and run.serving.mem_fraction_static == 0.8
    assert run.parallel.tp == 2 and run.serving.max_model_len == 16384


def test_sglang_without_chunked_prefill(tmp_path, capsys):
    """--chunked-prefill-size -1: chunked prefill off, a prefill batch of --max-prefill-tokens (16,384 by default),
    which the default mem_fraction_static reserves for; a prefill budget below the chunk is refused by name."""
    out = tmp_path / "run.toml"
    base = "python -m sglang.launch_server --model-path Qwen/Qwen3-8B --chunked-prefill-size -1"
    cfg = ["--hf-config", str(HF / "qwen3-8b"), "--gpu", "h100", "--engine-version", "0.5.12", "-o", str(out)]
    assert main(["from-sglang", base, *cfg]) == 0
    run = load_serve_run(out)
    assert not run.serving.enable_chunked_prefill and run.serving.max_num_batched_tokens == 16384
    # 512 + 16,384·1.5 + 256·2 + 128 MiB (no prefill graphs: their largest size is the chunk, -1)
    assert run.serving.mem_fraction_static == round((81_559 - 25_728) / 81_559, 3)
    assert main(["from-sglang", base + " --max-prefill-tokens 32768", *cfg, "--force"]) == 0
    assert load_serve_run(out).serving.max_num_batched_tokens == 32768
    # with chunked prefill on, a budget of at least the chunk changes nothing; a smaller one is refused by name
    chunked = "python -m sglang.launch_server --model-path Qwen/Qwen3-8B --max-prefill-tokens"
    assert main(["from-sglang", chunked + " 8192", *cfg, "--force"]) == 0  # H100: the chunk is 8,192
    assert load_serve_run(out).serving.max_num_batched_tokens == 8192
    assert main(["from-sglang", chunked + " 4096", *cfg, "--force"]) == 2
    assert "serving.max_prefill_tokens: 4096 is below the chunked prefill size 8192" in capsys.readouterr().err
    small = [*cfg[:2], "--gpu", "rtx4090", *cfg[4:]]  # its chunk is 2,048 at 0.5.12
    assert main(["from-sglang", chunked + " 4096", *small, "--force"]) == 0


@pytest.mark.parametrize(("option", "version", "state"), [
    ("--enable-piecewise-cuda-graph", "0.5.7", "on"),
    ("--disable-piecewise-cuda-graph", "0.5.12", "off"),
    ("--disable-piecewise-cuda-graph", "0.5.16", "off"),  # folded into --cuda-graph-backend-prefill there
    ("--disable-prefill-cuda-graph", "0.5.20", "off"),
    ("--cuda-graph-backend-prefill disabled", "0.5.23", "off"),
])
def test_sglang_prefill_graph_options(tmp_path, option, version, state):
    """Each release's way of turning SGLang's prefill CUDA graphs on or off reaches serving.prefill_cuda_graph, as
    that release's parser names it (the option's form at the version given)."""
    out = tmp_path / "run.toml"
    cmd = f"python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B {option}"
    assert main(["from-sglang", cmd, "--hf-config", str(HF / "llama-3.1-8b"), "--gpu", "h100", "--engine-version",
                 version, "-o", str(out)]) == 0
    assert load_serve_run(out).serving.prefill_cuda_graph == state


def test_sglang_attn_dp_size_is_dp_attention(tmp_path, capsys):
    """0.5.22's --attn-dp-size N is --enable-dp-attention --dp-size N (handle_deprecated_dp_attention rewrites the
    old spelling to it): the same run file; replicas of such an engine (--dp-size beside it) are refused."""
    dsv3 = ["--hf-config", str(HF / "deepseek-v3"), "--gpu", "h200", "--engine-version", "0.5.23"]
    base = "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 8"
    new, old = tmp_path / "new.toml", tmp_path / "old.toml"
    assert main(["from-sglang", f"{base} --attn-dp-size 8", *dsv3, "-o", str(new)]) == 0
    assert main(["from-sglang", f"{base} --enable-dp-attention --dp-size 8", *dsv3, "-o", str(old)]) == 0
    a, b = load_serve_run(new), load_serve_run(old)
    assert a.serving.enable_dp_attention and a.parallel.dp == 8
    assert (a.serving, a.parallel) == (b.serving, b.parallel)
    assert main(["from-sglang", f"{base} --attn-dp-size 8 --dp-size 2", *dsv3]) == 2
    assert "data-parallel replicas of an attention-DP engine are not modelled" in capsys.readouterr().err


def test_sglang_prefill_backend_by_hand_is_refused(tmp_path, capsys):
    cmd = "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B --cuda-graph-backend-prefill full"
    assert main(["from-sglang", cmd, "--hf-config", str(HF / "llama-3.1-8b"), "--engine-version", "0.5.23"]) == 2
    assert "--cuda-graph-backend-prefill full: a prefill CUDA-graph backend chosen by hand" in capsys.readouterr().err


def test_bad_commands_are_one_line(tmp_path, capsys):
    cfg = ["--hf-config", str(HF / "llama-3.1-8b")]
    assert main(["from-vllm", "vllm serve m --tensor-paralel-size 2", *cfg]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --tensor-paralel-size (did you mean --tensor-parallel-size") and "\n" not in err
    assert main(["from-vllm", "vllm serve m --cpu-offload-gb 4", *cfg]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --cpu-offload-gb: weights kept in host memory and streamed in are not modelled; --ignore-arg "
        "cpu-offload-gb passes over it (its memory not modelled)")
    assert main(["from-vllm", "vllm serve m --cpu-offload-gb 4", "--ignore-arg", "cpu-offload-gb", *cfg]) == 0
    assert "#   --cpu-offload-gb" in capsys.readouterr().out
    assert main(["from-vllm", "vllm serve org/not-cached -tp 2"]) == 2
    assert "org/not-cached: its config.json is not on this machine" in capsys.readouterr().err
    assert main(["from-vllm", "echo hello world"]) == 2
    assert "no serving command found" in capsys.readouterr().err
    out = tmp_path / "x.toml"
    assert main(["from-vllm", "vllm serve m --max-model-len 12.5", *cfg, "-o", str(out)]) == 2
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_the_model_is_found_in_the_hugging_face_cache(tmp_path, capsys, monkeypatch):
    snap = tmp_path / "hub" / "models--meta-llama--Llama-3.1-8B" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    shutil.copy(HF / "llama-3.1-8b" / "config.json", snap / "config.json")
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["from-vllm", "vllm serve meta-llama/Llama-3.1-8B"]) == 0
    captured = capsys.readouterr()
    assert str(snap / "config.json") in captured.out or "abc123/config.json" in captured.out
    assert f"note: the command does not say which vllm ran it: read as vllm {VLLM_DEFAULT}" in captured.err


def test_vllm_reads_human_readable_integers_as_vllm_does():
    assert [human_int("--max-model-len", x) for x in ("32768", "32k", "32K", "25.6k", "1m", "1M")] == [
        32768, 32000, 32768, 25600, 1_000_000, 1024 ** 2]


def test_the_option_tables_cover_what_the_mapping_reads():
    from timeline.io.serve_command import SGLANG_MAPPED, VLLM_MAPPED

    for engine, mapped in (("vllm", VLLM_MAPPED), ("sglang", SGLANG_MAPPED)):
        dests = {form["dest"] for forms in _forms(engine).values() for _, _, form in forms}  # any version's
        assert set(mapped) - {"model"} <= dests, (engine, set(mapped) - dests)
    assert options("vllm")["-tp"]["dest"] == "tensor_parallel_size"
    assert options("vllm")["--no-enable-prefix-caching"]["negates"] is True


def test_without_chunked_prefill_the_batch_budget_covers_a_whole_prompt(tmp_path):
    """engine/arg_utils.py: V1's default max_num_batched_tokens without chunked prefill is max_model_len (0.9/0.10),
    max(max_model_len, the default) from 0.11; the scheduler then accepts the run (verify_max_model_len)."""
    from timeline.spec.engine_versions import vllm_scheduler_defaults

    # V1 before 0.11.1 turns chunked prefill on for a generative model whatever the user gave (_set_default_args)
    for version in ("0.9.2", "0.10.1", "0.11.0"):
        d = vllm_scheduler_defaults(version, 32000, 79.19, "h100", False)
        assert (d.enable_chunked_prefill, d.max_num_batched_tokens) == (True, 8192)
    # from 0.11.1 the flag holds, and the budget covers max_model_len: max(max_model_len, the default)
    assert vllm_scheduler_defaults("0.11.1", 1024, 79.19, "h100", False).max_num_batched_tokens == 8192
    assert vllm_scheduler_defaults("0.11.2", 32000, 79.19, "h100", False).max_num_batched_tokens == 32000
    assert vllm_scheduler_defaults("0.11.2", 32000, 79.19, "h100", None).max_num_batched_tokens == 8192
    out = tmp_path / "run.toml"
    assert main(["from-vllm", "vllm serve m --max-model-len 32k --no-enable-chunked-prefill -O3", "--hf-config",
                 str(HF / "llama-3.1-8b"), "--engine-version", "0.11.2", "-o", str(out)]) == 0
    run = load_serve_run(out)
    assert (run.serving.enable_chunked_prefill, run.serving.max_num_batched_tokens) == (False, 32000)
    assert "#   -O -> (an optimization level: no memory of its own here)" in out.read_text()
    out.unlink()
    assert main(["from-vllm", "vllm serve m --max-model-len 32k --no-enable-chunked-prefill", "--hf-config",
                 str(HF / "llama-3.1-8b"), "--engine-version", "0.10.1", "-o", str(out)]) == 0
    run = load_serve_run(out)
    assert (run.serving.enable_chunked_prefill, run.serving.max_num_batched_tokens) == (True, 8192)
    assert any("runs chunked prefill whatever enable_chunked_prefill says" in n for n in run.notes)


def test_forms_users_write_as_the_engines_read_them(tmp_path, capsys):
    """From 36 public launch commands: any image tag, argparse's abbreviations, vLLM's dotted JSON keys and
    underscores (not SGLang's), options of other engine versions, `sglang serve`, DP attention's implied dp, an
    unset $MODEL, a context shorter than the default load."""
    llama, dsv3, qwen = (["--hf-config", str(HF / n)] for n in ("llama-3.1-8b", "deepseek-v3", "qwen3-8b"))
    assert main(["from-vllm", "docker run --gpus all vllm/vllm-openai:latest --model m/x --gpu-memory-util=0.7 "
                 "--compilation-config.cudagraph_mode FULL_DECODE_ONLY --max_num_seqs 64 --enable-reasoning",
                 *llama]) == 0
    out = capsys.readouterr().out
    assert "gpu_memory_utilization = 0.7" in out and 'cudagraph_mode = "full_decode_only"' in out
    assert "max_num_seqs = 64" in out and "#   --enable-reasoning (a reasoning parser" in out
    assert main(["from-vllm", "docker run --rm --entrypoint vllm vllm/vllm-openai:v0.10.1.1 serve m -tp 2",
                 *llama]) == 0
    assert 'engine_version = "0.10.1.1"' in capsys.readouterr().out
    assert main(["from-vllm", "vllm serve m \\\n  --max-num-seqs 16 \\\n  --port 8000\n", *llama]) == 0  # pasted
    assert "max_num_seqs = 16" in capsys.readouterr().out
    assert main(["from-vllm", "vllm serve m --num-speculative-tokens 3", *llama]) == 2
    assert capsys.readouterr().err.startswith("error: --num-speculative-tokens: speculative decoding's draft")
    assert main(["from-vllm", "vllm serve m --max-num-seqs --port 8000", *llama]) == 2
    assert capsys.readouterr().err.strip() == "error: --max-num-seqs is given without a value"
    sglang = ("python3 -m sglang.launch_server --model-path m --enable-dp-attention --tp 8 --cuda-graph-max-bs 128 "
              "--enable-ep-moe --mem-frac 0.8")
    assert main(["from-sglang", sglang, *dsv3, "--gpu", "h200", "--engine-version", "0.4.9"]) == 0
    out = capsys.readouterr().out
    assert "\ntp = 8\ndp = 8\nep = 8\n" in out and "mem_fraction_static = 0.8" in out
    assert main(["from-sglang", "sglang serve --model-path m --tp 2", *qwen]) == 0
    assert 'engine = "sglang"' in capsys.readouterr().out
    assert main(["from-sglang", "sglang serve --model-path m --mem_fraction_static 0.8", *qwen]) == 2
    assert "--mem_fraction_static (did you mean --mem-fraction-static?)" in capsys.readouterr().err
    out_file = tmp_path / "m.toml"
    assert main(["from-vllm", "vllm serve $MODEL --max-model-len 1024", *qwen, "-o", str(out_file)]) == 0
    run = load_serve_run(out_file)
    assert run.name == "qwen3-8b" and run.load is not None
    assert run.load.prompt_tokens.value + run.load.output_tokens.value == 1024
    script = tmp_path / "serve.sh"
    script.write_text('case "$ENGINE" in\n  vllm) vllm serve m --max-num-seqs 32 ;;\n'
                      '  sglang) python -m sglang.launch_server --model-path m ;;\nesac\n')
    assert main(["from-vllm", str(script), "--script-env", "ENGINE=vllm", *qwen]) == 0
    assert "max_num_seqs = 32" in capsys.readouterr().out


def test_a_quantized_checkpoint_serves_without_the_training_readers_note():
    run = load_serve_run(Path(__file__).resolve().parents[2] / "schedules" / "gpt-oss-20b-h100-serve.toml")
    assert run.quant is not None and run.quant.method == "mxfp4"
    assert not any("training memory" in n for n in run.notes), run.notes


def test_options_are_checked_against_the_version_that_ran(tmp_path, capsys):
    """The option tables hold 18 vLLM and 27 SGLang versions' parsers (``present``): an option of other versions
    than the one given is named with the versions that have it; unknown to every version, it is a typo."""
    from timeline.io.serve_command import presence, versions

    assert versions("vllm")[0] == "0.2.7" and len(versions("vllm")) == 18 and len(versions("sglang")) == 27
    assert presence("vllm", "--enable-reasoning") == "0.7.3 … 0.9.2"
    assert presence("vllm", "--tensor-parallel-size") == "0.2.7 … 0.34.0"
    qwen = ["--hf-config", str(HF / "qwen3-8b")]
    assert main(["from-vllm", "vllm serve m --enable-reasoning", *qwen, "--engine-version", "0.11.0"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --enable-reasoning is an option of vllm 0.7.3 … 0.9.2 — not of vllm 0.11.0 (give the version the "
        "command ran with --engine-version, or drop it)")
    assert main(["from-vllm", "vllm serve m --enable-reasoning --use-v2-block-manager", *qwen,
                 "--engine-version", "0.8.5"]) == 0
    assert "#   --use-v2-block-manager (the V0 block manager's" in capsys.readouterr().out
    # SGLang's --tp-size is dest tensor_parallel_size before 0.5.23, renamed by ServerArgs.from_cli_args
    assert main(["from-sglang", "python -m sglang.launch_server --model-path m --tp-size 4 --dp-size 2", *qwen,
                 "--engine-version", "0.4.9"]) == 0
    assert "\ntp = 4\ndp = 2\n" in capsys.readouterr().out


def test_kv_pool_sizes_given_by_hand_are_mapped(tmp_path, capsys):
    cfg = ["--hf-config", str(HF / "llama-3.1-8b"), "--gpu", "h100"]
    assert main(["from-vllm", "vllm serve m --num-gpu-blocks-override 2000 --kv-cache-memory-bytes 20G", *cfg,
                 "--engine-version", "0.11.0"]) == 0
    out = capsys.readouterr().out
    # --kv-cache-memory-bytes is vLLM's human_readable_int: 20G = 20 GiB
    assert "num_gpu_blocks_override = 2000" in out and f"kv_cache_memory_bytes = {20 << 30}" in out
    assert "#   --num-gpu-blocks-override -> serving.num_gpu_blocks_override" in out
    assert main(["from-vllm", "vllm serve m --kv-cache-memory-bytes 20G", *cfg, "--engine-version", "0.10.1.1"]) == 2
    assert "--kv-cache-memory-bytes is an option of vllm 0.10.2" in capsys.readouterr().err
    out_file = tmp_path / "sg.toml"
    assert main(["from-sglang", "python -m sglang.launch_server --model-path m --max-total-tokens 50000", *cfg,
                 "--engine-version", "0.5.5", "-o", str(out_file)]) == 0
    assert load_serve_run(out_file).serving.max_total_tokens == 50000


def test_every_option_of_every_engine_version_is_classified():
    """No option of the 18 vLLM and 10 SGLang parsers is refused for want of an entry: each is mapped, neutral or
    refused with what it does, read in the engine's source (``serve_option_classes.json`` names file and version)."""
    from timeline.io.serve_command import NEUTRAL, REFUSED, SGLANG_MAPPED, VLLM_MAPPED, option_classes

    for engine, mapped in (("vllm", VLLM_MAPPED), ("sglang", SGLANG_MAPPED)):
        read = option_classes(engine)
        for dest in {o["dest"] for o in options(engine).values()}:
            assert dest in mapped or dest in NEUTRAL or dest in REFUSED or dest in read, (engine, dest)
        for dest, entry in read.items():
            assert entry["class"] in ("neutral", "refused") and entry["why"] and entry["source"], (engine, dest)
            assert dest not in mapped and dest not in NEUTRAL and dest not in REFUSED, (engine, dest)


def test_options_read_from_source_are_neutral_or_refused_with_why(tmp_path, capsys):
    cfg = ["--hf-config", str(HF / "llama-3.1-8b"), "--engine-version", "0.30.0"]
    assert main(["from-vllm", "vllm serve m --disable-access-log-for-endpoints /health --numa-bind", *cfg]) == 0
    assert "#   --disable-access-log-for-endpoints (paths left out of uvicorn's access log" in capsys.readouterr().out
    assert main(["from-vllm", "vllm serve m --max-loras 4", *cfg]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --max-loras: ") and "LoRA" in err and "--ignore-arg max-loras" in err


def test_a_config_file_of_options_is_read_and_the_command_line_wins(tmp_path, capsys):
    folder = tmp_path / "deploy"
    folder.mkdir()
    (folder / "cfg.yaml").write_text("tensor-parallel-size: 2\nmax-model-len: 16384\nenable-prefix-caching: false\n"
                                     "gpu-memory-utilization: 0.85\nserved-model-name: [a, b]\n")
    script = folder / "serve.sh"
    script.write_text("vllm serve meta-llama/Llama-3.1-8B --config cfg.yaml --max-model-len 8192\n")
    out = tmp_path / "run.toml"
    assert main(["from-vllm", str(script), "--hf-config", str(HF / "llama-3.1-8b"), "--engine-version", "0.11.0",
                 "-o", str(out)]) == 0
    run = load_serve_run(out)
    # the YAML beside the script; the command line's 8192 over the file's 16384; `false` adds nothing (vLLM's
    # load_config_file), so V1's default prefix caching stays on
    assert run.parallel.tp == 2 and run.serving.max_model_len == 8192 and run.serving.gpu_memory_utilization == 0.85
    assert run.serving.enable_prefix_caching is True and "read --config" in out.read_text()
    assert main(["from-vllm", "vllm serve m --config nowhere.yaml", "--hf-config", str(HF / "llama-3.1-8b")]) == 2
    assert "--config nowhere.yaml: no such file" in capsys.readouterr().err


def test_sglang_expert_parallelism_below_tp_splits_each_expert_over_the_rest(tmp_path, capsys):
    """SGLang (srt/distributed/parallel_state.py: initialize_model_parallel): moe_tp_size = tp_size // ep_size —
    --tp 8 --ep-size 2 holds half the experts per rank, each split over 4: the same expert bytes as ep 1 or 8."""
    from timeline.serve.budget import compute_budget
    from timeline.serve.graph_view import expert_tp

    weights = {}
    for ep in (1, 2, 8):
        out = tmp_path / f"ep{ep}.toml"
        cmd = ("python3 -m sglang.launch_server --model-path Qwen/Qwen3-30B-A3B --tp 8"
               + (f" --ep-size {ep}" if ep > 1 else "") + " --mem-fraction-static 0.85")
        assert main(["from-sglang", cmd, "--hf-config", str(HF / "qwen3-30b-a3b"), "--engine-version", "0.5.16",
                     "--gpu", "h200", "-o", str(out)]) == 0
        run = load_serve_run(out)
        assert run.parallel.ep == ep and expert_tp(run) == 8 // ep
        weights[ep] = compute_budget(run).weights_bytes
    assert weights[1] == weights[2] == weights[8]
    bad = "python3 -m sglang.launch_server --model-path Qwen/Qwen3-30B-A3B --tp 8 --ep-size 3"
    assert main(["from-sglang", bad, "--hf-config", str(HF / "qwen3-30b-a3b"), "--engine-version", "0.5.16",
                 "--gpu", "h200"]) == 2
    assert "does not divide tp = 8" in capsys.readouterr().err


@pytest.mark.parametrize(("version", "extra", "refused"), [
    ("0.11.2", "-pp 2", "pipeline parallelism"), ("0.14.0", "-pp 2", "pipeline parallelism"), ("0.15.0", "-pp 2", ""),
    ("0.11.0", "--speculative-config '{\"method\": \"qwen3_next_mtp\", \"num_speculative_tokens\": 1}'",
     "speculative decoding"),
    ("0.11.2", "--speculative-config '{\"method\": \"qwen3_next_mtp\", \"num_speculative_tokens\": 1}'", "")])
def test_vllm_async_scheduling_is_refused_where_the_engine_refuses_it(tmp_path, capsys, version, extra, refused):
    model = "qwen3-next-80b-a3b" if "mtp" in extra else "qwen3-8b"
    cmd = f"vllm serve x --async-scheduling -tp 2 {extra}"
    code = main(["from-vllm", cmd, "--hf-config", str(HF / model), "--engine-version", version,
                 "-o", str(tmp_path / "run.toml")])
    err = capsys.readouterr().err
    assert (code, refused in err if refused else "async" not in err) == (2 if refused else 0, True)


def test_sglang_s_budget_line_names_no_profile_run(tmp_path, capsys):
    """SGLang sizes its pool from mem_fraction_static (ModelRunner.profile_max_num_token) and runs no profile step:
    the line says what weights and pool leave, not a vLLM-style activation peak."""
    out = tmp_path / "run.toml"
    cmd = "python3 -m sglang.launch_server --model-path Qwen/Qwen3-8B --tp 1 --mem-fraction-static 0.8"
    assert main(["from-sglang", cmd, "--hf-config", str(HF / "qwen3-8b"), "--engine-version", "0.5.5",
                 "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["serve", str(out), "-o", str(tmp_path / "run"), "--format", "summary"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "no profile run (" in text and "activation peak" not in text


def test_an_option_of_no_table_passes_over_by_hand_or_for_a_later_engine(capsys):
    """An option no version's command line read has: refused (a typo, a plugin's) unless --ignore-arg names it, or
    the engine version is later than every table read (vLLM 0.34.0 here), where it may be the release's own: then
    passed over as memory-neutral, unverified, with a note."""
    cfg = ["--hf-config", str(HF / "qwen3-8b"), "--gpu", "h100"]
    cmd = "vllm serve Qwen/Qwen3-8B --max-model-len 8192 --zeta-offload 3"
    assert main(["from-vllm", cmd, *cfg, "--engine-version", "0.34.0"]) == 2
    err = capsys.readouterr().err
    assert "--zeta-offload: an option of no vllm command line this tool has read (vllm 0.2.7 … 0.34.0" in err
    assert "an --engine-version later than 0.34.0 has such options passed over with a note" in err
    assert main(["from-vllm", cmd, *cfg, "--engine-version", "0.34.0", "--ignore-arg", "zeta-offload"]) == 0
    assert "#   --zeta-offload" in capsys.readouterr().out
    assert main(["from-vllm", cmd, *cfg, "--engine-version", "0.41.0"]) == 0
    out, err = capsys.readouterr()
    assert "--zeta-offload: of no vllm command line read" in err and "vllm 0.41.0 is later" in err
    assert "--zeta-offload (of no command line read, the engine later (unverified))" in out
