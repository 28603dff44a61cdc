"""The ``hf`` profile's static state as torch.optim holds it: one tensor per parameter, gradients
made by each backward and dropped by ``zero_grad(set_to_none=True)``, moments from the first step,
foreach Adam's ``_foreach_sqrt`` copy during every step, and PyTorch's two cuBLAS
workspaces."""

from __future__ import annotations

import numpy as np
from helpers_run import tiny_run
from sources import plan_of, state_bytes_of

from timeline.graph.source import model_source
from timeline.graph.tensors import CATEGORIES
from timeline.sim.simulate import simulate


def _events(**kw):
    run = tiny_run(profile="hf", pp=1, layers=3, num_microbatches=2, iterations=3, **kw)
    sim = simulate(plan_of(run, model_source))
    ev, names = sim.events[0], sim.names
    return run, sim, ev, [names[i] for i in ev.tensor]


def test_one_tensor_per_parameter_summing_to_the_static_state():
    run, sim, ev, names = _events()
    dev = sim.devices[0]
    w, g, o = state_bytes_of(run, dev.tensors)
    def total(prefix, sign=1):
        return int(sum(s for s, n, k in zip(ev.size, names, ev.sign, strict=True) if n.startswith(prefix) and k == sign))
    trainable = [t for t in dev.tensors if t.trainable]
    assert total("weights.") == w
    assert sum(1 for n, k in zip(names, ev.sign, strict=True) if n.startswith("weights.") and k > 0) == len(dev.tensors)
    # gradients: made in each of the 3 iterations, dropped after each step
    assert total("grad.") == 3 * g and total("grad.", -1) == 3 * g
    assert sum(1 for n, k in zip(names, ev.sign, strict=True) if n.startswith("grad.") and k > 0) == 3 * len(trainable)
    moments = sum(s for s, n, k in zip(ev.size, names, ev.sign, strict=True) if n.endswith((".exp_avg", ".exp_avg_sq"))
                  or n.startswith("master."))
    assert moments == o


def test_foreach_sqrt_copy_lives_through_each_step():
    run, sim, ev, names = _events()
    sqrt = [(t, s, k) for t, s, k, n in zip(ev.t_us, ev.size, ev.sign, names, strict=True) if n.endswith("_sqrt")]
    per_step = sum(s for _, s, k in sqrt if k > 0) // 3
    trainable = [t for t in sim.devices[0].tensors if t.trainable]
    assert per_step == sum(t.numel for t in trainable) * 4  # fp32 exp_avg_sq, one copy per parameter
    steps = [sp for sp in sim.spans[0] if sp.kind == "step"]
    assert {t for t, _, k in sqrt if k > 0} == {sp.start_us for sp in steps}


def test_zeros_keeps_gradients_and_set_to_none_frees_them():
    _, _, ev_none, names_none = _events(zero_grad="set_to_none")
    _, _, ev_zero, names_zero = _events(zero_grad="zeros")
    assert not any(n.startswith("grad.") and k < 0 for n, k in zip(names_zero, ev_zero.sign, strict=True))
    grads = CATEGORIES.index("grads")
    end_none = int(np.sum(np.where(ev_none.cat == grads, ev_none.sign.astype(np.int64) * ev_none.size, 0)))
    end_zero = int(np.sum(np.where(ev_zero.cat == grads, ev_zero.sign.astype(np.int64) * ev_zero.size, 0)))
    assert end_none == 0 and end_zero > 0


def test_gradients_arrive_layer_by_layer_in_backward_order():
    run, sim, ev, names = _events()
    first = {}
    for t, n, k in zip(ev.t_us, names, ev.sign, strict=True):
        if n.startswith("grad.layers.") and k > 0 and n not in first:
            first[n] = t
    by_layer = {}
    for n, t in first.items():
        by_layer.setdefault(int(n.split(".")[2]), set()).add(t)
    layers = sorted(by_layer)
    assert len(layers) > 1
    # the last layer's gradients come first
    assert max(by_layer[layers[-1]]) < min(by_layer[layers[0]])


def test_cublas_workspaces_of_the_forward_and_the_autograd_thread():
    """PyTorch's cuBLAS workspaces (CublasHandlePool.cpp): 32 MiB on compute capability 9.0 (8.125 MiB on
    8.0), the main thread's from the start, the autograd thread's at the first backward's output layer;
    ``[framework] workspaces = false`` leaves both out."""
    for sm, size in ((90, 32 * 2**20), (80, 8 * 2**20 + 128 * 1024)):
        run, sim, ev, names = _events(sm=sm)
        ws = {n: (t, s) for t, s, k, n in zip(ev.t_us, ev.size, ev.sign, names, strict=True)
              if n.startswith("workspace.") and k > 0}
        first_b = min(sp.start_us for sp in sim.spans[0] if sp.kind == "B")
        assert ws["workspace.torch_cublas_forward"] == (0.0, size)
        t, s = ws["workspace.torch_cublas_backward"]
        assert s == size and t >= first_b
        assert not any(n.startswith("workspace.") and k < 0 for n, k in zip(names, ev.sign, strict=True))
    _, _, _, names = _events(workspaces=False)
    assert not any(n.startswith("workspace.") for n in names)
