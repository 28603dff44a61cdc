"""GPU presets for ``[hardware] gpu``: capacity, dense BF16 throughput, bandwidths.

Datasheet figures (NVIDIA H100/H800 SXM, H200 SXM, A100 80GB SXM, B200 / DGX B200, GB200 NVL72
per GPU: 186 GB HBM3e at 8 TB/s, 2.5 PFLOP/s dense BF16, fifth-generation NVLink 1.8 TB/s):
capacity in GiB as the datasheet's memory size, dense (non-sparse) BF16 tensor throughput,
HBM bandwidth, NVLink bandwidth per direction, and one 400 Gb/s (50 GB/s) NIC per GPU
(H800's NVLink is cut to 400 GB/s bidirectional), and the compute capability (``sm``: 80 Ampere,
90 Hopper, 100 Blackwell) that architecture-dependent rules read (Transformer Engine's cuBLAS
workspace, its ``auto`` attention choice). Every field is overridable in the run file.

:data:`SM_COUNTS` gives each kind's number of streaming multiprocessors (``cudaDeviceProp.
multiProcessorCount``), which flash-attn's deterministic backward reads (``nsplits``): NVIDIA H100
Tensor Core GPU Architecture whitepaper (H100 SXM5: 132 SMs; H800 SXM5 and H200 SXM are the same
GH100 configuration), NVIDIA A100 Tensor Core GPU Architecture whitepaper (A100: 108 SMs), NVIDIA
Blackwell architecture technical brief (B200 and each GB200 GPU: 148 SMs). It is keyed by the kind,
not a run-file field.

Workstation and consumer kinds (a serving engine's usual hosts), from their data sheets: NVIDIA L40S
(48 GB GDDR6 at 864 GB/s, 362 TFLOP/s dense BF16, PCIe Gen4 x16, 142 SMs, sm 89), GeForce RTX 3090
(24 GB GDDR6X at 936 GB/s, 71 TFLOP/s BF16 with FP32 accumulate, NVLink bridge 112.5 GB/s both ways,
82 SMs, sm 86; NVIDIA Ampere GA102 whitepaper), GeForce RTX 4090 (24 GB at 1,008 GB/s, 165.2 TFLOP/s
BF16, PCIe Gen4, 128 SMs, sm 89; NVIDIA Ada Lovelace whitepaper), RTX A6000 (48 GB at 768 GB/s, 154.8
TFLOP/s dense BF16, NVLink bridge 112.5 GB/s, 84 SMs, sm 86) and A100 40GB (1,555 GB/s, otherwise the
A100 80GB). PCIe Gen4 x16 is 32 GB/s per direction. NVIDIA RTX PRO 6000 Blackwell (Workstation and Server
Edition, GB202; the AWS g7e instances' GPU): 96 GB GDDR7 on a 512-bit bus at 1,792 GB/s, 188 SMs, 4,000 AI
TOPS (FP4 with sparsity, so 500 TFLOP/s dense BF16: each precision doubling and dense halve it), PCIe Gen5
x16 (64 GB/s per direction, no NVLink), compute capability 12.0 (``sm`` 120, GB202's as the RTX 5090's). GeForce RTX
5090 (GB202; NVIDIA RTX Blackwell GPU architecture whitepaper): 32 GB GDDR7 on a 512-bit bus at 1,792 GB/s, 170 SMs,
209.5 TFLOP/s dense FP16/BF16 tensor (FP32 accumulate, as the RTX 4090's figure: 3,352 AI TOPS / 16), PCIe Gen5 x16,
no NVLink, ``sm`` 120.

More data-center and workstation kinds, from their data sheets: A800 80GB SXM4 (the A100 80GB with NVLink cut to
400 GB/s both ways: 200 per direction; 2,039 GB/s; 108 SMs; nvidia.cn/data-center/a800), A40 (48 GB GDDR6 at 696 GB/s,
149.7 TFLOP/s dense BF16 with FP32 accumulate, NVLink bridge 112.5 GB/s both ways, 84 SMs — a torch log's
``multi_processor_count=84`` —, sm 86), A30 (24 GB HBM2 at 933 GB/s, 165 TFLOP/s dense BF16, NVLink 200 GB/s both ways,
56 SMs, sm 80), A10 (24 GB GDDR6 at 600 GB/s, 125 TFLOP/s dense BF16, PCIe Gen4, 72 SMs, sm 86), L4 (24 GB GDDR6 at
300 GB/s, 242 TFLOP/s BF16 with sparsity: 121 dense, PCIe Gen4, 58 SMs = 7,424 CUDA cores / 128, sm 89), RTX A4000
(16 GB GDDR6 at 448 GB/s, 153.4 tensor TFLOP/s with sparsity: 76.7 dense, 48 SMs, sm 86), RTX A5000 (GA102: 24 GB
GDDR6 at 768 GB/s, 222.2 tensor TFLOP/s with sparsity: 111.1 dense, NVLink bridge 112.5 GB/s both ways, 8,192 CUDA
cores = 64 SMs — a torch log's ``multi_processor_count=64`` —, sm 86), GeForce RTX 4080 (NVIDIA Ada
whitepaper: 16 GB GDDR6X at 716.8 GB/s, 97.5 TFLOP/s BF16 with FP32 accumulate, 76 SMs, sm 89), RTX 4070 Ti SUPER
(16 GB GDDR6X at 672 GB/s, 66 SMs = 8,448 / 128, sm 89; 706 AI TOPS / 8 = 88.2 TFLOP/s, the rule that gives the
RTX 4080's 97.5 from its 780) and RTX 5080 (RTX Blackwell whitepaper: 16 GB GDDR7 at 960 GB/s, 84 SMs, sm 120, PCIe
Gen5; 1,801 AI TOPS / 16 = 112.6) and Tesla T4 (NVIDIA T4 data sheet: 16 GB GDDR6 at 320 GB/s, 65 TFLOP/s FP16
mixed precision — Turing has no BF16, so a 16-bit job runs in FP16 —, PCIe Gen3 x16 (16 GB/s per direction), 40 SMs =
2,560 CUDA cores / 64, ``sm`` 75) and RTX PRO 4500 Blackwell (GB203, Workstation and Server Edition: 32 GB GDDR7 on a
256-bit bus at 896 GB/s, 10,496 CUDA cores = 82 SMs, PCIe Gen5 x16, no NVLink, ``sm`` 120; 1,758 TFLOP/s FP4 with
sparsity, so 109.9 TFLOP/s dense BF16 with FP32 accumulate, the RTX 5080's rule; third-party spec listings
technical.city and hmc-tech.com, NVIDIA's page gives no tensor figure). Their TFLOP/s and bandwidths time the ops only; memory reads the capacity, ``sm``
and the SM count.

:data:`TORCH_TOTAL_GIB` is what PyTorch reports as a device's memory (``torch.cuda.mem_get_info()[1]``,
``get_device_properties().total_memory``): less than the data sheet's, by what the driver keeps. An
engine sizes its budget from it (vLLM ``requested_memory = total · gpu_memory_utilization``), so a
serving run without ``capacity_gib`` takes it. Each value is printed in a public log, named beside it;
the same GPU prints a few hundredths of a GiB apart under other drivers (H100 80GB: 79.22 GiB in
vllm-project/vllm#10511, December 2024), so a log's own figure wins where it prints one.
"""

