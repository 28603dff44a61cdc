"""PyTorch's default cuBLAS workspace per GPU generation and PyTorch version (``[framework] pytorch``).

``parseChosenWorkspaceSize`` (aten/src/ATen/cuda/CublasHandlePool.cpp): ``:4096:8`` (32 MiB) on
compute capability 9.0 in every version, on majors 10 and 12 from 2.12 (pytorch/pytorch#175344),
on major 11 from 2.14 (#189312); ``:4096:2:16:8`` (8.125 MiB) elsewhere; an explicit
``CUBLAS_WORKSPACE_CONFIG`` wins everywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_run import tiny_run

from timeline.errors import UserError
from timeline.io.runfile import run_from_data
from timeline.profiles.megatron_workspaces import torch_workspace_bytes
from timeline.result.build import build_timeline

MIB = 1 << 20
SMALL = 4096 * 1024 * 2 + 16 * 1024 * 8  # :4096:2:16:8


@pytest.mark.parametrize(("sm", "pytorch", "expected"), [
    (90, "2.9", 32 * MIB), (90, "2.13", 32 * MIB),
    (80, "2.13", SMALL),
    (100, "2.11", SMALL), (100, "2.11.1", SMALL), (100, "2.12", 32 * MIB), (100, "2.13.0", 32 * MIB),
    (120, "2.11", SMALL), (120, "2.12", 32 * MIB),
    (110, "2.13", SMALL), (110, "2.14", 32 * MIB),
])
def test_default_size_by_generation_and_version(sm, pytorch, expected):
    assert torch_workspace_bytes("", sm, pytorch) == expected


def test_explicit_config_wins_on_every_generation():
    assert torch_workspace_bytes(":4096:8", 100, "2.11") == 32 * MIB
    assert torch_workspace_bytes(":16:8", 90, "2.13") == 128 * 1024


def _torch_workspaces(run) -> dict[str, int]:
    """The PyTorch cuBLAS workspaces the last pipeline rank's device allocates (name → bytes)."""
    tl = build_timeline(run)
    d = max(range(tl.num_devices), key=lambda i: tl.devices[i].pp_rank)
    ev = tl.events(d)
    return {tl.names[t]: int(s) for t, s, sign in zip(ev.tensor, ev.size, ev.sign, strict=True)
            if sign > 0 and tl.names[t].startswith("workspace.torch_cublas")}


def test_a_blackwell_job_holds_the_version_s_workspaces():
    """The head's stage runs torch GEMMs: one workspace per (handle, stream), forward and backward."""
    before = _torch_workspaces(tiny_run(sm=100, pytorch="2.11"))
    after = _torch_workspaces(tiny_run(sm=100, pytorch="2.12"))
    assert before == {"workspace.torch_cublas_forward": SMALL, "workspace.torch_cublas_backward": SMALL}
    assert after == {"workspace.torch_cublas_forward": 32 * MIB, "workspace.torch_cublas_backward": 32 * MIB}
    assert _torch_workspaces(tiny_run(sm=90, pytorch="2.11")) == after


def test_a_version_that_is_not_one_names_the_key():
    data = {"name": "x", "model": {"preset": "llama3-8b", "num_hidden_layers": 1, "profile": "megatron"},
            "framework": {"pytorch": "latest"}}
    with pytest.raises(UserError, match=r"framework\.pytorch.*'latest' is not a version"):
        run_from_data(data, Path("x.toml"))


def _dummy_wgrads(megatron_core: str, te: str = "2.6", fusion: bool = True, tied: bool = False,
                  pp: int = 1, **extra: object) -> dict[str, int]:
    """The cached dummy weight gradients of a 2-layer TE GPT (tp 2, untied unless ``tied``) as ``from-megatron``
    writes it (name → bytes), on its last pipeline rank."""
    import tomllib

    from timeline.io.megatron_args import from_mapping
    from timeline.io.megatron_write import convert, run_file_text

    args = {"--num-layers": 2, "--hidden-size": 256, "--num-attention-heads": 4, "--seq-length": 128,
            "--max-position-embeddings": 128, "--micro-batch-size": 1, "--global-batch-size": 2, "--bf16": True,
            "--tensor-model-parallel-size": 2, "--untie-embeddings-and-output-weights": not tied,
            "--vocab-size": 2000, "--make-vocab-size-divisible-by": 128, "--pipeline-model-parallel-size": pp}
    if not fusion:
        args["--no-gradient-accumulation-fusion"] = True
    args |= extra
    conv = convert(from_mapping(args, {}, family="gpt", family_source="x"), world_size=2 * pp, te_version=te,
                   megatron_core=megatron_core)
    run = run_from_data(tomllib.loads(run_file_text(conv, name="x", source="x", world_size=2 * pp)), Path("x.toml"))
    tl = build_timeline(run)
    ev = tl.events(tl.num_devices - 1)
    return {tl.names[t]: int(s) for t, s, sign in zip(ev.tensor, ev.size, ev.sign, strict=True)
            if sign > 0 and tl.names[t].startswith("workspace.te_dummy_wgrad")}


