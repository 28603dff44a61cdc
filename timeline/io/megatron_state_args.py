"""Megatron-LM arguments that change how a job's static state comes into being rather than its model:
the first chunk's parameter all-gather launched inside the optimizer step, and what a checkpoint the
job resumes from loads (:mod:`timeline.sim.megatron_load` models the load itself).

Each function reads its arguments off an :class:`~timeline.io.megatron_map.ArgReader`, refuses what
Megatron-LM itself rejects (``megatron/training/arguments.py: validate_args``) in one line, and puts the
run-file keys the ``megatron`` profile's rules read. Nothing here simulates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from timeline.errors import UserError
from timeline.profiles.megatron_workspaces import version_tuple

if TYPE_CHECKING:
    from timeline.io.megatron_map import ArgReader, Conversion

#: the arguments that make ``args.virtual_pipeline_model_parallel_size`` (an interleaved schedule)
INTERLEAVING = ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                "--pipeline-model-parallel-layout")


#: memory-neutral arguments read only to refuse a combination Megatron-LM rejects (they stay listed neutral)
CHECKED_ONLY = ("--overlap-param-gather",)
#: checkpoint formats whose load is modelled (timeline.sim.megatron_load)
LOAD_FORMATS = ("torch_dist", "torch")


def _given(a: ArgReader, name: str) -> object:
    """An argument's value without marking it read: a memory-neutral argument checked only for a
    combination Megatron rejects stays listed neutral in the run file's header."""
    v = a.raw.get(name)
    return False if isinstance(v, str) and v.strip().lower() in ("false", "0", "no") else v


def param_gather_with_step(a: ArgReader, c: Conversion) -> None:
    """``--overlap-param-gather-with-optimizer-step`` → ``framework.overlap_param_gather_with_optimizer_step``.

    ``arguments.py: validate_args`` (46fdcd5b7e … d98e8a64dd) asserts the distributed optimizer,
    ``--overlap-param-gather``, an interleaved schedule and no distributed checkpointing
    (``use_dist_ckpt = ckpt_format != "torch"``, ``training/utils``: ``update_use_dist_ckpt``; the
    default format is ``torch_dist`` from core_v0.12.0 on). What the flag changes in memory is the DDP
    buckets and the optimizer chain (:mod:`timeline.graph.dp_buffers`); the all-gather itself is in place."""
    if not a.flag("--overlap-param-gather-with-optimizer-step"):
        c.put("framework.overlap_param_gather_with_optimizer_step", False)
        return
    needs = [name for name, ok in (
        ("--use-distributed-optimizer", a.flag("--use-distributed-optimizer")),
        ("--overlap-param-gather", bool(_given(a, "--overlap-param-gather"))),
        ("an interleaved schedule (" + " / ".join(INTERLEAVING) + ")",
         any(a.value(n) not in (None, False) for n in INTERLEAVING)),
        ("--ckpt-format torch", a.str("--ckpt-format", "torch_dist") == "torch")) if not ok]
    if needs:
        raise UserError(f"--overlap-param-gather-with-optimizer-step: Megatron-LM rejects it without {needs[0]} "
                        "(arguments.py: validate_args)")
    c.put("framework.overlap_param_gather_with_optimizer_step", True, "--overlap-param-gather-with-optimizer-step")


