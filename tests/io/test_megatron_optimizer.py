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
    # Megatron-Core 0.18 (5b512b45d1): muon with the distributed optimizer is the layer-wise one, DDP unsharded
    dist = training(BASE | {"--optimizer": "muon", "--use-distributed-optimizer": True}, megatron_core="0.18.0",
                    muon_buffer_layout=False)
    assert (dist["muon_layer_wise"], dist["zero"]) == (True, 0)


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
    ({"--optimizer": "dist_muon"}, {"megatron_core": "0.19.0"}, "optimizer/param_layout.py"),
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
