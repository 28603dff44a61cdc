"""A checkpoint's quantization as its Hugging Face ``quantization_config`` publishes it.

Read by :mod:`timeline.io.hf_quant`; turned into the bytes a device loads by
:mod:`timeline.serve.weights`. One record per checkpoint: the method, the stored weight format
and its scale layout, and the modules the checkpoint keeps in the model dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the formats :mod:`timeline.serve.weights` lays out
QUANT_METHODS = ("fp8", "awq", "gptq", "mxfp4", "compressed-tensors")


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointQuant:
    method: str  # one of QUANT_METHODS
    weight_dtype: str  # "fp8" | "int4" | "int8" | "mxfp4": the serving spec's name for the stored format
    bits: int  # bits per stored weight element
    group_size: int  # input elements per scale; 0: one scale per output channel; -1: one per tensor
    block_rows: int = 0  # fp8 block quantization: output rows per scale (weight_block_size[0]); 0 otherwise
    zero_point: bool = False  # zeros stored beside the scales (AWQ zero_point, GPTQ always, compressed-tensors asym)
    desc_act: bool = False  # GPTQ act-order (g_idx is stored either way)
    experts_only: bool = False  # only the MoE experts are quantized (MXFP4)
    int8_activations: bool = False  # compressed-tensors W8A8 int8: int8 weights with fp32 scales, not packed
    not_converted: tuple[str, ...] = ()  # module patterns kept in the model dtype (modules_to_not_convert / ignore)
    source: str = ""  # the config's quant_method and format, for notes

    @property
    def run_group_size(self) -> int:
        """The value ``serving.quant_group_size`` takes for this checkpoint (0: per channel)."""
        if self.method == "mxfp4":
            return 32
        if self.block_rows:
            return self.group_size
        return max(self.group_size, 0)