def checkpoint_load(a: ArgReader, c: Conversion, *, resumed: bool, dp_cp: int) -> None:
    """What the checkpoint a job loads puts on the device: ``training.resumed`` (its optimizer state is
    loaded) and ``framework.checkpoint_format``. ``resumed``: the job's ``--load`` holds a checkpoint of
    this training (``from-megatron --resumed``; a functional test's ``_2nd`` run).

    ``checkpointing.py: load_checkpoint`` (core_v0.12.0 … d98e8a64dd) loads the optimizer state (and
    with it the fp16 loss scaler's scale, ``MixedPrecisionOptimizer.load_state_dict``) unless
    ``--finetune`` or ``--no-load-optim``; without it the weights are read in place
    (``optimizer.reload_model_params`` copies them into the main parameters) and the moments are made
    in the first step, as in a fresh run. ``--ckpt-fully-parallel-load``: :func:`fully_parallel_load`."""
    fmt = a.str("--ckpt-format", "torch_dist")
    finetune, no_optim = a.flag("--finetune"), a.flag("--no-load-optim")
    # load_checkpoint (core_v0.12.0 … d98e8a64dd): where --load holds no checkpoint (a first launch; --resumed says it
    # does), --pretrained-checkpoint's is loaded with args.finetune = True — the weights alone
    pretrained = a.value("--pretrained-checkpoint") not in (None, False, "", "None")
    finetune = finetune or (pretrained and not resumed)
    main_params = a.flag("--load-main-params-from-ckpt")
    if main_params and not no_optim:
        raise UserError("--load-main-params-from-ckpt without --no-load-optim: Megatron-LM rejects it (arguments.py: "
                        "validate_args, '--load-main-params-from-ckpt must be used with --no-load-optim')")
    # with it, load_checkpoint's optimizer.reload_model_params(state_dict=…) fills the main parameters from the loaded
    # state dict in place (checkpointing.py, d98e8a64dd): the state the iterations hold is --no-load-optim's
    loads = resumed or finetune
    if loads and fmt not in LOAD_FORMATS:
        raise UserError(f"--ckpt-format {fmt}: loading a {fmt} checkpoint is not modelled (use torch_dist or torch)")
    fully_parallel_load(a, c, dp_cp=dp_cp, loads=loads and fmt == "torch_dist")
    optim = resumed and not (finetune or no_optim)
    c.put("training.resumed", optim, "--finetune", "--no-load-optim",
          *(["--pretrained-checkpoint"] if pretrained else []), *(["--load-main-params-from-ckpt"] if main_params else []))
    if optim:
        c.put("training.optimizer_step", True)  # the loaded loss scale has settled: no first-step overflows
    c.put("framework.checkpoint_format", fmt if fmt in LOAD_FORMATS else "torch_dist", "--ckpt-format")


