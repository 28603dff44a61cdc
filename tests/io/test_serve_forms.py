"""``timeline from-vllm`` on deployments that are not a shell command: a Kubernetes manifest or Compose file whose
container runs the engine, and a Python program building it (``LLM(...)``, ``sgl.Engine(...)``) — read without
running anything, as the kubelet, Compose and the engine's own fields would give them."""

from __future__ import annotations

from pathlib import Path

import pytest

from timeline.cli import main
from timeline.io.serve_runfile import load_serve_run

HF = ["--hf-config", str(Path(__file__).resolve().parents[1] / "data" / "hf" / "llama-3.1-8b"), "--gpu", "h100"]

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: llama}
spec:
  template:
    spec:
      containers:
      - name: proxy
        image: nginx:1.25
        args: ["-g", "daemon off;"]
      - name: vllm
        image: vllm/vllm-openai:v0.10.1.1
        command: ["/bin/sh", "-c"]
        args: ["vllm serve meta-llama/Llama-3.1-8B --max-model-len $MAX_LEN --tensor-parallel-size 2"]
        env:
        - name: HF_TOKEN
          valueFrom: {secretKeyRef: {name: hf, key: token}}
        - {name: MAX_LEN, value: "16384"}
---
apiVersion: v1
kind: Service
metadata: {name: llama}
"""


def _run(tmp_path, name: str, text: str, *extra: str):
    src = tmp_path / name
    src.write_text(text)
    out = tmp_path / "run.toml"
    assert main(["from-vllm", str(src), *HF, *extra, "-o", str(out), "--force"]) == 0
    return load_serve_run(out), out.read_text()


def test_a_kubernetes_container_running_a_shell_command(tmp_path):
    run, text = _run(tmp_path, "deploy.yaml", DEPLOYMENT)
    # the sidecar is passed over; the shell command reads the container's env; the image tag is the version
    assert run.parallel.tp == 2 and run.serving.max_model_len == 16384 and run.serving.engine_version == "0.10.1.1"
    assert "# note: read container 'vllm' (image vllm/vllm-openai:v0.10.1.1)" in text


def test_kubernetes_args_to_the_images_entrypoint_expand_env_references(tmp_path):
    manifest = ("containers:\n- name: server\n  image: vllm/vllm-openai:v0.9.2\n"
                '  args: ["--model", "$(MODEL)", "--max-model-len=8192", "--served-model-name", "$$(MODEL)"]\n'
                "  env:\n  - {name: MODEL, value: meta-llama/Llama-3.1-8B}\n")
    run, text = _run(tmp_path, "pod.yaml", manifest)
    assert run.serving.engine_version == "0.9.2" and run.serving.max_model_len == 8192
    assert 'name = "Llama-3.1-8B"' in text  # $(MODEL) expanded; $$(MODEL) is the literal "$(MODEL)"


COMPOSE = """\
services:
  vllm:
    image: vllm/vllm-openai:${VLLM_TAG:-v0.8.5}
    command: --model meta-llama/Llama-3.1-8B --max-model-len ${MAX_LEN:-4096} --max-num-seqs 64
  sglang:
    image: lmsysorg/sglang:v0.4.9.post2-cu126
    command: python3 -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B --max-total-tokens 60000
"""


def test_compose_services_interpolate_and_job_picks_one(tmp_path):
    run, text = _run(tmp_path, "compose.yaml", COMPOSE)
    assert run.serving.engine == "vllm" and run.serving.engine_version == "0.8.5"
    assert (run.serving.max_model_len, run.serving.max_num_seqs) == (4096, 64)
    assert "2 serving containers in" in text
    run, _ = _run(tmp_path, "compose.yaml", COMPOSE, "--script-env", "MAX_LEN=8192", "--script-env",
                  "VLLM_TAG=v0.10.2")
    assert run.serving.max_model_len == 8192 and run.serving.engine_version == "0.10.2"
    run, _ = _run(tmp_path, "compose.yaml", COMPOSE, "--job", "2")
    assert run.serving.engine == "sglang" and run.serving.max_total_tokens == 60000
    assert run.serving.engine_version == "0.4.9.post2"


OFFLINE = """\
import argparse, os
from vllm import LLM, SamplingParams

