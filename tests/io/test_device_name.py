"""The GPU a log names (``timeline/io/device_name.py``), read by ``from-vllm`` / ``from-sglang`` / ``from-megatron``.

The lines are written in the forms their programs print (vLLM's fused-MoE config file name, PyTorch's collect_env
report, nvidia-smi's table and ``-L`` lines, PyTorch's capability warning), with made-up values.
"""

from __future__ import annotations

import json
import lzma
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from timeline.io.device_name import DEVICE_NAMES, device_in, device_key, preset_of
from timeline.spec.hardware import GPUS

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "tests/data/hf/llama-3.1-8b"

MOE_LINE = ("(EngineCore_DP0 pid=1) WARNING 03-12 10:00:01 [fused_moe.py:727] Using default MoE config. Performance "
            "might be sub-optimal! Config file not found at ['/usr/local/lib/python3.12/dist-packages/vllm/"
            "model_executor/layers/fused_moe/configs/E=128,N=768,device_name=NVIDIA_GeForce_RTX_3090.json']")
COLLECT_ENV = """\
GPU models and configuration:
GPU 0: NVIDIA A100-SXM4-40GB
GPU 1: NVIDIA A100-SXM4-40GB

Nvidia driver version: 550.54.15
"""
SMI_TABLE = """\
|=========================================+========================+======================|
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:18:00.0 Off |                    0 |
| N/A   31C    P0             70W /  700W |       1MiB /  81559MiB |      0%      Default |
"""
SMI_CUT = "|   0  NVIDIA RTX PRO 6000 Blac...    On  |   00000000:01:00.0 Off |                  Off |\n"
CAPABILITY = ("UserWarning: NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the current "
              "PyTorch installation.")


def test_every_name_maps_to_a_preset_and_names_match_whole() -> None:
    assert set(DEVICE_NAMES.values()) <= set(GPUS)
    assert device_key("NVIDIA_RTX_PRO_6000_Blackwell_Max-Q_Workstation_Edition") == \
        "rtx pro 6000 blackwell max q workstation edition"
    assert preset_of("NVIDIA H100 80GB HBM3") == "h100"
    assert preset_of("NVIDIA A100-SXM4-40GB") == "a100-40gb" and preset_of("NVIDIA A100 80GB PCIe") == "a100"
    # other devices than the presets of similar names: another SM count, memory or bandwidth
    for other in ("NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA A10G", "NVIDIA GeForce RTX 3090 Ti", "NVIDIA L40",
                  "NVIDIA GeForce RTX 4090 D", "NVIDIA H20"):
        assert preset_of(other) is None, other
    assert preset_of("NVIDIA RTX PRO 6000 Blac...") == "rtx-pro-6000"  # every edition is the one preset
    assert preset_of("Tesla T4") == "t4" and preset_of("Tesla V100-SXM2-32GB") is None
    # the RTX A5000 (GA102, 64 SMs) is its own preset, not the A6000's nor the A4000's
    assert preset_of("NVIDIA RTX A5000") == "rtx-a5000" and preset_of("NVIDIA RTX A5000 Ada Generation") is None
    assert preset_of("NVIDIA GeForce RTX 40...") is None  # 4090, 4080, 4070 Ti SUPER: not one


@pytest.mark.parametrize(("text", "name"), [
    (MOE_LINE, "NVIDIA GeForce RTX 3090"),
    (COLLECT_ENV, "NVIDIA A100-SXM4-40GB"),
    (SMI_TABLE, "NVIDIA H100 80GB HBM3"),
    (SMI_CUT, "NVIDIA RTX PRO 6000 Blac..."),
    ("GPU 0: NVIDIA L40S (UUID: GPU-0a1b2c3d-0000-1111-2222-333344445555)\n", "NVIDIA L40S"),
    (CAPABILITY, "NVIDIA GeForce RTX 5090"),
    # before Ampere the data-center boards' names start with "Tesla", not the vendor's
    ("|   0  Tesla T4            Off  | 00000000:00:04.0 Off |                    0 |\n", "Tesla T4"),
    ("GPU 0: Tesla T4 (UUID: GPU-0a1b2c3d-0000-1111-2222-333344445555)\n", "Tesla T4"),
    ("Config file not found at ['/x/configs/E=8,N=7168,device_name=Tesla_T4.json']", "Tesla T4"),
    ("UserWarning: Tesla V100-SXM2-32GB with CUDA capability sm_70 is not compatible", "Tesla V100-SXM2-32GB"),
    ("INFO 03-12 10:00:00 [gpu_worker.py:298] Available KV cache memory: 60.12 GiB\n", None),
])
def test_each_form_a_program_prints_gives_the_name(text: str, name: str | None) -> None:
    assert device_in(text) == name


def test_the_first_name_in_the_text_is_taken() -> None:
    assert device_in(SMI_TABLE + MOE_LINE) == "NVIDIA H100 80GB HBM3"


VLLM_LOG = """\
(APIServer pid=5385) INFO 11-03 05:51:44 [api_server.py:1839] vLLM API server version 0.11.0
(APIServer pid=5385) INFO 11-03 05:51:44 [utils.py:233] non-default args: {'model_tag': 'meta-llama/Llama-3.1-8B', \
'model': 'meta-llama/Llama-3.1-8B', 'max_model_len': 8192, 'gpu_memory_utilization': 0.85}
"""


def _from_vllm(tmp_path: Path, text: str, *extra: str) -> tuple[dict, str]:
    log = tmp_path / "server.log"
    log.write_text(text)
    out = tmp_path / "run.toml"
    done = subprocess.run([sys.executable, "-m", "timeline", "from-vllm", str(log), "--hf-config", str(LLAMA),
                           "-o", str(out), "--force", *extra], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return tomllib.loads(out.read_text()), out.read_text()


def test_from_vllm_runs_on_the_gpu_the_log_names(tmp_path: Path) -> None:
    run, text = _from_vllm(tmp_path, SMI_TABLE.replace("NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 4090") + VLLM_LOG)
    assert run["hardware"]["gpu"] == "rtx4090"
    assert "the GPU the log names, 'NVIDIA GeForce RTX 4090'" in text
    run, text = _from_vllm(tmp_path, COLLECT_ENV + VLLM_LOG, "--gpu", "h100")  # --gpu wins, and the note says so
    assert run["hardware"]["gpu"] == "h100" and "--gpu h100 is taken as given" in text
    run, text = _from_vllm(tmp_path, "GPU 0: NVIDIA H100 PCIe\n" + VLLM_LOG)  # no preset's: the default, named
    assert run["hardware"]["gpu"] == "h100" and "which no preset is" in text
    run, _ = _from_vllm(tmp_path, VLLM_LOG)  # no name: the default
    assert run["hardware"]["gpu"] == "h100"


def test_from_megatron_runs_on_the_gpu_its_log_names(tmp_path: Path) -> None:
    job = json.loads(lzma.decompress((ROOT / "tests/data/megatron/dumps/main.json.xz").read_bytes()))["jobs"][0]
    log = tmp_path / "train.log"
    log.write_text(COLLECT_ENV + job["block"] + "\n")
    out = tmp_path / "run.toml"
    done = subprocess.run([sys.executable, "-m", "timeline", "from-megatron", str(log), "-o", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert tomllib.loads(out.read_text())["hardware"]["gpu"] == "a100-40gb"
    assert "'NVIDIA A100-SXM4-40GB'" in done.stderr
