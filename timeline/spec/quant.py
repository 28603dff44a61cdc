"""A checkpoint's quantization as its Hugging Face ``quantization_config`` publishes it.

Read by :mod:`timeline.io.hf_quant`; turned into the bytes a device loads by
:mod:`timeline.serve.weights`. One record per checkpoint: the method, the stored weight format
and its scale layout, and the modules the checkpoint keeps in the model dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the formats :mod:`timeline.serve.weights` lays out (vLLM's method names, ``auto-round`` for AutoRound's)
QUANT_METHODS = ("fp8", "awq", "gptq", "mxfp4", "compressed-tensors", "modelopt", "bitsandbytes", "auto-round")


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerOverride:
    """AutoRound's ``extra_config`` entry: one layer (a module name, or a regular expression) stored at other bits."""

    pattern: str
    bits: int  # 16 or more: kept in the model dtype
    group_size: int
    sym: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointQuant:
    method: str  # one of QUANT_METHODS
    weight_dtype: str  # "fp8" | "int4" | "int8" | "mxfp4" | "nvfp4" | "nf4": the serving spec's name for the format
    bits: int  # bits per stored weight element
    group_size: int  # input elements per scale; 0: one scale per output channel; -1: one per tensor
    block_rows: int = 0  # fp8 block quantization: output rows per scale (weight_block_size[0]); 0 otherwise
    zero_point: bool = False  # zeros stored beside the scales (AWQ zero_point, GPTQ always, compressed-tensors asym)
    desc_act: bool = False  # GPTQ act-order (g_idx is stored either way)
    sym: bool = True  # symmetric integer weights (GPTQ / AutoRound ``sym``): what Marlin kernels take
    experts_only: bool = False  # only the MoE experts are quantized (GPT-OSS's MXFP4)
    int8_activations: bool = False  # compressed-tensors W8A8 int8: int8 weights with fp32 scales, not packed
    weight_only: bool = False  # fp4 weights without activation quantization (compressed-tensors W4A16 NVFP4 / MXFP4)
    # the vLLM linear method an integer GPTQ / AWQ / AutoRound checkpoint ends in when the engine picks (no
    # --quantization): "gptq_marlin" / "awq_marlin" where the config is Marlin-compatible (the device decides
    # again), else "gptq" / "awq"; "" for the other methods
    packing: str = ""
    overrides: tuple[LayerOverride, ...] = ()  # AutoRound's per-layer extra_config
    # layers with schemes of their own (compressed-tensors config groups, ModelOpt MIXED_PRECISION): (targets,
    # scheme) — a layer no target names stays in the model dtype (timeline.serve.quant_layout.scheme_for)
    schemes: tuple[tuple[tuple[str, ...], CheckpointQuant], ...] = ()
    kv_fp8: bool = False  # ModelOpt's kv_cache_quant_algo / kv_cache_scheme is fp8 (the KV cache's default dtype)
    not_converted: tuple[str, ...] = ()  # module patterns kept in the model dtype (modules_to_not_convert / ignore)
    source: str = ""  # the config's quant_method and format, for notes

    @property
    def run_group_size(self) -> int:
        """The value ``serving.quant_group_size`` takes for this checkpoint (0: per channel)."""
        if self.weight_dtype == "mxfp4":
            return 32
        if self.block_rows:
            return self.group_size
        return max(self.group_size, 0)
