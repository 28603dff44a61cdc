"""CUDA autocast emulated on the CPU capture: the op lists pinned to PyTorch's, casts as CUDA makes them."""

from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch")

import cs336  # noqa: E402


def test_emulated_op_lists_are_the_installed_pytorch_cuda_autocast_ops():
    from timeline.capture.autocast import policies

    names = torch._C._dispatch_get_all_op_names()
    cuda = {n for n in names if torch._C._dispatch_has_kernel_for_dispatch_key(n, "AutocastCUDA")}
    assert torch.__version__.startswith("2.13")
    assert set(policies()) == cuda


def _autocast_step():
    model = cs336.BasicsTransformerLM(100, 16, 32, 2, 4, 64).cuda()
    x = torch.randint(0, 100, (2, 16), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = cs336.cross_entropy(model(x), x)
        loss.backward()

    return step


def test_cuda_autocast_regions_cast_as_cuda_does():
    from timeline.capture.step import capture_step

    tr = capture_step(_autocast_step, steps=1)
    fwd = [o for o in tr.ops if o.phase == "F"]
    dtypes = Counter((o.name, o.outputs[0].dtype) for o in fwd if o.outputs)
    assert dtypes[("aten.bmm.default", "bfloat16")] > 0 and not dtypes[("aten.bmm.default", "float32")]
    assert dtypes[("aten.exp.default", "float32")] > 0  # exp is on CUDA's fp32 list
    # each fp32 weight is cast once per region (the cache), 2 bytes per element
    params = {p.storage: p for p in tr.params if p.trainable}
    casts = Counter(s for o in fwd if o.name == "aten._to_copy.default" for s in o.inputs if s in params)
    used = {p for p in params if params[p].name != "token_embeddings.weight" and "ln" not in params[p].name}
    assert set(casts) == used and set(casts.values()) == {1}
    bf16 = [tr.storages[o.allocs[0]].nbytes for o in fwd if o.name == "aten._to_copy.default" and o.inputs[0] in used]
    assert sum(bf16) == sum(params[p].nbytes // 2 for p in used)


def test_without_autocast_nothing_is_cast():
    from timeline.capture.step import capture_step

    tr = capture_step(cs336.tiny_torch_adamw, steps=1)
    assert all(t.dtype != "bfloat16" for o in tr.ops for t in o.outputs)
