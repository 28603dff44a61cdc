"""DeepSeek-V3 multi-token prediction module (README_WEIGHTS.md of DeepSeek-V3): enorm,
hnorm, eh_proj [h, 2h], one full decoder layer and the shared head's norm; the embedding and
output head are shared with the main model. Megatron builds an embedding on the MTP stage
when it is not the first (profile rule ``mtp_embedding``). Everything is tagged ``mtp``.
"""

from __future__ import annotations

from dataclasses import replace

from timeline.graph.context import BuildCtx
from timeline.graph.layers.embedding import embedding_params
from timeline.graph.layers.norm import norm_params
from timeline.graph.tensors import TensorDef, param


def mtp_params(ctx: BuildCtx, index: int, layer_params: list[TensorDef]) -> list[TensorDef]:
    """Params of MTP module ``index`` around an already-built decoder layer."""
    h = ctx.model.hidden_size
    prefix = f"mtp.{index}"
    out = norm_params(ctx, f"{prefix}.enorm", h, module="mtp") + norm_params(ctx, f"{prefix}.hnorm", h,
                                                                             module="mtp")
    split = ctx.tp if ctx.profile.mtp_eh_proj_tp_split else 1
    out.append(param(f"{prefix}.eh_proj.weight", (h, 2 * h), module="mtp", dtype=ctx.dtype, split=split))
    out += [replace(t, module="mtp") for t in layer_params]
    out += norm_params(ctx, f"{prefix}.shared_head.norm", h, module="mtp")
    return out


def mtp_embedding_params(ctx: BuildCtx) -> list[TensorDef]:
    return embedding_params(ctx, prefix="mtp.embedding", module="mtp")
