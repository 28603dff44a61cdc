"""Durations: a roofline for compute ops and an alpha-beta model for communication.

Compute: ``max(flops / (peak · efficiency), bytes / HBM bandwidth)``. Communication:
``latency + bytes / (bandwidth · comm_efficiency)``, where the bandwidth is NVLink for
tensor-parallel collectives (and expert all-to-all when the EP group fits in one 8-GPU node),
the network otherwise. Measured durations from a trace replace this model when given.
This module knows nothing about schedules or memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from timeline.graph.ops import Op, OpCost
from timeline.spec.run import HardwareSpec, ParallelSpec

GPUS_PER_NODE = 8


@dataclass(frozen=True, slots=True)
class CostModel:
    flops_per_us: float
    hbm_bytes_per_us: float
    nvlink_bytes_per_us: float
    network_bytes_per_us: float
    latency_us: float
    ep_on_nvlink: bool

    @classmethod
    def of(cls, hw: HardwareSpec, par: ParallelSpec) -> CostModel:
        """The cost model of a device ``hw`` in the parallel layout ``par``."""
        return cls(
            flops_per_us=hw.bf16_tflops * 1e6 * hw.efficiency,
            hbm_bytes_per_us=hw.hbm_gbps * 1e3,
            nvlink_bytes_per_us=hw.nvlink_gbps * 1e3 * hw.comm_efficiency,
            network_bytes_per_us=hw.network_gbps * 1e3 * hw.comm_efficiency,
            latency_us=hw.latency_us,
            ep_on_nvlink=par.ep * par.etp <= GPUS_PER_NODE,
        )

    def compute_us(self, flops: float, bytes_moved: float = 0.0) -> float:
        return max(flops / self.flops_per_us, bytes_moved / self.hbm_bytes_per_us)

    def comm_us(self, nbytes: float, stream: str) -> float:
        if nbytes <= 0:
            return 0.0
        fast = stream == "tp" or (stream == "ep" and self.ep_on_nvlink)
        bw = self.nvlink_bytes_per_us if fast else self.network_bytes_per_us
        return self.latency_us + nbytes / bw

    def op_us(self, op: Op | OpCost) -> float:
        if op.kind == "compute":
            return self.compute_us(op.flops, op.bytes_moved)
        return self.comm_us(op.bytes_moved, op.stream)
