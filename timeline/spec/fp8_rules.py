"""Run-level rules of FP8 training (``[training] fp8_recipe`` / ``fp8_param_gather``): which jobs
Megatron-LM itself runs with them. This module decides no bytes (``timeline.profiles.megatron_fp8``
does)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from timeline.spec.framework import FrameworkSpec
    from timeline.spec.run import TrainingSpec

MC_ARGS = "NVIDIA/Megatron-LM@d98e8a64dd:megatron/training/arguments.py: validate_args"


def fp8_problems(tr: TrainingSpec, fw: FrameworkSpec, *, reads_framework: bool) -> list[tuple[str, str]]:
    """(key path, message) of every FP8 setting the run cannot have; ``reads_framework``: the run's
    profile is the megatron one (the only one with Transformer Engine's FP8 linears)."""
    out: list[tuple[str, str]] = []
    bf16 = tr.fp8_bf16_first_layers or tr.fp8_bf16_last_layers
    if bf16 and tr.fp8_recipe == "delayed":
        # transformer_config.py __post_init__: "Delayed scaling does not support first / last layer in BF16."
        out.append(("training.fp8_bf16_first_layers", "Megatron-LM keeps no layer in bf16 under the delayed recipe "
                    "(transformer_config.py raises); use fp8_recipe = \"tensorwise\" or 0 bf16 layers"))
    if tr.fp8_recipe == "none":
        if bf16:
            out.append(("training.fp8_bf16_first_layers", "bf16 first/last layers are an FP8 run's exception: set an "
                        "fp8_recipe, or 0 bf16 layers"))
        if tr.fp8_param_gather:
            out.append(("training.fp8_param_gather", 'FP8 parameters need an FP8 recipe: set fp8_recipe = '
                        '"delayed" or "tensorwise" (Megatron: --fp8-param-gather with --fp8-format)'))
        return out
    if not reads_framework:
        out.append(("training.fp8_recipe", 'models Transformer Engine\'s FP8 linears: set profile = "megatron"'))
    elif fw.transformer_impl != "transformer_engine":
        out.append(("training.fp8_recipe", 'FP8 GEMMs are Transformer Engine\'s: set framework.transformer_impl = '
                    '"transformer_engine"'))
    if tr.fp8_param_gather and tr.zero != 1:
        # MC_ARGS: '--fp8-param-gather only supported with distributed optimizer, torch fsdp2, megatron fsdp, …'
        out.append(("training.fp8_param_gather", "Megatron-LM keeps FP8 parameters only under the distributed "
                    "optimizer (arguments.py: validate_args); set training.zero = 1"))
    return out
