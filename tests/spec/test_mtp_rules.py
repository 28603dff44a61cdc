"""``parallel.mtp_stage``: each of Megatron's placement rules (``PipelineParallelLayerLayout.
validate_layer_layout``, core_v0.16.0 … d98e8a64dd) and the version that allows MTP apart from the loss,
as one problem naming the key."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers_run import TINY_MODEL, tiny_run

from timeline.profiles import LIMITS
from timeline.spec.validate import validate_run


def problems(mtp_stage, *, layout=(2, 2, 0, 0), mtp_layers=1, megatron_core="0.16.0", pp=4, **kw):
    model = replace(TINY_MODEL, num_hidden_layers=sum(layout), mtp_layers=mtp_layers)
    run = tiny_run(model=model, pp=pp, layout=layout, mtp_stage=mtp_stage, megatron_core=megatron_core, **kw)
    return [(k, m) for k, m in validate_run(run, LIMITS) if k == "parallel.mtp_stage"]


@pytest.mark.parametrize(("stage", "kw"), [(None, {}), (2, {}), (3, {}), (3, {"megatron_core": "0.14.0"}),
                                           (6, {"layout": (1,) * 6 + (0, 0), "vpp": 2, "schedule": "interleaved"}),
                                           (2, {"megatron_core": "0.19.0"}), (2, {"schedule": "gpipe"})])
def test_valid_placements(stage, kw):
    assert problems(stage, **kw) == []


@pytest.mark.parametrize(("stage", "kw", "needle"), [
    (2, {"mtp_layers": 0}, "the model has none (model.mtp_layers = 0)"),
    (4, {}, "4 is not a virtual stage; there are pp·vpp = 4 (0 … 3)"),
    (2, {"megatron_core": "0.15.3"}, "from 0.16.0 on (framework.megatron_core is '0.15.3')"),
    (2, {"profile": "paper", "megatron_core": "0.14.0"}, 'set profile = "megatron" or mtp_stage = 3'),
    (0, {"layout": (0, 0, 0, 4)}, "the first virtual stage holds the embedding"),
    (1, {"layout": (1, 1, 2, 0)}, "2 decoder layers follow virtual stage 1"),
    (2, {"layout": (1,) * 6 + (0, 0), "vpp": 2, "schedule": "interleaved"},
     "virtual stage 2 is vp stage 0 of pp rank 2; Megatron puts MTP in the last virtual stage of its rank: one of "
     "[4, 5, 6, 7]"),
])
def test_each_rule_is_one_line_naming_the_key(stage, kw, needle):
    got = problems(stage, **kw)
    assert len(got) == 1 and needle in got[0][1] and "\n" not in got[0][1], got


def test_v_shaped_schedules_place_stages_otherwise():
    got = problems(2, layout=(1, 1, 0, 0), pp=2, vpp=2, schedule="zbv")
    assert len(got) == 1 and 'schedule "zbv" does not' in got[0][1]
