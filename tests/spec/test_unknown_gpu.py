"""A GPU no preset holds: accepted when the run file gives the fields the rules read (``capacity_gib``, ``sm``,
``sms``, ``bf16_tflops``, ``hbm_gbps``; with more than one GPU also ``interconnect``, ``nvlink_gbps``,
``network_gbps``), refused with each missing field named otherwise. Given a preset's own numbers under another
name, every result equals the preset's: no rule reads the name where a field says it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from helpers_run import TINY_RUN_TOML

from timeline.api import load_run, simulate
from timeline.errors import SpecError
from timeline.io.serve_runfile import load_serve_run
from timeline.serve.budget import compute_budget
from timeline.serve.non_torch import context_bytes
from timeline.spec.hardware import GPUS, UNKNOWN_GPU_NEEDS, UNKNOWN_GPU_NEEDS_MULTI, preset_values
from timeline.spec.run import HardwareSpec

HF = Path(__file__).resolve().parents[1] / "data" / "hf"
GIB = 1 << 30


def _fields(gpu: str, *, multi: bool) -> str:
    """``[hardware]`` lines giving preset ``gpu``'s numbers explicitly."""
    keys = [*UNKNOWN_GPU_NEEDS, *(UNKNOWN_GPU_NEEDS_MULTI if multi else ())]
    values = preset_values(gpu)
    return "".join(f"{k} = {values[k]!r}\n".replace("'", '"') for k in keys if k != "capacity_gib")


def _serve(tmp_path: Path, gpu: str, hw: str, tp: int) -> Path:
    path = tmp_path / f"{gpu}-{tp}.toml"
    path.write_text(f'[model]\nhf_config = "{HF / "llama-3.1-8b" / "config.json"}"\n[parallel]\ntp = {tp}\n'
                    f'[hardware]\ngpu = "{gpu}"\ncapacity_gib = 47.54\n{hw}[serving]\nengine = "vllm"\n'
                    'engine_version = "0.19.0"\nmax_model_len = 8192\n[serving.load]\nnum_requests = 1\n')
    return path


@pytest.mark.parametrize("tp", [1, 2])
def test_serving_budget_of_a_named_gpu_equals_its_presets(tmp_path, tp):
    """The RTX A6000's data-sheet numbers under the name "my-a6000" give the a6000 preset's budget, byte for
    byte: weights, the profile run, the non-torch parts (its context carried by 84 SMs at 1,536 threads, the
    PCIe TP2 groups) and the KV pool."""
    preset = compute_budget(load_serve_run(_serve(tmp_path, "a6000", "", tp)))
    named = compute_budget(load_serve_run(_serve(tmp_path, "my-a6000", _fields("a6000", multi=tp > 1), tp)))
    assert named == preset
    assert named.kv_pool_bytes > 10 * GIB and named.non_torch_bytes > 0


def test_context_of_a_named_gpu_follows_its_sms():
    """A 64-SM compute-capability-8.6 card (the RTX A5000's data sheet): the H100's measured context less the
    H100's local-memory reservation (132 SMs × 2,048 threads × 1 KiB) plus its own (64 × 1,536 × 1 KiB)."""
    hw = HardwareSpec(gpu="my-a5000", capacity_gib=23.68, sm=86, sms=64, bf16_tflops=111.1, hbm_gbps=768,
                      interconnect="pcie")
    size, source = context_bytes(hw)
    assert size == int(0.51 * GIB) - 132 * 2048 * 1024 + 64 * 1536 * 1024
    assert "64 SMs" in source
    unknown_sm = replace(hw, sm=75 + 1)
    assert "not in the threads-per-SM table" in context_bytes(unknown_sm)[1]
    assert "no SM count" in context_bytes(replace(hw, sms=0))[1]


def test_serving_run_without_the_fields_names_each(tmp_path):
    path = _serve(tmp_path, "my-a5000", "", 2)
    with pytest.raises(SpecError) as err:
        load_serve_run(path)
    text = str(err.value)
    assert "hardware.gpu" in text and "'my-a5000' is no preset" in text
    for key in [*UNKNOWN_GPU_NEEDS, *UNKNOWN_GPU_NEEDS_MULTI]:
        if key != "capacity_gib":  # the run file gives it
            assert f"{key} = " in text, key
    one = _serve(tmp_path, "my-a5000", "", 1)
    with pytest.raises(SpecError) as err:
        load_serve_run(one)
    assert "nvlink_gbps" not in str(err.value)  # one GPU: how GPUs connect is not asked for