def test_te_dummy_wgrads_per_main_grad_shape_and_the_output_layer_from_megatron_core_0_15():
    """TE's ``get_dummy_wgrad`` (module/base.py, from 2.3): one bf16 ``torch.empty`` per distinct
    main_grad shape of the TE linears (h = 256, tp 2: qkv [384, 256], proj [256, 128], fc1 [512, 256],
    fc2 [256, 512]); Megatron's own output layer ([V_pad/tp, h] = [1024, 256], vocabulary 2,000 padded to
    a multiple of 128·2) calls it from e7c55de (layers.py:
    LinearWithGradAccumulationAndAsyncCommunication.backward), Megatron-Core 0.15 on main."""
    te_linears = {"workspace.te_dummy_wgrad_384x256": 384 * 256 * 2, "workspace.te_dummy_wgrad_256x128": 256 * 128 * 2,
                  "workspace.te_dummy_wgrad_512x256": 512 * 256 * 2, "workspace.te_dummy_wgrad_256x512": 256 * 512 * 2}
    assert _dummy_wgrads("0.14.0") == te_linears
    assert _dummy_wgrads("0.15.0rc3") == te_linears | {"workspace.te_dummy_wgrad_1024x256": 1024 * 256 * 2}
    assert _dummy_wgrads("0.15.0rc3", fusion=False) == {}
    assert _dummy_wgrads("0.16.0", te="2.2") == {}
    # tied embeddings on one stage: the output layer runs on the word embedding's weight, and its dummy takes
    # that weight's main_grad shape [V_pad/tp, h] (a dummy of the same shape an untied head makes); on the last
    # of two stages the head holds its own copy of the weight (output_layer.weight), the same shape again
    head = {"workspace.te_dummy_wgrad_1024x256": 1024 * 256 * 2}
    assert _dummy_wgrads("0.15.0rc3", tied=True) == te_linears | head
    assert _dummy_wgrads("0.14.0", tied=True) == te_linears
    assert _dummy_wgrads("0.15.0rc3", tied=True, pp=2) == {"workspace.te_dummy_wgrad_384x256": 384 * 256 * 2,
                                                          "workspace.te_dummy_wgrad_256x128": 256 * 128 * 2,
                                                          "workspace.te_dummy_wgrad_512x256": 512 * 256 * 2,
                                                          "workspace.te_dummy_wgrad_256x512": 256 * 512 * 2} | head


def test_the_moe_router_and_the_shared_experts_gate_take_no_dummy_wgrad():
    """Megatron's router weight ([E, h], ``moe/router.py: TopKRouter``) runs ``moe_utils.py:
    RouterGatingLinearFunction``, whose backward returns its ``grad_weight`` (core_v0.13.0 … d98e8a64dd), and the
    shared experts' gate ([1, h]) ``F.linear``: neither calls TE's ``get_dummy_wgrad``. A 2-layer TE MoE (h 256,
    tp 2, 4 grouped experts, TE 2.5 < 2.10 so the GroupedLinear experts take none either; Megatron-Core 0.16, the
    first with ``--moe-shared-expert-gate``) keeps the dummies of its TE linears and of the output layer
    ([V_pad/tp, h] = [1024, 256], Megatron-Core ≥ 0.15) only — not the router's [4, 256] (2,048 bytes) nor the
    gate's [1, 256]."""
    moe = {"--num-experts": 4, "--moe-router-topk": 2, "--moe-grouped-gemm": True, "--expert-model-parallel-size": 1,
           "--moe-token-dispatcher-type": "alltoall", "--sequence-parallel": True,
           "--moe-shared-expert-intermediate-size": 512, "--moe-shared-expert-gate": True}
    assert _dummy_wgrads("0.16.0", te="2.5", **moe) == {
        "workspace.te_dummy_wgrad_384x256": 384 * 256 * 2, "workspace.te_dummy_wgrad_256x128": 256 * 128 * 2,
        # the shared experts are TE linears: column fc1 [512/2, 256] and row fc2 [256, 512/2], one shape
        "workspace.te_dummy_wgrad_256x256": 256 * 256 * 2,
        "workspace.te_dummy_wgrad_1024x256": 1024 * 256 * 2}


