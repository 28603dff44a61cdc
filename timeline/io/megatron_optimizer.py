"""Megatron-LM's ``--optimizer`` and what it keeps per parameter, onto ``[training]``: ``optimizer``,
``sgd_momentum``, ``muon_layer_wise`` (the states themselves: :mod:`timeline.graph.optim_state`).

Refuses in one line what Megatron-LM itself rejects and what is not modelled: the emerging optimizers
other than Muon (``lion``, ``soap``, ``adaptive_muon``), and Muon's layer-wise optimizer laid out in the DDP
buffers (Megatron-LM from c1e938b039, 2026-05-13: ``MC/optimizer/param_layout.py``, the non-Muon parameters
in a ``DistributedOptimizer`` of their own, 0044db1f20). Nothing here simulates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from timeline.errors import UserError
from timeline.profiles.megatron_workspaces import version_tuple

if TYPE_CHECKING:
    from timeline.io.megatron_map import ArgReader, Conversion

#: --optimizer values whose states are modelled
MODELLED = ("adam", "sgd", "muon", "dist_muon")


def optimizer(a: ArgReader, c: Conversion, *, megatron_core: str | None, buffer_layout: bool | None) -> None:
    """``--optimizer`` (``--sgd-momentum``; with Muon ``--use-distributed-optimizer``) → ``training.optimizer``,
    ``sgd_momentum``, ``muon_layer_wise`` and ``zero``. ``buffer_layout``: whether the job's Megatron-LM lays
    the layer-wise optimizer out in the DDP buffers (c1e938b039; None: from Megatron-Core 0.19 on, main's
    0.18.0 spanning both sides).

    ``megatron/training/arguments.py``: ``--optimizer`` choices; from 5b512b45d1 (2026-04-02, Megatron-Core
    0.18) ``validate_args`` turns ``--optimizer dist_muon`` and ``muon --use-distributed-optimizer`` into
    ``use_layer_wise_distributed_optimizer`` with ``use_distributed_optimizer = False``; before it
    ``MC/optimizer/muon.py: get_megatron_muon_optimizer`` (693587db5a) raises on the distributed optimizer
    and on fp16, and ``dist_muon`` is the layer-wise one."""
    name = a.str("--optimizer", "adam")
    if name not in MODELLED:
        raise UserError(f"--optimizer {name}: its per-parameter states are not modelled; "
                        f"use one of {', '.join(MODELLED)}")
    if name == "sgd":
        c.put("training.optimizer", "sgd", "--optimizer")
        c.put("training.sgd_momentum", a.float("--sgd-momentum", 0.9), "--sgd-momentum")
        return
    a.value("--sgd-momentum")  # read: SGD's only
    if name == "adam":
        c.put("training.optimizer", "adam", "--optimizer")
        return
    if c.sections["training"]["dtype"] == "fp16":
        raise UserError(f"--optimizer {name} with --fp16: Megatron-LM rejects it (emerging optimizer with fp16 is "
                        "not supported); use --bf16")
    dist = a.flag("--use-distributed-optimizer")
    later = version_tuple(megatron_core or "0.14.0") >= (0, 18)
    if dist and not later:
        raise UserError(f"--optimizer {name} with --use-distributed-optimizer: Megatron-LM before 0.18 rejects it "
                        "(muon.py: 'muon with dist optimizer is not supported'); give --megatron-core 0.18 or later")
    layer_wise = name == "dist_muon" or dist
    if buffer_layout is None:
        buffer_layout = version_tuple(megatron_core or "0.14.0") >= (0, 19)
    if layer_wise and buffer_layout:
        raise UserError(f"--optimizer {name}{' --use-distributed-optimizer' if dist else ''}: Megatron-LM from "
                        "c1e938b039 (Megatron-Core 0.19) lays the layer-wise optimizer out in the DDP buffers "
                        "(optimizer/param_layout.py), which is not modelled; give --megatron-core 0.18 for the "
                        "ping-pong layer-wise optimizer")
    c.put("training.optimizer", "muon", "--optimizer")
    c.put("training.muon_layer_wise", layer_wise, "--optimizer", "--use-distributed-optimizer")
    c.put("training.zero", 0, "--use-distributed-optimizer")
