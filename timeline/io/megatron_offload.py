"""Megatron-LM's fine-grained activation offloading arguments → ``[offload]``.

``--fine-grained-activation-offloading --offload-modules M …`` (core_v0.16.0 … main; ``transformer_config.py:
TransformerConfig``'s ``fine_grained_activation_offloading``, ``offload_modules``, ``min_offloaded_tensor_size``):
the groups and their timing are :mod:`timeline.graph.offload` and :mod:`timeline.sim.offload`, read at f5b2ec0130.
"""

from __future__ import annotations

from timeline.errors import UserError
from timeline.io.megatron_map import ArgReader, Conversion, module_names
from timeline.profiles.megatron_workspaces import version_tuple
from timeline.spec.cuda_graph_rules import megatron_release
from timeline.spec.run import OFFLOAD_MODULES

#: the first Megatron-Core release whose ``validate_args`` asserts ``NVTE_CPU_OFFLOAD_V1=1`` under TE ≥ 2.10
#: (b97184db56 "Fine-grained activation offloading", in core_v0.16.0): every release after 0.16.0's candidates
ASSERTS_OFFLOAD_V1 = (0, 16, 0, 2**31)

#: modules later Megatron-LM offloads too, with what they wrap (main at d98e8a64dd)
LATER_MODULES = {"fused_group_mlp": "the TE op fuser's fused grouped MLP (5c660c3b4a)",
                 "gdp_qkv": "the gated delta-product mixer's QKV convolution input"}


def activation_offload(a: ArgReader, c: Conversion, env: dict[str, str]) -> None:
    """``[offload] modules`` and ``min_elements`` from the offloading arguments, refusing in one line what Megatron-LM
    refuses (``arguments.py: validate_args``: TE only, and with TE ≥ 2.10 ``NVTE_CPU_OFFLOAD_V1=1`` from core_v0.16.0;
    ``TransformerConfig.__post_init__``: at least one module, all known, ``attn_proj`` only with ``core_attn``) and
    the modules of later versions not modelled (:data:`LATER_MODULES`). ``--activation-offload-fraction`` and
    ``--delta-offload-bytes-across-pp-ranks`` (Megatron-LM 69c486825c on) drive ``post_warmup_callback``'s later
    rules (:mod:`timeline.sim.offload`)."""
    if not a.flag("--fine-grained-activation-offloading"):
        return
    mods = module_names(a.value("--offload-modules", ()))
    if not mods:
        raise UserError("--fine-grained-activation-offloading without --offload-modules: Megatron-LM asserts at least "
                        "one module (transformer_config.py); name them, e.g. --offload-modules core_attn attn_proj")
    later = [m for m in mods if m in LATER_MODULES]
    if later:
        raise UserError(f"--offload-modules {later[0]}: {LATER_MODULES[later[0]]}'s offload group is not modelled yet")
    unknown = [m for m in mods if m not in OFFLOAD_MODULES]
    if unknown:
        raise UserError(f"--offload-modules {' '.join(unknown)}: not a module Megatron-LM offloads; choose from "
                        f"{', '.join(OFFLOAD_MODULES)}")
    if "attn_proj" in mods and "core_attn" not in mods:
        raise UserError("--offload-modules attn_proj without core_attn: Megatron-LM raises (the output projection's "
                        "input is the core attention's output, which its backward needs); add core_attn")
    if a.str("--transformer-impl", "transformer_engine") != "transformer_engine":
        raise UserError("--fine-grained-activation-offloading needs --transformer-impl transformer_engine "
                        "(Megatron-LM asserts it: arguments.py validate_args)")
    fw = c.sections.get("framework", {})
    te, mc = str(fw.get("transformer_engine", "")), str(fw.get("megatron_core", ""))
    if te and version_tuple(te) >= (2, 10) and env.get("NVTE_CPU_OFFLOAD_V1", "0") != "1":
        # the assertion came with b97184db56 (2026-01-16, first released in core_v0.16.0); main's and dev's
        # 0.16.0rc0 snapshots span both sides of it, and ran without it before
        if megatron_release(mc) >= ASSERTS_OFFLOAD_V1:
            raise UserError(f"--fine-grained-activation-offloading with Transformer Engine {te}: Megatron-LM asserts "
                            "NVTE_CPU_OFFLOAD_V1=1 from TE 2.10 on (so that TE offloads no weights); set it in the "
                            "job's environment")
        c.notes.append(f"--fine-grained-activation-offloading with Transformer Engine {te} and no "
                       "NVTE_CPU_OFFLOAD_V1=1: a Megatron-LM snapshot before b97184db56 runs it; what TE's own CPU "
                       "offload then does with the weights is not modelled (the activations' offload is)")
    fraction = a.float("--activation-offload-fraction", 1.0)
    if not 0.0 <= fraction <= 1.0:
        raise UserError(f"--activation-offload-fraction {fraction}: Megatron-LM asserts a share between 0 and 1")
    delta = a.int("--delta-offload-bytes-across-pp-ranks", 0)
    if delta < 0:
        raise UserError(f"--delta-offload-bytes-across-pp-ranks {delta}: Megatron-LM asserts it is not negative")
    c.put("offload.modules", mods, "--fine-grained-activation-offloading", "--offload-modules")
    c.put("offload.min_elements", a.int("--min-offloaded-tensor-size", 1024 * 1024), "--min-offloaded-tensor-size")
    if fraction != 1.0:
        c.put("offload.fraction", fraction, "--activation-offload-fraction")
    if delta:
        c.put("offload.delta_bytes", delta, "--delta-offload-bytes-across-pp-ranks")
    if a.value("--fine-grained-offloading-max-inflight-offloads") is not None:
        c.mapped.setdefault("--fine-grained-offloading-max-inflight-offloads", "(read; sets no key of its own)")
        c.notes.append("--fine-grained-offloading-max-inflight-offloads: the compute stream waits for older copies to "
                       "the host; the model frees an offloaded tensor at its group's commit, as if every copy kept up")
