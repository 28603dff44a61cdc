"""Run-level rules of CUDA-graphed Megatron jobs (``[framework] cuda_graph_impl`` / ``cuda_graph_scope``):
which jobs Megatron-LM itself captures, and which of them this simulator models. This module decides no
bytes (``timeline.graph.cuda_graphs`` does)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from timeline.spec.framework import FrameworkSpec
    from timeline.spec.model import ModelSpec
    from timeline.spec.run import RecomputeSpec, ScheduleSpec

MC_CONFIG = ("NVIDIA/Megatron-LM@11debfa7b4:megatron/core/transformer/transformer_config.py: __post_init__, "
             "'moe cuda graph is only supported with drop-padding MoE'")
MC_HELPER = "NVIDIA/Megatron-LM@268fda0859:megatron/core/transformer/cuda_graphs.py: TECudaGraphHelper.__init__"

#: selective-recompute modules inside the graphed part of a layer under scope attn (a recomputed region
#: captured inside a graph replays its forward inside the backward graph: not modelled)
ATTN_REGION_MODULES = ("core_attn", "mla_up_proj", "layernorm")


def cuda_graph_problems(fw: FrameworkSpec, m: ModelSpec, *, profile: str, rc: RecomputeSpec, sched: ScheduleSpec,
                        expandable_segments: bool) -> list[tuple[str, str]]:
    """(key path, message) of every CUDA-graph setting the run cannot have."""
    out: list[tuple[str, str]] = []
    if fw.cuda_graph_impl == "none":
        return out
    key = "framework.cuda_graph_impl"
    if profile != "megatron":
        out.append((key, 'models Megatron-LM\'s CUDA graphs: set model.profile = "megatron"'))
    if fw.transformer_impl != "transformer_engine":
        out.append((key, 'TE\'s make_graphed_callables captures TE layers: set framework.transformer_impl = '
                    '"transformer_engine"'))
    if expandable_segments:  # TECudaGraphHelper.__init__ asserts it away
        out.append(("allocator.expandable_segments", f"Megatron refuses CUDA graphs with expandable segments "
                    f"({MC_HELPER}); set it false"))
    if sched.kind not in ("1f1b", "interleaved") or sched.combined_1f1b:
        out.append(("schedule.kind", "the graphs are captured in Megatron's 1F1B / interleaved order "
                    "(get_schedule_table); use kind = \"1f1b\" or \"interleaved\" without combined_1f1b"))
    if fw.fsdp_sharding:
        out.append((key, "CUDA graphs of a Megatron-FSDP job (its units gathered around the captured layers) are "
                    "not modelled; set framework.cuda_graph_impl = \"none\" or framework.fsdp_sharding = \"\""))
    if m.mtp_layers:
        out.append(("model.mtp_layers", "the MTP layers' graphs (cuda_graphs.py: TECudaGraphHelper, callables_is_mtp) "
                    "are not modelled with CUDA graphs; set 0 or framework.cuda_graph_impl = \"none\""))
    if m.is_hybrid:
        out.append(("model.hybrid_override_pattern", "Mamba layers' graphs are not modelled with CUDA graphs; "
                    "set framework.cuda_graph_impl = \"none\""))
    if fw.cuda_graph_scope == "full" and m.is_moe:
        out.append(("framework.cuda_graph_scope", "a whole MoE layer in a graph needs drop-and-pad routing "
                    f"({MC_CONFIG}) and is not modelled; use \"attn\""))
    if rc.policy == "full":
        out.append(("recompute.policy", "a recomputed layer inside a captured graph is not modelled; "
                    "use none or selective"))
    elif rc.policy == "selective" and (fw.cuda_graph_scope == "full"
                                       or any(mod in ATTN_REGION_MODULES for mod in rc.modules)):
        out.append(("recompute.modules", "a recomputed module inside the graphed part of a layer is not "
                    f"modelled (scope {fw.cuda_graph_scope}); recompute only modules outside it"))
    return out
