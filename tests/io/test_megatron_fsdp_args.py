"""from-megatron under Megatron-FSDP (--use-megatron-fsdp / --use-custom-fsdp): the strategy maps to
framework.fsdp_sharding with the distributed optimizer, the pools and dtypes it does not model are refused by name,
and a real functional-test configuration simulates within its measured band."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from timeline.errors import UserError
from timeline.io.megatron_args import from_mapping
from timeline.io.megatron_write import convert

#: the memory-relevant arguments of Megatron-LM's functional test tests/functional_tests/test_cases/gpt/
#: gpt3_mr_mcore_te_tp2_zp_z3_resume_torch_dist_dgx_a100_1N8G/model_config.yaml (at 0dd841a7d9)
ZP_Z3 = {"--num-layers": 12, "--hidden-size": 512, "--num-attention-heads": 8, "--micro-batch-size": 4,
         "--global-batch-size": 32, "--seq-length": 1024, "--max-position-embeddings": 1024,
         "--transformer-impl": "transformer_engine", "--tensor-model-parallel-size": 2, "--use-custom-fsdp": True,
         "--calculate-per-token-loss": True, "--data-parallel-sharding-strategy": "optim_grads_params",
         "--use-distributed-optimizer": True, "--deterministic-mode": True, "--no-gradient-accumulation-fusion": True,
         "--attention-softmax-in-fp32": True, "--ckpt-format": "torch_dist", "--bf16": True}
ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}
ROOT = Path(__file__).resolve().parents[2]
CASES = Path("~/.cache/timeline/megatron-cases.json").expanduser()


def _convert(args: dict, **kw):
    return convert(from_mapping(args, ENV), world_size=8, gpu="a100", **kw)


def test_the_strategy_maps_with_the_distributed_optimizer():
    c = _convert(ZP_Z3)
    assert c.sections["framework"]["fsdp_sharding"] == "optim_grads_params"
    assert c.sections["training"]["zero"] == 1
    assert c.mapped["--use-custom-fsdp"] == "framework.fsdp_sharding"
    # arguments.py (d98e8a64dd): Megatron-FSDP v1 turns the distributed optimizer on itself
    no_dist = {k: v for k, v in ZP_Z3.items() if k != "--use-distributed-optimizer"}
    assert _convert(no_dist).sections["training"]["zero"] == 1
    plain = {k: v for k, v in ZP_Z3.items() if k not in ("--use-custom-fsdp", "--data-parallel-sharding-strategy")}
    assert _convert(plain).sections["framework"]["fsdp_sharding"] == ""


@pytest.mark.parametrize(("arg", "value"), [("--fsdp-double-buffer", True), ("--outer-dp-sharding-strategy", "optim"),
                                            ("--suggested-communication-unit-size", 1_000_000),
                                            ("--megatron-fsdp-main-params-dtype", "bf16")])
def test_unmodelled_pools_and_dtypes_are_refused_by_name(arg, value):
    with pytest.raises(UserError, match=f"^{arg} "):
        _convert(ZP_Z3 | {arg: value})
    # at their defaults they change nothing
    if arg == "--outer-dp-sharding-strategy":
        assert _convert(ZP_Z3 | {arg: "no_shard"}).sections["framework"]["fsdp_sharding"] == "optim_grads_params"


def test_torch_fsdp2_stays_refused():
    with pytest.raises(UserError, match="^--use-torch-fsdp2: torch FSDP2"):
        _convert({k: v for k, v in ZP_Z3.items() if k != "--use-custom-fsdp"} | {"--use-torch-fsdp2": True})


def _record(commit: str) -> dict:
    if not CASES.exists():
        pytest.skip(f"{CASES}: the collected Megatron-LM records are absent (tools/collect_megatron_cases.py)")
    for r in json.loads(CASES.read_text()):
        if (r["name"].endswith("gpt3_mr_mcore_te_tp2_zp_z3_resume_torch_dist_dgx_a100_1N8G")
                and r.get("memory_values_first_commit", "").startswith(commit)):
            return r
    pytest.skip(f"no record of the zp_z3 test at {commit}")


def test_the_functional_test_simulates_within_half_a_percent_of_its_measurement():
    rec = _record("0dd841a7d9")  # after d677041da2: the decoder layers are the only FSDP units
    spec = importlib.util.spec_from_file_location("validate_measured", ROOT / "tools" / "validate_measured.py")
    assert spec is not None and spec.loader is not None
    vm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vm)
    # simulated under the CI image it was recorded in (validate_measured's tables)
    alloc, _, _, steady, _ = vm.predict({**rec, "expressible_note": None, "resumed": False})
    m = rec["measured"]
    assert abs(alloc / int(m["max_allocated_bytes_second_logged"]["bytes"]) - 1) < 0.005
    assert abs(steady / int(m["allocated_bytes_first_iter"]) - 1) < 0.005


def test_the_version_decides_the_package_the_default_strategy_and_log_params_norm_maps():
    """Megatron-LM af28b5a559 (core_v0.14.0) replaced custom_fsdp with the megatron_fsdp package; 3499efef80
    (core_v0.18.0) made optim_grads_params the default strategy (no_shard before)."""
    custom = _convert(ZP_Z3, megatron_core="0.13.1")
    assert custom.sections["framework"]["megatron_fsdp_package"] is False
    package = {k: v for k, v in ZP_Z3.items() if k not in ("--use-custom-fsdp", "--data-parallel-sharding-strategy")}
    package |= {"--use-megatron-fsdp": True, "--log-params-norm": True}
    c = _convert(package, megatron_core="0.18.0")
    fw = c.sections["framework"]
    assert (fw["megatron_fsdp_package"], fw["fsdp_sharding"], fw["log_params_norm"]) == (True, "optim_grads_params", True)
    assert c.mapped["--log-params-norm"] == "framework.log_params_norm"
    assert _convert(package, megatron_core="0.17.1").sections["framework"]["fsdp_sharding"] == "no_shard"
    # where the version misleads (main's 0.15.0rc0 before af28b5a559) the caller says it
    assert _convert(package, megatron_core="0.15.0rc0", fsdp_package=False).sections["framework"][
        "megatron_fsdp_package"] is False
    # without Megatron-FSDP --log-params-norm reads nothing
    plain = {k: v for k, v in package.items() if k != "--use-megatron-fsdp"}
    assert "log_params_norm" not in _convert(plain).sections["framework"]


def test_muon_the_precision_aware_optimizer_and_cuda_graphs_are_refused_sgd_maps():
    """Megatron-LM rejects Muon under Megatron-FSDP (arguments.py: validate_args, 693587db5a on); TE's FusedAdam
    holding the masters of its shards and CUDA graphs of the job are not modelled; SGD's momentum per owned shard
    is."""
    new = {k: v for k, v in ZP_Z3.items() if k != "--use-custom-fsdp"} | {"--use-megatron-fsdp": True}
    with pytest.raises(UserError, match="^--use-megatron-fsdp with --optimizer muon: Megatron-LM rejects it"):
        _convert(new | {"--optimizer": "muon"}, megatron_core="0.18.0")
    with pytest.raises(UserError, match="^--use-megatron-fsdp with --use-precision-aware-optimizer: "):
        _convert(new | {"--use-precision-aware-optimizer": True}, megatron_core="0.18.0")
    with pytest.raises(UserError, match="^--use-megatron-fsdp with --cuda-graph-impl transformer_engine: "):
        _convert(new | {"--cuda-graph-impl": "transformer_engine", "--cuda-graph-warmup-steps": 0},
                 megatron_core="0.18.0")
    c = _convert(new | {"--optimizer": "sgd"}, megatron_core="0.18.0")
    assert (c.sections["training"]["optimizer"], c.sections["training"]["zero"]) == ("sgd", 1)
    assert c.sections["framework"]["fsdp_sharding"] == "optim_grads_params"


def test_nccl_user_buffers_change_nothing_under_ddp_and_are_refused_under_megatron_fsdp():
    # param_and_grad_buffer.py (core_v0.13.0 … d98e8a64dd): under DDP the same buffers, inside an NCCL MemPool
    ddp = {k: v for k, v in ZP_Z3.items() if k not in ("--use-custom-fsdp", "--data-parallel-sharding-strategy")}
    plain = _convert(ddp)
    ub = _convert(ddp | {"--use-nccl-ub": True, "--disable-symmetric-registration": True})
    assert ub.sections == plain.sections
    # arguments.py validate_args (d98e8a64dd): under Megatron-FSDP it turns the double buffer on
    with pytest.raises(UserError, match="^--use-megatron-fsdp with --use-nccl-ub: .*--fsdp-double-buffer"):
        _convert(ZP_Z3 | {"--use-nccl-ub": True})


PACKAGE = {k: v for k, v in ZP_Z3.items() if k not in ("--use-custom-fsdp", "--calculate-per-token-loss")} | {
    "--use-megatron-fsdp": True}


@pytest.mark.parametrize(("version", "extra", "grads"), [
    ("0.16.0", {}, "fp32"),  # ParamAndGradBuffer: fp32 under grad_reduce_in_fp32 (bf16's default)
    ("0.16.0", {"--grad-reduce-in-bf16": True}, "bf16"),
    ("0.18.0", {}, "fp32"),  # the adapter's grandfathered grad_reduce_in_fp32
    ("0.18.0", {"--megatron-fsdp-main-grads-dtype": "bf16"}, "fp32"),  # ... wins over the argument
    ("0.18.0", {"--grad-reduce-in-bf16": True, "--megatron-fsdp-main-grads-dtype": "fp32"}, "fp32"),
    ("0.19.0", {}, "bf16"),  # adfe9e11d9: auto is the parameters' dtype
    ("0.19.0", {"--megatron-fsdp-main-grads-dtype": "fp32"}, "fp32"),
    ("0.19.0", {"--megatron-fsdp-main-grads-dtype": "fp32", "--megatron-fsdp-grad-comm-dtype": "fp32"}, "fp32"),
    ("0.19.0", {"--megatron-fsdp-main-grads-dtype": "auto", "--megatron-fsdp-grad-comm-dtype": "bf16"}, "bf16"),
])
def test_the_main_gradient_dtype_follows_the_release(version, extra, grads):
    """fsdp/mcore_fsdp_adapter.py: FullyShardedDataParallel.__init__ by release (megatron_state_args.py:
    fsdp_main_grads_dtype): fp32 under --accumulate-allreduce-grads-in-fp32 until core_v0.19.0, then the argument
    alone, its auto the parameters' dtype."""
    c = _convert(PACKAGE | extra, megatron_core=version)
    assert c.sections["training"]["grad_dtype"] == grads
    if version == "0.19.0" and not extra:
        assert any(n.startswith("Megatron-FSDP at Megatron-Core 0.19: bf16 main gradients") for n in c.notes)


