"""Run-level rules of CUDA-graphed Megatron jobs (``[framework] cuda_graph_impl`` / ``cuda_graph_scope``):
which jobs Megatron-LM itself captures, and which of them this simulator models. This module decides no
bytes (``timeline.graph.cuda_graphs`` does)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from timeline.spec.framework import CUDA_GRAPH_SCOPES

if TYPE_CHECKING:
    from timeline.spec.framework import FrameworkSpec
    from timeline.spec.model import ModelSpec
    from timeline.spec.run import RecomputeSpec, ScheduleSpec, TrainingSpec

MC_CONFIG = ("NVIDIA/Megatron-LM@11debfa7b4:megatron/core/transformer/transformer_config.py: __post_init__, "
             "'moe cuda graph is only supported with drop-padding MoE'")
MC_HELPER = "NVIDIA/Megatron-LM@268fda0859:megatron/core/transformer/cuda_graphs.py: TECudaGraphHelper.__init__"

MC_SCOPES = ("NVIDIA/Megatron-LM@4e85d74ae9:megatron/core/transformer/transformer_config.py: __post_init__ "
             "(the cuda_graph_scope checks)")
#: selective-recompute modules inside the graphed part of a layer, per graphed module (a recomputed region
#: captured inside a graph replays its forward inside the backward graph: not modelled)
REGION_MODULES = {"attn": ("core_attn", "mla_up_proj", "layernorm"), "mlp": ("mlp", "layernorm"),
                  "moe_router": ("shared_experts",)}


def megatron_release(version: str | None) -> tuple[int, int, int, int]:
    """``X.Y.Z[rcN]`` → (X, Y, Z, N), a release after every one of its candidates (N = 2**31); None: the
    newest."""
    if not version:
        return (2**31,) * 4
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?(?:rc(\d+))?", version.strip())
    if m is None:
        return (2**31,) * 4
    x, y, z, rc = m.groups()
    return int(x), int(y), int(z or 0), int(rc) if rc is not None else 2**31


def capture_before_first_step(megatron_core: str | None) -> bool:
    """Whether Megatron-LM captures before the first step whatever ``--cuda-graph-warmup-steps`` says (core
    ≤ 0.15.0rc5, ``training.py: train_step``@2b6b46b796); from core_v0.15.0rc6 (c173615753) it captures at
    iteration ``--cuda-graph-warmup-steps``."""
    return megatron_release(megatron_core) < (0, 15, 0, 6)


def scope_modules(scope: str) -> frozenset[str]:
    """The graphed modules ``[framework] cuda_graph_scope`` names; empty for "full" (the whole layer)."""
    words = frozenset(scope.split())
    return frozenset() if words == {"full"} else words


def scope_problems(scope: str, m: ModelSpec, fw: FrameworkSpec, tr: TrainingSpec) -> list[tuple[str, str]]:
    """Megatron's own checks of the modules (:data:`MC_SCOPES`), and the ones this simulator does not model."""
    key, words = "framework.cuda_graph_scope", scope.split()
    unknown = [w for w in words if w not in CUDA_GRAPH_SCOPES and w != "full"]
    if not words or unknown or ("full" in words and len(words) > 1):
        return [(key, f"{scope!r}: give \"full\" (the whole layer) or modules among {', '.join(CUDA_GRAPH_SCOPES)}, "
                 "space-separated")]
    mods, out = scope_modules(scope), []
    if "moe" in mods and "moe_router" in mods:
        out.append((key, f"names both moe and moe_router, which Megatron-LM refuses ({MC_SCOPES}); keep one"))
    if "moe_preprocess" in mods and "moe_router" not in mods:
        out.append((key, f"moe_preprocess needs moe_router ({MC_SCOPES}); add it"))
    if mods & {"moe", "moe_router", "moe_preprocess"} and not m.is_moe:
        out.append((key, "names MoE modules for a dense model, which Megatron-LM refuses; use attn and mlp"))
    if "mlp" in mods and m.is_moe and not any(not m.is_moe_layer(i) for i in range(m.num_hidden_layers)):
        out.append((key, "names mlp, but every layer is an MoE layer, which Megatron-LM refuses; drop mlp"))
    if "moe_preprocess" in mods and fw.moe_token_dispatcher == "alltoall" and tr.capacity_factor:
        out.append((key, "moe_preprocess with the alltoall dispatcher and a capacity factor (device-to-host "
                    f"copies in the preprocess), which Megatron-LM refuses ({MC_SCOPES}); drop moe_preprocess"))
    return out


