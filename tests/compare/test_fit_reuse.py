"""``fit``'s static numbers reuse one template per class of identical chunks (``ModelSource.signature``):
the numbers are exactly those of building every chunk's own template, and chunks that differ in
anything but their layer numbers never share a class."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from helpers_run import TINY_MODEL, tiny_run
from sources import source_of, statics_of, template_of, template_source

from timeline.compare.fit import selective_modules
from timeline.spec.presets import PRESETS
from timeline.spec.run import RecomputeSpec


def _template(run, chunk, pp_rank=None):
    return template_of(run, chunk, pp_rank=pp_rank)


def _specs(run):
    mods = selective_modules(run.model)
    return [RecomputeSpec(policy="none"), RecomputeSpec(policy="full", method="uniform", num_layers=1),
            *(RecomputeSpec(policy="selective", modules=s) for k in (1, 2) for s in itertools.combinations(mods, k))]


def _moe_run():
    model = replace(PRESETS["deepseek-v3"], num_hidden_layers=8, first_k_dense_replace=1, hidden_size=256,
                    num_attention_heads=4, num_key_value_heads=4, q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16,
                    v_head_dim=16, intermediate_size=512, moe_intermediate_size=64, n_routed_experts=8,
                    num_experts_per_tok=2, vocab_size=1024, mtp_layers=1)
    return tiny_run(model=model, pp=4, ep=2, dp=2)


@pytest.mark.parametrize("make", [lambda: tiny_run(pp=4, layers=12), _moe_run])
def test_shared_templates_give_the_numbers_of_per_chunk_templates(make):
    run = make()
    shared, plain = statics_of(run), statics_of(run, template_source(_template))
    assert len(set(shared.same_as.values())) < len(shared.same_as), "the middle chunks should share a class"
    assert set(plain.same_as.items()) == {(c, c) for c in plain.same_as}
    for spec in _specs(run):
        assert shared.candidate(spec) == plain.candidate(spec), spec


def test_chunks_that_differ_do_not_share_a_signature():
    run = _moe_run()  # chunk 0 holds the dense layer and the embedding, the last the head and MTP
    sigs = [source_of(run).signature(c) for c in range(4)]
    assert sigs[1] == sigs[2]
    assert len({sigs[0], sigs[1], sigs[3]}) == 3
    wider = tiny_run(pp=4, layers=12, model=replace(TINY_MODEL, intermediate_size=1024))
    assert source_of(wider).signature(1) != source_of(tiny_run(pp=4, layers=12)).signature(1)
