"""The plan's candidate space: factorisations, the remainder layout, Megatron's micro-batch rule,
invalid candidates with their reasons."""

from __future__ import annotations

from pathlib import Path

import pytest
from sources import candidate_run

from timeline.errors import UserError
from timeline.io.runfile import load_run
from timeline.plan.space import Candidate, build_space, candidates, remainder_layout

TINY = Path(__file__).with_name("tiny_moe.toml")


def test_remainder_layout_gives_the_first_and_last_stages_the_rest():
    assert remainder_layout(61, 16) == (3,) + (4,) * 14 + (2,)  # DeepSeek-V3, PP16
    assert remainder_layout(61, 32) == (1,) + (2,) * 30 + (0,)
    assert remainder_layout(61, 2) == (31, 30)
    assert remainder_layout(64, 16) == (4,) * 16  # divides: even
    assert remainder_layout(5, 1) == (5,)
    assert remainder_layout(61, 64) is None  # the middle stages alone need 62 layers
    for layers in range(1, 40):
        for chunks in range(1, 20):
            lay = remainder_layout(layers, chunks)
            assert lay is None or (sum(lay) == layers and len(lay) == chunks and min(lay) >= 0)


def _space(table: dict, world: int = 8, batch: int = 16):
    run = load_run(TINY)
    return run, build_space(run.model, table, world=world, global_batch=batch, selective=("selective:moe_act",))


def test_default_space_is_every_factorisation():
    run, space = _space({})
    layouts = {tuple(c.get(k) for k in ("parallel.tp", "parallel.pp", "parallel.cp", "parallel.ep",
                                        "parallel.etp")) for c in candidates(space)}
    # tp·pp·cp·dp = 8 and ep·etp | 8/pp: counted by hand over the divisors 1, 2, 4, 8
    expected = {(tp, pp, cp, ep, etp) for tp in (1, 2, 4, 8) for pp in (1, 2, 4, 8) for cp in (1, 2, 4, 8)
                for ep in (1, 2, 4, 8) for etp in (1, 2, 4, 8) if 8 % (tp * pp * cp) == 0 and (8 // pp) % (ep * etp) == 0}
    assert layouts == expected and len(expected) == 146
    # vpp 1–2 × micro-batch 1–2 × four schedules × three recompute policies
    assert space.size == 146 * 2 * 2 * 4 * 3


def test_candidate_run_derives_dp_microbatches_and_layout():
    run, space = _space({"parallel.tp": [1], "parallel.pp": [2], "parallel.cp": [1], "parallel.ep": [2],
                         "parallel.etp": [1], "parallel.vpp": [1], "training.micro_batch_size": [2],
                         "schedule.kind": ["1f1b"], "recompute": ["none"]})
    (cand,) = list(candidates(space))
    r, key, problem = candidate_run(run, cand, space)
    assert (key, problem) == ("", "")
    assert r.parallel.dp == 4 and r.training.num_microbatches == 16 // (2 * 4) and r.parallel.layout == (3, 2)
    assert cand.name == "tp=1 pp=2 vpp=1 cp=1 ep=2 etp=1 mbs=2 schedule=1f1b recompute=none"


@pytest.mark.parametrize(("settings", "key", "words"), [
    ({"parallel.tp": 3}, "parallel.dp", "does not divide the world size 8"),
    ({"training.micro_batch_size": 2, "parallel.pp": 1}, "training.num_microbatches", "not a multiple"),
    ({"schedule.kind": "dualpipev", "parallel.vpp": 1}, "parallel.vpp", "exactly 2 chunks"),
    ({"parallel.ep": 16}, "parallel.ep", "does not divide"),
])
def test_invalid_candidates_keep_their_reason(settings, key, words):
    table = {"parallel.tp": [1], "parallel.pp": [2], "parallel.cp": [1], "parallel.ep": [2], "parallel.etp": [1],
             "parallel.vpp": [1], "training.micro_batch_size": [1], "schedule.kind": ["1f1b"], "recompute": ["none"]}
    table.update({k: [v] for k, v in settings.items()})
    run, space = _space(table, batch=12 if "training.micro_batch_size" in settings else 16)
    if "training.micro_batch_size" in settings:
        space = build_space(run.model, table, world=8, global_batch=12, selective=())
    (cand,) = list(candidates(space))
    r, k, problem = candidate_run(run, cand, space)
    assert r is None and k == key and words in problem


def test_space_errors_are_user_errors():
    with pytest.raises(UserError, match="derived by the plan"):
        _space({"parallel.dp": [1, 2]})
    with pytest.raises(UserError, match="not a run-file key"):
        _space({"parallel.bogus": [1]})
    with pytest.raises(UserError, match="lists no values"):
        _space({"parallel.tp": []})
    with pytest.raises(UserError, match="recompute"):
        _space({"recompute": ["sometimes"]})


def test_other_keys_are_searched_and_named():
    run, space = _space({"parallel.tp": [1], "parallel.pp": [2], "parallel.cp": [1], "parallel.ep": [2],
                         "parallel.etp": [1], "parallel.vpp": [1], "training.micro_batch_size": [1],
                         "schedule.kind": ["1f1b"], "recompute": ["none"], "training.zero": [0, 1]})
    cands = list(candidates(space))
    assert [c.name.split()[-1] for c in cands] == ["training.zero=0", "training.zero=1"]
    runs = [candidate_run(run, c, space)[0] for c in cands]
    assert [r.training.zero for r in runs] == [0, 1]
    assert isinstance(cands[0], Candidate)