def cuda_graph_problems(fw: FrameworkSpec, m: ModelSpec, *, profile: str, rc: RecomputeSpec, sched: ScheduleSpec,
                        expandable_segments: bool, tr: TrainingSpec) -> list[tuple[str, str]]:
    """(key path, message) of every CUDA-graph setting the run cannot have."""
    out: list[tuple[str, str]] = []
    if fw.cuda_graph_impl == "none":
        return out
    out += scope_problems(fw.cuda_graph_scope, m, fw, tr)
    if out:
        return out
    mods = scope_modules(fw.cuda_graph_scope)
    key = "framework.cuda_graph_impl"
    if profile != "megatron":
        out.append((key, 'models Megatron-LM\'s CUDA graphs: set model.profile = "megatron"'))
    if fw.transformer_impl != "transformer_engine":
        out.append((key, 'TE\'s make_graphed_callables captures TE layers: set framework.transformer_impl = '
                    '"transformer_engine"'))
    # TECudaGraphHelper.__init__ asserts it away before 2b343d739f (2025-12-31, main's 0.16.0rc0 taken to have it;
    # core_v0.16.0), and from it on asks for NCCL_GRAPH_REGISTER=0 (from-megatron checks the job's environment)
    if expandable_segments and megatron_release(fw.megatron_core) < (0, 16, 0, 0):
        out.append(("allocator.expandable_segments", f"Megatron refuses CUDA graphs with expandable segments "
                    f"({MC_HELPER}); set it false"))
    if sched.kind not in ("1f1b", "interleaved"):
        out.append(("schedule.kind", "the graphs are captured in Megatron's 1F1B / interleaved order "
                    "(get_schedule_table); use kind = \"1f1b\" or \"interleaved\""))
    if sched.combined_1f1b and (not mods or mods & {"mlp", "moe"}):  # transformer_config.py: __post_init__
        out.append(("framework.cuda_graph_scope", "combined 1F1B (--overlap-moe-expert-parallel-comm) takes no graph "
                    f"of a whole layer, MLP or MoE ({MC_SCOPES}); use attn, moe_router, moe_preprocess"))
    if fw.fsdp_sharding:
        out.append((key, "CUDA graphs of a Megatron-FSDP job (its units gathered around the captured layers) are "
                    "not modelled; set framework.cuda_graph_impl = \"none\" or framework.fsdp_sharding = \"\""))
    if m.mtp_layers and capture_before_first_step(fw.megatron_core):
        out.append(("model.mtp_layers", "the MTP layers' graphs before Megatron-Core 0.15.0rc6 (training.py: "
                    "cuda_graph_capture) are not modelled; set framework.megatron_core to 0.15.0rc6 or later, "
                    "model.mtp_layers = 0 or framework.cuda_graph_impl = \"none\""))
    if m.is_hybrid:
        out.append(("model.hybrid_override_pattern", "Mamba layers' graphs are not modelled with CUDA graphs; "
                    "set framework.cuda_graph_impl = \"none\""))
    if (not mods or "moe" in mods) and m.is_moe:
        out.append(("framework.cuda_graph_scope", "a whole MoE layer in a graph needs drop-and-pad routing "
                    f"({MC_CONFIG}) and is not modelled; use \"attn moe_router moe_preprocess\""))
    if rc.policy == "full":
        out.append(("recompute.policy", "a recomputed layer inside a captured graph is not modelled; "
                    "use none or selective"))
    elif rc.policy == "selective":
        if "moe" in rc.modules and "moe_router" in mods:  # transformer_config.py: __post_init__
            out.append(("recompute.modules", f"moe with a moe_router graph, which Megatron-LM refuses ({MC_SCOPES}); "
                        "recompute moe_act or drop moe_router"))
        inside = {mod for scope in (mods or REGION_MODULES) for mod in REGION_MODULES.get(scope, ())}
        # the pre-MLP norm's recompute: Megatron keeps it inside a router graph that also holds the preprocess
        # with the alltoall dispatcher or a latent MoE, and turns it off otherwise (transformer_layer.py:
        # can_recompute_pre_mlp_layernorm_for_cudagraph; profiles/megatron.py router_graph_drops_norm_recompute)
        if "moe_preprocess" in mods and (fw.moe_token_dispatcher == "alltoall" or m.moe_latent_size):
            inside.add("layernorm")
        if not mods or any(mod in inside for mod in rc.modules):
            out.append(("recompute.modules", "a recomputed module inside the graphed part of a layer is not "
                        f"modelled (scope {fw.cuda_graph_scope}); recompute only modules outside it"))
    return out