from __future__ import annotations

GPUS: dict[str, dict[str, float]] = {
    #          capacity  TFLOP/s   HBM GB/s  NVLink GB/s (per direction)  network GB/s
    "h100": {"capacity_gib": 80, "bf16_tflops": 989, "hbm_gbps": 3350, "nvlink_gbps": 450, "network_gbps": 50, "sm": 90},
    "h800": {"capacity_gib": 80, "bf16_tflops": 989, "hbm_gbps": 3350, "nvlink_gbps": 200, "network_gbps": 50, "sm": 90},
    "h200": {"capacity_gib": 141, "bf16_tflops": 989, "hbm_gbps": 4800, "nvlink_gbps": 450, "network_gbps": 50, "sm": 90},
    "a100": {"capacity_gib": 80, "bf16_tflops": 312, "hbm_gbps": 2039, "nvlink_gbps": 300, "network_gbps": 25, "sm": 80},
    "gb200": {"capacity_gib": 186, "bf16_tflops": 2500, "hbm_gbps": 8000, "nvlink_gbps": 900, "network_gbps": 50,
              "sm": 100},
    "b200": {"capacity_gib": 180, "bf16_tflops": 2250, "hbm_gbps": 8000, "nvlink_gbps": 900, "network_gbps": 50, "sm": 100},
    "a100-40gb": {"capacity_gib": 40, "bf16_tflops": 312, "hbm_gbps": 1555, "nvlink_gbps": 300, "network_gbps": 25,
                  "sm": 80},
    "l40s": {"capacity_gib": 48, "bf16_tflops": 362, "hbm_gbps": 864, "nvlink_gbps": 32, "network_gbps": 25, "sm": 89},
    "a6000": {"capacity_gib": 48, "bf16_tflops": 154.8, "hbm_gbps": 768, "nvlink_gbps": 56.25, "network_gbps": 25,
              "sm": 86},
    "rtx3090": {"capacity_gib": 24, "bf16_tflops": 71, "hbm_gbps": 936, "nvlink_gbps": 56.25, "network_gbps": 25,
                "sm": 86},
    "rtx4090": {"capacity_gib": 24, "bf16_tflops": 165.2, "hbm_gbps": 1008, "nvlink_gbps": 32, "network_gbps": 25,
                "sm": 89},
    "rtx-pro-6000": {"capacity_gib": 96, "bf16_tflops": 500, "hbm_gbps": 1792, "nvlink_gbps": 64, "network_gbps": 25,
                     "sm": 120},
    "rtx5090": {"capacity_gib": 32, "bf16_tflops": 209.5, "hbm_gbps": 1792, "nvlink_gbps": 64, "network_gbps": 25,
                "sm": 120},
    "a800": {"capacity_gib": 80, "bf16_tflops": 312, "hbm_gbps": 2039, "nvlink_gbps": 200, "network_gbps": 25, "sm": 80},
    "a40": {"capacity_gib": 48, "bf16_tflops": 149.7, "hbm_gbps": 696, "nvlink_gbps": 56.25, "network_gbps": 25, "sm": 86},
    "a30": {"capacity_gib": 24, "bf16_tflops": 165, "hbm_gbps": 933, "nvlink_gbps": 100, "network_gbps": 25, "sm": 80},
    "a10": {"capacity_gib": 24, "bf16_tflops": 125, "hbm_gbps": 600, "nvlink_gbps": 32, "network_gbps": 25, "sm": 86},
    "l4": {"capacity_gib": 24, "bf16_tflops": 121, "hbm_gbps": 300, "nvlink_gbps": 32, "network_gbps": 25, "sm": 89},
    "rtx-a4000": {"capacity_gib": 16, "bf16_tflops": 76.7, "hbm_gbps": 448, "nvlink_gbps": 32, "network_gbps": 25,
                  "sm": 86},
    "rtx-a5000": {"capacity_gib": 24, "bf16_tflops": 111.1, "hbm_gbps": 768, "nvlink_gbps": 56.25, "network_gbps": 25,
                  "sm": 86},
    "rtx4080": {"capacity_gib": 16, "bf16_tflops": 97.5, "hbm_gbps": 716.8, "nvlink_gbps": 32, "network_gbps": 25,
                "sm": 89},
    "rtx4070ti-super": {"capacity_gib": 16, "bf16_tflops": 88.2, "hbm_gbps": 672, "nvlink_gbps": 32, "network_gbps": 25,
                        "sm": 89},
    "rtx5080": {"capacity_gib": 16, "bf16_tflops": 112.6, "hbm_gbps": 960, "nvlink_gbps": 64, "network_gbps": 25,
                "sm": 120},
    "t4": {"capacity_gib": 16, "bf16_tflops": 65, "hbm_gbps": 320, "nvlink_gbps": 16, "network_gbps": 25, "sm": 75},
    "rtx-pro-4500": {"capacity_gib": 32, "bf16_tflops": 109.9, "hbm_gbps": 896, "nvlink_gbps": 64, "network_gbps": 25,
                     "sm": 120},
}