def _te_cublas(megatron_core: str, te: str, *, gpu: str = "h100", impl: str = "local", experts: int = 2,
               router_dtype: str = "", fixed: bool = False) -> dict[str, int]:
    """The TE cuBLAS workspace a 2-layer GPT on one GPU holds (name → bytes), as ``from-megatron``
    writes it: ``impl`` layers, ``experts`` experts (0: dense)."""
    import tomllib

    from timeline.io.megatron_args import from_mapping
    from timeline.io.megatron_write import convert, run_file_text

    args: dict[str, object] = {
        "--num-layers": 2, "--hidden-size": 256, "--num-attention-heads": 4, "--seq-length": 128,
        "--max-position-embeddings": 128, "--micro-batch-size": 1, "--global-batch-size": 1, "--bf16": True,
        "--vocab-size": 2000, "--make-vocab-size-divisible-by": 128, "--transformer-impl": impl}
    if experts:
        args |= {"--num-experts": experts, "--moe-router-topk": 1}
    if router_dtype:
        args["--moe-router-dtype"] = router_dtype
    conv = convert(from_mapping(args, {}, family="moe" if experts else "gpt", family_source="x"), world_size=1,
                   gpu=gpu, te_version=te, megatron_core=megatron_core, router_te_gemm_fixed=fixed)
    run = run_from_data(tomllib.loads(run_file_text(conv, name="x", source="x", world_size=1)), Path("x.toml"))
    tl = build_timeline(run)
    ev = tl.events(0)
    return {tl.names[t]: int(s) for t, s, sign in zip(ev.tensor, ev.size, ev.sign, strict=True)
            if sign > 0 and tl.names[t] == "workspace.te_cublas"}


def test_a_commit_with_the_router_gemm_fix_under_a_lagging_version_holds_te_s_workspace():
    """Megatron-LM's dev branch merged d3528a2130 (2026-03-06) while its package_info still said 0.16.0rc0
    (06ecac391e, 2026-04-08): with TE ≥ 2.10 its local MoE job's router runs TE's GEMM and holds TE's
    cuBLAS workspace (``[framework] router_te_gemm_fixed``), 32 MiB + 1,024 bytes on Hopper; the flag changes
    nothing where the version already decides (TE < 2.10, or Megatron-Core ≥ 0.17) nor in a dense job."""
    hopper = {"workspace.te_cublas": 32 * MIB + 1024}
    assert _te_cublas("0.16.0rc0", "2.13") == {}
    assert _te_cublas("0.16.0rc0", "2.13", fixed=True) == hopper
    assert _te_cublas("0.16.0rc0", "2.13", gpu="a100", fixed=True) == {"workspace.te_cublas": 4 * MIB}
    assert _te_cublas("0.18.0", "2.14", fixed=True) == _te_cublas("0.18.0", "2.14") == hopper
    assert _te_cublas("0.16.0rc0", "2.13", router_dtype="fp64", fixed=True) == {}
    assert _te_cublas("0.16.0rc0", "2.13", experts=0, fixed=True) == {}