MODEL = os.environ.get("MODEL", "meta-llama/Llama-3.1-8B")
parser = argparse.ArgumentParser()
parser.add_argument("--tp", type=int, default=2)
parser.add_argument("--max-len", type=int, default=16384)
args = parser.parse_args()
llm = LLM(model=MODEL, tensor_parallel_size=args.tp, max_model_len=args.max_len, gpu_memory_utilization=0.8,
          enable_prefix_caching=True, compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8]})
"""


def test_an_offline_llm_call_with_its_usage_contexts_defaults(tmp_path):
    run, text = _run(tmp_path, "offline.py", OFFLINE, "--engine-version", "0.11.0")
    sv = run.serving
    assert run.parallel.tp == 2 and sv.max_model_len == 16384 and sv.gpu_memory_utilization == 0.8
    assert sv.enable_prefix_caching is True and sv.cuda_graph_sizes == (1, 2, 4, 8)
    # LLM_CLASS: 16,384 tokens a step on an H100 (the server's 8,192), engine/arg_utils.py _set_default_args
    assert sv.usage_context == "llm_class" and (sv.max_num_batched_tokens, sv.max_num_seqs) == (16384, 1024)
    served = tmp_path / "served"
    assert main(["serve", str(tmp_path / "run.toml"), "-o", str(served), "--format", "summary"]) == 0


def test_sglang_offline_engine(tmp_path):
    program = ("import sglang as sgl\nif __name__ == '__main__':\n"
               "    llm = sgl.Engine(model_path='meta-llama/Llama-3.1-8B', tp_size=2, mem_fraction_static=0.85,"
               " context_length=8192)\n")
    run, _ = _run(tmp_path, "sgl.py", program, "--engine-version", "0.5.5")
    assert run.serving.engine == "sglang" and run.parallel.tp == 2 and run.serving.mem_fraction_static == 0.85
    assert run.serving.max_model_len == 8192


@pytest.mark.parametrize(("program", "message"), [
    ("from vllm import LLM\nn = get_gpus()\nllm = LLM('m', tensor_parallel_size=n)\n",
     "LLM(…) at line 3: tensor_parallel_size=n: a value this reader cannot follow"),
    ("from vllm import LLM\nkw = dict(tensor_parallel_size=2)\nllm = LLM('m', **kw)\n",
     "**kw: keyword arguments unpacked from a variable are not read"),
    ("from vllm import LLM\nllm = LLM('m', tensor_paralel_size=2)\n",
     "tensor_paralel_size: a field of no vllm version's engine arguments this tool has read (did you mean "
     "tensor_parallel_size"),
    ("containers:\n- name: web\n  image: nginx\n  args: ['-g', 'daemon off;']\n",
     "no container runs a serving engine"),
])
def test_what_cannot_be_read_is_one_line(tmp_path, capsys, program, message):
    src = tmp_path / ("x.py" if "import" in program else "x.yaml")
    src.write_text(program)
    out = tmp_path / "run.toml"
    assert main(["from-vllm", str(src), *HF, "--engine-version", "0.11.0", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and not out.exists()


def test_a_login_shell_with_options_and_a_build_of_the_image(tmp_path):
    """``["/bin/bash", "-lc", "--"]`` (KubeRay / AIBrix) runs its argument as a script, as ``-c`` does; an image
    built on the engine's (``aibrix/vllm-openai:v0.7.3.self.post1``) gives its release, with a note."""
    manifest = ("containers:\n- name: head\n  image: aibrix/vllm-openai:v0.7.3.self.post1\n"
                '  command: ["/bin/bash", "-lc", "--"]\n'
                '  args: ["ulimit -n 65536; vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 2"]\n')
    run, text = _run(tmp_path, "fleet.yaml", manifest)
    assert run.parallel.tp == 2 and run.serving.engine_version == "0.7.3"
    assert "read from the tag of aibrix/vllm-openai:v0.7.3.self.post1" in text