#: streaming multiprocessors per GPU kind (the data sheets above)
SM_COUNTS: dict[str, int] = {"h100": 132, "h800": 132, "h200": 132, "a100": 108, "gb200": 148, "b200": 148,
                             "a100-40gb": 108, "l40s": 142, "a6000": 84, "rtx3090": 82, "rtx4090": 128,
                             "rtx-pro-6000": 188, "rtx5090": 170, "a800": 108, "a40": 84, "a30": 56, "a10": 72,
                             "l4": 58, "rtx-a4000": 48, "rtx-a5000": 64, "rtx4080": 76, "rtx4070ti-super": 66, "rtx5080": 84,
                             "t4": 40, "rtx-pro-4500": 82}

#: MiB ``nvidia-smi --query-gpu=memory.total`` prints (SGLang sizes its defaults from it), each in the public
#: log named
NVIDIA_SMI_TOTAL_MIB: dict[str, int] = {
    "h100": 81559,  # H100 80GB HBM3: vllm-project/vllm#55169 (nvidia-smi table)
    "rtx4090": 24564,  # vllm-project/vllm#7553 and #7768 (nvidia-smi table)
    "h200": 143771,  # H200: traces/groundtruth-h200/context_probe.json (NVML total 150,754,820,096 B, driver 580.159.04)
    "b200": 183359,  # NVIDIA/TensorRT-LLM#10278 (nvidia-smi table)
    "gb200": 189471,  # public code index, ids 58750094259 and 54650828460 (nvidia-smi tables)
    "rtx-pro-6000": 97887,  # antirez/ds4#431 (every edition, ECC on or off)
    "h800": 81559,  # public code index, ids 70396795401 and 57382739794 (the H100 80GB HBM3's)
    "a800": 81920,  # vllm-project/vllm#41519, dexmal/dexbotic#41 (SXM4 and PCIe)
    "l4": 23034,  # modal-labs/modal-client#2797, lmstudio-ai/lmstudio-bug-tracker#1638
    "a10": 23028,  # QwenLM/Qwen3#678, modal-labs/modal-client#2797
    "t4": 15109,  # ECC on, as clouds run it: public code index, ids 12126150674, 18722886883 and 45251997209
    #               (nvidia-smi tables); 15,360 with ECC off
    "rtx-pro-4500": 32623,  # Server Edition, ECC on: vllm-project/vllm#51590 (a comment's table, driver 595.91.07)
}

