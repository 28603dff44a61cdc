"""The GPU a log names, as the hardware preset it is.

A startup or training log names its device where a line prints CUDA's device name
(``torch.cuda.get_device_name()``, NVML's ``nvmlDeviceGetName``: ``NVIDIA H100 80GB HBM3``, ``NVIDIA GeForce RTX
3090``). The forms read here, each as its program prints it:

- a fused-MoE tuning file's name — vLLM's ``model_executor/layers/fused_moe/fused_moe.py`` ``get_config_file_name``
  and SGLang's ``fused_moe_triton`` copy: ``E={E},N={N},device_name={name}…json``, the name with its spaces as
  underscores (``current_platform.get_device_name().replace(" ", "_")``), printed when the file is loaded or missing
  ("Using default MoE config. Performance might be sub-optimal! Config file not found at …");
- PyTorch's ``collect_env`` report (the one a vLLM / SGLang / Megatron-LM bug report carries): ``GPU models and
  configuration:`` then one ``GPU N: NAME`` line per device (``nvidia-smi -L`` without the UUID);
- ``nvidia-smi``'s own ``-L`` lines (``GPU 0: NAME (UUID: GPU-…)``) and its table rows (``|   0  NAME   On |``;
  the table cuts a long name to ``…`` / ``...``);
- PyTorch's capability warning (``torch/cuda/__init__.py`` ``_check_capability``: ``NAME with CUDA capability sm_XY
  is not compatible …``).

A name is matched whole, not in part: the H100 PCIe, the A10G or the RTX 3090 Ti are other devices (SM count, memory
or bandwidth) than the presets named H100, A10 and RTX 3090, and no preset's.
"""

from __future__ import annotations

import re

#: CUDA's device names, as :func:`device_key` writes them, of the devices each preset of
#: :data:`timeline.spec.hardware.GPUS` is (the NVIDIA data sheets its docstring cites)
DEVICE_NAMES: dict[str, str] = {
    "h100 80gb hbm3": "h100",
    "h800": "h800",
    "h800 80gb hbm3": "h800",
    "h200": "h200",
    "b200": "b200",
    "gb200": "gb200",
    "a100 sxm4 80gb": "a100",
    "a100 80gb pcie": "a100",
    "a100 sxm4 40gb": "a100-40gb",
    "a100 pcie 40gb": "a100-40gb",
    "a800 sxm4 80gb": "a800",
    "a800 80gb pcie": "a800",
    "l40s": "l40s",
    "l4": "l4",
    "a40": "a40",
    "a30": "a30",
    "a10": "a10",
    "rtx a6000": "a6000",
    "rtx a4000": "rtx-a4000",
    "rtx a5000": "rtx-a5000",
    "geforce rtx 3090": "rtx3090",
    "geforce rtx 4090": "rtx4090",
    "geforce rtx 4080": "rtx4080",
    "geforce rtx 4070 ti super": "rtx4070ti-super",
    "geforce rtx 5090": "rtx5090",
    "geforce rtx 5080": "rtx5080",
    "tesla t4": "t4",
    "rtx pro 4500 blackwell": "rtx-pro-4500",
    "rtx pro 4500 blackwell server edition": "rtx-pro-4500",
    "rtx pro 6000 blackwell server edition": "rtx-pro-6000",
    "rtx pro 6000 blackwell workstation edition": "rtx-pro-6000",
    "rtx pro 6000 blackwell max q workstation edition": "rtx-pro-6000",
}

#: the vendor's prefix CUDA's name starts with: ``NVIDIA``, or ``Tesla`` on the data-center boards before Ampere
#: (``Tesla T4``, ``Tesla V100-SXM2-32GB``)
_VENDOR = r"(?:NVIDIA|Tesla)"
_NAME = _VENDOR + r"[ _][A-Za-z0-9 _.\-]*?[A-Za-z0-9]"
#: the lines that print a device name (module docstring), each with its name in group ``n``
DEVICE_LINES = (
    re.compile(r"device_name=(?P<n>" + _VENDOR + r"_[A-Za-z0-9_\-]+?)(?:,|\.json)"),
    re.compile(r"^\s*GPU \d+: (?P<n>" + _NAME + r")(?:\s*\(UUID|\s*$)", re.MULTILINE),
    re.compile(r"^\|\s+\d+\s+(?P<n>" + _VENDOR + r" [A-Za-z0-9 .\-]+?(?:\.\.\.|…)?)\s+(?:On|Off)\s+\|", re.MULTILINE),
    re.compile(r"(?P<n>" + _NAME + r") with CUDA capability sm_\d+"),
)


def device_key(name: str) -> str:
    """``"NVIDIA_RTX_PRO_6000_Blackwell_Max-Q_Workstation_Edition"`` → ``"rtx pro 6000 blackwell max q workstation
    edition"``: lower case, underscores and hyphens as spaces, the vendor's name dropped."""
    key = re.sub(r"[\s_\-]+", " ", name.strip().lower()).strip()
    return key[len("nvidia "):] if key.startswith("nvidia ") else key


def preset_of(name: str) -> str | None:
    """The hardware preset the device ``name`` is (None: no preset's). A name ``nvidia-smi``'s table cut short
    (``…``, ``...``) is the preset every full name it begins is, if they agree."""
    key = device_key(name)
    cut = re.sub(r"\s*(?:\.\.\.|…)$", "", key)
    if cut != key:
        found = {preset for full, preset in DEVICE_NAMES.items() if full.startswith(cut)}
        return found.pop() if len(found) == 1 else None
    return DEVICE_NAMES.get(key)


def device_in(text: str) -> str | None:
    """The first device name ``text`` prints (a :data:`DEVICE_LINES` form), spaces restored; None if none."""
    hits = [(m.start("n"), m["n"]) for rx in DEVICE_LINES for m in [rx.search(text)] if m is not None]
    if not hits:
        return None
    return min(hits)[1].replace("_", " ").strip()


def device_note(name: str, preset: str | None, given: str | None) -> str:
    """What the run file says of the log's device ``name`` (its ``preset``) when ``--gpu`` was ``given`` or not."""
    if given is not None:
        agrees = preset == given
        return (f"the log names its GPU '{name}'" + ("" if agrees else
                f" ({'the preset ' + preset if preset else 'no preset'}); --gpu {given} is taken as given"))
    if preset is not None:
        return f"hardware.gpu = {preset}: the GPU the log names, '{name}'"
    return (f"the log names its GPU '{name}', which no preset is (its SM count, memory or bandwidth are another "
            "device's): read as h100; give --gpu NAME with its --gpu-field values")


def run_gpu(name: str | None, given: str | None) -> tuple[str, str | None]:
    """The run's ``hardware.gpu`` (``--gpu`` ``given``, else the preset of the device the log names, else h100) and
    the note on the log's device (None where the log names none)."""
    if name is None:
        return given or "h100", None
    preset = preset_of(name)
    return given or preset or "h100", device_note(name, preset, given)
