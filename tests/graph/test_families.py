"""One file per layer family, one vocabulary: each exposes its parameter shard (``params``) and its
forward ops (``forward``); the MoE router is one function per framework, chosen by one table."""

from __future__ import annotations

import inspect
from dataclasses import replace

from helpers_run import tiny_run

from timeline.graph.analytic import AnalyticSource
from timeline.graph.families import attention, embedding, head, mla, mlp, moe, mtp, norm, router
from timeline.graph.source import model_source
from timeline.graph.trace.source import TraceSource
from timeline.profiles import PROFILES

FAMILIES = (attention, embedding, head, mla, mlp, moe, mtp, norm)


def test_every_family_exposes_params_and_forward():
    for family in FAMILIES:
        assert inspect.isfunction(family.params) and inspect.isfunction(family.forward), family.__name__
        first = next(iter(inspect.signature(family.params).parameters))
        assert first == "ctx", family.__name__  # a shard is built from a BuildCtx, forward from a Builder
        assert next(iter(inspect.signature(family.forward).parameters)) == "b", family.__name__


def test_one_router_per_framework():
    assert set(router.ROUTERS) == set(PROFILES)
    for name, p in PROFILES.items():
        assert router.router(p.name) is router.ROUTERS[name]


def test_the_model_source_is_chosen_once_from_the_run():
    run = tiny_run(pp=1)
    assert isinstance(model_source(run), AnalyticSource)
    assert isinstance(model_source(replace(run, model_source="trace:x.json")), TraceSource)