#: GiB PyTorch reports as the device's total memory, each printed in the public log named
TORCH_TOTAL_GIB: dict[str, float] = {
    "h100": 79.19,  # H100 80GB HBM3: llm-d-incubation/llm-d-planner accuracy logs (vLLM 0.19.0, total_memory=79.19GiB)
    "a100": 79.22,  # A100-SXM4-80GB: a runtime record pinned as evidence (torch 2.9.1+cu128: get_device_properties
    #                 total_memory 85,056,798,720 B; public code index, id 57380434949)
    "a100-40gb": 39.38,  # A100 40GB PCIe: vllm-project/vllm#16570 (total_gpu_memory)
    "l40s": 44.42,  # vllm-project/vllm#15815 (total_gpu_memory)
    "a6000": 47.54,  # RTX A6000: vllm-project/vllm#10360 (total_gpu_memory=47.54GiB)
    "rtx3090": 23.58,  # vllm-project/vllm#10517 and #14447 (total_gpu_memory)
    "rtx4090": 23.64,  # 3DTopia/Phidias-Diffusion#8 (PyTorch's OOM message: "a total capacity of 23.64 GiB")
    "h200": 139.80,  # H200: traces/groundtruth-h200/non_torch.json (torch.cuda.mem_get_info total 150,109,880,320 B)
    "rtx5090": 31.36,  # GeForce RTX 5090: TrajectoryCrafter/TrajectoryCrafter#20 (OOM: "a total capacity of 31.36 GiB")
    "b200": 178.35,  # unslothai/unsloth#3411 ("Total VRAM: 178.35 GB", max memory 178.351), pytorch/ao#4002 (148 SMs)
    "gb200": 184.31,  # public code index, ids 53295161045 and 66768263030 (OOM: "a total capacity of 184.31 GiB")
    "rtx-pro-6000": 94.97,  # ls1intum/edutelligence#570 (vLLM: "Free memory on device cuda:0 (79.12/94.97 GiB)")
    "a800": 79.33,  # hahnyuan/PB-LLM#3 (OOM: "a total capacty of 79.33 GiB")
    "a40": 44.55,  # public code index, id 54349325738 (Unsloth, torch 2.9.1: max memory 44.549 GB)
    "a30": 23.53,  # google/RB-Modulation#5 (OOM: "a total capacty of 23.53 GiB")
    "a10": 22.18,  # OpenBMB/MiniCPM-V#640 (OOM: "a total capacity of 22.18 GiB")
    "l4": 22.03,  # ArcInstitute/evo2#190 (OOM: "a total capacity of 22.03 GiB")
    "rtx-a4000": 15.61,  # DengKaiCQ/VGGT-Long#6 (OOM: "a total capacity of 15.61 GiB")
    "rtx-a5000": 23.57,  # public code index, id 29278846479 (get_device_properties: total_memory=24138MB, i.e. MiB;
    #                      another pod's, id 36903445345, prints 24114MB under another driver)
    "rtx4080": 15.67,  # public code index, id 22567041692 (Linux: total_memory=16049MB; Windows reports ~15.99)
    "rtx4070ti-super": 15.60,  # kinggongzilla/whatsapp-ai-clone#12 (OOM: "a total capacity of 15.60 GiB")
    "rtx5080": 15.48,  # vllm-project/vllm#14452 (OOM: "a total capacity of 15.48 GiB")
    "t4": 14.7556,  # Tesla T4, ECC on: deviceQuery "Total amount of global memory: 15110 MBytes (15843721216 bytes)"
    #               (cudaDeviceProp.totalGlobalMem, what PyTorch reports), chiemon.github.io/2024/12/25/显卡信息.html
    "rtx-pro-4500": 31.38,  # Server Edition, ECC on: vllm-project/vllm#51590 (a comment: get_device_properties(0)
    #                         .total_memory = 33,689,829,376 B)
}

