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
}

#: streaming multiprocessors per GPU kind (the data sheets above)
SM_COUNTS: dict[str, int] = {"h100": 132, "h800": 132, "h200": 132, "a100": 108, "gb200": 148, "b200": 148}
