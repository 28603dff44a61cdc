"""A resumed Megatron run's checkpoint load (timeline.sim.megatron_load), in bytes from shapes: under
torch_dist the optimizer makes its state before the read (the distributed optimizer dummies first), TE's
FusedAdam.load_state_dict (TE ≥ 1.13) makes every state anew while the loaded ones live, so the moments
exist twice at the peak of the load and once after it; a torch-format checkpoint (read to the host) and an
older TE make them once."""

from __future__ import annotations

import numpy as np
from helpers_run import tiny_run
from test_engine import uniform_template

from timeline.result.build import build_timeline


def _load(zero: int, **framework) -> tuple[list[tuple[str, int, int]], int, int]:
    """(name, bytes, sign) of device 0's optimizer-state events at start, its Adam moment bytes from the
    owned elements, and its fp32 main-parameter bytes."""
    run = tiny_run(pp=1, dp=2, zero=zero, iterations=1, resumed=True, **framework)
    tl = build_timeline(run, uniform_template)
    ev = tl.events(0)
    names = np.array(tl.sim.names)[ev.tensor]
    dev = tl.sim.devices[0]
    if zero:
        elems = sum(s.shard_numel for b in dev.dp_buffers for s in b.slots)
    else:
        elems = sum(t.numel for t in dev.tensors if t.trainable)
    out = [(str(n), int(s), int(g)) for n, s, g, t in zip(names, ev.size, ev.sign, ev.t_us, strict=True)
           if t == 0 and str(n).startswith(("ckpt.", "static.moments."))]
    return out, elems * 8, elems * 4


def _live_peak(events: list[tuple[str, int, int]]) -> tuple[int, int]:
    """(highest, final) live bytes of the events in order."""
    live = top = 0
    for _, size, sign in events:
        live += size * sign
        top = max(top, live)
    return top, live


def test_the_distributed_optimizer_load_holds_the_moments_twice_then_once():
    events, moments, _ = _load(zero=1, transformer_engine="2.10")
    kinds = list(dict.fromkeys((n.split(".")[0] + "." + n.split(".")[1], g) for n, _, g in events))
    # dummies, the inner optimizer's states, dummies dropped; then the states made anew, the loaded ones dropped
    assert kinds == [("ckpt.dummy_state", 1), ("ckpt.loaded_state", 1), ("ckpt.dummy_state", -1),
                     ("static.moments", 1), ("ckpt.loaded_state", -1)]
    assert _live_peak(events) == (2 * moments, moments)
    made = [s for n, s, g in events if n.startswith("static.moments.") and g > 0]
    assert sum(made) == moments and len(made) % 2 == 0


def test_the_plain_optimizer_reads_into_zeros_then_makes_its_states_anew():
    events, moments, _ = _load(zero=0, transformer_engine="2.10")
    assert not any(n.startswith("ckpt.dummy_state") for n, _, _ in events)
    assert _live_peak(events) == (2 * moments, moments)


def test_a_torch_format_checkpoint_or_an_older_te_makes_the_moments_once():
    for framework in ({"transformer_engine": "2.10", "checkpoint_format": "torch"}, {"transformer_engine": "1.11"}):
        events, moments, _ = _load(zero=1, **framework)
        assert {n.split(".")[0] for n, _, _ in events} == {"static"}, framework
        assert _live_peak(events) == (moments, moments), framework