def fully_parallel_load(a: ArgReader, c: Conversion, *, dp_cp: int, loads: bool) -> None:
    """Accept a fully parallel load (``--ckpt-fully-parallel-load``) of a ``torch_dist`` checkpoint (``loads``)
    as the plain load: each shard is read into the very tensor the plain load reads into. Refused (a UserError
    naming what it would allocate besides): the ``gather_object`` exchange and FP8 parameters.

    ``checkpointing.py: _load_global_dist_base_checkpoint`` wraps the load in ``FullyParallelLoadStrategyWrapper``
    over the DP·CP group (``--ckpt-fully-parallel-load-process-group dp``, the only group before core_v0.17.0)
    or the expert-DP group (``ep_dp``). ``MC/dist_checkpointing/strategies/fully_parallel.py:
    FullyParallelLoadStrategyWrapper.load`` (core_v0.12.0 … d98e8a64dd): a group of one loads plainly; else each
    rank reads its share of the main replicas into the state dict's own tensors and the exchange
    (``exchange_utils.py: exchange_loaded_tensors_broadcast``, ``broadcast`` by default) skips a shard only one
    rank needs, broadcasts into the existing tensor of a needed shard (``_get_empty_tensor_for_exchange`` →
    ``ShardedTensor.init_data``, which keeps ``data`` when it is set) and into a fresh CUDA tensor, dropped at
    once, for a shard this rank does not need. Such shards exist only where the group holds expert shards some
    but not all of its ranks need (:func:`expert_shard_spread`). Their broadcasts are asynchronous and
    ProcessGroupNCCL keeps each buffer until its work is reaped, so how many are alive at once depends on timing
    (identical jobs measure hundreds of MiB apart): the plain load is the lower bound, and a note says so.
    ``gather_object`` unpickles every rank's loaded tensors on each rank, and an FP8 parameter is exchanged as a
    new high-precision copy (``from_float8``) that the loaded state dict keeps."""
    algo = a.str("--ckpt-fully-parallel-load-exchange-algo", "broadcast")
    group = a.str("--ckpt-fully-parallel-load-process-group", "dp")
    if not (a.flag("--ckpt-fully-parallel-load") and loads):
        return
    if algo == "gather_object":
        raise UserError("--ckpt-fully-parallel-load-exchange-algo gather_object: every rank's loaded shards are "
                        "unpickled on each rank (exchange_utils.py: exchange_loaded_tensors_gather_object)")
    if dp_cp > 1 and c.sections.get("training", {}).get("fp8_param_gather"):
        raise UserError("--ckpt-fully-parallel-load with FP8 parameters (--fp8-param-gather): each exchanged FP8 "
                        "shard becomes a new high-precision copy the loaded state dict keeps (exchange_utils.py: "
                        "from_float8), not modelled")
    par = c.sections["parallel"]
    if group != "dp" or dp_cp == 1:
        return
    kinds, holders = expert_shard_spread(dp_cp, tp=int(par.get("tp", 1)), ep=int(par.get("ep", 1)),
                                         etp=int(par.get("etp", par.get("tp", 1))))
    if kinds > 1 and holders > 1:
        c.notes.append(
            f"--ckpt-fully-parallel-load over the DP·CP group of {dp_cp}: it holds {kinds} different expert "
            f"shards, each needed by {holders} of its ranks and broadcast to all; the others receive it into a "
            "temporary buffer (exchange_utils.py: _get_empty_tensor_for_exchange) that lives until NCCL's "
            "asynchronous broadcast is reaped, a matter of timing. Simulated as the plain load (a lower bound): "
            f"before and in the first iteration the peak can be higher by up to the other {kinds - 1} expert "
            "shard(s)' weights (and, without the distributed optimizer, their optimizer states). "
            "--ckpt-fully-parallel-load-process-group ep_dp exchanges none")


