

def test_nest_returns_durations_in_the_slices_own_order():
    """Slices given out of time order keep their own durations (three slices: a rotation, not a swap)."""
    import numpy as np

    from timeline.exporters.trace_common import nest

    order, dur, clipped = nest(np.array([20, 0, 10]), np.array([21, 5, 13]))
    assert order.tolist() == [1, 2, 0] and dur.tolist() == [1, 5, 3] and clipped == 0
    order, dur, clipped = nest(np.array([20, 0, 10, 1]), np.array([21, 5, 13, 9]))  # 1–9 overlaps 0–5
    assert dur.tolist() == [1, 5, 3, 4] and clipped == 1


def test_actions_merge_an_overlapped_pair_and_cover_their_ops():
    """An overlapped F&B pair (DualPipe: both halves span the same time) is one action slice; a
    comm op takes the half its phase names; a compute op that rounds past its action is clipped."""
    from types import SimpleNamespace

    import numpy as np

    from timeline.exporters.trace_common import actions, threads
    from timeline.result.timeline import Span

    names = ["compute", "ep", "F", "B", "op"]
    spans = [Span(0, 0, 0, 0, "F", 0, 0.0, 10.0), Span(0, 1, 1, 5, "F", 2, 10.0, 30.0, 2.0),
             Span(0, 2, 1, 3, "B", 1, 10.0, 30.0, 2.0, overlapped=True), Span(0, -1, 1, -1, "step", -1, 30.0, 31.0)]
    #            compute F0        compute in pair (F)  ep in pair (B)  compute past the pair's end
    ops = SimpleNamespace(t_start_us=np.array([1.0, 12.0, 15.0, 20.0]), t_end_us=np.array([9.0, 14.0, 25.0, 30.002]),
                          stream=np.array([0, 0, 1, 0]), phase=np.array([2, 2, 3, 3]), name=np.full(4, 4),
                          microbatch=np.array([0, 2, -1, 1]), stage=np.array([0, 5, -1, 3]), layer=np.zeros(4, int))
    tl = SimpleNamespace(ops=[ops], names=names, spans=[spans])
    acts = actions(tl, 0)
    assert [acts.name(k) for k in range(len(acts.spans))] == ["0F0", "5F2 & 3B1", "step"]
    assert acts.args(1) == {"kind_F": "F", "microbatch_F": 2, "stage_F": 5, "kind_B": "B", "microbatch_B": 1,
                            "stage_B": 3, "iteration": 1}
    assert acts.of_op.tolist() == [0, 1, 1, 1]
    assert (acts.start_ns[1], acts.start_ns[1] + acts.dur_ns[1]) == (10_000, 30_000)  # the action's own bounds
    labels, its, mbs, sts = acts.comm_fields(tl, 0, np.array([2]))
    assert (labels, its, mbs, sts) == (["3B1"], [1], [1], [3])  # the B half, its micro-batch and stage
    compute = threads(tl, 0, acts)[0]
    assert compute.index.tolist() == [-1, 0, -2, 1, 3, -3]  # each action before the ops it holds
    assert compute.clipped == 1 and compute.dur_ns.tolist()[4] == 10_000  # the overrunning op ends with its action
    assert compute.dur_ns.tolist()[5] == 1_000  # the step action keeps its length
