"""Profiles' lifecycle facts that run validation needs (DESIGN §5).

A profile names how a framework saves tensors and manages state. The graph layer holds the
shape rules (:mod:`timeline.graph.profiles`, :mod:`timeline.graph.saved`); this table holds what
decides whether a run is possible at all — the highest ZeRO level the framework offers and
whether it models one device per model replica — so :func:`timeline.spec.validate.validate_run`
reads a table, never ``if profile == …``. This module does not build or size anything.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileLifecycle:
    name: str
    #: highest ZeRO level the framework offers
    max_zero: int
    #: why ZeRO stops at ``max_zero`` (said when a run asks for more)
    zero_note: str = ""
    #: one device per model replica: no pipeline, tensor, expert or context parallelism
    single_device: bool = False
    #: the profile to suggest for what this one cannot do
    instead: str = "megatron"
    #: why attention with learned sinks cannot run under context parallelism ("": it can)
    sinks_cp_note: str = ""


#: profile name → lifecycle facts, in the order ``model.profile`` lists them (megatron is the default)
PROFILES: dict[str, ProfileLifecycle] = {
    "megatron": ProfileLifecycle(name="megatron", max_zero=1, instead="paper",
                                 zero_note="its distributed optimizer is zero = 1",
                                 # NVIDIA/TransformerEngine@v2.8 attention/dot_product_attention/utils.py
                                 # get_attention_backend: "Filter: Softmax type"
                                 sinks_cp_note="Transformer Engine 2.8 runs a learnable softmax under context "
                                               "parallelism only with cp_comm_type = a2a, not the KV ring "
                                               "this profile models"),
    "paper": ProfileLifecycle(name="paper", max_zero=3, zero_note="ZeRO 0–3 as DeepSpeed defines them"),
    "hf": ProfileLifecycle(name="hf", max_zero=3, single_device=True,
                           zero_note="FSDP or DeepSpeed for ZeRO 2/3"),
}

#: ``[parallel]`` keys a single-device profile requires to be 1
MODEL_PARALLEL_KEYS = ("pp", "tp", "ep", "cp")