def test_compose_environment_is_interpolated_and_dotenv_read(tmp_path):
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / ".env").write_text("# defaults\nMAX_LEN=6144\nTAG='v0.10.0'\n")
    compose = ("services:\n  vllm:\n    image: vllm/vllm-openai:${TAG}\n    environment:\n"
               "      - UTIL=${GPU_UTIL:-0.3}\n    entrypoint: [\"/bin/sh\", \"-c\"]\n"
               "    command: [\"vllm serve meta-llama/Llama-3.1-8B --gpu-memory-utilization $$UTIL "
               "--max-model-len ${MAX_LEN}\"]\n")
    run, text = _run(folder, "compose.yml", compose)
    assert run.serving.gpu_memory_utilization == 0.3 and run.serving.max_model_len == 6144
    assert run.serving.engine_version == "0.10.0" and "as Compose does" in text
    run, _ = _run(folder, "compose.yml", compose, "--script-env", "GPU_UTIL=0.7", "--script-env", "MAX_LEN=2048")
    assert run.serving.gpu_memory_utilization == 0.7 and run.serving.max_model_len == 2048


@pytest.mark.parametrize(("name", "program", "message"), [
    ("bad.yaml", "containers:\n- name: x\n  image: vllm/vllm-openai:v0.10.0\n   args: [\"--tp\", \"2\"]\n",
     "not valid YAML (line 4"),
    ("k.yaml", 'containers:\n- name: x\n  image: vllm/vllm-openai:v0.10.0\n  command: ["/bin/sh", "-c"]\n'
     '  args: ["vllm serve meta-llama/Llama-3.1-8B $EXTRA_ARGS"]\n',
     "$EXTRA_ARGS (in the command's words) is not set where the command is read; give its value with --script-env "
     "EXTRA_ARGS=VALUE"),
    ("other.py", "from gllm import LLM\nllm = LLM('m', tensor_parallel_size=2)\n",
     "a Python program that builds no serving engine"),
    ("launch.py", "import subprocess\nsubprocess.run(['vllm', 'serve', 'm'])\n",
     "a server it starts in a subprocess is not followed"),
])
def test_what_a_file_does_not_say_is_named(tmp_path, capsys, name, program, message):
    src = tmp_path / name
    src.write_text(program)
    assert main(["from-vllm", str(src), *HF, "--engine-version", "0.11.0"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_a_snippet_without_imports_is_vllms_llm(tmp_path):
    run, _ = _run(tmp_path, "snippet.py", "llm = LLM(model='meta-llama/Llama-3.1-8B', tensor_parallel_size=2)\n",
                  "--engine-version", "0.11.0")
    assert run.parallel.tp == 2 and run.serving.usage_context == "llm_class"


def test_engine_args_outside_the_server_take_the_engine_contexts_defaults(tmp_path):
    program = ("from vllm import AsyncEngineArgs\nfrom vllm.engine.async_llm_engine import AsyncLLMEngine\n"
               "args = AsyncEngineArgs(model='meta-llama/Llama-3.1-8B', tensor_parallel_size=2)\n"
               "engine = AsyncLLMEngine.from_engine_args(args)\n")
    run, text = _run(tmp_path, "server.py", program, "--engine-version", "0.11.0")
    # SchedulerConfig.__post_init__'s own: 128 sequences, 2,048 tokens (ENGINE_CONTEXT is in neither table)
    sv = run.serving
    assert sv.usage_context == "engine_context" and (sv.max_num_seqs, sv.max_num_batched_tokens) == (128, 2048)
    assert "#   EngineArgs(...) -> serving.usage_context = engine_context" in text


def test_values_from_a_module_beside_the_program(tmp_path):
    (tmp_path / "config.py").write_text("import os\nMODEL = os.getenv('MODEL', 'meta-llama/Llama-3.1-8B')\n"
                                        "TP = int(os.getenv('TP', 2))\nMAX_LEN = 8192\n")
    (tmp_path / "settings.py").write_text("UTIL = 0.75\n")
    program = ("from vllm import LLM\nimport config\nfrom settings import UTIL\n"
               "llm = LLM(model=config.MODEL, tensor_parallel_size=config.TP, max_model_len=config.MAX_LEN, "
               "gpu_memory_utilization=UTIL)\n")
    run, _ = _run(tmp_path, "serve.py", program, "--engine-version", "0.11.0")
    assert (run.parallel.tp, run.serving.max_model_len, run.serving.gpu_memory_utilization) == (2, 8192, 0.75)
    run, _ = _run(tmp_path, "serve.py", program, "--engine-version", "0.11.0", "--script-env", "TP=4")
    assert run.parallel.tp == 4  # the environment reaches the imported module's os.getenv
