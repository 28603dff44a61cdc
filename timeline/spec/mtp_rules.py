"""Where a run may place its MTP layers (``parallel.mtp_stage``): run validation's rules, one line each.

By default the MTP layers are built on the last virtual stage, with the head and the loss. From
Megatron-Core 0.16.0 (Megatron-LM 5247a1f460, "Support placing MTP layers into standalone stages") a
pipeline layout may put them on an earlier virtual stage; ``megatron/core/transformer/
pipeline_parallel_layer_layout.py: PipelineParallelLayerLayout.validate_layer_layout`` (core_v0.16.0 …
d98e8a64dd) then wants all of them in one virtual stage, that stage the last virtual stage of its
pipeline rank, and no decoder layer after them. Its first-rank restriction only tests the rank's earlier
virtual stages, which hold no MTP anyway, so it adds nothing. This module decides no bytes.
"""

from __future__ import annotations

from timeline.spec.engine_versions import parse_version
from timeline.spec.framework import FrameworkSpec
from timeline.spec.run import ParallelSpec
from timeline.spec.schedule_rules import SCHEDULE_KINDS

#: the Megatron-Core release that first builds MTP apart from the loss (5247a1f460, 2026-01-15)
STANDALONE_MTP = (0, 16, 0)


def mtp_stage_problems(par: ParallelSpec, layout: list[int], *, mtp_layers: int, schedule_kind: str,
                       framework: FrameworkSpec, reads_framework: bool) -> list[tuple[str, str]]:
    """The problems of ``par.mtp_stage`` (none when unset); ``layout``: decoder layers per virtual stage;
    ``reads_framework``: the run's profile is Megatron's (it alone builds a standalone MTP stage)."""
    key = "parallel.mtp_stage"
    stage = par.mtp_stage
    if stage is None:
        return []
    chunks = par.pp * par.vpp
    if not mtp_layers:
        return [(key, "places the MTP layers, but the model has none (model.mtp_layers = 0); remove it")]
    if stage >= chunks:
        return [(key, f"{stage} is not a virtual stage; there are pp·vpp = {chunks} (0 … {chunks - 1})")]
    if stage == chunks - 1:
        return []  # the default placement, with the loss
    if not reads_framework:
        return [(key, 'MTP apart from the loss is Megatron-Core\'s standalone MTP stage: set profile = "megatron" '
                 f"or mtp_stage = {chunks - 1}")]
    version = parse_version(framework.megatron_core)
    if version is None or version < STANDALONE_MTP:
        return [(key, f"Megatron-Core builds MTP apart from the loss from 0.16.0 on (framework.megatron_core is "
                 f"{framework.megatron_core!r}); set megatron_core = \"0.16.0\" or later, or mtp_stage = {chunks - 1}")]
    if SCHEDULE_KINDS[schedule_kind].placement not in ("one", "looped"):
        return [(key, f'Megatron places virtual stage i on pipeline rank i mod pp; schedule "{schedule_kind}" '
                 'does not; use 1f1b, interleaved, gpipe or zb-h1')]
    if stage == 0:
        return [(key, "the first virtual stage holds the embedding; Megatron builds MTP apart from the loss on a "
                 "later stage")]
    if stage // par.pp != par.vpp - 1:
        last = [(par.vpp - 1) * par.pp + r for r in range(par.pp)]
        return [(key, f"virtual stage {stage} is vp stage {stage // par.pp} of pp rank {stage % par.pp}; Megatron "
                 f"puts MTP in the last virtual stage of its rank: one of {last}")]
    after = sum(layout[stage + 1:])
    if after:
        return [(key, f"{after} decoder layers follow virtual stage {stage} in parallel.layout; Megatron runs every "
                 "decoder layer before the MTP layers: give the later stages 0 layers")]
    return []
