"""``--optimizer`` in from-megatron (timeline.io.megatron_optimizer): Adam, SGD and Muon map onto
``[training]``; Megatron's own rejections and what is not modelled are one-line errors. The Muon case is
Megatron-LM's ``moe/gpt3_moe_mcore_te_ep8_resume_torch_dist_dist_muon`` functional test (model_config.yaml at
693587db5a), whose last rank's optimizer state is checked to the byte."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from timeline.errors import UserError
from timeline.io.megatron_args import from_mapping
from timeline.io.megatron_write import convert, run_file_text
from timeline.io.runfile import run_from_data

BASE = {"--num-layers": 2, "--hidden-size": 64, "--num-attention-heads": 4, "--seq-length": 128,
        "--max-position-embeddings": 128, "--micro-batch-size": 1, "--global-batch-size": 8, "--bf16": True,
        "--vocab-size": 1000}
#: model_config.yaml of gpt3_moe_mcore_te_ep8_resume_torch_dist_dist_muon@693587db5a, its memory-relevant part
DIST_MUON = {"--num-layers": 12, "--hidden-size": 512, "--num-attention-heads": 8, "--micro-batch-size": 4,
             "--global-batch-size": 32, "--seq-length": 1024, "--max-position-embeddings": 1024,
             "--disable-bias-linear": True, "--transformer-impl": "transformer_engine",
             "--tensor-model-parallel-size": 1, "--pipeline-model-parallel-size": 1,
             "--expert-model-parallel-size": 8, "--num-experts": 8, "--moe-token-dispatcher-type": "allgather",
             "--moe-router-load-balancing-type": "aux_loss", "--moe-router-topk": 2, "--moe-router-dtype": "fp32",
             "--moe-ffn-hidden-size": 1024, "--moe-grouped-gemm": True, "--no-gradient-accumulation-fusion": True,
             "--bf16": True, "--optimizer": "dist_muon", "--muon-momentum": 0.9, "--muon-extra-scale-factor": 0.2,
             "--muon-scale-mode": "spectral"}


PRECISION = {"--use-precision-aware-optimizer": True, "--use-distributed-optimizer": True}


def training(args: dict, world_size: int = 2, **kw) -> dict:
    return convert(from_mapping(args), world_size=world_size, **kw).sections["training"]


def test_adam_sgd_and_muon_map_onto_training():
    assert training(BASE)["optimizer"] == "adam"
    sgd = training(BASE | {"--optimizer": "sgd", "--sgd-momentum": 0.0})
    assert (sgd["optimizer"], sgd["sgd_momentum"]) == ("sgd", 0.0)
    muon = training(BASE | {"--optimizer": "muon"})
    assert (muon["optimizer"], muon["muon_layer_wise"], muon["zero"]) == ("muon", False, 0)
    # main's 0.18.0 before c1e938b039: muon with the distributed optimizer is the layer-wise one, DDP unsharded
    dist = training(BASE | {"--optimizer": "muon", "--use-distributed-optimizer": True}, megatron_core="0.18.0",
                    muon_buffer_layout="ping_pong")
    assert (dist["muon_layer_wise"], dist["zero"]) == (True, 0)
    # the released 0.18.0 and later: the distributed optimizer's buffers, unless --no-use-layer-wise-param-layout
    padded = training(BASE | {"--optimizer": "dist_muon"}, megatron_core="0.19.0")
    assert (padded["muon_layer_wise"], padded["zero"]) == (True, 1)
    legacy = training(BASE | {"--optimizer": "dist_muon", "--no-use-layer-wise-param-layout": True},
                      megatron_core="0.19.0")
    assert (legacy["muon_layer_wise"], legacy["zero"]) == (True, 0)
    compact = convert(from_mapping(BASE | {"--optimizer": "dist_muon"}), world_size=2, muon_buffer_layout="compact")
    assert (compact.sections["training"]["zero"], compact.sections["framework"]["layer_wise_layout"]) == (1, "compact")


def test_the_precision_aware_optimizer_maps_its_dtypes():
    t = training(BASE | PRECISION | {"--main-grads-dtype": "bf16", "--exp-avg-dtype": "bf16",
                                     "--exp-avg-sq-dtype": "fp16"}, te_version="2.6")
    assert (t["precision_aware"], t["zero"], t["grad_dtype"], t["master_dtype"], t["master_remainders"]) == (
        True, 1, "bf16", "fp32", True)
    assert (t["moment_dtype"], t["exp_avg_sq_dtype"]) == ("bf16", "fp16")
    # fp16 masters keep their own dtype; TE before 2.1 stores no remainders
    assert training(BASE | PRECISION | {"--main-params-dtype": "fp16"})["master_remainders"] is False
    assert training(BASE | PRECISION, te_version="2.0")["master_remainders"] is False


@pytest.mark.parametrize(("extra", "kw", "message"), [
    ({"--optimizer": "lion"}, {}, "--optimizer lion: its per-parameter states are not modelled"),
    ({"--optimizer": "muon", "--fp16": True, "--bf16": False}, {}, "--optimizer muon with --fp16: Megatron-LM rejects"),
    ({"--optimizer": "muon", "--use-distributed-optimizer": True}, {"megatron_core": "0.16.0"}, "before 0.18 rejects"),
    ({"--optimizer": "dist_muon"}, {"muon_buffer_layout": "integrated"}, "main between c1e938b039 and 0044db1f20"),
    ({"--optimizer": "muon", "--muon-scalar-optimizer": "lion"}, {}, "--muon-scalar-optimizer lion: Lion's state"),
    ({"--use-precision-aware-optimizer": True}, {}, "only with --use-distributed-optimizer"),
    ({"--exp-avg-dtype": "bf16"}, {}, "--exp-avg-dtype bf16: Megatron-LM rejects it without"),
    (PRECISION | {"--exp-avg-dtype": "fp8"}, {}, "--exp-avg-dtype fp8: TE's Float8Tensor states"),
    (PRECISION, {"megatron_core": "0.14.0"}, "before Megatron-Core 0.15"),
    (PRECISION | {"--optimizer": "sgd"}, {}, "with --optimizer adam only"),
])
def test_what_is_refused_is_one_line(extra, kw, message):
    with pytest.raises(UserError, match=message) as exc:
        training(BASE | extra, **kw)
    assert "\n" not in str(exc.value)


def test_dist_muon_functional_test_keeps_the_last_rank_s_dealt_states():
    conv = convert(from_mapping(DIST_MUON), world_size=8, megatron_core="0.16.0")
    run = run_from_data(tomllib.loads(run_file_text(conv, name="dist-muon", source="x", world_size=8)),
                        Path("/tmp/dist-muon.toml"))
    assert (run.training.optimizer, run.training.muon_layer_wise, run.training.zero) == ("muon", True, 0)
    from timeline.result.build import build_timeline

    dev = build_timeline(run, summary_only=True).devices[-1]
    # 51,520,512 parameters: bf16 weights and an fp32 grad buffer, unsharded
    assert (dev.weights_bytes, dev.grads_bytes) == (51_520_512 * 2, 51_520_512 * 4)
    # rank 7 of dp·cp = 8 is dealt (sorted by size, loop 0…7 7…0) six 512-element norms, two routers, two
    # linear_proj and the word embeddings; every expert matrix (expert-DP 1): 24 × 524,288. Adam: fp32 master
    # and two moments (12 B); Muon: fp32 master and momentum (8 B)
    adam = 6 * 512 + 50_304 * 512
    muon = 2 * 8 * 512 + 2 * 512 * 512 + 24 * 1024 * 512
    assert dev.optimizer_bytes == adam * 12 + muon * 8 == 414_027_776



def _plan(args: dict, world_size: int = 2, optimizer_impl: str | None = None, megatron_core: str | None = None):
    """The simulation plan of the job (its devices and how their state comes into being)."""
    from timeline.profiles import profile
    from timeline.result.build import StateRules, model_source, plan, plan_pipeline

    conv = convert(from_mapping(args), world_size=world_size, optimizer_impl=optimizer_impl,
                   megatron_core=megatron_core)
    run = run_from_data(tomllib.loads(run_file_text(conv, name="o", source="x", world_size=world_size)),
                        Path("/tmp/o.toml"))
    rules = StateRules(profile=run.profile, framework=run.framework, sm=run.hardware.sm, traced=False,
                       expert_state_group=profile(run.profile).params.expert_state_group)
    pipe = plan_pipeline(run.schedule, run.parallel, run.training.num_microbatches, run.hardware, run.csv_rows)
    return run, plan(model_source(run), pipe, model=run.model, training=run.training, parallel=run.parallel,
                     rules=rules)


def _temporaries(steps) -> list[tuple[str, int, int]]:
    """(name, bytes, sign) of a step's temporaries (not the states its first step makes)."""
    return [(n, b, sign) for n, b, sign, _, first in steps if not first]


