"""Model sources for tests: a test's own template function ``fn(run, chunk, pp_rank=None)`` as a
:class:`~timeline.graph.source.ModelSource` (parameters from the run's real source), and
shorthands that read a run's template, devices or static bytes through the slices the package takes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace

from timeline.compare.fit import Statics
from timeline.graph.analytic import AnalyticSource
from timeline.graph.build import Node, chunk_layers
from timeline.graph.context import BuildCtx
from timeline.graph.ir import FOp
from timeline.graph.ops import ChunkTemplate
from timeline.graph.source import ModelSource, SourceFn, model_source
from timeline.graph.static import state_bytes
from timeline.graph.tensors import TensorDef
from timeline.pipeline.placement import stage_placement
from timeline.placement.devices import StaticDevice, chunk_params, static_devices
from timeline.plan.bound import Bound
from timeline.plan.space import Candidate, Space
from timeline.profiles import profile
from timeline.sim.estimate import WorkEstimate, estimate_work
from timeline.sim.plan import SimPlan, plan, plan_pipeline
from timeline.sim.static_state import StateRules
from timeline.spec.model import ModelSpec
from timeline.spec.run import ParallelSpec, RecomputeSpec, RunSpec, TrainingSpec

TemplateFn = Callable[..., ChunkTemplate]


@dataclass(frozen=True, slots=True)
class FnSource:
    """``fn``'s templates of ``run``; nodes and parameter counts from the run's model source."""

    run: RunSpec
    fn: TemplateFn

    def nodes(self, chunk: int) -> list[Node]:
        return model_source(self.run).nodes(chunk)

    def total_params(self) -> int:
        return model_source(self.run).total_params()

    def template(self, chunk: int, *, pp_rank: int | None = None) -> ChunkTemplate:
        return self.fn(self.run, chunk, pp_rank=pp_rank)

    def signature(self, chunk: int) -> Hashable:
        return ("chunk", chunk)  # a test's templates never share a build

    def under(self, *, recompute: RecomputeSpec | None = None, routing_skew: float | None = None) -> FnSource:
        run = self.run if recompute is None else replace(self.run, recompute=recompute)
        if routing_skew is not None:
            run = replace(run, training=replace(run.training, routing_skew=routing_skew))
        return FnSource(run, self.fn)


    def cut(self, model: ModelSpec, parallel: ParallelSpec, training: TrainingSpec,
            recompute: RecomputeSpec) -> FnSource:
        return FnSource(replace(self.run, model=model, parallel=parallel, training=training, recompute=recompute),
                        self.fn)


def template_source(fn: TemplateFn) -> SourceFn:
    """A source factory (``build_timeline``'s, ``fit``'s ``source_fn``) whose templates are ``fn``'s."""
    return functools.partial(FnSource, fn=fn)


def template_of(run: RunSpec, chunk: int, *, pp_rank: int | None = None) -> ChunkTemplate:
    """The run's op templates of virtual stage ``chunk``."""
    return model_source(run).template(chunk, pp_rank=pp_rank)


def expert_rule(run: RunSpec) -> str:
    return profile(run.profile).params.expert_state_group


def devices_of(run: RunSpec, *, buffers: bool = False) -> list[StaticDevice]:
    """Each pipeline rank's representative device under the run's schedule kind's placement; with ``buffers``, laid
    out in the profile's DDP buffers as the simulator lays it (Megatron's shards under the distributed optimizer)."""
    from timeline.sim.static_state import ddp_of

    par = run.parallel
    ddp = ddp_of(run.profile, run.framework, run.model, run.training, par, traced=False) if buffers else None
    return static_devices(model_source(run), stage_placement(run.schedule.kind, par.pp, par.vpp), parallel=par,
                          training=run.training, num_layers=run.model.num_hidden_layers,
                          expert_state_group=expert_rule(run), ddp=ddp)


def tensors_of(run: RunSpec, pp_rank: int) -> tuple[tuple[int, ...], list[TensorDef]]:
    """(chunks, parameter TensorDefs) of pipeline rank ``pp_rank``'s representative device."""
    stages = stage_placement(run.schedule.kind, run.parallel.pp, run.parallel.vpp)[pp_rank]
    params = chunk_params(model_source(run), stages)
    return stages, [t for c in stages for t in params[c]]


def state_bytes_of(run: RunSpec, tensors: list[TensorDef], **ranks: int) -> tuple[int, int, int]:
    return state_bytes(run.training, run.parallel, expert_rule(run), tensors, **ranks)


def source_of(run: RunSpec) -> ModelSource:
    return model_source(run)


def statics_of(run: RunSpec, source_fn: SourceFn = model_source) -> Statics:
    """``fit``'s static numbers of ``run`` (as :func:`timeline.compare.fit.fit` builds them)."""
    par = run.parallel
    pipe = plan_pipeline(run.schedule, par, run.training.num_microbatches, run.hardware, run.csv_rows)
    return Statics(source_fn(run), pipe, run.model, chunk_layers(par, run.model.num_hidden_layers))


def plan_of(run: RunSpec, source_fn: SourceFn = model_source) -> SimPlan:
    """The simulation's plan of ``run`` (as :func:`timeline.result.build.build_timeline` makes it)."""
    par, tr = run.parallel, run.training
    pipe = plan_pipeline(run.schedule, par, tr.num_microbatches, run.hardware, run.csv_rows)
    return plan(source_fn(run), pipe, model=run.model, training=tr, parallel=par, rules=rules_of(run))


def forward_ops_of(run: RunSpec, chunk: int) -> list[FOp]:
    source = model_source(run)
    assert isinstance(source, AnalyticSource)
    return source.forward_ops(chunk)


def ctx_of(run: RunSpec) -> BuildCtx:
    return BuildCtx.of(run.model, run.profile, run.framework, run.parallel, run.training.dtype)


def rules_of(run: RunSpec) -> StateRules:
    return StateRules(profile=run.profile, framework=run.framework, sm=run.hardware.sm,
                      traced=run.trace is not None, expert_state_group=expert_rule(run))


def coarse_bound_of(run: RunSpec) -> Bound:
    """The planner's coarse bound of ``run``'s layout (as ``plan.search.bound_block`` computes it)."""
    from timeline.plan.search import run_bound

    return run_bound(run, coarse=True)


def bound_of(run: RunSpec) -> Bound:
    """The planner's exact static bound of ``run`` (as ``plan.search.exact_block`` computes it)."""
    from timeline.plan.search import run_bound

    return run_bound(run, coarse=False)


def estimate_of(run: RunSpec) -> WorkEstimate:
    """The run's work estimate, as the command line makes it."""
    return estimate_work(model_source(run), model=run.model, parallel=run.parallel, training=run.training,
                         recompute=run.recompute, schedule_kind=run.schedule.kind, hardware=run.hardware,
                         traced=run.trace is not None)


def candidate_run(base: RunSpec, cand: Candidate, space: Space) -> tuple[RunSpec | None, str, str]:
    """(run, "", "") for a candidate that runs, else (None, key, problem), as the planner derives it."""
    from timeline.plan.search import derive

    run, reason = derive(base, space, cand)
    key, _, problem = reason.partition(": ")
    return run, key, problem