def test_a_communication_dtype_apart_from_the_main_gradients_is_refused():
    with pytest.raises(UserError, match="^--megatron-fsdp-grad-comm-dtype fp32 with bf16 main gradients: "):
        _convert(PACKAGE | {"--megatron-fsdp-grad-comm-dtype": "fp32"}, megatron_core="0.19.0")
    # 0.17 … 0.18: grad_reduce_in_fp32 makes both fp32, whatever the argument says
    c = _convert(PACKAGE | {"--megatron-fsdp-grad-comm-dtype": "bf16"}, megatron_core="0.18.0")
    assert c.sections["training"]["grad_dtype"] == "fp32"
    assert c.mapped["--megatron-fsdp-grad-comm-dtype"].startswith("training.grad_dtype")


def test_bf16_main_gradients_halve_the_buffer_and_copy_each_shard_to_fp32_in_the_step():
    """At 0.19 the sharded main-gradient buffer is bf16; each step's update_main_grads makes ``optimizer_grad.to(
    fp32)`` of every main-weight shard (MF/param_and_grad_buffer.py, core_v0.19.0), which zero_grad dereferences
    at the next train_step (dist_main_grad's _local_tensor = None)."""
    import tomllib

    import numpy as np

    from timeline.io.megatron_write import run_file_text
    from timeline.io.runfile import run_from_data
    from timeline.result.build import build_timeline
    tls = {}
    for version in ("0.18.0", "0.19.0"):
        c = _convert(PACKAGE, megatron_core=version)
        text = run_file_text(c, name=f"fsdp-{version}", source="<test>", world_size=8)
        tls[version] = build_timeline(run_from_data(tomllib.loads(text), Path(f"<test>/{version}.toml")))
    sizes = {}
    for version, tl in tls.items():
        ev = tl.events(0)
        names = np.array(tl.sim.names)[ev.tensor].astype(str)
        buf = names == "static.grad_buffer.fsdp"
        copies = np.char.startswith(names, "step.main_grad.") & (ev.sign > 0)
        master = np.char.startswith(names, "static.master.") & (ev.sign > 0)
        sizes[version] = (int(ev.size[buf][0]), int(ev.size[copies].sum()), int(ev.size[master].sum()),
                          sum(s.kind == "step" for s in tl.sim.spans[0]))
    (g18, c18, m18, _), (g19, c19, m19, steps) = sizes["0.18.0"], sizes["0.19.0"]
    assert g19 * 2 == g18 and c18 == 0 and m19 == m18
    # one fp32 copy of the rank's main-weight shard per step
    assert c19 == m19 * steps and steps == 2