def test_training_run_of_a_named_gpu_equals_its_presets(tmp_path):
    """The tiny Llama on two pipeline ranks: "my-h100" with the H100's numbers simulates the h100 preset's
    timeline — the same peaks, reserved and iteration time on every device."""
    def run(gpu: str, hw: str):
        path = tmp_path / f"{gpu}.toml"
        path.write_text(TINY_RUN_TOML + f'[hardware]\ngpu = "{gpu}"\ncapacity_gib = 80\n{hw}')
        return simulate(load_run(path))

    preset, named = run("h100", ""), run("my-h100", _fields("h100", multi=True))
    assert [preset.peak(d) for d in range(2)] == [named.peak(d) for d in range(2)]
    assert preset.meta.iteration_time_us == named.meta.iteration_time_us > 0


def test_training_run_without_the_fields_is_refused(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text(TINY_RUN_TOML + '[hardware]\ngpu = "my-gpu"\n')
    with pytest.raises(SpecError) as err:
        load_run(path)
    text = str(err.value)
    for key in [*UNKNOWN_GPU_NEEDS, *UNKNOWN_GPU_NEEDS_MULTI]:  # pp = 2: two GPUs
        assert f"{key} = " in text, key


def test_every_preset_fills_every_needed_field():
    for gpu in GPUS:
        values = preset_values(gpu)
        assert set(UNKNOWN_GPU_NEEDS) - {"capacity_gib"} <= set(values) and set(UNKNOWN_GPU_NEEDS_MULTI) <= set(values)
        assert values["sms"] > 0, gpu


def test_measured_totals_sit_below_each_presets_data_sheet_size():
    """PyTorch's total (each from a named public log) is the board's memory less what the driver keeps: below the
    preset's size and within 10 % of it, not above nvidia-smi's total (whole MiB, rounded down: the T4's
    totalGlobalMem is its 15,109.7), which is below the size too."""
    from timeline.spec.hardware import NVIDIA_SMI_TOTAL_MIB, TORCH_TOTAL_GIB

    for gpu, total in TORCH_TOTAL_GIB.items():
        size = GPUS[gpu]["capacity_gib"]
        assert 0.90 * size < total < size, gpu
        if gpu in NVIDIA_SMI_TOTAL_MIB:
            assert total * 1024 < NVIDIA_SMI_TOTAL_MIB[gpu] + 1 and NVIDIA_SMI_TOTAL_MIB[gpu] <= size * 1024, gpu


def test_a_serving_run_on_a_new_preset_budgets_from_its_measured_total(tmp_path):
    from timeline.io.serve_runfile import load_serve_run
    from timeline.serve.budget import compute_budgets

    hf = Path(__file__).resolve().parents[1] / "data" / "hf" / "llama-3.1-8b" / "config.json"
    path = tmp_path / "l4.toml"
    path.write_text(f'[model]\nhf_config = "{hf}"\n[hardware]\ngpu = "l4"\n[serving]\nengine = "vllm"\n'
                    'engine_version = "0.11.0"\nmax_model_len = 4096\n[serving.load]\nnum_requests = 1\n')
    run = load_serve_run(path)
    assert run.hardware.capacity_gib == 22.03 and run.hardware.sm == 89
    b = compute_budgets(run)[0]
    assert b.total_bytes == int(22.03 * 2**30) and b.requested_bytes == int(b.total_bytes * 0.9)
    assert b.failure == "" and b.num_kv_blocks > 0  # an 8B bf16 model (14.96 GiB) leaves an L4 a pool


def test_the_rtx_a5000_budgets_from_its_printed_total(tmp_path):
    """The RTX A5000's PyTorch total is the 24,138 MiB ``get_device_properties`` prints in a public pod's log
    (23.57 GiB); a Llama-3.1-8B bf16 serve at 0.9 gets a KV pool from it rather than a refusal for the name."""
    from timeline.io.serve_runfile import load_serve_run
    from timeline.serve.budget import compute_budgets

    hf = Path(__file__).resolve().parents[1] / "data" / "hf" / "llama-3.1-8b" / "config.json"
    path = tmp_path / "a5000.toml"
    path.write_text(f'[model]\nhf_config = "{hf}"\n[hardware]\ngpu = "rtx-a5000"\n[serving]\nengine = "vllm"\n'
                    'engine_version = "0.11.0"\nmax_model_len = 4096\n[serving.load]\nnum_requests = 1\n')
    run = load_serve_run(path)
    assert run.hardware.capacity_gib == 23.57 and round(24138 / 1024, 2) == 23.57
    assert (run.hardware.sm, run.hardware.sms) == (86, 64)
    b = compute_budgets(run)[0]
    assert b.total_bytes == int(23.57 * 2**30) and b.requested_bytes == int(b.total_bytes * 0.9)
    assert b.failure == "" and b.num_kv_blocks > 0