def test_a_local_moe_job_holds_te_s_workspace_through_the_router_gemm():
    """Megatron's router GEMM (moe_utils.py: RouterGatingLinearFunction, from 0f058666a8) runs TE's
    ``general_gemm`` whenever TE ≥ 2.0 is importable, so a ``--transformer-impl local`` MoE job holds
    TE's one cuBLAS workspace (``get_cublas_workspace_size_bytes``: 32 MiB + 1,024 bytes on Hopper from
    TE 2.9, 4 MiB on Ampere): from Megatron-Core 0.13.0; with TE ≥ 2.10 (no ``module/base.py:
    get_workspace``) only from 0.17 (d3528a2130's import fallback); never under ``--moe-router-dtype
    fp64``, nor in a dense local job."""
    hopper = {"workspace.te_cublas": 32 * MIB + 1024}
    assert _te_cublas("0.18.0", "2.14") == hopper
    assert _te_cublas("0.18.0", "2.14", gpu="a100") == {"workspace.te_cublas": 4 * MIB}
    assert _te_cublas("0.14.0", "2.6") == {"workspace.te_cublas": 32 * MIB}
    assert _te_cublas("0.13.0", "2.6") == {"workspace.te_cublas": 32 * MIB}
    assert _te_cublas("0.13.0rc0", "2.2") == {}  # main before 0f058666a8
    assert _te_cublas("0.16.0", "2.11") == {}  # te_general_gemm is None: torch.mm
    assert _te_cublas("0.17.0", "2.11") == hopper
    assert _te_cublas("0.18.0", "1.11") == {}  # no cpp_extensions.general_gemm before TE 2.0
    assert _te_cublas("0.18.0", "2.14", router_dtype="fp64") == {}
    assert _te_cublas("0.18.0", "2.14", experts=0) == {}
    # a TE-layer job holds the same single workspace, MoE or not
    assert _te_cublas("0.18.0", "2.14", impl="transformer_engine") == hopper
    assert _te_cublas("0.18.0", "2.14", impl="transformer_engine", experts=0) == hopper


def test_the_backward_thread_s_workspace_comes_with_its_first_gemm_not_before_the_loss_backward():
    """The autograd thread's cuBLAS workspace is created by its first ``torch.matmul`` — on the stage
    holding the head, the output layer's dgrad, which runs after the loss's backward has freed the
    fp32 logits — so the first backward's loss step does not hold it (six measured tp 1 H100 jobs
    peak in iteration 1 exactly at their loss forward, 32 MiB below the old placement)."""
    import numpy as np

    tl = build_timeline(tiny_run(sm=90, pytorch="2.13"))
    d = max(range(tl.num_devices), key=lambda i: tl.devices[i].pp_rank)
    ev, names = tl.events(d), tl.names
    name = np.array([names[t] for t in ev.tensor])
    op = np.array([names[o] if o >= 0 else "" for o in ev.op])
    ws = int(np.flatnonzero((name == "workspace.torch_cublas_backward") & (ev.sign > 0))[0])
    first_b = min(s.start_us for s in tl.spans[d] if s.kind == "B")
    head = np.flatnonzero((op == "output.output_layer") & (ev.t_us >= first_b))[0]
    loss_frees = np.flatnonzero((op == "output.loss") & (ev.sign < 0) & (ev.t_us >= first_b) & (ev.t_us <= ev.t_us[ws]))
    assert ev.t_us[ws] == ev.t_us[head] > first_b  # at the output layer's backward, not the backward's start
    assert ws > loss_frees.max() and ws > head  # after the loss's frees and the dgrad output it writes
    assert int(ev.size[ws]) == 32 * MIB


def _head_gather(args: dict, world_size: int) -> tuple[dict[str, int], set[str]]:
    """(the global-buffer workspace bytes, the names of the output layer's gather tensors) on the last
    pipeline rank of a small TE GPT as ``from-megatron`` writes it."""
    import tomllib

    from timeline.io.megatron_args import from_mapping
    from timeline.io.megatron_write import convert, run_file_text

    base = {"--num-layers": 2, "--hidden-size": 256, "--num-attention-heads": 4, "--seq-length": 128,
            "--max-position-embeddings": 128, "--micro-batch-size": 2, "--global-batch-size": 4, "--bf16": True,
            "--vocab-size": 2000, "--make-vocab-size-divisible-by": 128, "--transformer-impl": "transformer_engine"}
    conv = convert(from_mapping(base | args, {}, family="gpt", family_source="x"), world_size=world_size)
    run = run_from_data(tomllib.loads(run_file_text(conv, name="x", source="x", world_size=world_size)),
                        Path("x.toml"))
    tl = build_timeline(run)
    d = max(range(tl.num_devices), key=lambda i: tl.devices[i].pp_rank)
    ev = tl.events(d)
    names = [tl.names[t] for t, sign in zip(ev.tensor, ev.sign, strict=True) if sign > 0]
    buf = {n: int(s) for n, s, sign in zip((tl.names[t] for t in ev.tensor), ev.size, ev.sign, strict=True)
           if sign > 0 and n == "workspace.global_memory_buffer"}
    # (grad:…gathered, the input gradient grad_output·W, is a fresh tensor in Megatron too)
    return buf, {n for n in names if n.endswith(("output_layer.gathered", "output_layer.wgrad_input"))
                 and not n.startswith("grad:")}