def expert_shard_spread(dp_cp: int, *, tp: int, ep: int, etp: int) -> tuple[int, int]:
    """(different expert shards in one DP·CP group, ranks of the group needing each): the group is the ranks of
    one tensor-parallel rank, ``k·tp + t``; the expert grid (``parallel_state.py: initialize_model_parallel``,
    expert ranks ordered tp-ep-dp within a pipeline stage) gives rank ``r`` the expert-TP rank ``r % etp`` and
    the expert-parallel rank ``(r // etp) % ep``, the pair naming the expert shard it holds."""
    pairs = [((r // etp) % ep, r % etp) for r in range(0, dp_cp * tp, tp)]
    kinds = len(set(pairs))
    return kinds, dp_cp // kinds


def embedding_wgrad(a: ArgReader, c: Conversion) -> None:
    """``--defer-embedding-wgrad-compute`` / ``--wgrad-deferral-limit`` → ``framework.defer_embedding_wgrad`` /
    ``wgrad_deferral_limit`` (the held tensors: :func:`timeline.sim.expand.head_wgrad_kept`).

    ``megatron/core/model_parallel_config.py: ModelParallelConfig.__post_init__`` (core_v0.12.0 … d98e8a64dd)
    raises without pipeline parallelism, without gradient-accumulation fusion and for a negative limit.
    With MTP each micro-batch calls the output layer once per head, so a limit counts calls, not
    micro-batches: that split is not modelled."""
    if not a.flag("--defer-embedding-wgrad-compute"):
        a.value("--wgrad-deferral-limit")
        c.put("framework.defer_embedding_wgrad", False)
        return
    limit = a.int("--wgrad-deferral-limit", 0)
    if c.sections["parallel"]["pp"] == 1:
        raise UserError("--defer-embedding-wgrad-compute: Megatron-LM rejects it without pipeline parallelism "
                        "(model_parallel_config.py)")
    if not c.sections["framework"]["gradient_accumulation_fusion"]:
        raise UserError("--defer-embedding-wgrad-compute with --no-gradient-accumulation-fusion: Megatron-LM rejects "
                        "it (model_parallel_config.py)")
    if limit < 0:
        raise UserError(f"--wgrad-deferral-limit {limit}: Megatron-LM rejects a negative limit; give 0 (all) or more")
    if limit and c.sections["model"].get("mtp_layers"):
        raise UserError("--wgrad-deferral-limit with --mtp-num-layers: which of a micro-batch's output-layer calls "
                        "defer is not modelled; give 0 (all)")
    c.put("framework.defer_embedding_wgrad", True, "--defer-embedding-wgrad-compute")
    c.put("framework.wgrad_deferral_limit", limit, "--wgrad-deferral-limit")


#: Megatron-FSDP arguments whose pools or precisions are not modelled, with the value that leaves them off
FSDP_OFF = {"--fsdp-double-buffer": None, "--megatron-fsdp-max-pool-double-buffer": None,
            "--suggested-communication-unit-size": None, "--outer-dp-sharding-strategy": "no_shard",
            "--megatron-fsdp-version": "1", "--megatron-fsdp-enable-fine-grained-param-gather": None}
#: the Megatron-FSDP precision arguments read (Megatron-LM core_v0.17.0 on: ``_add_experimental_args``)
FSDP_DTYPES = ("--megatron-fsdp-main-grads-dtype", "--megatron-fsdp-grad-comm-dtype")


MAIN_PARAMS = "--megatron-fsdp-main-params-dtype"


def fsdp_main_params(a: ArgReader, c: Conversion) -> None:
    """``--megatron-fsdp-main-params-dtype`` (core_v0.17.0 on, default fp32) → ``training.master_dtype`` (and
    ``moment_dtype``) under Megatron-FSDP; read after ``framework.optimizer_impl``.

    ``MF/param_and_grad_buffer.py: _init_each_parameter_group_buffers`` (core_v0.17.0 … d98e8a64dd) makes the
    main-weight buffer only for a main dtype that is not None; ``auto`` maps to None (``arguments.py``), so the
    optimizer steps the model-weight shards themselves (``_init_optimizer_named_parameters``; ``DistributedOptimizer``
    leaves weights and gradients to Megatron-FSDP) and ``update_main_grads`` casts nothing. TE's FusedAdam keeps
    fp32 moments whatever the parameters' dtype (``exp_avg_dtype`` defaults to fp32); Apex's FusedAdam and
    ``torch.optim.AdamW`` make them ``zeros_like`` the parameters. Another dtype makes a main-weight buffer of its
    own: modelled unless it is the weights' own (a second copy the master rule does not count)."""
    v = _given(a, MAIN_PARAMS)
    a.value(MAIN_PARAMS)
    if not c.sections["framework"].get("fsdp_sharding") or v in (None, False, "fp32"):
        return
    tr = c.sections["training"]
    if str(v) == "auto":
        c.put("training.master_dtype", tr["dtype"], MAIN_PARAMS)
        if c.sections["framework"].get("optimizer_impl", "te_fused") != "te_fused":
            c.put("training.moment_dtype", tr["dtype"], MAIN_PARAMS)
        return
    if str(v) == tr["dtype"]:
        raise UserError(f"{MAIN_PARAMS} {v}: a main-weight buffer in the weights' own dtype (a second copy of each "
                        "shard) is not modelled; give auto (no main weights) or fp32")
    c.put("training.master_dtype", str(v), MAIN_PARAMS)


def fsdp_main_grads_dtype(a: ArgReader, c: Conversion, version: tuple[int, ...]) -> None:
    """Megatron-FSDP's main-gradient buffer dtype → ``training.grad_dtype`` (what ``grad_reduce_in_fp32``,
    ``--accumulate-allreduce-grads-in-fp32`` or bf16's default, has put there), by release:

    - before core_v0.17.0 ``MF/param_and_grad_buffer.py: ParamAndGradBuffer`` takes fp32 under
      ``grad_reduce_in_fp32``, else the parameters' dtype: as under DDP;
    - core_v0.17.0 … 0.18.x (``fsdp/mcore_fsdp_adapter.py: FullyShardedDataParallel.__init__``, ff70b24884 and
      f456199700): ``MixedPrecisionPolicy(main_grads_dtype=fp32 if ddp_config.grad_reduce_in_fp32 else
      --megatron-fsdp-main-grads-dtype)``, ``grad_comm_dtype`` alike;
    - core_v0.19.0 on (adfe9e11d9, 2026-07-02, which dropped that "grandfathered argument"): the argument alone;
      its default ``auto`` (None) leaves ``_resolve_group_grad_dtype`` the parameters' own dtype — bf16 main
      gradients in a bf16 job, whatever ``--accumulate-allreduce-grads-in-fp32`` says.

    A gradient-communication dtype other than the main gradients' allocates its own buffers
    (``MixedPrecisionPolicy.grad_comm_dtype``): refused, but where it equals them (no memory, the docstring)."""
    main, comm = (_given(a, name) for name in FSDP_DTYPES)
    if version < (0, 17, 0):
        for name, v in zip(FSDP_DTYPES, (main, comm), strict=True):
            if v not in (None, False, "auto"):
                raise UserError(f"{name} {v}: not an argument before Megatron-Core 0.17.0 (Megatron-FSDP took fp32 "
                                "main gradients under --accumulate-allreduce-grads-in-fp32); drop it or give "
                                "--megatron-core 0.17.0 or later")
        return
    a.value(FSDP_DTYPES[0])
    a.value(FSDP_DTYPES[1])
    tr = c.sections["training"]
    # get_megatron_ddp_config: grad_reduce_in_fp32 = args.accumulate_allreduce_grads_in_fp32, which validate_args
    # sets for bf16 unless --grad-reduce-in-bf16 (megatron_map.py reads the same into training.grad_dtype)
    fp32_reduce = a.flag("--accumulate-allreduce-grads-in-fp32") or (
        tr["dtype"] == "bf16" and not a.flag("--grad-reduce-in-bf16"))
    grandfathered = version < (0, 19, 0) and fp32_reduce
    if grandfathered:
        resolved = "fp32"
    elif main not in (None, False, "auto"):
        resolved = str(main)
    else:
        resolved = tr["dtype"]  # the parameters' dtype (fp8 parameters are refused under Megatron-FSDP)
    given_comm = "fp32" if grandfathered else (str(comm) if comm not in (None, False, "auto") else resolved)
    if given_comm != resolved:
        raise UserError(f"--megatron-fsdp-grad-comm-dtype {comm} with {resolved} main gradients: Megatron-FSDP's "
                        "separate gradient-communication buffers are not modelled; drop it (auto) or give "
                        f"{resolved}")
    moved = resolved != tr["grad_dtype"]
    c.put("training.grad_dtype", resolved, *FSDP_DTYPES, "--accumulate-allreduce-grads-in-fp32", "--grad-reduce-in-bf16")
    if moved and version[:2] == (0, 19) and main in (None, False, "auto") and resolved != "fp32":
        c.notes.append(f"Megatron-FSDP at Megatron-Core 0.19: {resolved} main gradients (auto: the parameters' dtype; "
                       "adfe9e11d9, 2026-07-02, stopped reading --accumulate-allreduce-grads-in-fp32 there). A "
                       "main-branch snapshot labelled 0.19.0 from before that commit kept fp32: give "
                       "--megatron-fsdp-main-grads-dtype fp32 to model one")


def megatron_fsdp(a: ArgReader, c: Conversion, *, package: bool | None = None) -> None:
    """``--use-megatron-fsdp`` / ``--use-custom-fsdp`` with ``--data-parallel-sharding-strategy`` →
    ``framework.fsdp_sharding`` and ``training.zero = 1`` (``arguments.py: validate_args``@d98e8a64dd: Megatron-FSDP v1
    sets ``--use-distributed-optimizer``; the strategy's default is ``optim_grads_params`` from 3499efef80,
    2026-04-01, Megatron-Core 0.18.0, ``no_shard`` before). ``framework.megatron_fsdp_package``: whether the
    Megatron-LM commit has af28b5a559's ``megatron_fsdp`` package (None: from ``framework.megatron_core``, 0.14.0
    on; main's 0.15.0rc0 spans both sides of it); ``--log-params-norm`` → ``framework.log_params_norm``. The layout
    and events: :mod:`timeline.graph.fsdp_buffers`, :mod:`timeline.sim.megatron_fsdp`. Double buffers, NCCL user
    buffers, HSDP, a suggested communication unit, Megatron-FSDP v2, a main-weight dtype other than fp32, Muon (Megatron-LM
    rejects it), the precision-aware optimizer and CUDA graphs are refused by name. ``--use-nccl-ub`` is refused
    here only: under Megatron-FSDP it turns on the double buffer and manual registration (``arguments.py:
    validate_args``@d98e8a64dd); under DDP it changes no byte (:data:`timeline.io.megatron_table.MAPPED`)."""
    if not (a.flag("--use-megatron-fsdp") or a.flag("--use-custom-fsdp")):
        c.put("framework.fsdp_sharding", "")
        return
    for name, off in FSDP_OFF.items():
        v = _given(a, name)
        if v not in (None, False) and (off is None or str(v) != off):
            raise UserError(f"{name} {v}: Megatron-FSDP's {name.lstrip('-')} is not modelled; drop it to model "
                            "plain Megatron-FSDP")
    if a.flag("--delay-wgrad-compute"):
        raise UserError("--use-megatron-fsdp with --delay-wgrad-compute: Megatron-FSDP's delayed weight gradients (its "
                        "gradient buckets held to each backward_dw) are not modelled; drop --delay-wgrad-compute")
    if a.flag("--use-nccl-ub"):
        raise UserError("--use-megatron-fsdp with --use-nccl-ub: Megatron-LM then turns on --fsdp-double-buffer and "
                        "manual registration (arguments.py: validate_args), which are not modelled; drop --use-nccl-ub")
    if c.sections["training"].get("optimizer", "adam") == "muon":
        raise UserError("--use-megatron-fsdp with --optimizer muon: Megatron-LM rejects it (arguments.py: validate_args, "
                        "693587db5a on: Muon does not support Megatron-FSDP); use Adam or SGD, or drop Megatron-FSDP")
    if a.flag("--use-precision-aware-optimizer"):
        raise UserError("--use-megatron-fsdp with --use-precision-aware-optimizer: TE's FusedAdam holding the masters "
                        "of Megatron-FSDP's shards is not modelled; drop the flag to model plain Megatron-FSDP")
    if c.sections["framework"].get("cuda_graph_impl", "none") != "none":
        raise UserError("--use-megatron-fsdp with --cuda-graph-impl transformer_engine: CUDA graphs of a Megatron-FSDP "
                        "job are not modelled; drop one of them")
    if c.sections["training"].get("fp8_recipe", "none") != "none":
        raise UserError("--use-megatron-fsdp with --fp8-format: Megatron-FSDP's FP8 parameter groups and transpose "
                        "caches are not modelled; drop FP8 to model plain Megatron-FSDP")
    version = version_tuple(str(c.sections["framework"].get("megatron_core", "0.14.0")))
    strategy = a.str("--data-parallel-sharding-strategy", "optim_grads_params" if version >= (0, 18, 0) else "no_shard")
    c.put("framework.fsdp_sharding", strategy, "--use-megatron-fsdp", "--use-custom-fsdp",
          "--data-parallel-sharding-strategy", *FSDP_OFF)
    fsdp_main_grads_dtype(a, c, version)
    c.put("framework.megatron_fsdp_package", version >= (0, 14, 0) if package is None else package)
    c.put("framework.log_params_norm", a.flag("--log-params-norm"), "--log-params-norm")
    c.put("training.zero", 1, "--use-distributed-optimizer")