#: GPU kinds whose boards sit in NVSwitch systems (SXM); every other preset is a PCIe card
NVSWITCH = ("h100", "h800", "h200", "a100", "a800", "b200", "gb200")

#: what a GPU the presets do not hold must give in ``[hardware]``: every field a rule reads (the memory
#: rules: ``capacity_gib``, ``sm``, ``sms``; the op timings: ``bf16_tflops``, ``hbm_gbps``), with a data-sheet
#: example (the RTX A6000's) for the message
UNKNOWN_GPU_NEEDS: dict[str, str] = {
    "capacity_gib": "the GiB PyTorch reports as its total (torch.cuda.mem_get_info()[1] / 2**30), e.g. 47.54",
    "sm": "its compute capability × 10 (torch.cuda.get_device_capability(): (8, 6) → 86)",
    "sms": "its streaming multiprocessors (torch.cuda.get_device_properties(0).multi_processor_count), e.g. 84",
    "bf16_tflops": "its dense BF16 tensor TFLOP/s from the data sheet, e.g. 154.8",
    "hbm_gbps": "its memory bandwidth in GB/s from the data sheet, e.g. 768",
}
#: what such a GPU must also give when the job spans more than one GPU: how they connect
UNKNOWN_GPU_NEEDS_MULTI: dict[str, str] = {
    "interconnect": '"nvswitch" (SXM boards) or "pcie"',
    "nvlink_gbps": "GB/s per direction between two GPUs of a node (PCIe Gen4 x16: 32, Gen5: 64)",
    "network_gbps": "GB/s per GPU between nodes (one 400 Gb/s NIC: 50)",
}


def preset_values(gpu: str) -> dict[str, float | int | str]:
    """The ``[hardware]`` values preset kind ``gpu`` fills in (data sheet, SM count, interconnect)."""
    return {**GPUS[gpu], "sms": SM_COUNTS.get(gpu, 0), "interconnect": "nvswitch" if gpu in NVSWITCH else "pcie"}


def fill_gpu(values: dict, gpus: int, where: str = "hardware") -> list[tuple[str, str]]:
    """Fill ``values`` (a ``[hardware]`` table) from its ``gpu``'s preset; for a kind no preset holds, the
    problems naming each field the run file must give instead (``gpus``: how many GPUs the job spans —
    over one, how they connect is needed too). A preset's fields are defaults: the run file's win."""
    gpu = values.get("gpu")
    if not isinstance(gpu, str) or not gpu.strip():
        return [(f"{where}.gpu", f"{gpu!r} is not a GPU name; use a preset ({', '.join(GPUS)}) or any name with "
                 "its fields given")]
    if gpu in GPUS:
        for k, v in preset_values(gpu).items():
            values.setdefault(k, v)
        return []
    needs = dict(UNKNOWN_GPU_NEEDS)
    if gpus > 1:
        needs.update(UNKNOWN_GPU_NEEDS_MULTI)
    missing = [k for k in needs if k not in values]
    if not missing:
        return []
    lines = "; ".join(f"{k} = {needs[k]}" for k in missing)
    return [(f"{where}.gpu", f"{gpu!r} is no preset ({', '.join(GPUS)}): give its fields in [{where}] — {lines}")]