def test_torch_s_sgd_step_copies_the_gradients_it_decays():
    local = BASE | {"--optimizer": "sgd", "--transformer-impl": "local"}
    run, p = _plan(local, optimizer_impl="torch_foreach")
    assert (run.training.optimizer, run.training.weight_decay) == ("sgd", 0.01)
    steps = _temporaries(p.states[0].step_transients)
    # per decayed group (2-D weights), one fp32 copy per parameter, then all dropped; norms and biases: none
    made = [(n, b) for n, b, sign in steps if sign > 0]
    assert [b for _, b in made] == [b for n, b, sign in steps if sign < 0]
    assert all(not n.endswith(("bias", "layernorm.weight", "norm.weight")) for n, _ in made)
    words = next(b for n, b in made if n.endswith("word_embeddings.weight"))
    assert words == 1024 * 64 * 4  # 1000 padded to a multiple of 128, × hidden 64, fp32
    # the first step's momentum buffers are cloned from the decayed gradients, while those are live
    first = [(n, sign) for n, _, sign, _, _ in p.states[0].step_transients]
    decayed_words = "step.sgd_decayed_grad.embedding.word_embeddings.weight"
    assert first.index((decayed_words, 1)) < first.index(("static.moments.embedding.word_embeddings.weight."
                                                           "momentum_buffer", 1)) < first.index((decayed_words, -1))
    # Transformer Engine's FusedSGD (Megatron's first choice) decays inside its kernel: no copy
    _, te = _plan(BASE | {"--optimizer": "sgd"})
    assert _temporaries(te.states[0].step_transients) == []
    # an SGD without decay copies nothing; its state is the fp32 main parameter and momentum
    _, q = _plan(local | {"--weight-decay": 0.0}, optimizer_impl="torch_foreach")
    assert _temporaries(q.states[0].step_transients) == []
    assert q.devices[0].optimizer_bytes == sum(t.numel for t in q.devices[0].tensors) * 8