def test_the_output_layer_gathers_its_sequence_parallel_input_into_the_global_memory_buffer():
    """GPTModel's output layer is Megatron's ColumnParallelLinear under TE too; with sequence parallelism
    LinearWithGradAccumulationAndAsyncCommunication all-gathers its [s/(cp·tp), b, h] input into
    GlobalMemoryBuffer("mpu"), forward and again for the wgrad: one persistent [s/cp · b, h] bf16 buffer
    (s 128, b 2, h 256: 128·2·256·2 bytes; cp 2 halves it) and no gather tensor of its own
    (Megatron-LM 5fe3f06658 tensor_parallel/layers.py; models/gpt/gpt_model.py: GPTModel.__init__)."""
    tp_sp = {"--tensor-model-parallel-size": 2, "--sequence-parallel": True}
    buf, gathers = _head_gather(tp_sp, 2)
    assert buf == {"workspace.global_memory_buffer": 128 * 2 * 256 * 2}
    assert gathers == set()
    buf, _ = _head_gather(tp_sp | {"--context-parallel-size": 2}, 4)
    assert buf == {"workspace.global_memory_buffer": 128 // 2 * 2 * 256 * 2}
    assert _head_gather({"--tensor-model-parallel-size": 2}, 2) == ({}, set())  # no SP: no gather at all
    # with two pipeline stages the last one holds the output layer and the buffer
    assert _head_gather(tp_sp | {"--pipeline-model-parallel-size": 2}, 4)[0] == {
        "workspace.global_memory_buffer": 128 * 2 * 256 * 2}


def _torch_workspaces_per_stage(megatron_core: str, te: str) -> list[set[str]]:
    """Per pipeline rank of a 2-stage TE-layer MoE GPT as ``from-megatron`` writes it, the PyTorch
    cuBLAS workspaces its device allocates."""
    import tomllib

    from timeline.io.megatron_args import from_mapping
    from timeline.io.megatron_write import convert, run_file_text

    args = {"--num-layers": 2, "--hidden-size": 256, "--num-attention-heads": 4, "--seq-length": 128,
            "--max-position-embeddings": 128, "--micro-batch-size": 1, "--global-batch-size": 2, "--bf16": True,
            "--vocab-size": 2000, "--make-vocab-size-divisible-by": 128, "--pipeline-model-parallel-size": 2,
            "--num-experts": 2, "--moe-router-topk": 1}
    conv = convert(from_mapping(args, {}, family="moe", family_source="x"), world_size=2, gpu="h100",
                   te_version=te, megatron_core=megatron_core)
    tl = build_timeline(run_from_data(tomllib.loads(run_file_text(conv, name="x", source="x", world_size=2)),
                                      Path("x.toml")))
    out: list[set[str]] = [set(), set()]
    for d in range(tl.num_devices):
        ev = tl.events(d)
        out[tl.devices[d].pp_rank] |= {tl.names[t] for t, sign in zip(ev.tensor, ev.sign, strict=True)
                                       if sign > 0 and tl.names[t].startswith("workspace.torch_cublas")}
    return out


def test_a_te_moe_stage_without_the_head_runs_no_torch_gemm_once_the_router_uses_te_s():
    """Where the router's GEMM is ``torch.mm`` (Megatron-Core before 0.13.0) every MoE stage holds both
    PyTorch workspaces; once it is TE's ``general_gemm``, a TE-layer stage without the output layer runs
    no PyTorch GEMM and holds none, while the head's stage keeps both (its output layer is torch's)."""
    both = {"workspace.torch_cublas_forward", "workspace.torch_cublas_backward"}
    assert _torch_workspaces_per_stage("0.12.0", "2.2") == [both, both]
    assert _torch_workspaces_per_stage("0.14.0", "2.6") == [set(), both]
    # the shared experts' gate is a torch.nn.functional.linear (moe/shared_experts.py: SharedExpertMLP)
    from dataclasses import replace

    from helpers_run import TINY_MODEL

    from timeline.profiles.megatron_workspaces import torch_gemm_ops
    from timeline.spec.framework import FrameworkSpec

    fw = FrameworkSpec(megatron_core="0.14.0", transformer_engine="2.6")
    assert torch_gemm_ops(fw, TINY_MODEL, holds_head=False, has_moe=True) == ""
    gated = torch_gemm_ops(fw, replace(TINY_MODEL, shared_expert_gate=True), holds_head=False, has_moe=True)
    assert gated == r"\.shared_expert_gate$"
