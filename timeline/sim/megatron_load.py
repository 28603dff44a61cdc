"""What loading a checkpoint leaves on the device of a resumed Megatron-LM run (``training.resumed``),
before its first measured iteration: the optimizer's moments, and the copies of them the load holds
for a moment.

Read at Megatron-Core 0.16.0 (``MC``, ``megatron/training/checkpointing.py``, ``MC`` =
``megatron/core``) and Transformer Engine 2.10 (``TE``); ``setup_model_and_optimizer`` builds the model,
its DDP buffers and the optimizer's main parameters first (:mod:`timeline.sim.megatron_state`), then
``load_checkpoint``:

- ``--ckpt-format torch_dist`` (``checkpointing.py: load_checkpoint`` → ``generate_state_dict``):
  the optimizer makes its state before anything is read, so the checkpoint can be read into it.
  ``MC/optimizer/distrib_optimizer.py: DistributedOptimizer.sharded_state_dict(is_loading=True)``
  calls ``self.load_state_dict(self.state_dict())``, whose empty inner state gets a dummy
  ``torch.empty`` ``exp_avg`` and ``exp_avg_sq`` per owned shard (``load_state_dict``: "Allocate dummy
  tensors"), handed to the inner optimizer's ``load_state_dict``; the non-distributed
  ``Float16OptimizerWithFloat16Params.sharded_state_dict`` runs ``init_state_fn`` (``torch.zeros_like``
  per parameter, ``MC/optimizer/__init__.py``). ``MC/dist_checkpointing/strategies/torch.py:
  mcore_to_pyt_state_dict`` hands PyTorch DCP those very tensors (``sh_ten.data.detach()``): the read
  is in place. Then ``optimizer.load_state_dict(state_dict['optimizer'])`` hands the loaded tensors
  to the inner optimizer's ``load_state_dict`` again (the distributed optimizer's retrieves its
  existing state, ``inner_state_dict["state"]``, and copies the main parameters and states in place,
  ``load_parameter_state_from_dp_reshardable`` → ``_set_main_param_and_optimizer_states``).
- ``TE/pytorch/optimizers/fused_adam.py: FusedAdam.load_state_dict`` (the Adam Megatron imports first;
  from TE 05c0fb024, 2024-11, first released in 1.13, unchanged to 2.17): after PyTorch's own
  ``load_state_dict`` (``.to`` of a tensor already of the parameter's dtype and device is the tensor
  itself) it resets ``self.state[param] = {}`` and ``set_scaled_state`` → ``_initialize_state`` makes
  each state anew (``torch.empty``), copying the given one into it, parameter by parameter in state
  order, ``exp_avg`` then ``exp_avg_sq``. The given tensors live while their caller holds them: the
  dummies until the distributed optimizer's ``load_state_dict`` returns, the loaded ones until
  ``load_checkpoint`` returns (its ``state_dict``). So the moments exist twice for a moment, twice for
  the distributed optimizer (dummies → state, loaded → state), once for the others.
- ``--ckpt-format torch``: ``torch.load(…, map_location='cpu')`` reads the checkpoint to the host and
  no state exists before the optimizer's ``load_state_dict``; PyTorch's ``load_state_dict`` casts every
  state to the device (one copy each), and FusedAdam's reset frees each parameter's copy as it makes
  its own: the moments once, plus one parameter's at a time (not modelled: under one tensor's bytes).

A fully parallel load (``--ckpt-fully-parallel-load``) is this load where each shard lands in place
(:func:`timeline.io.megatron_state_args.fully_parallel_load`). What it does not model: the temporary buffers
a fully parallel load receives expert shards this rank does not need into (their lifetime is NCCL's:
``from-megatron`` writes the plain load as the lower bound, with a note), other checkpoint formats, and a load without optimizer state (``--finetune``,
``--no-load-optim``: the weights are read in place and the moments made in the first step, as a fresh
run's).
"""

from __future__ import annotations

from timeline.profiles.megatron_workspaces import version_tuple
from timeline.spec.framework import FrameworkSpec

#: TE's FusedAdam makes each state anew in load_state_dict from this release on (05c0fb024)
TE_REALLOCATES = (1, 13)

#: (created at, name, bytes, category code, +1 alloc / −1 free), as timeline.sim.megatron_state's
LoadEvent = tuple[str, str, int, int, int]


def reallocates(fw: FrameworkSpec) -> bool:
    """Whether the optimizer's ``load_state_dict`` makes every state anew (TE FusedAdam ≥ 1.13)."""
    return version_tuple(fw.transformer_engine) >= TE_REALLOCATES


def resumed_moments(order: list[tuple[str, int, tuple[tuple[str, int], ...]]], category: int, *,
                    distributed: bool, fw: FrameworkSpec) -> list[LoadEvent]:
    """The optimizer states of a resumed run as its checkpoint load makes them, all at the run's start:
    ``order`` is (main parameter or shard, elements, its (state, bytes per element) …) in the optimizer's
    state order; the states that survive are named ``static.moments.{name}.{state}``. Only TE's
    ``FusedAdam`` makes its states anew (Adam's ``exp_avg``); a torch optimizer's ``load_state_dict``
    (Muon's, SGD's: ``torch/optim/optimizer.py: _process_value_according_to_param_policy``, ``value.to`` of
    the same dtype and device) keeps the tensors the load filled in place."""
    def made(prefix: str, sign: int, params: list[tuple[str, int, tuple[tuple[str, int], ...]]]) -> list[LoadEvent]:
        return [("start", f"{prefix}.{n}.{state}", k * b, category, sign) for n, k, states in params
                for state, b in states]

    fused = [p for p in order if p[2][:1] and p[2][0][0] == "exp_avg"]
    kept = made("static.moments", 1, [p for p in order if not (p[2][:1] and p[2][0][0] == "exp_avg")])
    if fw.checkpoint_format != "torch_dist" or not reallocates(fw):
        return kept + made("static.moments", 1, fused)
    order = fused
    out: list[LoadEvent] = list(kept)
    first = "ckpt.loaded_state"
    if distributed:  # sharded_state_dict(is_loading=True): dummies, then the inner optimizer's own states
        out += made("ckpt.dummy_state", 1, order) + made(first, 1, order) + made("ckpt.dummy_state", -1, order)
    else:  # init_state_fn: zeros_like per parameter
        out += made(first, 1, order)
    # DCP reads into `first` in place; optimizer.load_state_dict makes the states anew from it
    return out + made("static.moments", 1, order) + made(first, -1, order)
