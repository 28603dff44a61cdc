"""Megatron-LM's ``--optimizer`` and what it keeps per parameter, onto ``[training]``: ``optimizer``,
``sgd_momentum``, ``muon_layer_wise`` (the states themselves: :mod:`timeline.graph.optim_state`), and which
implementation runs it, onto ``[framework] optimizer_impl``.

Refuses in one line what Megatron-LM itself rejects and what is not modelled: the emerging optimizers
other than Muon (``lion``, ``soap``, ``adaptive_muon``) and the layer-wise layout of Megatron-LM's main between
c1e938b039 and 0044db1f20. Nothing here simulates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from timeline.errors import UserError
from timeline.profiles.megatron_workspaces import version_tuple
from timeline.spec.framework import OPTIMIZER_IMPLS

if TYPE_CHECKING:
    from timeline.io.megatron_map import ArgReader, Conversion

#: --optimizer values whose states are modelled
MODELLED = ("adam", "sgd", "muon", "dist_muon")
#: the precision-aware optimizer's dtype arguments (arguments.py: _add_training_args), each fp32 by default
PRECISION_DTYPES = ("--main-grads-dtype", "--main-params-dtype", "--exp-avg-dtype", "--exp-avg-sq-dtype")


def optimizer(a: ArgReader, c: Conversion, *, megatron_core: str | None, buffer_layout: str | None) -> None:
    """``--optimizer`` (``--sgd-momentum``, ``--weight-decay``; with Muon ``--use-distributed-optimizer``,
    ``--no-use-layer-wise-param-layout``) → ``training.optimizer``, ``sgd_momentum``, ``weight_decay``,
    ``muon_layer_wise`` and ``zero``.

    ``megatron/training/arguments.py``: ``--optimizer`` choices; from 5b512b45d1 (2026-04-02) ``validate_args``
    turns ``--optimizer dist_muon`` and ``muon --use-distributed-optimizer`` into
    ``use_layer_wise_distributed_optimizer``; before it ``MC/optimizer/muon.py: get_megatron_muon_optimizer``
    (693587db5a) raises on the distributed optimizer and on fp16, and ``dist_muon`` is the layer-wise one.
    ``buffer_layout`` (None: by ``megatron_core``) is how that optimizer lays out its state:

    - ``"ping_pong"`` (before c1e938b039, and under ``--no-use-layer-wise-param-layout``): the distributed
      optimizer off, whole parameters dealt by size over unsharded buffers (``zero = 0``);
    - ``"padded"`` (Megatron-Core 0.18.0 as released, main from 0044db1f20): the distributed optimizer's buffers,
      Muon's matrices in shard-aligned buffers of their own (:func:`timeline.graph.dp_buffers.layer_wise_layout`),
      the rest in a ``DistributedOptimizer`` (``zero = 1``);
    - ``"compact"`` (Megatron-LM's dev branch from 3b9c248a1b, not on main): Muon's buffers unpadded and
      all-reduced beside the distributed optimizer's, Muon's matrices dealt ping-pong (``zero = 1``,
      ``[framework] layer_wise_layout = "compact"``);
    - ``"integrated"`` (main between c1e938b039 and 0044db1f20): not modelled."""
    name = a.str("--optimizer", "adam")
    if name not in MODELLED:
        raise UserError(f"--optimizer {name}: its per-parameter states are not modelled; "
                        f"use one of {', '.join(MODELLED)}")
    if name == "sgd":
        c.put("training.optimizer", "sgd", "--optimizer")
        c.put("training.sgd_momentum", a.float("--sgd-momentum", 0.9), "--sgd-momentum")
        # arguments.py: --weight-decay 0.01 (a --weight-decay-incr-style schedule's start value is not read)
        c.put("training.weight_decay", a.float("--weight-decay", 0.01), "--weight-decay")
        return
    a.value("--weight-decay")  # read: only SGD's step copies what it decays
    a.value("--sgd-momentum")  # read: SGD's only
    if name == "adam":
        c.put("training.optimizer", "adam", "--optimizer")
        return
    if c.sections["training"]["dtype"] == "fp16":
        raise UserError(f"--optimizer {name} with --fp16: Megatron-LM rejects it (emerging optimizer with fp16 is "
                        "not supported); use --bf16")
    dist = a.flag("--use-distributed-optimizer")
    version = megatron_core or "0.14.0"
    if dist and version_tuple(version) < (0, 18):
        raise UserError(f"--optimizer {name} with --use-distributed-optimizer: Megatron-LM before 0.18 rejects it "
                        "(muon.py: 'muon with dist optimizer is not supported'); give --megatron-core 0.18 or later")
    layer_wise = name == "dist_muon" or dist
    if buffer_layout is None:
        buffer_layout = "padded" if version_tuple(version) >= (0, 18) and "rc" not in version else "ping_pong"
    if a.flag("--no-use-layer-wise-param-layout"):
        buffer_layout = "ping_pong"
    if layer_wise and buffer_layout not in ("ping_pong", "padded", "compact"):
        where = {"integrated": "main between c1e938b039 and 0044db1f20",
                 "compact": "the dev branch from 3b9c248a1b"}.get(buffer_layout, buffer_layout)
        raise UserError(f"--optimizer {name}{' --use-distributed-optimizer' if dist else ''}: the layer-wise "
                        f"optimizer's {buffer_layout} layout ({where}) is not modelled; the released Megatron-Core "
                        "0.18.0's padded one is")
    in_buffers = layer_wise and buffer_layout in ("padded", "compact")
    model = c.sections["model"]
    if in_buffers and model.get("n_routed_experts") and model.get("linear_bias"):
        raise UserError(f"--optimizer {name} with expert biases: Megatron-LM rejects non-Muon expert parameters on the "
                        "layer-wise + distributed optimizer path (optimizer/__init__.py); add --disable-bias-linear")
    c.put("training.optimizer", "muon", "--optimizer")
    c.put("training.muon_layer_wise", layer_wise, "--optimizer", "--use-distributed-optimizer",
          "--no-use-layer-wise-param-layout")
    c.put("training.zero", int(in_buffers), "--use-distributed-optimizer")
    if in_buffers:
        c.put("framework.layer_wise_layout", buffer_layout)


def precision_aware(a: ArgReader, c: Conversion, *, megatron_core: str | None) -> None:
    """``--use-precision-aware-optimizer`` with ``--main-grads-dtype``, ``--main-params-dtype``,
    ``--exp-avg-dtype``, ``--exp-avg-sq-dtype`` → ``training.precision_aware``, ``grad_dtype``, ``master_dtype``,
    ``master_remainders``, ``moment_dtype``, ``exp_avg_sq_dtype`` (the states:
    :func:`timeline.sim.megatron_state.fused_adam_states`).

    ``MC/optimizer/optimizer_config.py: OptimizerConfig.__post_init__`` (d98e8a64dd) asserts Adam and, without
    the flag, fp32 for all four; ``get_megatron_optimizer`` raises without the distributed optimizer;
    ``store_param_remainders`` defaults to True (no argument sets it), off before TE 2.1 and, in TE's
    ``FusedAdam.__init__``, unless the masters are fp32; ``arguments.py: validate_args`` turns fp32 gradient
    accumulation off for bf16 when ``--main-grads-dtype bf16``. Megatron-Core before 0.15 (972553db35) let TE hold
    the masters only when they were not fp32: not modelled. FP8 states (TE ``Float8Tensor`` with its quantizer
    per parameter) are refused."""
    dtypes = {name: a.str(name, "fp32") for name in PRECISION_DTYPES}
    if not a.flag("--use-precision-aware-optimizer"):
        for name, dtype in dtypes.items():
            if dtype != "fp32":
                raise UserError(f"{name} {dtype}: Megatron-LM rejects it without --use-precision-aware-optimizer "
                                "(optimizer_config.py)")
        return
    tr = c.sections["training"]
    if tr.get("optimizer", "adam") != "adam":
        raise UserError("--use-precision-aware-optimizer: Megatron-LM supports it with --optimizer adam only")
    if not a.flag("--use-distributed-optimizer"):
        raise UserError("--use-precision-aware-optimizer: Megatron-LM supports it only with "
                        "--use-distributed-optimizer (optimizer/__init__.py)")
    if version_tuple(megatron_core or "0.15.0") < (0, 15):
        raise UserError("--use-precision-aware-optimizer: before Megatron-Core 0.15 (972553db35) who holds the fp32 "
                        "masters differs and is not modelled; give --megatron-core 0.15 or later")
    if tr.get("resumed"):
        raise UserError("--use-precision-aware-optimizer in a resumed run: how TE's FusedAdam.load_state_dict remakes "
                        "its masters and scaled states is not modelled; drop --load or the flag")
    for name in ("--exp-avg-dtype", "--exp-avg-sq-dtype"):
        if dtypes[name] == "fp8":
            raise UserError(f"{name} fp8: TE's Float8Tensor states (a quantizer's scale and amax per parameter) are "
                            "not modelled; use fp32, bf16 or fp16")
    if dtypes["--main-grads-dtype"] == "bf16" and tr["dtype"] == "bf16" and not a.flag(
            "--accumulate-allreduce-grads-in-fp32"):
        c.put("training.grad_dtype", "bf16", "--main-grads-dtype")
    else:
        a.value("--main-grads-dtype")
    master = dtypes["--main-params-dtype"]
    te = version_tuple(str(c.sections["framework"].get("transformer_engine", "2.6")))
    c.put("training.precision_aware", True, "--use-precision-aware-optimizer")
    c.put("training.master_dtype", master, "--main-params-dtype")
    c.put("training.master_remainders", master == "fp32" and tr["dtype"] == "bf16" and te >= (2, 1))
    c.put("training.moment_dtype", dtypes["--exp-avg-dtype"], "--exp-avg-dtype")
    if dtypes["--exp-avg-sq-dtype"] != dtypes["--exp-avg-dtype"]:
        c.put("training.exp_avg_sq_dtype", dtypes["--exp-avg-sq-dtype"], "--exp-avg-sq-dtype")
    else:
        a.value("--exp-avg-sq-dtype")


def cpu_offload(a: ArgReader, c: Conversion) -> None:
    """``--optimizer-cpu-offload`` with ``--optimizer-offload-fraction`` → ``training.optimizer_cpu_offload`` and
    ``optimizer_offload_fraction`` (the hybrid optimizer: :func:`timeline.graph.optim_state.hybrid_split`).

    ``megatron/training/arguments.py: validate_args`` (d98e8a64dd) asserts ``--use-precision-aware-optimizer`` with
    it, and FP8 parameters only under the delayed recipe; ``MC/optimizer/__init__.py`` asserts decoupled weight decay
    (AdamW). Not modelled, and refused: bf16 main gradients (converted per shard on both sides) and FP8 parameters
    (their fp32 main shards go to the hybrid optimizer instead of the weights' own)."""
    fraction = a.float("--optimizer-offload-fraction", 1.0)
    if not a.flag("--optimizer-cpu-offload"):
        return
    tr = c.sections["training"]
    if not tr.get("precision_aware"):
        raise UserError("--optimizer-cpu-offload: Megatron-LM requires --use-precision-aware-optimizer with it "
                        "(arguments.py: validate_args); add it")
    if not 0.0 <= fraction <= 1.0:
        raise UserError(f"--optimizer-offload-fraction {fraction}: a share of the parameters, between 0 and 1")
    if tr.get("grad_dtype", "fp32") != "fp32":
        raise UserError("--optimizer-cpu-offload with --main-grads-dtype bf16: the hybrid optimizer's per-shard fp32 "
                        "copies of bf16 gradients are not modelled; drop --main-grads-dtype bf16")
    if tr.get("fp8_param_gather"):
        raise UserError("--optimizer-cpu-offload with --fp8-param-gather: the hybrid optimizer then steps fp32 main "
                        "shards, which is not modelled; drop --fp8-param-gather")
    c.put("training.optimizer_cpu_offload", True, "--optimizer-cpu-offload")
    c.put("training.optimizer_offload_fraction", fraction, "--optimizer-offload-fraction")
    if fraction < 1.0:
        c.notes.append("--optimizer-offload-fraction below 1: Megatron's first HybridDeviceOptimizer, built over the "
                       "whole (unsharded) parameters before the distributed optimizer rebuilds it over its shards, "
                       "makes fp32 clones of the ones it keeps on the GPU and holds itself in a reference cycle "
                       "(its step hooks), so they live until Python's cyclic garbage collector runs — not simulated "
                       "(taken as freed at once; --manual-gc collects before the first iteration)")


def optimizer_impl(a: ArgReader, c: Conversion, impl: str | None) -> None:
    """``[framework] optimizer_impl``: which Adam (and SGD) Megatron-Core imported, as the job's environment had
    them — not an argument: ``MC/optimizer/__init__.py`` takes Transformer Engine's ``FusedAdam``, else Apex's,
    else ``torch.optim.AdamW`` with the warning "Transformer Engine and Apex are not installed. Falling back to
    Torch optimizers." (None: TE's). Written only when not TE's; refused in one line where the arguments need TE."""
    if impl is None or impl == "te_fused":
        return
    if impl not in OPTIMIZER_IMPLS:
        raise UserError(f"--optimizer-impl {impl}: use one of {', '.join(OPTIMIZER_IMPLS)}")
    if c.sections["framework"]["transformer_impl"] != "local":
        raise UserError(f"--optimizer-impl {impl}: means Transformer Engine is not installed, but --transformer-impl "
                        "is transformer_engine (Megatron's default) and runs its layers; add --transformer-impl local")
    if c.sections["training"].get("precision_aware"):
        raise UserError(f"--optimizer-impl {impl}: --use-precision-aware-optimizer is Transformer Engine's FusedAdam; "
                        "drop one of them")
    c.put("framework.optimizer_impl", impl)