def test_auto_main_params_step_the_weight_shards_themselves():
    """--megatron-fsdp-main-params-dtype auto (None): no main-weight buffer (_init_each_parameter_group_buffers), the
    optimizer steps the model-weight shards and update_main_grads casts nothing; TE's FusedAdam keeps fp32 moments,
    Apex's and torch's zeros_like the bf16 shards. A main dtype equal to the weights' would be a second copy: refused."""
    import tomllib

    import numpy as np

    from timeline.io.megatron_write import run_file_text
    from timeline.io.runfile import run_from_data
    from timeline.result.build import build_timeline

    def sim(extra: dict, **kw):
        c = _convert(PACKAGE | extra, megatron_core="0.19.0", **kw)
        text = run_file_text(c, name="fsdp-main", source="<test>", world_size=8)
        tl = build_timeline(run_from_data(tomllib.loads(text), Path("<test>/main.toml")))
        ev = tl.events(0)
        names = np.array(tl.sim.names)[ev.tensor].astype(str)
        made = ev.sign > 0

        def total(prefix: str) -> int:
            return int(ev.size[np.char.startswith(names, prefix) & made].sum())

        return c, total("static.master."), total("step.main_grad."), total("static.moments.")

    c, master, copies, moments = sim({})
    assert c.sections["training"].get("master_dtype", "fp32") == "fp32" and master > 0 and copies == 2 * master
    c, m_auto, c_auto, mo_auto = sim({"--megatron-fsdp-main-params-dtype": "auto"})
    assert c.sections["training"]["master_dtype"] == "bf16" and (m_auto, c_auto) == (0, 0)
    assert mo_auto == moments  # TE's FusedAdam: fp32 moments of the same shards
    with pytest.raises(UserError, match="^--megatron-fsdp-main-params-dtype bf16: a main-weight buffer in the weights"):
        _convert(PACKAGE | {"--megatron-fsdp-main-params-dtype": "bf16"}, megatron_core="0.19.0")
    c, m16, c16, _ = sim({"--megatron-fsdp-main-params-dtype": "fp16"})
    assert m16 * 2 == master and c16 == 2 * m16  # an fp16 main-weight buffer; each step's grads cast to fp16


def test_auto_main_params_under_apex_keep_moments_in_the_weights_dtype():
    # Apex's FusedAdam and torch.optim.AdamW: state = zeros_like(p), p the bf16 shard
    c = _convert(PACKAGE | {"--megatron-fsdp-main-params-dtype": "auto", "--transformer-impl": "local"},
                 megatron_core="0.19.0", optimizer_impl="apex_fused")
    assert (c.sections["training"]["master_dtype"], c.sections["training"]["moment_dtype"]) == ("bf16", "bf16")