def test_the_layer_wise_step_gathers_every_rank_s_parameters():
    # dist_muon's layer-wise step as Megatron-Core before 0.18 runs it (the default release, 0.19, packs it into
    # the distributed optimizer's buffers)
    _, p = _plan(BASE | {"--optimizer": "dist_muon"}, world_size=2, megatron_core="0.17.0")
    steps = _temporaries(p.states[0].step_transients)
    total = sum(t.numel for t in p.devices[0].tensors) * 2  # bf16, every parameter is dense here
    made = {n: b for n, b, sign in steps if sign > 0}
    gathered = sum(b for n, b in made.items() if n.startswith("step.layer_wise_gathered.dense."))
    assert gathered == total and made["step.layer_wise_flat.dense"] == made["step.layer_wise_gathered.dense.1"]
    assert sum(sign * b for _, b, sign in steps) == 0


def test_muon_in_the_distributed_optimizer_s_buffers_keeps_the_last_shard_s_matrices():
    """The same functional test as Megatron-Core 0.18.0 released it (``--optimizer muon
    --use-distributed-optimizer``): Muon's matrices packed whole into 8 padded shards, largest first."""
    args = DIST_MUON | {"--optimizer": "muon", "--use-distributed-optimizer": True}
    conv = convert(from_mapping(args), world_size=8, megatron_core="0.18.0")
    run = run_from_data(tomllib.loads(run_file_text(conv, name="muon-padded", source="x", world_size=8)),
                        Path("/tmp/muon-padded.toml"))
    assert (run.training.muon_layer_wise, run.training.zero, run.framework.layer_wise_layout) == (True, 1, "padded")
    from timeline.result.build import build_timeline

    dev = build_timeline(run, summary_only=True).devices[-1]
    # buffers: Adam's (50 norms of 512 + the word embeddings, to a multiple of 128) 25,781,248; Muon's dense one
    # 8 × 1,835,008 (the fullest shard: two linear_qkv and two linear_proj); the 24 expert matrices 12,582,912
    numel = 25_781_248 + 8 * 1_835_008 + 24 * 524_288
    assert (dev.weights_bytes, dev.grads_bytes) == (numel * 2, numel * 4)
    # shard 7: one linear_qkv, three linear_proj, two routers (Muon: 8 B); every expert matrix; Adam's byte shard
    # [22,558,592, 25,781,248) of its buffer, all word embeddings (12 B)
    muon = 786_432 + 3 * 262_144 + 2 * 4_096 + 24 * 524_288
    assert dev.optimizer_bytes == muon * 8 + 3_222_656 * 12 == 151_983_616


def test_muon_without_nesterov_keeps_the_same_state():
    """``--muon-no-use-nesterov`` (main between 879a7a1e33 and 1c8bf21621) only drops the step's
    ``grad.lerp(momentum)`` copy, a step transient: the run file is the Nesterov run's, the argument named as
    memory-neutral."""
    with_ = convert(from_mapping(BASE | {"--optimizer": "muon"}), world_size=2)
    without = convert(from_mapping(BASE | {"--optimizer": "muon", "--muon-no-use-nesterov": True}), world_size=2)
    assert without.sections == with_.sections
    assert "--muon-no-use-nesterov" in without.neutral
